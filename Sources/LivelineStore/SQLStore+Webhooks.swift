import Foundation
import LivelineCore
import NIOCore
import SQLiteNIO

/// An app's webhook endpoint.
public struct WebhookRecord: Sendable, Hashable {
    /// `wh_…`
    public var id: String
    public var appID: String
    public var url: String
    /// The event types it receives; empty: every type.
    public var eventTypes: [LifecycleEventType]
    public var enabled: Bool
    /// The signing secret, sealed (``CredentialSealer/seal(_:appID:webhookID:)``).
    public var sealedSecret: [UInt8]
    public var createdAt: Date
    /// When and why Liveline disabled it (its deliveries kept failing).
    public var disabledAt: Date?
    public var disabledReason: String?

    public init(
        id: String, appID: String, url: String, eventTypes: [LifecycleEventType], enabled: Bool, sealedSecret: [UInt8], createdAt: Date,
        disabledAt: Date? = nil, disabledReason: String? = nil
    ) {
        self.id = id
        self.appID = appID
        self.url = url
        self.eventTypes = eventTypes
        self.enabled = enabled
        self.sealedSecret = sealedSecret
        self.createdAt = createdAt
        self.disabledAt = disabledAt
        self.disabledReason = disabledReason
    }

    /// Whether it receives events of `type`.
    public func receives(_ type: LifecycleEventType) -> Bool { eventTypes.isEmpty || eventTypes.contains(type) }
}

/// Where one event's delivery to one endpoint stands.
public enum WebhookDeliveryStatus: String, Sendable, Hashable, CaseIterable {
    case pending, delivered, failed
}

/// One event to one endpoint, with its last attempt.
public struct WebhookDeliveryRecord: Sendable, Hashable {
    public var id: Int64
    public var webhookID: String
    public var eventID: String
    /// The exact body sent (the event's JSON).
    public var payload: String
    public var status: WebhookDeliveryStatus
    public var attempts: Int
    public var nextAttemptAt: Date
    public var lastStatusCode: Int?
    public var lastError: String?
    public var lastLatencyMilliseconds: Double?
    public var lastAttemptAt: Date?
    public var createdAt: Date
    public var finishedAt: Date?
    /// When it was first tried (its retry period runs from then): nil before its first attempt.
    public var firstAttemptAt: Date? = nil
}

/// A pending delivery due now, with what sending it needs.
public struct DueWebhookDelivery: Sendable, Hashable {
    public var delivery: WebhookDeliveryRecord
    public var appID: String
    public var url: String
    public var sealedSecret: [UInt8]
}

/// How one attempt went, as the deliverer decided.
public enum WebhookAttemptResult: Sendable, Hashable {
    /// The endpoint answered 2xx.
    case delivered
    /// Try again at `next`.
    case retry(next: Date)
    /// Retries ran out: the delivery failed and the endpoint is disabled, with `reason`.
    case failed(reason: String)
}

