import Foundation
import LivelineCore
import SQLiteNIO

/// The delivery timeline, stored in segments: each recorded batch of attempts is one row of `delivery_segments`, its
/// attempts a JSON array, oldest first. A fan-out records thousands of attempts a second; one row per batch instead of
/// one per attempt keeps that cheap for the one writer. Reading and pruning unpack the segments.
///
/// An attempt's id is its segment's id times ``attemptsPerSegment`` plus its place in the segment: ids rise with time
/// and stay put when pruning trims a segment (its `first_index` then rises).
extension SQLStore {
    /// The most attempts one segment holds.
    static let attemptsPerSegment = 4096
    /// Segments read at a time when paging the timeline.
    static let segmentsPerRead = 4

    /// The statements that append `attempts` (of one activity) to the timeline, while the activity exists: a pass still
    /// sending when its app was deleted leaves no segment behind (the table has no foreign key to the activity, which
    /// would fail the pass's whole progress write instead).
    static func timelineStatements(appID: String, activityID: String, attempts: [DeliveryRecord]) -> [(sql: String, binds: [SQLiteData])] {
        attempts.chunked(into: attemptsPerSegment).map { chunk in
            var json: [UInt8] = []
            json.reserveCapacity(chunk.count * 120)
            json.append(UInt8(ascii: "["))
            for (index, attempt) in chunk.enumerated() {
                if index > 0 { json.append(UInt8(ascii: ",")) }
                append(attempt, to: &json)
            }
            json.append(UInt8(ascii: "]"))
            let newest = chunk.map(\.attemptedAt).max() ?? Date(timeIntervalSince1970: 0)
            return (
                """
                INSERT INTO delivery_segments (app_id, activity_id, first_index, attempt_count, newest_attempt_at, attempts)
                SELECT ?, ?, 0, ?, ?, ? WHERE EXISTS (SELECT 1 FROM activities WHERE app_id = ? AND activity_id = ?)
                """,
                [.text(appID), .text(activityID), .integer(chunk.count), .integer(millis(newest)), .text(String(decoding: json, as: UTF8.self)),
                 .text(appID), .text(activityID)]
            )
        }
    }

    /// One attempt as a JSON array: device, platform, sequence, event, priority, status, provider id, reason, latency,
    /// attempt number, when (milliseconds since 1970), and a broadcast's channel id (only for a broadcast).
    private static func append(_ attempt: DeliveryRecord, to json: inout [UInt8]) {
        func string(_ value: String?) {
            if let value { JSONValue.appendString(value, to: &json) } else { json.append(contentsOf: "null".utf8) }
        }
        func integer(_ value: some BinaryInteger) { JSONValue.appendInteger(value, to: &json) }
        func comma() { json.append(UInt8(ascii: ",")) }
        json.append(UInt8(ascii: "["))
        string(attempt.deviceID); comma()
        string(attempt.platform.rawValue); comma()
        integer(attempt.sequence); comma()
        string(attempt.event.rawValue); comma()
        integer(attempt.priority); comma()
        string(attempt.status.rawValue); comma()
        string(attempt.providerID); comma()
        string(attempt.reason); comma()
        (attempt.latencyMilliseconds.map(JSONValue.number) ?? .null).append(to: &json); comma()
        integer(attempt.attempt); comma()
        integer(millis(attempt.attemptedAt))
        if let channelID = attempt.channelID {
            comma()
            string(channelID)
        }
        json.append(UInt8(ascii: "]"))
    }

