import Foundation
import LivelineCore
import SQLiteNIO

/// A registration as a member of a set (``SetWrite``): on PostgreSQL, registrations queued together are written with
/// two statements for all of them (one read of their activities and instances; one write of the new activities, the
/// new instances with their catch-ups, and the events) instead of two round trips each. What they decide is
/// ``RegistrationSet``'s; the registrations it leaves out run ``SQLStore/registerInstance(_:at:)``'s own body after it.
struct RegistrationWrite: SetWrite {
    var registration: InstanceRegistration
    var now: Date

    static func runTogether(_ members: [RegistrationWrite], on db: any SQLConnection) throws -> [SetWriteOutcome<RegistrationResult>] {
        // The statements bind arrays, which only PostgreSQL has (SQLite's writer never runs sets).
        guard db.dialect == .postgres else { return members.map { _ in .alone } }
        let registrations = members.map(\.registration)
        // The activities' rows first, locked in key order (as each body locks its activity's row); then which devices
        // have instances already: one statement, one round trip. Both parts read the statement's one snapshot, taken
        // before any lock was waited for, so an instance another set inserted and committed meanwhile is not seen here:
        // the new instance's primary key keeps it (the insert fails this transaction, which runs again).
        let activityKeys = distinct(registrations.map { ActivityKey(appID: $0.appID, activityID: $0.activityID) })
        let found = try db.query(
            setRead,
            [PostgresArray.text(activityKeys.map(\.appID)), PostgresArray.text(activityKeys.map(\.activityID)),
             PostgresArray.text(registrations.map(\.appID)), PostgresArray.text(registrations.map(\.activityID)),
             PostgresArray.text(registrations.map(\.deviceID))]
        )
        var activities: [ActivityKey: RegistrationSet.FoundActivity] = [:]
        var existing = Set<RegistrationSet.InstanceKey>()
        for row in found {
            let appID = try row.string("app_id")
            let activityID = try row.string("activity_id")
            if let deviceID = row.column("device_id")?.string {
                existing.insert(RegistrationSet.InstanceKey(appID: appID, activityID: activityID, deviceID: deviceID))
            } else {
                activities[ActivityKey(appID: appID, activityID: activityID)] = RegistrationSet.FoundActivity(
                    state: ActivityState(rawValue: try row.string("state")) ?? .ended,
                    attributesType: row.column("attributes_type")?.string,
                    sequence: Int64(row.column("sequence")?.integer ?? 0),
                    channelID: row.column("channel_id")?.string
                )
            }
        }
        var set = RegistrationSet(
            members.map { RegistrationSet.Member(registration: $0.registration, nowMillis: SQLStore.millis($0.now)) },
            activities: activities, existing: existing
        )
        if !set.unchangedCandidates.isEmpty {
            // The devices registering again: their instances, read now that their activities' rows are locked and locked
            // themselves, as each body reads its own (a row another transaction changed since the statement above began is
            // read as it now is).
            let again = set.unchangedRegistrations
            let rows = try db.query(
                instancesReadLocking,
                [PostgresArray.text(again.map(\.appID)), PostgresArray.text(again.map(\.activityID)), PostgresArray.text(again.map(\.deviceID))]
            )
            var found: [RegistrationSet.InstanceKey: InstanceRecord] = [:]
            for row in rows {
                let instance = try SQLStore.instance(from: row)
                found[RegistrationSet.InstanceKey(appID: instance.appID, activityID: instance.activityID, deviceID: instance.deviceID)] = instance
            }
            set.answerUnchanged(found)
        }
        try write(set, on: db)
        return set.decisions
    }

    /// Instances by key (app ids, activity ids, device ids), as ``SQLStore/instanceReadLocking`` reads one: their
    /// columns with the delivered sequence the API shows, each row locked (`FOR UPDATE`), in key order.
    static let instancesReadLocking = """
        SELECT \(SQLStore.instanceColumns) FROM instances
        WHERE (app_id, activity_id, device_id) IN (
            SELECT k.app_id, k.activity_id, k.device_id
            FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, activity_id, device_id)
        )
        ORDER BY app_id, activity_id, device_id FOR UPDATE
        """

    /// The set's first read: its activities' rows (app ids, activity ids), in key order, locked as a single
    /// registration locks its activity's (`FOR NO KEY UPDATE`: the set may rewrite them to catch their new phones up,
    /// and a share lock to be upgraded later deadlocked with another registration's).
    static let activitiesRead = """
        SELECT a.app_id, a.activity_id, a.state, a.attributes_type, a.sequence, a.channel_id
        FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, activity_id)
        JOIN activities a ON a.app_id = k.app_id AND a.activity_id = k.activity_id
        ORDER BY a.app_id, a.activity_id FOR NO KEY UPDATE OF a
        """