/// Webhook endpoints and their deliveries.
public protocol WebhookStore: Sendable {
    /// Creates an endpoint; it receives the events recorded from now on.
    /// Creates an endpoint unless its app already has `maximum` of them (checked in the same transaction: endpoints
    /// created at once cannot pass the limit together); false when it has.
    func createWebhook(_ webhook: WebhookRecord, maximum: Int) async throws -> Bool
    func webhooks(appID: String) async throws -> [WebhookRecord]
    func webhook(appID: String, id: String) async throws -> WebhookRecord?
    /// Deletes an endpoint and its deliveries; false when the app has no such endpoint.
    func deleteWebhook(appID: String, id: String) async throws -> Bool
    /// Turns the events recorded since each enabled endpoint last looked into pending deliveries (up to `limit` events an
    /// endpoint); returns how many deliveries were made.
    func enqueueWebhookDeliveries(limit: Int, at now: Date) async throws -> Int
    /// A delivery of `payload` to one endpoint, outside the feed (`POST /v1/webhooks/{id}/test`).
    func enqueueWebhookTest(appID: String, webhookID: String, eventID: String, payload: String, at now: Date) async throws -> WebhookDeliveryRecord?
    /// Pending deliveries due at `now` of enabled endpoints, each the oldest pending one of its activity at its endpoint,
    /// none of those `excluding` names (the caller's attempts in flight) nor of the endpoints `excludingEndpoints`
    /// names, and at most `perEndpoint` of one endpoint; the endpoints take turns (each one's first due delivery
    /// before any one's second), so one endpoint's backlog does not keep another's deliveries waiting. On a database
    /// several nodes share, the deliveries returned are this node's for two minutes (the others skip them), unless its
    /// attempt's record says otherwise sooner.
    func dueWebhookDeliveries(
        now: Date, limit: Int, perEndpoint: Int, excluding: Set<Int64>, excludingEndpoints: Set<String>
    ) async throws -> [DueWebhookDelivery]
    /// When the next pending delivery falls due, if any.
    func nextWebhookDeliveryAt() async throws -> Date?
    /// Hands back deliveries taken with ``dueWebhookDeliveries(now:limit:perEndpoint:excluding:excludingEndpoints:)``
    /// whose attempts were not made after all (a graceful stop cancelled them): those still pending are due at `now`
    /// again, for any node, rather than when this node's hold on them runs out.
    func handBackWebhookDeliveries(_ ids: [Int64], at now: Date) async throws
    /// Records one attempt and what follows from it.
    func recordWebhookAttempt(
        deliveryID: Int64, statusCode: Int?, error: String?, latencyMilliseconds: Double, result: WebhookAttemptResult, at now: Date
    ) async throws
    /// An endpoint's deliveries, newest first.
    func webhookDeliveries(appID: String, webhookID: String, before id: Int64?, limit: Int) async throws -> [WebhookDeliveryRecord]
}

extension SQLStore: WebhookStore {
    public func createWebhook(_ webhook: WebhookRecord, maximum: Int) async throws -> Bool {
        // An endpoint receives the events after its creation: on PostgreSQL those committed before it get their feed
        // positions first, under the one it starts from (with no endpoint, nothing else gives them any until the feed
        // is read: ``enqueueWebhookDeliveries(limit:at:)``).
        try await sequenceEventsCommittedBefore()
        return try await transaction { db in
            let count = try db.query("SELECT COUNT(*) AS n FROM webhooks WHERE app_id = ?", [.text(webhook.appID)]).first?.column("n")?.integer ?? 0
            guard count < maximum else { return false }
            _ = try db.query(
                """
                INSERT INTO webhooks (id, app_id, url, event_types, enabled, sealed_secret, scanned_position, created_at)
                VALUES (?, ?, ?, ?, ?, ?, (SELECT COALESCE(MAX(id), 0) FROM events), ?)
                """,
                [.text(webhook.id), .text(webhook.appID), .text(webhook.url),
                 .text(JSONValue.array(webhook.eventTypes.map { .string($0.rawValue) }).encodedString), .integer(webhook.enabled ? 1 : 0),
                 .blob(ByteBuffer(bytes: webhook.sealedSecret)), .integer(Self.millis(webhook.createdAt))]
            )
            return true
        }
    }

    public func webhooks(appID: String) async throws -> [WebhookRecord] {
        try await reader.query("SELECT * FROM webhooks WHERE app_id = ? ORDER BY created_at, id", [.text(appID)]).map(Self.webhook(from:))
    }

    public func webhook(appID: String, id: String) async throws -> WebhookRecord? {
        try await reader.query("SELECT * FROM webhooks WHERE app_id = ? AND id = ?", [.text(appID), .text(id)]).first.map(Self.webhook(from:))
    }

    public func deleteWebhook(appID: String, id: String) async throws -> Bool {
        try await transaction { db in
            _ = try db.query(
                "DELETE FROM webhook_deliveries WHERE webhook_id = (SELECT id FROM webhooks WHERE app_id = ? AND id = ?)", [.text(appID), .text(id)]
            )
            return !(try db.query("DELETE FROM webhooks WHERE app_id = ? AND id = ? RETURNING id", [.text(appID), .text(id)]).isEmpty)
        }
    }

