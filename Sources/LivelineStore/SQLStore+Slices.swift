import Foundation
import LivelineCore
import SQLiteNIO

/// Shared fan-outs: the holder of an activity's claim cuts its pending instances into slices by device id
/// (`fanout_slices`), and any engine of any node claims a slice, sends it and records its outcome, while the holder
/// waits for them all before it releases the activity. Slices are leased like activities: a node that dies holding one
/// has it taken over once its lease ran out.
///
/// Every write here changes only rows it names, or locks first (`FOR UPDATE SKIP LOCKED`, the activity's row), so on
/// PostgreSQL they run at `READ COMMITTED` (``WriteIsolation/lockingRows``): serializable, the engines' claims,
/// renewals and outcomes on the one small table failed one another (its reads are scans, whose predicate locks cover
/// the whole table), and a renewal retried long enough let its slice's lease run out.
extension SQLStore {
    public func planSlices(
        appID: String, activityID: String, owner: String, below sequence: Int64, platforms: [Platform], size: Int, now: Date,
        consultingMarks: Bool
    ) async throws -> Int {
        guard !platforms.isEmpty, size > 0 else { return 0 }
        // The instances still to send, as both the read below and the planning's walk select them: with the marks only
        // when the claim found marks of the sequence (on PostgreSQL, seeking them for every instance made each walk of
        // 100,000 half a second of its time). The claim says so: a look of their own here, planned at every call on
        // PostgreSQL, was 72 µs of its planning for every activity claimed (`pg_stat_statements`, 20,000 activities).
        let key: [SQLiteData] = [.text(appID), .text(activityID)]
        func pending(_ select: String) -> (sql: String, binds: [SQLiteData]) {
            Self.pendingInstancesWhere(
                select, appID: appID, activityID: activityID, below: sequence, platforms: platforms, after: nil, through: nil,
                consultingMarks: consultingMarks
            )
        }
        let beyond = pending("SELECT i.device_id")
        let walk = pending("SELECT i.device_id, ROW_NUMBER() OVER (ORDER BY i.device_id) AS n, COUNT(*) OVER () AS total")
        // Most activities have no more instances to send than one slice holds, and no slices left by an engine before:
        // one read says so, and no transaction is taken (on PostgreSQL, four statements fewer for each pass). Only the
        // claim's holder plans slices, so none can appear between this read and the transaction.
        let worthPlanning = try await readKeepingPlan(
            """
            SELECT 1 AS found FROM fanout_slices WHERE app_id = ? AND activity_id = ?
            UNION ALL
            SELECT 1 AS found FROM (\(beyond.sql) LIMIT 1 OFFSET \(size)) AS beyond_one_slice
            LIMIT 1
            """,
            key + beyond.binds
        )
        if worthPlanning.isEmpty { return 0 }
        // At READ COMMITTED behind the activity's row lock: planning is the claim holder's alone, and reads the
        // instances as progress writes change them beside it.
        return try await transaction(isolation: .lockingRows) { db in
            let held = try db.query(
                "SELECT 1 FROM activities WHERE app_id = ? AND activity_id = ? AND claim_owner = ?\(db.rowLock("FOR UPDATE"))",
                [.text(appID), .text(activityID), .text(owner)]
            )
            guard !held.isEmpty else { return 0 }
            let existing = try db.query(
                "SELECT COUNT(*) AS n FROM fanout_slices WHERE app_id = ? AND activity_id = ?", [.text(appID), .text(activityID)]
            ).first?.column("n")?.integer ?? 0
            if existing > 0 { return existing }
            // Every `size`-th pending device id ends a slice (in one walk of the primary key's order); the last slice
            // runs to the end, so one never ends on the very last instance (it would leave an empty one).
            let bounds = try db.query(
                """
                SELECT device_id FROM (
                    \(walk.sql)
                ) AS pending
                WHERE n % \(size) = 0 AND n < total ORDER BY device_id
                """,
                walk.binds
            ).map { try $0.string("device_id") }
            guard !bounds.isEmpty else { return 0 }
            for index in 0...bounds.count {
                try db.execute(
                    """
                    INSERT INTO fanout_slices (app_id, activity_id, slice, after_device, through_device, created_at)
                    VALUES (?, ?, ?, ?, ?, ?)
                    """,
                    [
                        .text(appID), .text(activityID), .integer(index), index == 0 ? .null : .text(bounds[index - 1]),
                        index < bounds.count ? .text(bounds[index]) : .null, .integer(Self.millis(now)),
                    ]
                )
            }
            return bounds.count + 1
        }
    }