    /// The attempts of one segment row, oldest first, with their ids.
    private static func attempts(from row: StoreRow, appID: String, activityID: String) throws -> [DeliveryRecord] {
        let segment = Int64(row.column("id")?.integer ?? 0)
        let firstIndex = Int64(row.column("first_index")?.integer ?? 0)
        guard let values = try row.json("attempts")?.arrayValue else { throw CorruptRow(column: "attempts") }
        return try values.enumerated().map { offset, value in
            guard let fields = value.arrayValue, fields.count == 11 || fields.count == 12 else { throw CorruptRow(column: "attempts") }
            func string(_ index: Int) -> String? {
                if case .string(let text) = fields[index] { return text }
                return nil
            }
            func integer(_ index: Int) -> Int64? {
                switch fields[index] {
                case .integer(let value): value
                case .number(let value): Int64(exactly: value)
                default: nil
                }
            }
            let latency: Double? =
                switch fields[8] {
                case .number(let value): value
                case .integer(let value): Double(value)
                default: nil
                }
            guard let deviceID = string(0), let sequence = integer(2), let event = string(3), let status = string(5),
                let attemptedAt = integer(10)
            else { throw CorruptRow(column: "attempts") }
            return DeliveryRecord(
                id: segment * Int64(attemptsPerSegment) + firstIndex + Int64(offset), appID: appID, activityID: activityID,
                deviceID: deviceID, platform: string(1).flatMap(Platform.init(rawValue:)) ?? .ios, sequence: sequence,
                event: LiveActivityEvent(rawValue: event), priority: integer(4).map { Int($0) } ?? 10,
                status: DeliveryStatus(rawValue: status) ?? .rejected, providerID: string(6), reason: string(7),
                latencyMilliseconds: latency, attempt: integer(9).map { Int($0) } ?? 1, attemptedAt: date(Int(attemptedAt)),
                channelID: fields.count == 12 ? string(11) : nil
            )
        }
    }

    public func deliveries(appID: String, activityID: String, cursor: String?, limit: Int) async throws -> Page<DeliveryRecord> {
        var before: Int64?
        if let cursor {
            guard let id = Int64(try Self.decodeCursor(cursor)) else { throw StoreError.invalidCursor }
            before = id
        }
        // Newest first: segments from the cursor's down, a few at a time (each may hold thousands of attempts), each
        // read newest attempt first, until a page and one more.
        var items: [DeliveryRecord] = []
        var segmentBelow = before.map { $0 / Int64(Self.attemptsPerSegment) + 1 } ?? Int64.max
        while items.count <= limit {
            let rows = try await reader.query(
                """
                SELECT id, first_index, attempts FROM delivery_segments WHERE app_id = ? AND activity_id = ? AND id < ?
                ORDER BY id DESC LIMIT \(Self.segmentsPerRead)
                """,
                [.text(appID), .text(activityID), .integer(Int(segmentBelow))]
            )
            for row in rows {
                for attempt in try Self.attempts(from: row, appID: appID, activityID: activityID).reversed()
                where before.map({ attempt.id < $0 }) ?? true {
                    items.append(attempt)
                }
                if items.count > limit { break }
            }
            guard rows.count == Self.segmentsPerRead, let last = rows.last?.column("id")?.integer else { break }
            segmentBelow = Int64(last)
        }
        let page = Array(items.prefix(limit))
        let next = items.count > limit ? page.last.map { Self.encodeCursor(String($0.id)) } : nil
        return Page(items: page, nextCursor: next)
    }

    /// Prunes a little at a time: each write deletes at most ``segmentsPerPruneWrite`` segments, so accepted writes,
    /// which share SQLite's one writer with it, never wait behind it for long. (A 100,000-instance fan-out records 400
    /// segments; after ten of them, pruning in one write held the writer for 0.7 s, and accepts waited as long.)
    public func pruneDeliveries(olderThan: Date, keepPerActivity: Int) async throws {
        // Segments are appended as they are recorded, so ids follow time: every segment before the first with a
        // recent attempt goes (found by walking from the oldest, which stops there).
        let oldestKept = try await reader.query(
            """
            SELECT COALESCE(
                (SELECT id FROM delivery_segments WHERE newest_attempt_at >= ? ORDER BY id LIMIT 1),
                (SELECT COALESCE(MAX(id), 0) + 1 FROM delivery_segments)
            ) AS id
            """,
            [.integer(Self.millis(olderThan))]
        ).first?.column("id")?.integer ?? 0
        try await deleteSegments(below: oldestKept, of: nil)

        let crowded = try await reader.query(
            "SELECT app_id, activity_id FROM delivery_segments GROUP BY app_id, activity_id HAVING SUM(attempt_count) > ?",
            [.integer(keepPerActivity)]
        )
        for row in crowded {
            try await pruneDeliveries(appID: try row.string("app_id"), activityID: try row.string("activity_id"), keepNewest: keepPerActivity)
        }
    }

