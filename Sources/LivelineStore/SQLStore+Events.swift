import Foundation
import LivelineCore
import SQLiteNIO

/// A lifecycle event to record, in the same transaction as the change that causes it (an outbox: none is lost in a
/// crash, none is recorded for a change that rolled back).
public struct NewEvent: Sendable, Hashable {
    public var type: LifecycleEventType
    public var appID: String
    public var activityID: String?
    public var deviceID: String?
    /// A small object particular to the type (documented in the OpenAPI document).
    public var data: JSONValue

    public init(_ type: LifecycleEventType, appID: String, activityID: String? = nil, deviceID: String? = nil, data: JSONValue = [:]) {
        self.type = type
        self.appID = appID
        self.activityID = activityID
        self.deviceID = deviceID
        self.data = data
    }
}

/// A recorded lifecycle event.
public struct EventRecord: Sendable, Hashable {
    /// The feed's position: increases with every event recorded.
    public var position: Int64
    /// The event's public id (`evt_…`), the same in the feed and in webhooks.
    public var id: String
    public var type: LifecycleEventType
    public var appID: String
    public var activityID: String?
    public var deviceID: String?
    public var data: JSONValue
    public var createdAt: Date

    public init(
        position: Int64, id: String, type: LifecycleEventType, appID: String, activityID: String?, deviceID: String?, data: JSONValue,
        createdAt: Date
    ) {
        self.position = position
        self.id = id
        self.type = type
        self.appID = appID
        self.activityID = activityID
        self.deviceID = deviceID
        self.data = data
        self.createdAt = createdAt
    }
}

extension EventRecord {
    /// The event as the feed shows it and webhooks send it.
    public var json: JSONValue {
        .object([
            "id": .string(id),
            "type": .string(type.rawValue),
            "createdAt": .string(APIDate.iso8601(createdAt)),
            "appId": .string(appID),
            "activityId": activityID.map(JSONValue.string) ?? .null,
            "deviceId": deviceID.map(JSONValue.string) ?? .null,
            "data": data,
        ])
    }
}

/// The event feed: lifecycle events in the order they were recorded, per app.
public protocol EventStore: Sendable {
    /// The app's events after `position` (from the oldest kept when nil), of `types` (all when empty), oldest first.
    func events(appID: String, after position: Int64?, types: Set<LifecycleEventType>, limit: Int) async throws -> [EventRecord]
    /// Forgets events recorded before `cutoff`; returns how many. The positions of the events recorded afterwards come
    /// after every position given before, whatever was forgotten.
    func pruneEvents(olderThan cutoff: Date) async throws -> Int
    /// Forgets the webhook deliveries (each with its event's message) that finished, delivered or failed, before
    /// `cutoff`; returns how many. Pending ones stay.
    func pruneWebhookDeliveries(finishedBefore cutoff: Date) async throws -> Int
    /// Records `instance.start_unconfirmed`, once, for each remotely started instance still `starting` since before
    /// `cutoff`; returns how many.
    func reportUnconfirmedStarts(startedBefore cutoff: Date, at now: Date) async throws -> Int
}

extension SQLStore: EventStore {
    /// The statement that records `event` at `now`.
    static func eventStatement(_ event: NewEvent, at now: Date) -> (sql: String, binds: [SQLiteData]) {
        ("\(insertEvent) VALUES (?, ?, ?, ?, ?, ?)", eventBinds(event, at: now))
    }

    /// The statement that writes an event of the delivery engine (a push refused, a token invalidated, a budget warning):
    /// only while its app exists, since a pass may still be sending when the app is deleted. On SQLite an event refused
    /// by the foreign key would fail the pass's whole progress write; on PostgreSQL, where `events` has no key to the
    /// app (its step 17), it would be left under the gone app.
    static func engineEventStatement(_ event: NewEvent, at now: Date) -> (sql: String, binds: [SQLiteData]) {
        (
            "\(insertEvent) SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM apps WHERE id = ?)",
            eventBinds(event, at: now) + [.text(event.appID)]
        )
    }

    /// An event's insert, up to its values.
    private static let insertEvent = "INSERT INTO events (app_id, type, activity_id, device_id, data, created_at)"

    /// The values of ``insertEvent``'s columns for `event` at `now`.
    private static func eventBinds(_ event: NewEvent, at now: Date) -> [SQLiteData] {
        [.text(event.appID), .text(event.type.rawValue), text(event.activityID), text(event.deviceID), .text(event.data.encodedString),
         .integer(millis(now))]
    }