    public func claimSlice(owner: String, now: Date, lease: TimeInterval, of activity: ActivityKey?) async throws -> SliceClaim? {
        let nowMillis = Self.millis(now)
        var binds: [SQLiteData] = [.text(owner), .integer(nowMillis + Int(lease * 1000)), .integer(nowMillis)]
        var scope = ""
        if let activity {
            scope = " AND app_id = ? AND activity_id = ?"
            binds += [.text(activity.appID), .text(activity.activityID)]
        }
        // As the activities' claim: several nodes claim at once on PostgreSQL, so the subquery skips the rows another
        // node's claim has locked.
        guard let row = try await transaction(isolation: .lockingRows, { [scope, binds] db in
            try db.query(
                """
                UPDATE fanout_slices SET claim_owner = ?, claim_expires_at = ?
                WHERE (app_id, activity_id, slice) = (
                    SELECT app_id, activity_id, slice FROM fanout_slices
                    WHERE outcome IS NULL AND (claim_expires_at IS NULL OR claim_expires_at < ?)\(scope)
                    ORDER BY created_at, slice LIMIT 1\(db.rowLock("FOR UPDATE SKIP LOCKED"))
                )
                RETURNING app_id, activity_id, slice, after_device, through_device
                """,
                binds
            ).first
        }) else { return nil }
        let slice = try Self.slice(from: row)
        let marked = Self.sliceMarked(slice)
        guard let activityRow = try await reader.query(
            "SELECT \(Self.claimColumns), \(marked.sql) AS slice_marked FROM activities WHERE app_id = ? AND activity_id = ?",
            marked.binds + [.text(slice.appID), .text(slice.activityID)]
        ).first else {
            // The activity is gone (and its slices with it).
            return nil
        }
        var claim = try Self.claim(from: activityRow, owner: owner)
        // The slice's pages and counts seek marks only when a mark of the sequence reaches into its range: the slices
        // sent before it marked ranges of their own, and reading without the marks skips two seeks an instance.
        claim.sequenceMarked = (activityRow.column("slice_marked")?.integer ?? 1) != 0
        return SliceClaim(slice: slice, claim: claim)
    }

    /// Whether a mark of the activity's sequence reaches into `slice`'s range of device ids, as SQL over a row of
    /// `activities`, with its binds: a mark reaches in when its range ends after the slice's `after` (any, for the
    /// first slice) and starts at or before its `through` (any, for the last).
    static func sliceMarked(_ slice: FanOutSlice) -> (sql: String, binds: [SQLiteData]) {
        var range = ""
        var binds: [SQLiteData] = []
        if let after = slice.after {
            range += " AND m.through_device > ?"
            binds.append(.text(after))
        }
        if let through = slice.through {
            range += " AND m.from_device <= ?"
            binds.append(.text(through))
        }
        return (
            """
            EXISTS (
                SELECT 1 FROM delivery_marks m WHERE m.app_id = activities.app_id AND m.activity_id = activities.activity_id
                  AND m.platform IN ('ios', 'android') AND m.sequence = activities.sequence\(range)
            )
            """,
            binds
        )
    }