    public func enqueueWebhookDeliveries(limit: Int, at now: Date) async throws -> Int {
        // With no endpoint (the usual case), nothing is written: on PostgreSQL the events keep waiting for their feed
        // positions until the feed is read or an endpoint created. The deliverer looks at every wake-up of the engine,
        // and giving positions on each was five statements and a second write of every event: 250 times in
        // 10,000 updates, a tenth of PostgreSQL's statements.
        guard try await !reader.query("SELECT 1 AS found FROM webhooks WHERE enabled = 1 LIMIT 1").isEmpty else { return 0 }
        try await sequenceEvents()
        // Looked at on a reader first: with no endpoint behind the feed, the writer is not taken.
        let behind = try await reader.query(
            """
            SELECT 1 FROM webhooks w WHERE w.enabled = 1
              AND EXISTS (SELECT 1 FROM events e WHERE e.app_id = w.app_id AND e.id > w.scanned_position)
            LIMIT 1
            """
        )
        guard !behind.isEmpty else { return 0 }
        // Bookkeeping: the events are durable already; lost in a power cut, the same events are scanned again.
        return try await transaction(durability: .bookkeeping) { db in
            let nowMillis = Self.millis(now)
            var made = 0
            for row in try db.query("SELECT * FROM webhooks WHERE enabled = 1") {
                let webhook = try Self.webhook(from: row)
                let scanned = Int64(row.column("scanned_position")?.integer ?? 0)
                let events = try db.query(
                    "SELECT * FROM events WHERE app_id = ? AND id > ? ORDER BY id LIMIT \(limit)", [.text(webhook.appID), .integer(Int(scanned))]
                ).map(self.event(from:))
                guard let last = events.last else { continue }
                for event in events where webhook.receives(event.type) {
                    _ = try db.query(
                        """
                        INSERT INTO webhook_deliveries (webhook_id, event_position, event_id, ordering_key, payload, status, next_attempt_at,
                            created_at)
                        VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)
                        """,
                        [.text(webhook.id), .integer(Int(event.position)), .text(event.id), .text(event.activityID ?? ""),
                         .text(event.json.encodedString), .integer(nowMillis), .integer(nowMillis)]
                    )
                    made += 1
                }
                _ = try db.query("UPDATE webhooks SET scanned_position = ? WHERE id = ?", [.integer(Int(last.position)), .text(webhook.id)])
            }
            return made
        }
    }

    public func enqueueWebhookTest(
        appID: String, webhookID: String, eventID: String, payload: String, at now: Date
    ) async throws -> WebhookDeliveryRecord? {
        try await transaction { db in
            guard !(try db.query("SELECT 1 FROM webhooks WHERE app_id = ? AND id = ?", [.text(appID), .text(webhookID)]).isEmpty) else {
                return nil
            }
            let nowMillis = Self.millis(now)
            return try db.query(
                """
                INSERT INTO webhook_deliveries (webhook_id, event_position, event_id, ordering_key, payload, status, next_attempt_at, created_at)
                VALUES (?, 0, ?, ?, ?, 'pending', ?, ?) RETURNING *
                """,
                [.text(webhookID), .text(eventID), .text("test:" + eventID), .text(payload), .integer(nowMillis), .integer(nowMillis)]
            ).first.map(Self.webhookDelivery(from:))
        }
    }

    /// How long a node that took due webhook deliveries on a shared database has to send them before another node may.
    static let webhookDeliveryLease: TimeInterval = 120