    /// The set's second read: which of its devices (app ids, activity ids, device ids) have instances already.
    static let instancesRead = """
        SELECT i.app_id, i.activity_id, i.device_id
        FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, activity_id, device_id)
        JOIN instances i ON i.app_id = k.app_id AND i.activity_id = k.activity_id AND i.device_id = k.device_id
        """

    /// Both reads as one statement (``activitiesRead``'s values, then ``instancesRead``'s): a row with a `device_id`
    /// is an instance found, one without it an activity. The activities' part is materialized, so it locks its rows in
    /// its own order whatever the plan of the whole.
    static let setRead = """
        WITH found_activities AS MATERIALIZED (\(activitiesRead)),
        found_instances AS MATERIALIZED (\(instancesRead))
        SELECT app_id, activity_id, state, attributes_type, sequence, channel_id, CAST(NULL AS text) AS device_id
        FROM found_activities
        UNION ALL
        SELECT app_id, activity_id, NULL, NULL, NULL, NULL, device_id FROM found_instances
        """

    /// Sends the set's writes without waiting for their answers (a failure fails the transaction at its commit).
    private static func write(_ set: RegistrationSet, on db: any SQLConnection) throws {
        var statements: [(sql: String, binds: [SQLiteData])] = []
        if !set.newActivities.isEmpty {
            // Joined with the instances that refer to them: PostgreSQL checks an inserted instance's activity once the
            // whole statement has run (as its foreign key's trigger fires then), and finds the activity inserted by it.
            let new = set.newActivities
            statements.append((
                """
                INSERT INTO activities (app_id, activity_id, attributes_type, attributes, state, sequence, created_at, updated_at)
                SELECT a.app_id, a.activity_id, a.attributes_type, a.attributes, ?, 0, a.now, a.now
                FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]), CAST(? AS bigint[]))
                    AS a(app_id, activity_id, attributes_type, attributes, now)
                """,
                [.text(ActivityState.active.rawValue), PostgresArray.text(new.map(\.key.appID)),
                 PostgresArray.text(new.map(\.key.activityID)), PostgresArray.text(new.map(\.attributesType)),
                 PostgresArray.text(new.map { $0.attributes?.encodedString }), PostgresArray.integer(new.map(\.nowMillis))]
            ))
        }
        if !set.newInstances.isEmpty {
            let instances = set.newInstances
            statements.append((
                """
                INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, user_id, state, created_at, updated_at,
                    priority10_tally, channel_id, joined_pass)
                SELECT r.app_id, r.activity_id, r.device_id, r.platform, r.push_token, r.user_id, ?, r.now, r.now, r.tally, r.channel_id,
                    COALESCE((SELECT a.pass_counter FROM activities a WHERE a.app_id = r.app_id AND a.activity_id = r.activity_id), 0)
                FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]),
                    CAST(? AS text[]), CAST(? AS bigint[]), CAST(? AS bigint[]), CAST(? AS text[]))
                    AS r(app_id, activity_id, device_id, platform, push_token, user_id, now, tally, channel_id)
                """,
                [.text(InstanceState.active.rawValue), PostgresArray.text(instances.map(\.registration.appID)),
                 PostgresArray.text(instances.map(\.registration.activityID)), PostgresArray.text(instances.map(\.registration.deviceID)),
                 PostgresArray.text(instances.map(\.registration.platform.rawValue)),
                 PostgresArray.text(instances.map(\.registration.pushToken)), PostgresArray.text(instances.map(\.registration.userID)),
                 PostgresArray.integer(instances.map(\.nowMillis)),
                 PostgresArray.integer(instances.map { SQLStore.emptyPriority10Tally(for: $0.registration.platform, at: $0.nowMillis).integer }),
                 PostgresArray.text(instances.map(\.registration.channelID))]
            ))
            if !set.catchingUp.isEmpty {
                statements.append((
                    """
                    UPDATE activities SET dispatched_sequence = 0, next_dispatch_at = NULL
                    WHERE (app_id, activity_id) IN (
                        SELECT k.app_id, k.activity_id FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, activity_id)
                    ) AND sequence > 0
                    """,
                    [PostgresArray.text(set.catchingUp.map(\.appID)), PostgresArray.text(set.catchingUp.map(\.activityID))]
                ))
            }
            statements.append(eventsStatement(set.events))
        }
        // The new activities, the new instances, their activities' catch-ups (of activities that were there before)
        // and their events: rows of their own, none read by another, in one statement.
        if !statements.isEmpty { try db.executeTogether(statements) }
    }
}

