import Foundation
import LivelineCore
import SQLiteNIO

/// Remote starts: a start is accepted with one activity row and one audience row, whatever the audience's size; the
/// delivery engine later admits the audience's devices as `starting` instances, a page at a time.
extension SQLStore {
    /// Devices at most admitted by one statement: ten bound values each, well under SQLite's limit.
    private static let admissionChunk = 500

    public func startActivity(_ start: ActivityStart, at now: Date) async throws -> AcceptedStart {
        // Counted on a reader, before the write: an audience of every device is a long read, and the one writer (every
        // accept waits for it) should not hold it. The counts say whom the start reaches as it is accepted.
        let counts = try await audienceCounts(start)
        return try await transaction { db in try Self.startActivity(start, counts: counts, at: now, on: db) }
    }

    public func startActivity(
        _ start: ActivityStart, at now: Date, idempotency: IdempotencyClaim<AcceptedStart>?
    ) async throws -> IdempotentOutcome<AcceptedStart> {
        let counts = try await audienceCounts(start)
        return try await transaction { db in
            try Self.idempotently(idempotency, appID: start.appID, at: now, on: db) {
                try Self.startActivity(start, counts: counts, at: now, on: db)
            }
        }
    }

    /// Accepts `start` on the writer, inside its transaction.
    static func startActivity(_ start: ActivityStart, counts: AudienceCounts, at now: Date, on db: any SQLConnection) throws -> AcceptedStart {
        let existing = try db.query(
            "SELECT state, sequence, timestamp_seconds, attributes_type FROM activities WHERE app_id = ? AND activity_id = ?",
            [.text(start.appID), .text(start.activityID)]
        ).first
        let head = try existing.map { row in
            ActivityHead(
                state: ActivityState(rawValue: try row.string("state")) ?? .ended, sequence: Int64(row.column("sequence")?.integer ?? 0),
                timestamp: row.column("timestamp_seconds")?.integer.map(Int64.init), contentState: nil, staleDate: nil,
                relevanceScore: nil
            )
        }
        // An attributes type the backend gave (with a start, before any update) binds its later starts. One that only
        // phones' registrations gave (any holder of the publishable key may register first, under a guessed activity
        // id) is replaced by the backend's start below.
        if let type = existing?.column("attributes_type")?.string, type != start.attributesType {
            if head?.state == .ended { throw StoreError.activityEnded }
            if (head?.sequence ?? 0) > 0 { throw StoreError.attributesTypeMismatch(existing: type) }
        }
        // The state the phones get: a start to the devices admitted, an update (without the start's alert) to those
        // already watching.
        let next: LiveActivityState
        do throws(NextStateRefusal) {
            next = try LiveActivityState.update(
                activityID: start.activityID, after: head, contentState: start.contentState, staleDate: start.staleDate,
                relevanceScore: start.relevanceScore, alert: nil, now: now
            )
        } catch {
            throw Self.storeError(error)
        }
        let nowMillis = Self.millis(now)
        if head != nil {
            try db.query(
                """
                UPDATE activities SET sequence = ?, event = ?, sequence_at = ?, timestamp_seconds = ?, content_state = ?, alert = NULL,
                    stale_date = ?, relevance_score = ?, priority = NULL, updated_at = ?, content_shape = COALESCE(?, content_shape),
                    attributes_type = ?, attributes = ?, start_alert = ?, next_dispatch_at = NULL
                WHERE app_id = ? AND activity_id = ?
                """,
                [.integer(Int(next.sequence)), .text(next.event.rawValue), .integer(nowMillis), .integer(Int(next.timestamp)),
                 Self.json(next.contentState), Self.integer(next.staleDate), Self.real(next.relevanceScore), .integer(nowMillis),
                 Self.shape(start.contentShape), .text(start.attributesType), Self.json(start.attributes), Self.json(start.alert.json),
                 .text(start.appID), .text(start.activityID)]
            )
        } else {
            try db.query(
                """
                INSERT INTO activities (app_id, activity_id, attributes_type, attributes, state, sequence, event, sequence_at,
                    timestamp_seconds, content_state, stale_date, relevance_score, created_at, updated_at, content_shape, start_alert)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """,
                [.text(start.appID), .text(start.activityID), .text(start.attributesType), Self.json(start.attributes),
                 .text(ActivityState.active.rawValue), .integer(Int(next.sequence)), .text(next.event.rawValue), .integer(nowMillis),
                 .integer(Int(next.timestamp)), Self.json(next.contentState), Self.integer(next.staleDate),
                 Self.real(next.relevanceScore), .integer(nowMillis), .integer(nowMillis), Self.shape(start.contentShape),
                 Self.json(start.alert.json)]
            )
        }
        try db.query(
            """
            INSERT INTO start_audiences (app_id, activity_id, sequence, attributes_type, audience, created_at)
            VALUES (?, ?, ?, ?, ?, ?)
            """,
            [.text(start.appID), .text(start.activityID), .integer(Int(next.sequence)), .text(start.attributesType),
             Self.json(start.audience.json), .integer(nowMillis)]
        )
        try record(
            NewEvent(
                (head?.sequence ?? 0) == 0 ? .activityStarted : .activityUpdated, appID: start.appID, activityID: start.activityID,
                data: [
                    "sequence": .integer(next.sequence), "via": "start", "attributesType": .string(start.attributesType),
                    "audience": start.audience.json,
                    "counts": ["ios": .integer(Int64(counts.ios)), "android": .integer(Int64(counts.android)), "skipped": .integer(Int64(counts.skipped))],
                ]
            ),
            at: now, on: db
        )
        return AcceptedStart(
            sequence: AcceptedSequence(activityID: start.activityID, sequence: next.sequence, event: .start, acceptedAt: Self.date(nowMillis)),
            counts: counts
        )
    }