    public func dueWebhookDeliveries(
        now: Date, limit: Int, perEndpoint: Int, excluding: Set<Int64> = [], excludingEndpoints: Set<String> = []
    ) async throws -> [DueWebhookDelivery] {
        // The exclusions as literals (ids are numbers; endpoint ids are quoted as SQL strings), so the statement binds
        // the same values on both databases; a deliverer has a few dozen attempts in flight at most.
        var exclusions = ""
        if !excluding.isEmpty { exclusions += " AND d.id NOT IN (\(excluding.sorted().map(String.init).joined(separator: ", ")))" }
        if !excludingEndpoints.isEmpty {
            let quoted = excludingEndpoints.sorted().map { "'" + $0.replacingOccurrences(of: "'", with: "''") + "'" }
            exclusions += " AND d.webhook_id NOT IN (\(quoted.joined(separator: ", ")))"
        }
        // `turn`: a delivery's place among its endpoint's due ones.
        let due = """
            SELECT t.id FROM (
                SELECT d.id, d.next_attempt_at,
                    ROW_NUMBER() OVER (PARTITION BY d.webhook_id ORDER BY d.next_attempt_at, d.id) AS turn
                FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
                WHERE d.status = 'pending' AND d.next_attempt_at <= ? AND w.enabled = 1\(exclusions)
                  AND NOT EXISTS (
                      SELECT 1 FROM webhook_deliveries p
                      WHERE p.webhook_id = d.webhook_id AND p.ordering_key = d.ordering_key AND p.status = 'pending' AND p.id < d.id
                  )
            ) AS t
            WHERE t.turn <= \(max(perEndpoint, 1))
            ORDER BY t.turn, t.next_attempt_at, t.id LIMIT \(limit)
            """
        let rows: [StoreRow]
        switch dialect {
        case .sqlite:
            rows = try await reader.query(
                """
                SELECT d.*, w.app_id AS webhook_app_id, w.url AS webhook_url, w.sealed_secret AS webhook_secret
                FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
                WHERE d.id IN (\(due))
                ORDER BY d.next_attempt_at, d.id
                """,
                [.integer(Self.millis(now))]
            )
        case .postgres:
            // Looked at on a reader first: with nothing due (the usual case at each wake-up), no write transaction is
            // taken.
            guard try await !reader.query("SELECT 1 AS found FROM (\(due)) AS due LIMIT 1", [.integer(Self.millis(now))]).isEmpty else {
                return []
            }
            // Several nodes: the deliveries a node takes are not due for the others until the lease runs out (the
            // attempt's record sets the next attempt), and rows another node is taking are skipped.
            rows = try await write(
                """
                UPDATE webhook_deliveries AS d SET next_attempt_at = ?
                FROM webhooks w
                WHERE w.id = d.webhook_id AND d.id IN (
                    SELECT l.id FROM webhook_deliveries l WHERE l.id IN (\(due)) FOR UPDATE OF l SKIP LOCKED
                )
                RETURNING d.*, w.app_id AS webhook_app_id, w.url AS webhook_url, w.sealed_secret AS webhook_secret
                """,
                [.integer(Self.millis(now.addingTimeInterval(Self.webhookDeliveryLease))), .integer(Self.millis(now))]
            ).sorted { ($0.column("id")?.integer ?? 0) < ($1.column("id")?.integer ?? 0) }
        }
        return try rows.map { row in
            DueWebhookDelivery(
                delivery: try Self.webhookDelivery(from: row), appID: try row.string("webhook_app_id"), url: try row.string("webhook_url"),
                sealedSecret: Array(buffer: row.column("webhook_secret")?.blob ?? ByteBuffer())
            )
        }
    }

    public func nextWebhookDeliveryAt() async throws -> Date? {
        try await reader.query(
            """
            SELECT MIN(d.next_attempt_at) AS due FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
            WHERE d.status = 'pending' AND w.enabled = 1
            """
        ).first?.column("due")?.integer.map(Self.date)
    }

    public func handBackWebhookDeliveries(_ ids: [Int64], at now: Date) async throws {
        guard !ids.isEmpty else { return }
        // The ids as literals (numbers), as in `dueWebhookDeliveries`.
        try await transaction(durability: .bookkeeping) { db in
            try db.execute(
                "UPDATE webhook_deliveries SET next_attempt_at = ? WHERE status = 'pending' AND next_attempt_at > ? AND id IN (\(ids.map(String.init).joined(separator: ", ")))",
                [.integer(Self.millis(now)), .integer(Self.millis(now))]
            )
        }
    }