    public func renewSlice(_ slice: FanOutSlice, owner: String, now: Date, lease: TimeInterval) async throws -> Bool {
        try await !write(
            """
            UPDATE fanout_slices SET claim_expires_at = ?
            WHERE app_id = ? AND activity_id = ? AND slice = ? AND claim_owner = ? AND outcome IS NULL
            RETURNING slice
            """,
            [.integer(Self.millis(now) + Int(lease * 1000)), .text(slice.appID), .text(slice.activityID), .integer(slice.index), .text(owner)],
            isolation: .lockingRows
        ).isEmpty
    }

    public func heldSlice(_ slice: FanOutSlice, owner: String, now: Date) async throws -> DispatchClaim? {
        guard let row = try await reader.query(
            """
            SELECT \(Self.claimColumns) FROM activities
            WHERE app_id = ? AND activity_id = ? AND EXISTS (
                SELECT 1 FROM fanout_slices s WHERE s.app_id = activities.app_id AND s.activity_id = activities.activity_id
                  AND s.slice = ? AND s.claim_owner = ? AND s.claim_expires_at > ? AND s.outcome IS NULL
            )
            """,
            [.text(slice.appID), .text(slice.activityID), .integer(slice.index), .text(owner), .integer(Self.millis(now))]
        ).first else { return nil }
        return try Self.claim(from: row, owner: owner)
    }

    public func finishSlice(_ slice: FanOutSlice, owner: String, outcome: SliceOutcome?, completed: Int64?) async throws {
        // Only a sent slice says it was completed: one handed back is sent again, whatever its pass did.
        let completed = outcome == nil ? nil : completed
        _ = try await write(
            """
            UPDATE fanout_slices SET outcome = ?, completed_sequence = ?, claim_owner = NULL, claim_expires_at = NULL
            WHERE app_id = ? AND activity_id = ? AND slice = ? AND claim_owner = ? AND outcome IS NULL
            """,
            [
                outcome.map { .text($0.rawValue) } ?? .null, completed.map { .integer(Int($0)) } ?? .null, .text(slice.appID),
                .text(slice.activityID), .integer(slice.index), .text(owner),
            ],
            isolation: .lockingRows
        )
    }

    public func slicesCompleted(appID: String, activityID: String) async throws -> Int64? {
        guard
            let row = try await reader.query(
                """
                SELECT COUNT(*) AS slices, COUNT(completed_sequence) AS completed, MIN(completed_sequence) AS sequence
                FROM fanout_slices WHERE app_id = ? AND activity_id = ?
                """,
                [.text(appID), .text(activityID)]
            ).first,
            let slices = row.column("slices")?.integer, slices > 0, row.column("completed")?.integer == slices,
            let sequence = row.column("sequence")?.integer
        else { return nil }
        return Int64(sequence)
    }

    public func sliceOutcomes(appID: String, activityID: String) async throws -> [SliceOutcome?] {
        try await reader.query(
            "SELECT outcome FROM fanout_slices WHERE app_id = ? AND activity_id = ? ORDER BY slice", [.text(appID), .text(activityID)]
        ).map { row in
            guard let text = row.column("outcome")?.string else { return nil }
            guard let outcome = SliceOutcome(rawValue: text) else { throw CorruptRow(column: "outcome") }
            return outcome
        }
    }

    public func dropSlices(appID: String, activityID: String, owner: String) async throws {
        _ = try await write(
            """
            DELETE FROM fanout_slices WHERE app_id = ? AND activity_id = ? AND EXISTS (
                SELECT 1 FROM activities WHERE app_id = ? AND activity_id = ? AND claim_owner = ?
            )
            """,
            [.text(appID), .text(activityID), .text(appID), .text(activityID), .text(owner)], isolation: .lockingRows
        )
    }

    private static func slice(from row: StoreRow) throws -> FanOutSlice {
        guard let index = row.column("slice")?.integer else { throw CorruptRow(column: "slice") }
        return FanOutSlice(
            appID: try row.string("app_id"), activityID: try row.string("activity_id"), index: index,
            after: row.column("after_device")?.string, through: row.column("through_device")?.string
        )
    }
}