    /// The devices of an audience, as a condition on `devices d` with its bound values.
    static func audienceCondition(_ audience: StartAudience) -> (sql: String, binds: [SQLiteData]) {
        switch audience {
        case .deviceIDs(let ids):
            ("d.device_id IN (SELECT value FROM json_each(?))", [.text(JSONValue.array(ids.map(JSONValue.string)).encodedString)])
        case .userIDs(let ids):
            ("d.user_id IN (SELECT value FROM json_each(?))", [.text(JSONValue.array(ids.map(JSONValue.string)).encodedString)])
        case .tags(let tags):
            {
                var binds: [SQLiteData] = []
                let conditions = tagConditions(
                    ArraySlice(tags.sorted { $0.key < $1.key }.map { DeviceTag(key: $0.key, value: $0.value) }), binds: &binds
                )
                return ("1 = 1" + conditions, binds)
            }()
        case .all:
            ("1 = 1", [])
        }
    }

    /// The audience's devices with the token a start would go to (`start_token`: the push-to-start token for the
    /// attributes type on iOS, the FCM token on Android; NULL when there is none or it was refused) and their instance of
    /// the activity, if any. The caller appends the rest of the WHERE clause and binds `attributes type, activity id, app id`.
    private static let audienceRows = """
        SELECT d.device_id, d.platform, d.user_id, d.os_version,
            CASE WHEN d.platform = 'ios' THEN p.token WHEN d.fcm_token_dropped_at IS NULL THEN d.fcm_token END AS start_token,
            i.state AS instance_state
        FROM devices d
        LEFT JOIN push_to_start_tokens p
            ON p.app_id = d.app_id AND p.device_id = d.device_id AND p.attributes_type = ? AND p.dropped_at IS NULL
        LEFT JOIN instances i ON i.app_id = d.app_id AND i.activity_id = ? AND i.device_id = d.device_id
        WHERE d.app_id = ?
        """

    /// Whether a device of the audience is reached: it is already watching, or it has a token for the start and no
    /// instance that keeps it out (dismissed or ended on the phone; a refused token's instance is started afresh).
    private static let reached = """
        (instance_state IN ('active', 'starting') OR (start_token IS NOT NULL AND (instance_state IS NULL OR instance_state = 'invalidated')))
        """

    func audienceCounts(_ start: ActivityStart) async throws -> AudienceCounts {
        let condition = Self.audienceCondition(start.audience)
        let row = try await reader.query(
            """
            SELECT COUNT(*) AS matched,
                COALESCE(SUM(CASE WHEN \(Self.reached) AND platform = 'ios' THEN 1 ELSE 0 END), 0) AS ios,
                COALESCE(SUM(CASE WHEN \(Self.reached) AND platform = 'android' THEN 1 ELSE 0 END), 0) AS android
            FROM (\(Self.audienceRows) AND \(condition.sql)) AS audience
            """,
            [.text(start.attributesType), .text(start.activityID), .text(start.appID)] + condition.binds
        ).first
        let ios = row?.column("ios")?.integer ?? 0
        let android = row?.column("android")?.integer ?? 0
        var asked = row?.column("matched")?.integer ?? 0
        // Device ids asked for that are not devices of the app are skipped too.
        if case .deviceIDs(let ids) = start.audience { asked = Set(ids).count }
        return AudienceCounts(ios: ios, android: android, skipped: max(0, asked - ios - android))
    }