    public func recordWebhookAttempt(
        deliveryID: Int64, statusCode: Int?, error: String?, latencyMilliseconds: Double, result: WebhookAttemptResult, at now: Date
    ) async throws {
        try await transaction(durability: .bookkeeping) { db in
            let nowMillis = Self.millis(now)
            var status: WebhookDeliveryStatus
            var next = nowMillis
            switch result {
            case .delivered: status = .delivered
            case .retry(let at):
                status = .pending
                next = Self.millis(at)
            case .failed: status = .failed
            }
            // Another delivery to the endpoint may have disabled it while this attempt was under way (and failed this
            // one with the rest of its queue): a delivery to try again then fails instead, or it would stay pending
            // for ever behind a disabled endpoint. One that got through is still recorded delivered.
            if status == .pending {
                let enabled = try db.query(
                    "SELECT w.enabled FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE d.id = ?",
                    [.integer(Int(deliveryID))]
                ).first?.column("enabled")?.integer
                if enabled == 0 { status = .failed }
            }
            let rows = try db.query(
                """
                UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, next_attempt_at = ?, last_status_code = ?, last_error = ?,
                    last_latency_ms = ?, last_attempt_at = ?, finished_at = ?, first_attempt_at = COALESCE(first_attempt_at, ?)
                WHERE id = ? RETURNING webhook_id
                """,
                [.text(status.rawValue), .integer(next), statusCode.map { .integer($0) } ?? .null, Self.text(error),
                 .float(latencyMilliseconds), .integer(nowMillis), status == .pending ? .null : .integer(nowMillis), .integer(nowMillis),
                 .integer(Int(deliveryID))]
            )
            if case .failed(let reason) = result, let webhookID = rows.first?.column("webhook_id")?.string {
                _ = try db.query(
                    "UPDATE webhooks SET enabled = 0, disabled_at = ?, disabled_reason = ? WHERE id = ? AND enabled = 1",
                    [.integer(nowMillis), .text(reason), .text(webhookID)]
                )
                // A disabled endpoint is never sent to again (it is deleted and created anew): the deliveries queued
                // behind the one that failed end with it, rather than stay pending for ever.
                _ = try db.query(
                    """
                    UPDATE webhook_deliveries SET status = 'failed', finished_at = ?, next_attempt_at = ?,
                        last_error = CASE WHEN attempts = 0 THEN 'not sent: the endpoint was disabled'
                            ELSE COALESCE(last_error, 'not sent again: the endpoint was disabled') END
                    WHERE webhook_id = ? AND status = 'pending'
                    """,
                    [.integer(nowMillis), .integer(nowMillis), .text(webhookID)]
                )
            }
        }
    }

    public func webhookDeliveries(appID: String, webhookID: String, before id: Int64?, limit: Int) async throws -> [WebhookDeliveryRecord] {
        try await reader.query(
            """
            SELECT d.* FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
            WHERE w.app_id = ? AND d.webhook_id = ? AND d.id < ? ORDER BY d.id DESC LIMIT \(limit)
            """,
            [.text(appID), .text(webhookID), .integer(Int(id ?? Int64.max))]
        ).map(Self.webhookDelivery(from:))
    }

    static func webhook(from row: StoreRow) throws -> WebhookRecord {
        WebhookRecord(
            id: try row.string("id"), appID: try row.string("app_id"), url: try row.string("url"),
            eventTypes: (try row.json("event_types")?.arrayValue ?? []).compactMap { $0.stringValue.flatMap(LifecycleEventType.init(rawValue:)) },
            enabled: (row.column("enabled")?.integer ?? 0) != 0,
            sealedSecret: Array(buffer: row.column("sealed_secret")?.blob ?? ByteBuffer()), createdAt: try row.date("created_at"),
            disabledAt: row.column("disabled_at")?.integer.map(date), disabledReason: row.column("disabled_reason")?.string
        )
    }

    static func webhookDelivery(from row: StoreRow) throws -> WebhookDeliveryRecord {
        WebhookDeliveryRecord(
            id: Int64(row.column("id")?.integer ?? 0), webhookID: try row.string("webhook_id"), eventID: try row.string("event_id"),
            payload: try row.string("payload"), status: WebhookDeliveryStatus(rawValue: try row.string("status")) ?? .pending,
            attempts: row.column("attempts")?.integer ?? 0, nextAttemptAt: try row.date("next_attempt_at"),
            lastStatusCode: row.column("last_status_code")?.integer, lastError: row.column("last_error")?.string,
            lastLatencyMilliseconds: row.column("last_latency_ms")?.double, lastAttemptAt: row.column("last_attempt_at")?.integer.map(date),
            createdAt: try row.date("created_at"), finishedAt: row.column("finished_at")?.integer.map(date),
            firstAttemptAt: row.column("first_attempt_at")?.integer.map(date)
        )
    }
}