/// An update as a member of a set (``SetWrite``): on PostgreSQL, updates queued together (without an `Idempotency-Key`)
/// are written with three statements for all of them (their activities' heads under a lock, the activities' rows, the
/// events) instead of two each. What they decide is ``UpdateSet``'s; the updates it leaves out run their own body
/// after it.
struct UpdateWrite: SetWrite {
    var update: ActivityUpdate
    var now: Date

    static func runTogether(
        _ members: [UpdateWrite], on db: any SQLConnection
    ) throws -> [SetWriteOutcome<IdempotentOutcome<AcceptedSequence>>] {
        guard db.dialect == .postgres else { return members.map { _ in .alone } }
        let keys = distinct(members.map { ActivityKey(appID: $0.update.appID, activityID: $0.update.activityID) })
        // The heads under an exclusive lock, in key order, as each body locks its activity's row.
        let rows = try db.query(headsRead, [PostgresArray.text(keys.map(\.appID)), PostgresArray.text(keys.map(\.activityID))])
        var heads: [ActivityKey: ActivityHead] = [:]
        for row in rows {
            heads[ActivityKey(appID: try row.string("app_id"), activityID: try row.string("activity_id"))] = ActivityHead(
                state: ActivityState(rawValue: try row.string("state")) ?? .ended,
                sequence: Int64(row.column("sequence")?.integer ?? 0),
                timestamp: row.column("timestamp_seconds")?.integer.map(Int64.init),
                contentState: nil, staleDate: nil, relevanceScore: nil
            )
        }
        let set = UpdateSet(members.map { UpdateSet.Member(update: $0.update, now: $0.now) }, heads: heads)
        // The columns of ``SQLStore/updatedActivityValues(_:next:nowMillis:)``, in its order, with their array types.
        let columns = [
            ("sequence", "bigint"), ("event", "text"), ("sequence_at", "bigint"), ("timestamp_seconds", "bigint"),
            ("content_state", "text"), ("alert", "text"), ("stale_date", "bigint"), ("relevance_score", "float8"),
            ("priority", "bigint"), ("updated_at", "bigint"), ("content_shape", "text"), ("min_update_interval", "float8"),
        ]
        let unnest = "unnest(CAST(? AS text[]), CAST(? AS text[]), "
            + columns.map { "CAST(? AS \($0.1)[])" }.joined(separator: ", ")
            + ") AS v(app_id, activity_id, " + columns.map(\.0).joined(separator: ", ") + ")"
        func binds(_ rows: [UpdateSet.Row]) -> [SQLiteData] {
            [PostgresArray.text(rows.map(\.key.appID)), PostgresArray.text(rows.map(\.key.activityID))]
                + columns.indices.map { column in PostgresArray.values(rows.map { $0.values[column] }) }
        }
        var statements: [(sql: String, binds: [SQLiteData])] = []
        if !set.changed.isEmpty {
            statements.append((
                """
                UPDATE activities AS a SET sequence = v.sequence, event = v.event, sequence_at = v.sequence_at,
                    timestamp_seconds = v.timestamp_seconds, content_state = v.content_state, alert = v.alert,
                    stale_date = v.stale_date, relevance_score = v.relevance_score, priority = v.priority, updated_at = v.updated_at,
                    content_shape = COALESCE(v.content_shape, a.content_shape),
                    min_update_interval = COALESCE(v.min_update_interval, a.min_update_interval),
                    next_dispatch_at = \(SQLStore.dispatchTime(interval: "COALESCE(v.min_update_interval, a.min_update_interval)", lastSentAt: "a.last_sent_at"))
                FROM \(unnest)
                WHERE a.app_id = v.app_id AND a.activity_id = v.activity_id
                """,
                binds(set.changed)
            ))
        }
        if !set.created.isEmpty {
            // Written as delivered, as ``SQLStore/acceptUpdate(_:at:on:)`` writes an activity it creates: nobody can watch
            // an activity before its row exists.
            statements.append((
                """
                INSERT INTO activities (app_id, activity_id, state, created_at, \(columns.map(\.0).joined(separator: ", ")),
                    dispatched_sequence)
                SELECT v.app_id, v.activity_id, ?, v.updated_at, \(columns.map { "v." + $0.0 }.joined(separator: ", ")), v.sequence
                FROM \(unnest)
                """,
                [.text(ActivityState.active.rawValue)] + binds(set.created)
            ))
        }
        if !set.events.isEmpty { statements.append(eventsStatement(set.events)) }
        // The activities' rows (each its own, locked or new) and the events: none read by another.
        try db.executeTogether(statements)
        return set.decisions.map { $0.map { .performed($0) } }
    }
}