    public func admitStartAudience(appID: String, activityID: String, limit: Int, at now: Date) async throws -> Bool {
        try await transaction(durability: .bookkeeping) { db in
            // Admission is bookkeeping: lost in a crash, the same page is admitted again (an instance already there stays).
            let activity = try db.query(
                "SELECT state, channel_id, channel_status, pass_counter FROM activities WHERE app_id = ? AND activity_id = ?",
                [.text(appID), .text(activityID)]
            ).first
            // Admitted by the holder of the activity's claim, after the claim raised the counter: the instances join
            // the pass that sends them, whose marks do not speak for them (their starts are written in their rows).
            let joinedPass = activity?.column("pass_counter")?.integer ?? 0
            if activity?.column("state")?.string == ActivityState.ended.rawValue {
                // An ended activity starts nowhere.
                _ = try db.query(
                    "UPDATE start_audiences SET admitted = 1 WHERE app_id = ? AND activity_id = ? AND admitted = 0",
                    [.text(appID), .text(activityID)]
                )
                return false
            }
            let audiences = try db.query(
                """
                SELECT sequence, attributes_type, audience, admitted_after FROM start_audiences
                WHERE app_id = ? AND activity_id = ? AND admitted = 0 ORDER BY sequence LIMIT 2
                """,
                [.text(appID), .text(activityID)]
            )
            guard let row = audiences.first else { return false }
            let sequence = row.column("sequence")?.integer ?? 0
            let attributesType = try row.string("attributes_type")
            guard let audience = try row.json("audience").flatMap(StartAudience.init(json:)) else {
                throw CorruptRow(column: "audience")
            }
            let after = row.column("admitted_after")?.string
            let condition = Self.audienceCondition(audience)
            let devices = try db.query(
                "\(Self.audienceRows) AND \(condition.sql)\(after == nil ? "" : " AND d.device_id > ?") ORDER BY d.device_id LIMIT \(limit)",
                [.text(attributesType), .text(activityID), .text(appID)] + condition.binds + (after.map { [.text($0)] } ?? [])
            )
            let nowMillis = Self.millis(now)
            // A broadcast activity's iPhones on iOS 18 or later are started into its channel (`input-push-channel`).
            let channelID = activity?.column("channel_status")?.string == ChannelStatus.active.rawValue
                ? activity?.column("channel_id")?.string : nil
            var admitted: [(deviceID: String, platform: String, userID: String?, token: String, channelID: String?)] = []
            for device in devices {
                guard let token = device.column("start_token")?.string else { continue }
                let state = device.column("instance_state")?.string
                guard state == nil || state == InstanceState.invalidated.rawValue else { continue }
                let platform = try device.string("platform")
                let subscribes = platform == Platform.ios.rawValue
                    && BroadcastSupport.supportsChannels(osVersion: device.column("os_version")?.string)
                admitted.append(
                    (try device.string("device_id"), platform, device.column("user_id")?.string, token, subscribes ? channelID : nil)
                )
            }
            for chunk in admitted.chunked(into: Self.admissionChunk) {
                var binds: [SQLiteData] = []
                binds.reserveCapacity(chunk.count * 12)
                for device in chunk {
                    binds += [
                        .text(appID), .text(activityID), .text(device.deviceID), .text(device.platform), .text(device.token),
                        Self.text(device.userID), .text(InstanceState.starting.rawValue), .integer(nowMillis), .integer(nowMillis),
                        Self.emptyPriority10Tally(for: Platform(rawValue: device.platform), at: nowMillis),
                        Self.text(device.channelID), .integer(joinedPass),
                    ]
                }
                _ = try db.query(
                    """
                    INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, user_id, state, created_at, updated_at,
                        priority10_tally, channel_id, joined_pass)
                    VALUES \(Array(repeating: "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", count: chunk.count).joined(separator: ","))
                    ON CONFLICT (app_id, activity_id, device_id) DO UPDATE SET
                        state = excluded.state, push_token = excluded.push_token, delivered_sequence = 0, updated_at = excluded.updated_at,
                        channel_id = excluded.channel_id, joined_pass = excluded.joined_pass
                    WHERE instances.state = 'invalidated'
                    """,
                    binds
                )
            }
            let finished = devices.count < limit
            _ = try db.query(
                "UPDATE start_audiences SET admitted_after = ?, admitted = ? WHERE app_id = ? AND activity_id = ? AND sequence = ?",
                [Self.text(try devices.last.map { try $0.string("device_id") } ?? after), .integer(finished ? 1 : 0),
                 .text(appID), .text(activityID), .integer(sequence)]
            )
            if !admitted.isEmpty {
                // The activity may have been fanned out already (a start on an activity that is being updated): the
                // newcomers are behind it.
                try Self.markPending(appID: appID, activityID: activityID, in: db)
            }
            return !finished || audiences.count > 1
        }
    }

    public func unconfirmedStarts(appID: String, activityID: String, startedBefore cutoff: Date, limit: Int) async throws -> UnconfirmedStarts {
        let binds: [SQLiteData] = [.text(appID), .text(activityID), .integer(Self.millis(cutoff))]
        let count = try await reader.query(
            "SELECT COUNT(*) AS n FROM instances WHERE app_id = ? AND activity_id = ? AND state = 'starting' AND updated_at <= ?", binds
        ).first?.column("n")?.integer ?? 0
        guard count > 0 else { return UnconfirmedStarts(count: 0, instances: []) }
        let rows = try await reader.query(
            """
            SELECT \(Self.instanceColumns) FROM instances
            WHERE app_id = ? AND activity_id = ? AND state = 'starting' AND updated_at <= ?
            ORDER BY updated_at, device_id LIMIT \(limit)
            """,
            binds
        )
        return UnconfirmedStarts(count: count, instances: try Self.instances(from: rows))
    }
}