    /// Records `event` on the writer, inside the caller's transaction.
    static func record(_ event: NewEvent, at now: Date, on db: any SQLConnection) throws {
        let statement = eventStatement(event, at: now)
        try db.execute(statement.sql, statement.binds)
    }

    /// The public id of the app's event at `position`: `evt_` and, in base 36, the number the app sees for the position
    /// (``PublicNumbers``), the same wherever the event goes.
    func eventID(position: Int64, appID: String) -> String {
        "evt_" + String(publicNumbers(appID: appID).number(for: position), radix: 36)
    }

    /// On PostgreSQL, gives feed positions to the committed events still without one (up to ``sequencerPassLimit``
    /// of them, in the order they were written), after the last position given; returns how many it gave. Writers on
    /// several connections and nodes take `seq` from one sequence and commit in any order, so `seq` cannot be the
    /// feed's position: a reader walking upwards could pass a `seq` whose transaction had not committed yet, and never
    /// see its event. Positions are given instead by one sequencer at a time (on every node) to what has committed,
    /// each pass above the last, so a reader that walks positions upwards never skips one. An event written after
    /// another one's transaction committed comes after it; events of transactions that ran side by side come in the
    /// order of their writes when one pass finds both committed, else in the order of their commits. Nothing waits for
    /// transactions still running, so a long one elsewhere on the server (in another database, or another node's)
    /// holds nothing back. On SQLite the one writer commits in order, and the row id is the position from the start.
    @discardableResult
    func sequenceEvents() async throws -> Int {
        guard dialect == .postgres else { return 0 }
        // A read first (the partial index `events_unsequenced`): an idle deliverer's pass, or a feed read with nothing
        // new, takes no write transaction. `ORDER BY seq` is the index's order, which keeps PostgreSQL on it: without
        // it, statistics taken while many events waited made a scan of the whole table look quicker (5.5 ms for 30,000
        // events, none waiting, against 0.5 ms), and the table only grows.
        guard try await !reader.query("SELECT 1 AS waiting FROM events WHERE id IS NULL ORDER BY seq LIMIT 1").isEmpty else { return 0 }
        // One sequencer at a time (on every node), at READ COMMITTED: the statement below takes its snapshot after the
        // lock, so it reads the positions the sequencer before it committed, and the sequencer holds no predicate
        // locks, which made every write that records an event fail and run again while it ran serializable beside them.
        return try await writer.write(durability: .full, isolation: .exclusive(lock: Self.eventSequencerLock)) { db in
            // The waiting events through `events_unsequenced`, then each one by its key, whatever the statistics say:
            // the waiting events are a few among all those kept, and statistics taken while many waited made plans
            // that read the whole table (a sequential scan, or a merge join along the primary key) look cheaper, at a
            // cost that grows with the table at every call: 24 ms for 150 events among 30,000, against 2.5 ms.
            try db.setLocal([("enable_seqscan", "off"), ("enable_mergejoin", "off"), ("enable_hashjoin", "off")])
            let given = try db.query(
                """
                WITH given AS (
                    UPDATE events SET id = s.position FROM (
                        SELECT seq, GREATEST(
                            (SELECT COALESCE(MAX(id), 0) FROM events), (SELECT COALESCE(MAX(pruned_through), 0) FROM event_feed)
                        ) + ROW_NUMBER() OVER (ORDER BY seq) AS position
                        FROM events WHERE id IS NULL ORDER BY seq LIMIT \(Self.sequencerPassLimit)
                    ) AS s WHERE events.seq = s.seq
                    RETURNING 1
                )
                SELECT count(*) AS given FROM given
                """,
                []
            )
            return Int(given.first?.column("given")?.integer ?? 0)
        }
    }

    /// The advisory lock the event sequencer takes on PostgreSQL: one sequencer at a time.
    static let eventSequencerLock: Int64 = 0x4C49_5645_4556_4E54  // "LIVEEVNT"

    /// The most events one pass of the sequencer gives positions to: a backlog goes in several short transactions.
    static let sequencerPassLimit = 10_000

    /// On PostgreSQL, gives feed positions to every event committed before the call: a client reads the events of its
    /// own writes, as on SQLite.
    func sequenceEventsCommittedBefore() async throws {
        while try await sequenceEvents() == Self.sequencerPassLimit {}
    }