    public func pruneDeliveryMarks(sentBefore cutoff: Date) async throws {
        try await writer.write(durability: .bookkeeping, isolation: .lockingRows, under: Self.engineSettings) { db in
            try db.execute(
                """
                DELETE FROM delivery_marks WHERE sent_at < ? AND sequence <= (
                    SELECT a.settled_sequence FROM activities a
                    WHERE a.app_id = delivery_marks.app_id AND a.activity_id = delivery_marks.activity_id
                )
                """,
                [.integer(Int(cutoff.timeIntervalSince1970))]
            )
        }
    }

    public func pruneDeliveries(appID: String, activityID: String, keepNewest keepPerActivity: Int) async throws {
        let activity = ActivityKey(appID: appID, activityID: activityID)
        // Newest first: keep whole segments while they fit, trim the one that crosses the limit; the older ones go.
        let firstKept: Int? = try await transaction(durability: .bookkeeping) { db in
            let segments = try db.query(
                "SELECT id, attempt_count FROM delivery_segments WHERE app_id = ? AND activity_id = ? ORDER BY id DESC",
                [.text(activity.appID), .text(activity.activityID)]
            )
            var kept = 0
            for segment in segments {
                guard let id = segment.column("id")?.integer, let count = segment.column("attempt_count")?.integer else {
                    throw CorruptRow(column: "attempt_count")
                }
                if kept + count <= keepPerActivity {
                    kept += count
                    continue
                }
                let room = keepPerActivity - kept
                guard room > 0 else { return id + 1 }
                try Self.trim(segment: id, keepingNewest: room, of: count, in: db)
                return id
            }
            return nil
        }
        if let firstKept { try await deleteSegments(below: firstKept, of: activity) }
    }

    /// Segments deleted per write when pruning.
    static let segmentsPerPruneWrite = 64

    /// Deletes the segments below `id` (of `activity` only, if given), oldest first, ``segmentsPerPruneWrite`` a write.
    private func deleteSegments(below id: Int, of activity: ActivityKey?) async throws {
        let scope = activity == nil ? "" : "app_id = ? AND activity_id = ? AND "
        let binds: [SQLiteData] = (activity.map { [.text($0.appID), .text($0.activityID)] } ?? []) + [.integer(id)]
        while true {
            let deleted = try await transaction(durability: .bookkeeping) { db in
                try db.query(
                    """
                    DELETE FROM delivery_segments WHERE id IN (
                        SELECT id FROM delivery_segments WHERE \(scope)id < ? ORDER BY id LIMIT \(Self.segmentsPerPruneWrite)
                    ) RETURNING id
                    """,
                    binds
                ).count
            }
            if deleted < Self.segmentsPerPruneWrite { return }
        }
    }

    /// Drops the oldest attempts of a segment, keeping its newest `keep` of `count`.
    private static func trim(segment id: Int, keepingNewest keep: Int, of count: Int, in db: any SQLConnection) throws {
        guard let row = try db.query("SELECT attempts FROM delivery_segments WHERE id = ?", [.integer(id)]).first,
            let attempts = try row.json("attempts")?.arrayValue
        else { throw CorruptRow(column: "attempts") }
        let newest = JSONValue.array(Array(attempts.suffix(keep)))
        _ = try db.query(
            "UPDATE delivery_segments SET first_index = first_index + ?, attempt_count = ?, attempts = ? WHERE id = ?",
            [.integer(count - keep), .integer(keep), .text(newest.encodedString), .integer(id)]
        )
    }
}