extension UpdateWrite {
    /// The set's read: its activities' heads (app ids, activity ids) under an exclusive lock, in key order.
    static let headsRead = """
        SELECT a.app_id, a.activity_id, a.state, a.sequence, a.timestamp_seconds
        FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, activity_id)
        JOIN activities a ON a.app_id = k.app_id AND a.activity_id = k.activity_id
        ORDER BY a.app_id, a.activity_id FOR UPDATE OF a
        """
}

/// `keys` without repeats, each where it first came.
private func distinct(_ keys: [ActivityKey]) -> [ActivityKey] {
    var seen = Set<ActivityKey>()
    return keys.filter { seen.insert($0).inserted }
}

/// The statement that records `events`, each at its time, in order, as one multi-row insert (PostgreSQL).
private func eventsStatement(_ events: [(event: NewEvent, nowMillis: Int)]) -> (sql: String, binds: [SQLiteData]) {
    (
        """
        INSERT INTO events (app_id, type, activity_id, device_id, data, created_at)
        SELECT e.app_id, e.type, e.activity_id, e.device_id, e.data, e.created_at
        FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[]),
            CAST(? AS bigint[])) AS e(app_id, type, activity_id, device_id, data, created_at)
        """,
        [PostgresArray.text(events.map(\.event.appID)), PostgresArray.text(events.map(\.event.type.rawValue)),
         PostgresArray.text(events.map(\.event.activityID)), PostgresArray.text(events.map(\.event.deviceID)),
         PostgresArray.text(events.map(\.event.data.encodedString)), PostgresArray.integer(events.map(\.nowMillis))]
    )
}

/// PostgreSQL array values, bound as text in the array's input syntax (`{"a","b",NULL}`) and cast where they are used
/// (`CAST(? AS text[])`): one placeholder for any number of rows, so the statement's text, and its prepared form, stay
/// the same whatever the count.
enum PostgresArray {
    /// A `text[]`: each element quoted, its backslashes and double quotes escaped; nil is `NULL`.
    static func text(_ values: [String?]) -> SQLiteData {
        var literal = Literal(capacity: values.reduce(2) { $0 + ($1?.utf8.count ?? 4) + 3 })
        for value in values {
            if let value { literal.append(quoting: value) } else { literal.append(unquoted: "NULL") }
        }
        return literal.finished
    }

    /// An array of a column's values as the Store binds them (text, integer, float or null; no set writes a blob), for a
    /// cast to the column's array type.
    static func values(_ values: [SQLiteData]) -> SQLiteData {
        var literal = Literal(capacity: 64)
        for value in values {
            switch value {
            case .text(let text): literal.append(quoting: text)
            case .integer(let integer): literal.append(unquoted: String(integer))
            case .float(let double): literal.append(unquoted: "\(double)")
            case .null: literal.append(unquoted: "NULL")
            case .blob: preconditionFailure("a set binds no blob column")
            }
        }
        return literal.finished
    }

    /// An array literal built as UTF-8 bytes: the sets bind one per column, of every row's value, for each write.
    private struct Literal {
        private var bytes: [UInt8] = [UInt8(ascii: "{")]
        private var empty = true

        init(capacity: Int) {
            bytes.reserveCapacity(capacity)
        }

        mutating func append(unquoted element: String) {
            separate()
            bytes.append(contentsOf: element.utf8)
        }

        /// `element` in double quotes, its backslashes and double quotes escaped.
        mutating func append(quoting element: String) {
            separate()
            bytes.append(UInt8(ascii: "\""))
            for byte in element.utf8 {
                if byte == UInt8(ascii: "\\") || byte == UInt8(ascii: "\"") { bytes.append(UInt8(ascii: "\\")) }
                bytes.append(byte)
            }
            bytes.append(UInt8(ascii: "\""))
        }

        private mutating func separate() {
            if !empty { bytes.append(UInt8(ascii: ",")) }
            empty = false
        }

        var finished: SQLiteData {
            var closed = bytes
            closed.append(UInt8(ascii: "}"))
            return .text(String(decoding: closed, as: UTF8.self))
        }
    }

    /// A `bigint[]`; nil is `NULL`.
    static func integer(_ values: [Int?]) -> SQLiteData {
        var literal = Literal(capacity: 2 + values.count * 14)
        for value in values { literal.append(unquoted: value.map(String.init) ?? "NULL") }
        return literal.finished
    }
}