    public func events(appID: String, after position: Int64?, types: Set<LifecycleEventType>, limit: Int) async throws -> [EventRecord] {
        try await sequenceEventsCommittedBefore()
        var sql = "SELECT * FROM events WHERE app_id = ? AND id > ?"
        var binds: [SQLiteData] = [.text(appID), .integer(Int(position ?? 0))]
        if !types.isEmpty {
            sql += " AND type IN (\(Array(repeating: "?", count: types.count).joined(separator: ",")))"
            binds += types.map { .text($0.rawValue) }.sorted { "\($0)" < "\($1)" }
        }
        sql += " ORDER BY id LIMIT \(limit)"
        return try await reader.query(sql, binds).map(event(from:))
    }

    func event(from row: StoreRow) throws -> EventRecord {
        let position = Int64(row.column("id")?.integer ?? 0)
        let appID = try row.string("app_id")
        return EventRecord(
            position: position, id: eventID(position: position, appID: appID),
            type: LifecycleEventType(rawValue: try row.string("type")) ?? .activityUpdated, appID: appID,
            activityID: row.column("activity_id")?.string, deviceID: row.column("device_id")?.string,
            data: try row.json("data") ?? [:], createdAt: try row.date("created_at")
        )
    }

    /// On PostgreSQL, has the sequencer give positions above `position` from now on, whatever events are left: to be
    /// called when events up to it are deleted (pruned, or their app's), since it goes on from the highest position kept.
    static func keepFeedAbove(_ position: Int, on db: any SQLConnection) throws {
        try db.execute(
            """
            INSERT INTO event_feed (id, pruned_through) VALUES (1, ?)
            ON CONFLICT (id) DO UPDATE SET pruned_through = GREATEST(event_feed.pruned_through, EXCLUDED.pruned_through)
            """,
            [.integer(position)]
        )
    }

    public func pruneEvents(olderThan cutoff: Date) async throws -> Int {
        // Every event waiting for its position gets one first (they wait until the feed is read when no webhook
        // endpoint is there to read it): one without a position would never be pruned.
        try await sequenceEventsCommittedBefore()
        let dialect = dialect
        return try await transaction { db in
            // Ids rise with time: everything below the first event recorded at or after the cutoff goes.
            let pruned = try db.query(
                """
                DELETE FROM events WHERE id < COALESCE(
                    (SELECT id FROM events WHERE created_at >= ? ORDER BY id LIMIT 1), (SELECT MAX(id) + 1 FROM events)
                ) RETURNING id
                """,
                [.integer(Self.millis(cutoff))]
            )
            // PostgreSQL's sequencer goes on from the highest position kept; with every event gone it would start again
            // at 1, under the cursors clients hold and the positions the webhooks have scanned up to, and neither would
            // ever see the new events. The highest position pruned is kept for it (SQLite's AUTOINCREMENT keeps its own).
            if dialect == .postgres, let highest = pruned.compactMap({ $0.column("id")?.integer }).max() {
                try Self.keepFeedAbove(highest, on: db)
            }
            return pruned.count
        }
    }

    public func pruneWebhookDeliveries(finishedBefore cutoff: Date) async throws -> Int {
        try await transaction(durability: .bookkeeping) { db in
            try db.query(
                "DELETE FROM webhook_deliveries WHERE status <> 'pending' AND finished_at < ? RETURNING id", [.integer(Self.millis(cutoff))]
            ).count
        }
    }

    public func reportUnconfirmedStarts(startedBefore cutoff: Date, at now: Date) async throws -> Int {
        try await transaction { db in
            let rows = try db.query(
                """
                UPDATE instances SET unconfirmed_reported_at = ?
                WHERE state = 'starting' AND updated_at <= ? AND unconfirmed_reported_at IS NULL
                RETURNING app_id, activity_id, device_id, platform, updated_at
                """,
                [.integer(Self.millis(now)), .integer(Self.millis(cutoff))]
            )
            for row in rows {
                try Self.record(
                    NewEvent(
                        .instanceStartUnconfirmed, appID: try row.string("app_id"), activityID: try row.string("activity_id"),
                        deviceID: try row.string("device_id"),
                        data: ["platform": .string(try row.string("platform")), "startedAt": .string(APIDate.iso8601(try row.date("updated_at")))]
                    ),
                    at: now, on: db
                )
            }
            return rows.count
        }
    }
}
