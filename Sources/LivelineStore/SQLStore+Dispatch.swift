import Foundation
import LivelineCore
import NIOCore
import SQLiteNIO

extension SQLStore {
    /// A claim's columns, read from a row of `activities`: the activity's own and its app's. The app's come from
    /// subqueries rather than a join, so the same list serves a SELECT and the RETURNING clause of an UPDATE.
    static let claimColumns = """
        *, (SELECT bundle_id FROM apps WHERE apps.id = activities.app_id) AS app_bundle_id,
        (SELECT budget_hourly FROM apps WHERE apps.id = activities.app_id) AS app_budget_hourly,
        (SELECT budget_hourly_frequent FROM apps WHERE apps.id = activities.app_id) AS app_budget_hourly_frequent,
        EXISTS (
            SELECT 1 FROM start_audiences s WHERE s.app_id = activities.app_id AND s.activity_id = activities.activity_id AND s.admitted = 0
        ) AS audience_waiting,
        EXISTS (
            SELECT 1 FROM delivery_marks m WHERE m.app_id = activities.app_id AND m.activity_id = activities.activity_id AND m.priority = 10
        ) AS priority10_marked,
        (EXISTS (
            SELECT 1 FROM delivery_marks m WHERE m.app_id = activities.app_id AND m.activity_id = activities.activity_id
              AND m.platform = 'ios' AND m.sequence = activities.sequence
        ) OR EXISTS (
            SELECT 1 FROM delivery_marks m WHERE m.app_id = activities.app_id AND m.activity_id = activities.activity_id
              AND m.platform = 'android' AND m.sequence = activities.sequence
        )) AS sequence_marked,
        EXISTS (
            SELECT 1 FROM fanout_slices f WHERE f.app_id = activities.app_id AND f.activity_id = activities.activity_id
        ) AS slices_left,
        \(CredentialProvider.allCases.map(credentialsVersionColumns).joined(separator: ",\n"))
        """

    /// The columns of ``claimColumns`` that say which of the app's credentials for `provider` are stored
    /// (``DispatchClaim/credentials``): `<provider>_credentials_at` and `<provider>_credentials_healthy`, null when
    /// none are. For activities of one phone each, the engine's read of them at every pass was one statement of the
    /// nine or so an activity cost it on PostgreSQL, a round trip each.
    private static func credentialsVersionColumns(_ provider: CredentialProvider) -> String {
        let row = "FROM app_credentials c WHERE c.app_id = activities.app_id AND c.provider = '\(provider.rawValue)'"
        return """
            (SELECT c.updated_at \(row)) AS \(provider.rawValue)_credentials_at,
            (SELECT c.healthy \(row)) AS \(provider.rawValue)_credentials_healthy
            """
    }

    /// The app's stored credentials as a claim's row says (``credentialsVersionColumns(_:)``).
    static func credentialsVersions(from row: StoreRow) -> [CredentialProvider: CredentialsVersion] {
        var versions: [CredentialProvider: CredentialsVersion] = [:]
        for provider in CredentialProvider.allCases {
            guard let millis = row.column("\(provider.rawValue)_credentials_at")?.integer else { continue }
            let healthy = row.column("\(provider.rawValue)_credentials_healthy")?.integer ?? 1
            versions[provider] = CredentialsVersion(updatedAt: date(millis), healthy: healthy != 0)
        }
        return versions
    }

    // The engine's claims, renewals and releases are single statements (``write(_:_:)``), each its own transaction:
    // one trip to the writer's thread instead of four, so they hold the one writer, and every accept behind it, for
    // as short a time as SQLite works.

    /// How many pending activities one claim looks at, at most: those with nothing behind are all marked done at once.
    static let claimLooksAt = 64

    /// The claim's look when the first activity due has nothing behind (after ``pickHeadStatement``): the pending
    /// activities due first, oldest change first (``claimLooksAt`` at most). It walks
    /// the index `activities_due` from its start and stops after the last row it takes: it never sorts the pending
    /// activities. On PostgreSQL, where several nodes claim at once, it locks the rows it returns and skips the rows
    /// another node's claim (or a write of the API's) has locked (`FOR UPDATE SKIP LOCKED`) rather than wait for them
    /// and collide. Binds: now, twice.
    static let pickStatement = pick(limit: claimLooksAt)

    /// The claim's first step: the first two activities due (``pickStatement``'s first two), locked the same way. The
    /// first is the claim's when it has something behind (``leaseIfBehindStatement(_:platforms:)``), and the second says
    /// whether more are due.
    static let pickHeadStatement = pick(limit: 2)

    /// The pending activities due first, `limit` at most (see ``pickStatement``): their `columns`. Binds: now, twice.
    private static func pick(limit: Int, columns: String = "app_id, activity_id") -> String {
        """
        SELECT \(columns) FROM activities
        WHERE dispatched_sequence < sequence AND COALESCE(next_dispatch_at, 0) <= ?
          AND content_state IS NOT NULL AND (claim_expires_at IS NULL OR claim_expires_at < ?)
        ORDER BY COALESCE(next_dispatch_at, 0), updated_at
        LIMIT \(limit)
        """
    }

    /// The claim's step after ``pickStatement``, on the activities picked (and locked): those with nothing behind for
    /// the engine's platforms (``somethingBehind(app:activity:platforms:keyBinds:)``) are marked done, as
    /// ``releaseClaim(appID:activityID:owner:platforms:retryAt:)`` marks an activity after a pass that found nothing to
    /// send, and leased to nobody; it returns their keys. An activity nobody watches costs the engine a part of this
    /// one write instead of a claim, the reads of a pass and a release.
    ///
    /// The keys go in a list whose length is a power of two (the last key repeated to fill it), so that the statement
    /// has few texts, each prepared once on PostgreSQL. Binds: the returned ones.
    static func settleStatement(_ keys: [ActivityKey], platforms: [Platform]) -> (sql: String, binds: [SQLiteData]) {
        var filled = keys
        while filled.count & (filled.count - 1) != 0 { filled.append(keys[keys.count - 1]) }
        let behind = somethingBehind(app: "activities.app_id", activity: "activities.activity_id", platforms: platforms, keyBinds: [])
        let sql = """
            UPDATE activities SET dispatched_sequence = activities.sequence, next_dispatch_at = NULL, claim_owner = NULL,
                claim_expires_at = NULL
            FROM (VALUES \(Array(repeating: "(?, ?)", count: filled.count).joined(separator: ", "))) AS v
            WHERE activities.app_id = v.column1 AND activities.activity_id = v.column2 AND NOT \(behind.sql)
            RETURNING activities.app_id, activities.activity_id
            """
        return (sql, filled.flatMap { [SQLiteData.text($0.appID), .text($0.activityID)] } + behind.binds)
    }

    /// The claim's last step: the first activity picked that was not marked done, leased to its owner. Binds: the owner,
    /// the lease's end twice (``leaseSetting``), the activity's app and id.
    static let leaseStatement = """
        UPDATE activities SET \(leaseSetting), pass_counter = pass_counter + 1 WHERE app_id = ? AND activity_id = ?
        RETURNING \(claimColumns)
        """

    /// A lease's columns: its owner, its end, and the activity's dispatch time moved to that end (binds: the owner, the
    /// end, the end again). A leased activity is then due where a dead holder's lease runs out, which is when another
    /// claim may take it; until then it stays out of the part of `activities_due` the claims walk (``pickStatement``
    /// reads only what is due by now). It kept its dispatch time before, and every claim walked past every leased
    /// activity at the head of the index: with 128 workers on SQLite, claims took 17.6 % of the server's samples
    /// through a burst of activities of one phone each. The releases (``releaseClaim(appID:activityID:owner:platforms:retryAt:claimedSequence:sendStart:verified:)``,
    /// ``deferClaim(appID:activityID:owner:sequence:until:)``, ``releaseAllClaims()``) set it anew.
    static let leaseSetting = "claim_owner = ?, \(leaseEndSetting)"

    /// A lease's end and the activity's dispatch time moved with it (binds: the end, twice): ``leaseSetting``'s, and a
    /// renewal's (``renewClaim(appID:activityID:owner:now:lease:)``).
    static let leaseEndSetting = "claim_expires_at = ?, next_dispatch_at = ?"

    /// The claim's common case on PostgreSQL, in one statement sent alone at `READ COMMITTED`
    /// (``WriteIsolation/lockingStatement``): the first two activities due picked and locked as ``pickHeadStatement``
    /// does, and the first leased to its owner as ``leaseIfBehindStatement(_:platforms:)`` leases it, when it has
    /// something behind. Its row says what was picked (`picked_app_id`, `picked_activity_id`; no row: nothing is due),
    /// whether another activity is due (`more_due`) and, when the first was leased, the claim's columns
    /// (``claimColumns``; null otherwise). It costs one round trip where the claim's transaction costs four (`BEGIN`,
    /// the pick, the lease, `COMMIT`: PostgreSQL's client sends a statement only once the one before is answered).
    ///
    /// What is behind is read on the statement's snapshot, taken before the pick's lock: an instance registered and
    /// committed in between is not seen. So only a lease is taken on its word (the pass reads the instances afresh);
    /// an activity picked with nothing behind goes to the claim's transaction, whose statements each read afresh.
    ///
    /// The picked activity is named to the lease's subqueries as the pick's values (`(SELECT app_id FROM picked)`),
    /// not as the row being updated: a subquery that names the row is correlated, and PostgreSQL may run a correlated
    /// `EXISTS` as one hashed read of all its table's rows. The plan is kept for the connection's life
    /// (``engineSettings``), and one made while the tables were nearly empty read every instance for every claim in
    /// four runs of fourteen (ten times PostgreSQL's time). Named by values, each is a lookup by key, as in
    /// ``leaseIfBehindStatement(_:platforms:)`` (`PostgresPlanTests`). Binds: now twice, the owner and the lease's end
    /// twice (``leaseSetting``), the returned ones.
    static func leaseFirstDueStatement(platforms: [Platform]) -> (sql: String, binds: [SQLiteData]) {
        let app = "(SELECT app_id FROM picked)"
        let activity = "(SELECT activity_id FROM picked)"
        let behind = somethingBehind(app: app, activity: activity, platforms: platforms, keyBinds: [])
        // ``pickHeadStatement``'s, with the columns of its order, by which the first of its two is picked.
        let head = pick(limit: 2, columns: "app_id, activity_id, COALESCE(next_dispatch_at, 0) AS due, updated_at")
        return (
            """
            WITH head AS MATERIALIZED (
                \(head) FOR UPDATE SKIP LOCKED
            ), picked AS MATERIALIZED (
                SELECT app_id, activity_id FROM head ORDER BY due, updated_at LIMIT 1
            ), leased AS (
                UPDATE activities SET \(leaseSetting), pass_counter = pass_counter + 1
                WHERE app_id = \(app) AND activity_id = \(activity) AND \(behind.sql)
                RETURNING \(claimColumns)
            )
            SELECT picked.app_id AS picked_app_id, picked.activity_id AS picked_activity_id,
                (SELECT COUNT(*) FROM head) > 1 AS more_due, leased.*
            FROM picked LEFT JOIN leased ON true
            """,
            behind.binds
        )
    }

    /// The claim's step after ``pickHeadStatement``: the activity due first leased to its owner if it has something
    /// behind for the engine's platforms (``somethingBehind(app:activity:platforms:keyBinds:)``), and nothing written
    /// otherwise. Binds: the owner and the lease's end twice (``leaseSetting``), then the returned ones.
    static func leaseIfBehindStatement(_ key: ActivityKey, platforms: [Platform]) -> (sql: String, binds: [SQLiteData]) {
        let behind = somethingBehind(app: "?", activity: "?", platforms: platforms, keyBinds: [.text(key.appID), .text(key.activityID)])
        return (
            """
            UPDATE activities SET \(leaseSetting), pass_counter = pass_counter + 1
            WHERE app_id = ? AND activity_id = ? AND \(behind.sql)
            RETURNING \(claimColumns)
            """,
            [.text(key.appID), .text(key.activityID)] + behind.binds
        )
    }

    /// Whether anything on one activity is behind its sequence for an engine sending to `platforms`, as an SQL boolean:
    /// a deliverable instance on one of them, a start audience not yet admitted, (with iOS among them) a broadcast not
    /// yet published on its active channel, or a shared fan-out's slices, which only the holder of the activity's claim
    /// drops once every one is sent. `app` and `activity` are SQL expressions naming the activity (columns, or `?` each,
    /// bound by `keyBinds`: the app's value, then the activity's).
    static func somethingBehind(app: String, activity: String, platforms: [Platform], keyBinds: [SQLiteData]) -> (sql: String, binds: [SQLiteData]) {
        let placeholders = Array(repeating: "?", count: max(platforms.count, 1)).joined(separator: ",")
        let platformBinds: [SQLiteData] = platforms.isEmpty ? [.text("")] : platforms.map { .text($0.rawValue) }
        // The instances' search seeks marks for each instance only when the activity has marks of its sequence (looked up
        // once): without, it is the search by rows alone it was before marks (on PostgreSQL, seeking an empty table's
        // index four times an instance cost a release about half a second of PostgreSQL's time for 100,000 instances).
        let marked = """
            EXISTS (
                SELECT 1 FROM delivery_marks mk JOIN activities ma ON ma.app_id = mk.app_id AND ma.activity_id = mk.activity_id
                WHERE ma.app_id = \(app) AND ma.activity_id = \(activity) AND mk.platform IN ('ios', 'android') AND mk.sequence = ma.sequence
            )
            """
        func instancesBehind(consultingMarks: Bool) -> String {
            """
            EXISTS (
                SELECT 1 FROM instances i JOIN activities a ON a.app_id = i.app_id AND a.activity_id = i.activity_id
                WHERE i.app_id = \(app) AND i.activity_id = \(activity) AND \(deliverable("i."))
                  AND \(waitsFor("i.", sequence: "a.sequence", settledSequence: "a.settled_sequence", settledPass: "a.settled_pass", consultingMarks: consultingMarks))
                  AND i.platform IN (\(placeholders))
            )
            """
        }
        let sql = """
            (((\(marked)) AND \(instancesBehind(consultingMarks: true))) OR (NOT (\(marked)) AND \(instancesBehind(consultingMarks: false)))
            OR EXISTS (
                SELECT 1 FROM start_audiences s WHERE s.app_id = \(app) AND s.activity_id = \(activity) AND s.admitted = 0
            ) OR EXISTS (
                SELECT 1 FROM activities b WHERE b.app_id = \(app) AND b.activity_id = \(activity) AND b.channel_status = 'active'
                  AND b.broadcast_sequence < b.sequence AND 'ios' IN (\(placeholders))
            ) OR EXISTS (
                SELECT 1 FROM fanout_slices f WHERE f.app_id = \(app) AND f.activity_id = \(activity)
            ))
            """
        return (
            sql,
            keyBinds + keyBinds + platformBinds + keyBinds + keyBinds + platformBinds + keyBinds + keyBinds + platformBinds + keyBinds
        )
    }

    /// The instances the engine sends to, as SQL on a row of `instances` (columns prefixed with `prefix`): active ones,
    /// and remotely started ones not yet confirmed — an Android phone at its FCM token, an iPhone only until its start
    /// went out (its push-to-start token takes nothing but a start; it is caught up once it registers its own token).
    ///
    /// An instance subscribed to the activity's broadcast channel takes its broadcasts instead (its start, when it was
    /// started remotely, still goes to its push-to-start token).
    static func deliverable(_ prefix: String) -> String {
        "((\(prefix)state = 'active' AND \(prefix)channel_id IS NULL)"
            + " OR (\(prefix)state = 'starting' AND (\(prefix)platform = 'android' OR \(prefix)delivered_sequence = 0)))"
    }

    static let deliverableInstance = deliverable("")

    /// Whether the instance row of `prefix` still waits for `sequence` (an SQL expression), as SQL: its row's delivered
    /// sequence is below it, the activity's settled sequence does not speak for it (`settledSequence` and `settledPass`
    /// are SQL expressions for the activity's), and no mark of `sequence` does (``markedFor(_:sequence:)``).
    static func waitsFor(
        _ prefix: String, sequence: String, settledSequence: String, settledPass: String, consultingMarks: Bool = true
    ) -> String {
        """
        \(prefix)delivered_sequence < \(sequence) AND NOT (\(prefix)joined_pass < \(settledPass) AND \(settledSequence) >= \(sequence))
        """ + (consultingMarks ? " AND NOT \(markedFor(prefix, sequence: sequence))" : "")
    }

    /// Whether a mark of `sequence` (an SQL expression) speaks for the instance row of `prefix`, as SQL: two seeks, each
    /// reading one mark of that sequence and platform written by a pass after the instance joined: in the marks' key, the
    /// first whose range ends at or after the device (it speaks when its range starts at or before it), and in
    /// `delivery_marks_by_start`, the last whose range starts at or before the device (it speaks when its range ends at or
    /// after it). The marks of one pass never overlap, so either finds the one that covers the device; after an
    /// interrupted pass, a later pass's mark may overlap or hold an earlier one, which one of the two then finds. Only a
    /// device under several overlapping marks may be read as waiting when one of them covers it: sent again, never left
    /// out.
    ///
    /// Each seek is an ordered read of one row, which each database can only answer well from its own index: the first
    /// compares the start through `COALESCE`, so that SQLite does not walk `delivery_marks_by_start` over every mark
    /// before the device (it did, each page reading every mark the pass had written: rounds four times slower, and
    /// slower each round). They were once a seek for the nearest end or start and then a lookup of the marks there by
    /// equality, which PostgreSQL, whose statistics never know the sequence a pass is writing, answered from
    /// `delivery_marks_by_start` whatever the end: every mark of the sequence read for each instance (11.6 s to count
    /// 100,000 instances against 2,700 marks, 0.74 s now; the rounds' pages took 100 ms each).
    static func markedFor(_ prefix: String, sequence: String) -> String {
        let scope = """
            WHERE m.app_id = \(prefix)app_id AND m.activity_id = \(prefix)activity_id AND m.platform = \(prefix)platform AND m.sequence = \(sequence)
              AND m.pass > \(prefix)joined_pass
            """
        return """
            (COALESCE((
                SELECT COALESCE(m.from_device, '') <= \(prefix)device_id FROM delivery_marks m \(scope)
                  AND m.through_device >= \(prefix)device_id ORDER BY m.through_device LIMIT 1
            ), FALSE) OR COALESCE((
                SELECT m.through_device >= \(prefix)device_id FROM delivery_marks m \(scope)
                  AND m.from_device <= \(prefix)device_id ORDER BY m.from_device DESC LIMIT 1
            ), FALSE))
            """
    }

    /// The delivered sequence of the instance row of `prefix` as the API shows it, as SQL: for an instance the engine
    /// sends to (``deliverable(_:)``), the highest of its row's, the activity's settled sequence when it speaks for the
    /// instance, and the marks that do; for any other (ended, refused, a channel's subscriber), its row's: a change of
    /// state writes what it had into the row (``materializedDelivered(_:)``), and neither the marks nor the settled
    /// sequence speak for an instance the engine did not send to.
    static func effectiveDelivered(_ prefix: String) -> String {
        "CASE WHEN \(deliverable(prefix)) THEN \(materializedDelivered(prefix)) ELSE \(prefix)delivered_sequence END"
    }

    /// The highest of the row's delivered sequence, the activity's settled one when it speaks for the instance, and the
    /// marks that do, as SQL: what a write that changes the instance's state, or the pass it joined in, stores in its
    /// `delivered_sequence` first.
    ///
    /// Only the marks of sequences above the higher of the other two are read: the marks of priority-10 pushes stay for
    /// the budgets' hour after their activity settled past them, and the search for the highest covering mark read the
    /// newest sequence's marks from its end until one covered the device. Over the database `bench fanout --instances
    /// 100000 --rounds 3` left (170 marks a sequence), computing it for every instance took 0.88 s in `sqlite3`, and 0.13 s
    /// now; with 900 marks a sequence (shorter runs), 36 µs an instance against 1.8. The end of an activity writes it
    /// into each instance's row.
    static func materializedDelivered(_ prefix: String) -> String {
        let settled = """
            COALESCE((SELECT s.settled_sequence FROM activities s WHERE s.app_id = \(prefix)app_id AND s.activity_id = \(prefix)activity_id
                AND \(prefix)joined_pass < s.settled_pass), 0)
            """
        return """
            MAX(\(prefix)delivered_sequence, \(settled),
                COALESCE((SELECT MAX(m.sequence) FROM delivery_marks m WHERE m.app_id = \(prefix)app_id AND m.activity_id = \(prefix)activity_id
                    AND m.platform = \(prefix)platform AND m.sequence > MAX(\(prefix)delivered_sequence, \(settled))
                    AND m.from_device <= \(prefix)device_id AND m.through_device >= \(prefix)device_id
                    AND m.pass > \(prefix)joined_pass), 0))
            """
    }

    /// How the engine's claims and releases commit. They are bookkeeping: one lost to a power cut is done again (an
    /// activity marked done is pending again and is marked done again; a lease that is lost is taken again). On
    /// PostgreSQL each is a transaction of its own, and a full commit waits for a WAL flush of its own: one for every
    /// claim, which bounded how fast the engine went through many small activities. On SQLite they stay full: they
    /// share the writer's one commit with the writes queued beside them, whereas bookkeeping writes wait until no full
    /// write is queued, and would leave the engine waiting through a burst of updates.
    var engineDurability: Durability { dialect == .postgres ? .bookkeeping : .full }

    public func claimPendingActivity(owner: String, now: Date, lease: TimeInterval, platforms: [Platform]) async throws -> PendingActivityClaim? {
        let nowMillis = Self.millis(now)
        let leaseEnd = SQLiteData.integer(nowMillis + Int(lease * 1000))
        let leaseBinds: [SQLiteData] = [.text(owner), leaseEnd, leaseEnd]
        if dialect == .postgres {
            // The common case in one statement: the activity due first, leased when it has something behind.
            let first = Self.leaseFirstDueStatement(platforms: platforms)
            let nowBinds: [SQLiteData] = [.integer(nowMillis), .integer(nowMillis)]
            let row = try await writer.write(durability: engineDurability, isolation: .lockingStatement, under: Self.engineSettings) { db in
                try db.query(first.sql, nowBinds + leaseBinds + first.binds).first
            }
            guard let row else { return nil }
            if row.column("claim_owner")?.string != nil {
                return PendingActivityClaim(
                    claim: try Self.claim(from: row, owner: owner), settled: [], leftPending: (row.column("more_due")?.integer ?? 1) != 0
                )
            }
            // Picked with nothing behind on the statement's snapshot: the transaction below looks again.
        }
        // READ COMMITTED, the picked rows locked first: a write that could put something behind on an activity (an
        // update, a registration, a start: each locks the activity's row first) either committed before the lock, and
        // the next statement, which reads afresh, sees it; or it waits for this claim's commit and then makes the
        // activity pending again. One statement could not do both: its reads would not see what committed after it
        // began. Serializable, claims failed one another by the thousand on the index pages they read.
        let found: (settled: [ActivityKey], leased: StoreRow?, leftPending: Bool)? = try await writer.write(
            durability: engineDurability, isolation: .lockingRows, under: Self.engineSettings
        ) { db in
            // Every step here looks rows up by key, and PostgreSQL plans each from statistics that mislead it:
            // - they lag behind a burst of updates. Believing a few dozen activities pending when thousands were, the
            //   pick read them all and sorted them for each claim (10 ms a claim, the engine at 300 claims a second for
            //   20 s after a burst of 10,000 updates). Without sorts, walking the index is its only plan.
            // - they say nothing of one activity's instances but on the whole. When one activity has them all (a
            //   100,000-instance fan-out), the settle's search for an instance behind, one per activity looked at, read
            //   every instance of the table for each activity that had none: 0.5 – 2.5 s a claim, every update behind
            //   it waiting. Without sequential scans it takes the primary key.
            // With those two off, each step has one plan whatever its values, so PostgreSQL keeps it
            // (`PostgresHandle.keptPlans`) rather than plan it at every claim: over 3,000 updates from 4 connections,
            // planning the settles took 1.9 s (1.2 ms each: up to 64 activities, four subqueries) and running them 0.4 s.
            // Left to choose (`cachedPlans`), it still planned them at most claims: 0.55 s over 10,000 updates.
            // (``engineSettings``, set before the body.)
            func pick(_ statement: String) throws -> [ActivityKey] {
                try db.query(statement + db.rowLock("FOR UPDATE SKIP LOCKED"), [.integer(nowMillis), .integer(nowMillis)]).map {
                    ActivityKey(appID: try $0.string("app_id"), activityID: try $0.string("activity_id"))
                }
            }
            // The activity due first alone, leased when it has something to send. During a burst of updates to
            // activities a phone each watches, every one due has, and the claim takes one: asking it of the 64 it looks
            // at below, again at every claim, cost 1 ms a claim on PostgreSQL (4,955 claims, 5.2 s of 11.5).
            let head = try pick(Self.pickHeadStatement)
            guard let first = head.first else { return nil }
            let leaseFirst = Self.leaseIfBehindStatement(first, platforms: platforms)
            if let leased = try db.query(leaseFirst.sql, leaseBinds + leaseFirst.binds).first {
                return ([], leased, head.count > 1)
            }
            // Nothing behind the first: most likely a run of activities nobody watches, marked done together.
            let picked = try pick(Self.pickStatement)
            guard !picked.isEmpty else { return nil }
            let settle = Self.settleStatement(picked, platforms: platforms)
            let settled = Set(try db.query(settle.sql, settle.binds).map {
                ActivityKey(appID: try $0.string("app_id"), activityID: try $0.string("activity_id"))
            })
            // Fewer than a claim looks at: it saw every activity due (but those other claims hold). As many: more may
            // be due beyond them.
            let lookedAtAll = picked.count < Self.claimLooksAt
            // The first in order with something behind is this claim's; the others stay pending for the next ones.
            guard let first = picked.first(where: { !settled.contains($0) }) else { return (picked, nil, !lookedAtAll) }
            let leased = try db.query(Self.leaseStatement, leaseBinds + [.text(first.appID), .text(first.activityID)]).first
            return (picked.filter(settled.contains), leased, !lookedAtAll || picked.count - settled.count > 1)
        }
        guard let found else { return nil }
        return PendingActivityClaim(
            claim: try found.leased.map { try Self.claim(from: $0, owner: owner) }, settled: found.settled, leftPending: found.leftPending
        )
    }

    public func nextClaimable() async throws -> ClaimableTimes {
        let row = try await reader.read(under: Self.dueSettings, in: .delivery) { try $0.query(Self.dueStatement, [], settings: Self.dueSettings) }.first
        return ClaimableTimes(next: row?.column("due")?.integer.map(Self.date), slice: row?.column("slice_due")?.integer.map(Self.date))
    }

    /// The planner settings of the delivery engine's writes on PostgreSQL: its claims
    /// (``claimPendingActivity(owner:now:lease:platforms:)``), its progress (``progressStatements(_:at:)``) and its
    /// releases. Each of their statements reads and writes rows by key, and with no sorts, sequential scans, hash joins
    /// or merge joins each has one plan, the walk of its keys, whatever its values: so each keeps the plan it made first
    /// (``PostgresHandle/keptPlans``), where planning it at every call cost more than running it (see each). One list
    /// for them all, so that the writers' pool keeps connections opened with it for them (``PostgresPool``'s
    /// bookkeeping connections), where their transactions send no settings.
    static let engineSettings: [(name: String, value: String)] = [
        ("enable_sort", "off"), ("enable_seqscan", "off"), ("enable_hashjoin", "off"), ("enable_mergejoin", "off"),
        PostgresHandle.keptPlans,
    ]

    /// The planner settings ``dueStatement`` runs under on PostgreSQL. The readers' pool keeps a connection opened with
    /// them for the engine (``ReadLane/delivery``, with ``keyedReadSettings``, which hold them), where the read is its
    /// statement alone: the engine's workers ask after every wake-up, 447 times in a `bench api` of 20,000 registrations
    /// and 10,000 updates, and each asked in a transaction of its own was four statements, four round trips.
    ///
    /// No sorts either: the first unleased pending activity is then read in the order of `activities_due`, one row.
    /// With one `MIN` PostgreSQL read it so by itself (its plan for `MIN` over a union asks each part for its rows in
    /// order); with two (`due`, `slice_due`), the plan it made on empty tables read every pending activity and sorted them.
    static let dueSettings: [(name: String, value: String)] = [("enable_seqscan", "off"), ("enable_sort", "off")]

    /// When the next pending activity or fan-out slice is due (`due`): an activity at its dispatch time, and not before
    /// its lease runs out; a slice not sent yet as its lease runs out (at once when unclaimed), which `slice_due` says
    /// alone.
    ///
    /// It reads what it needs by index, not every pending activity (3.1 ms a call on PostgreSQL during a burst of
    /// 10,000 updates, once after every wake-up of the engine): the first unleased pending activity in `activities_due`
    /// (its order is the dispatch time's), and the leased ones through `activities_claimed` (a handful; whether each is
    /// pending is asked of its row, not in the condition, which would let `activities_due` serve the read too, and
    /// PostgreSQL took it, planning on empty tables). Sequential scans are off when it runs on PostgreSQL: it is
    /// planned once (it binds nothing), perhaps while the tables are empty, and without statistics PostgreSQL takes
    /// nearly every activity for leased.
    static let dueStatement = """
        SELECT MIN(due) AS due, MIN(slice_due) AS slice_due FROM (
            SELECT due, CAST(NULL AS BIGINT) AS slice_due FROM (
                SELECT COALESCE(next_dispatch_at, 0) AS due FROM activities
                WHERE dispatched_sequence < sequence AND content_state IS NOT NULL AND claim_expires_at IS NULL
                ORDER BY COALESCE(next_dispatch_at, 0), updated_at
                LIMIT 1
            ) AS unleased
            UNION ALL
            SELECT MIN(CASE WHEN dispatched_sequence < sequence AND content_state IS NOT NULL
                THEN MAX(COALESCE(next_dispatch_at, 0), claim_expires_at) END) AS due, CAST(NULL AS BIGINT) AS slice_due
            FROM activities WHERE claim_expires_at IS NOT NULL
            UNION ALL
            SELECT MIN(COALESCE(claim_expires_at, 0)) AS due, MIN(COALESCE(claim_expires_at, 0)) AS slice_due
            FROM fanout_slices WHERE outcome IS NULL
        ) AS pending
        """

    public func renewClaim(appID: String, activityID: String, owner: String, now: Date, lease: TimeInterval) async throws -> DispatchClaim? {
        let leaseEnd = SQLiteData.integer(Self.millis(now) + Int(lease * 1000))
        guard let row = try await write(
            """
            UPDATE activities SET \(Self.leaseEndSetting) WHERE app_id = ? AND activity_id = ? AND claim_owner = ?
            RETURNING \(Self.claimColumns)
            """,
            [leaseEnd, leaseEnd, .text(appID), .text(activityID), .text(owner)]
        ).first else { return nil }
        return try Self.claim(from: row, owner: owner)
    }

    public func heldClaim(appID: String, activityID: String, owner: String, now: Date) async throws -> DispatchClaim? {
        guard let row = try await reader.query(
            """
            SELECT \(Self.claimColumns) FROM activities
            WHERE app_id = ? AND activity_id = ? AND claim_owner = ? AND claim_expires_at > ?
            """,
            [.text(appID), .text(activityID), .text(owner), .integer(Self.millis(now))]
        ).first else { return nil }
        return try Self.claim(from: row, owner: owner)
    }

    /// A claim from a row of `claimColumns`.
    static func claim(from row: StoreRow, owner: String) throws -> DispatchClaim {
        DispatchClaim(
            activity: try Self.activity(from: row), bundleID: try row.string("app_bundle_id"), owner: owner,
            budget: Self.claimBudget(row), audienceWaiting: (row.column("audience_waiting")?.integer ?? 0) != 0,
            pass: Int64(row.column("pass_counter")?.integer ?? 0),
            priority10Marked: (row.column("priority10_marked")?.integer ?? 0) != 0,
            sequenceMarked: (row.column("sequence_marked")?.integer ?? 1) != 0,
            slicesLeft: (row.column("slices_left")?.integer ?? 1) != 0,
            credentials: credentialsVersions(from: row)
        )
    }

    public func pendingInstances(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, through last: String?,
        limit: Int, consultingMarks: Bool
    ) async throws -> [InstanceRecord] {
        guard !platforms.isEmpty else { return [] }
        var (sql, binds) = Self.pendingInstancesWhere(
            "SELECT i.*", appID: appID, activityID: activityID, below: sequence, platforms: platforms, after: cursor, through: last,
            consultingMarks: consultingMarks
        )
        // The limit is written into the statement (here and in the Store's other reads): SQLite compiles a statement
        // whose LIMIT is a bound parameter a second time once the value is bound, and the engine reads every page so.
        sql += " ORDER BY i.device_id LIMIT \(limit)"
        return try Self.instances(from: await readKeepingPlan(sql, binds))
    }

    public func pendingInstanceCount(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, through last: String?,
        consultingMarks: Bool
    ) async throws -> Int {
        guard !platforms.isEmpty else { return 0 }
        let (sql, binds) = Self.pendingInstancesWhere(
            "SELECT COUNT(*) AS pending", appID: appID, activityID: activityID, below: sequence, platforms: platforms, after: cursor,
            through: last, consultingMarks: consultingMarks
        )
        return try await readKeepingPlan(sql, binds).first?.column("pending")?.integer ?? 0
    }

    /// `select` from the instances ``pendingInstances(appID:activityID:below:platforms:after:through:limit:)`` reads,
    /// with its binds.
    static func pendingInstancesWhere(
        _ select: String, appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?,
        through last: String?, consultingMarks: Bool
    ) -> (sql: String, binds: [SQLiteData]) {
        // The activity's settled sequence and pass by subqueries that name no column of the instance: each database reads
        // them once a statement (a join of the activity's row let PostgreSQL look it up again for every instance).
        let settled = { (column: String) in "(SELECT \(column) FROM activities WHERE app_id = ? AND activity_id = ?)" }
        var sql = """
            \(select) FROM instances i WHERE i.app_id = ? AND i.activity_id = ? AND \(deliverable("i."))
              AND i.delivered_sequence < ? AND NOT (i.joined_pass < \(settled("settled_pass")) AND \(settled("settled_sequence")) >= ?)
            """
        let key: [SQLiteData] = [.text(appID), .text(activityID)]
        let s = SQLiteData.integer(Int(sequence))
        var binds: [SQLiteData] = key + [s] + key + key + [s]
        if consultingMarks {
            let marked = markedFor("i.", sequence: "?")
            sql += " AND NOT \(marked)"
            binds += Array(repeating: s, count: marked.count { $0 == "?" })
        }
        sql += " AND i.platform IN (\(Array(repeating: "?", count: platforms.count).joined(separator: ",")))"
        binds += platforms.map { .text($0.rawValue) }
        if let cursor {
            sql += " AND i.device_id > ?"
            binds.append(.text(cursor))
        }
        if let last {
            sql += " AND i.device_id <= ?"
            binds.append(.text(last))
        }
        return (sql, binds)
    }

    public func recordProgress(_ progress: DeliveryProgress, at now: Date) async throws {
        // Progress is bookkeeping: if a power cut loses it, those instances are sent their state again.
        //
        // On PostgreSQL, a batch whose statements join into one (``progressGoesTogether(_:)``, nearly every one) goes
        // alone on the engine's connections, PostgreSQL's own transaction around it (``WriteIsolation/snapshotStatement``):
        // `BEGIN` and `COMMIT` were two of the ten or so statements an activity of one phone cost the engine. At
        // `REPEATABLE READ` an instance's row changed since the statement's snapshot (its phone registered a new token
        // meanwhile) fails it, and it runs again on a new one: the rows written are those `READ COMMITTED` would have
        // written. Any other batch is a transaction at READ COMMITTED: every statement changes rows it names by key
        // (locking them as it does), and a delivered sequence only rises (`MAX`). Serializable, the batches of a shared
        // fan-out's slices, written at once by several engines, collided on their predicate locks: the first run that
        // shared a 100,000-instance fan-out logged 520 serialization failures at COMMIT, each one a batch written again.
        // (The slices' batches touch rows of their own: neither isolation has them fail one another.)
        //
        // On SQLite it may commit part by part (``progressParts(_:at:)``), so that an accepted write waits for one part of
        // it at most.
        if dialect == .postgres, Self.progressGoesTogether(progress) {
            let statements = Self.progressStatements(progress, at: now)
            let oneStatement = statements.count <= 1 || PostgresDialect.together(statements) != nil
            try await writer.write(
                durability: .bookkeeping, isolation: oneStatement ? .snapshotStatement : .lockingRows, under: Self.engineSettings
            ) { db in
                try db.executeTogether(statements)
            }
            return
        }
        try await transaction(
            parts: Self.progressParts(progress, at: now), durability: .bookkeeping, isolation: .lockingRows,
            settings: Self.engineSettings
        )
    }

    /// Whether `progress`'s statements may run as one statement on PostgreSQL (``SQLConnection/executeTogether(_:)``):
    /// when it only raises delivered sequences and tallies (each instance's row once, matched by its key and the token
    /// pushed to) and adds the timeline's attempts (which read only the activity's row), as nearly every batch does. One
    /// statement instead of one for the instances and one for the timeline: an activity of one phone cost the engine
    /// about a dozen statements on PostgreSQL, each with its own parse, bind and answer. Changes of state, events, refused
    /// tokens and budget warnings touch the instances' rows a second time or read what another statement writes, and
    /// keep their order; so do more attempts than one segment of the timeline holds, whose segments' ids must rise in
    /// the attempts' order (the parts of one statement run in no set order).
    static func progressGoesTogether(_ progress: DeliveryProgress) -> Bool {
        progress.startsDelivered.isEmpty && progress.invalidated.isEmpty && progress.endDelivered.isEmpty
            && progress.refusedTokens.isEmpty && progress.budgetWarnings == 0 && progress.events.isEmpty
            && progress.attempts.count <= attemptsPerSegment
    }

    /// The statements that write `progress`, run back to back in one transaction: ``progressParts(_:at:)``'s, in order.
    ///
    /// They run under ``engineSettings`` on PostgreSQL. Each statement joins its list of instances to their rows by
    /// primary key, one lookup a row. PostgreSQL plans from statistics that may date from when the activity had a handful
    /// of instances: believing so, it hashed all of the activity's instances for each batch, or, told not to, read them
    /// all once and matched each row of the list against every one of them (100,000 of them: 100 – 200 ms a batch of
    /// 256, rounds of 20 – 50 s instead of 3.5) until the next automatic `ANALYZE`. Without hash joins, merge joins or
    /// sequential scans, the lookups are its only plan.
    ///
    /// So each statement keeps the plan it made first (``PostgresHandle/keptPlans``): planned for its values at every
    /// call, a fan-out of 200,000 pushes spent 399 ms planning its 800 writes of progress and 184 ms planning their
    /// timeline's inserts (`pg_stat_statements`), beside 3.2 s running them.
    static func progressStatements(_ progress: DeliveryProgress, at now: Date) -> [(sql: String, binds: [SQLiteData])] {
        progressParts(progress, at: now).flatMap { $0 }
    }

    /// Instances a part of a progress write updates (``progressParts(_:at:)``).
    static let progressRowsPerPart = 250

    /// The statements that write `progress`, in parts each whole on its own (a writer may commit them one by one:
    /// ``StoreWriter/writeStatements(parts:durability:isolation:settings:)``).
    ///
    /// Every part but the last only raises delivered sequences and rewrites priority-10 tallies, of up to
    /// ``progressRowsPerPart`` instances, which no other row speaks of: committed without the rest, they only mean that
    /// fewer instances are sent again. The last part holds everything that must commit together: each change of an
    /// instance's state, the events and the timeline, and the delivered sequences of the instances the events or
    /// state changes are about (an instance marked done without the event saying it failed would never have it
    /// said). When the batch warns of a budget (its event counts instances of the other parts), it is one part.
    static func progressParts(_ progress: DeliveryProgress, at now: Date) -> [[(sql: String, binds: [SQLiteData])]] {
        var statements: [(sql: String, binds: [SQLiteData])] = []
        let nowMillis = Self.millis(now)
        // Each statement joins a VALUES list on the primary key (app, activity, device): one lookup per instance,
        // whatever the number of instances on the activity, and only for the token that was pushed to.
        //
        // Delivered sequences (they only ever rise) and priority-10 tallies, one row write per instance.
        struct PushedToken: Hashable {
            var deviceID: String
            var token: String

            // The device alone: it tells an activity's instances apart, and hashing the token too (64 characters or
            // more) made the hashing of this dictionary a sixth of the progress write's statements.
            func hash(into hasher: inout Hasher) {
                hasher.combine(deviceID)
            }
        }
        var rows: [PushedToken: (sequence: Int64?, tally: Priority10Tally?)] = [:]
        rows.reserveCapacity(progress.delivered.count)
        for pushed in progress.delivered {
            let key = PushedToken(deviceID: pushed.deviceID, token: pushed.token)
            rows[key, default: (nil, nil)].sequence = max(rows[key]?.sequence ?? pushed.sequence, pushed.sequence)
        }
        for (pushed, tally) in progress.priority10Tallies {
            rows[PushedToken(deviceID: pushed.deviceID, token: pushed.token), default: (nil, nil)].tally = tally
        }
        // The instances whose state changes carry their own delivered sequences and tallies (one write of the row, not
        // two: ``stateChangeStatement(_:_:appID:activityID:at:)``), taken out of the rows.
        let stateChanges = [(InstanceEvent.tokenInvalidated, progress.invalidated), (.endDelivered, progress.endDelivered)].map {
            event, instances in
            (event, instances.map { pushed in
                (pushed, rows.removeValue(forKey: PushedToken(deviceID: pushed.deviceID, token: pushed.token)) ?? (nil, nil))
            })
        }
        // The instances an event in the last part is about.
        var tied: Set<String> = []
        for event in progress.events { if let deviceID = event.deviceID { tied.insert(deviceID) } }
        typealias Row = (key: PushedToken, value: (sequence: Int64?, tally: Priority10Tally?))
        var free: [Row] = []
        var last: [Row] = []
        free.reserveCapacity(rows.count)
        for row in rows {
            if tied.contains(row.key.deviceID) { last.append(row) } else { free.append(row) }
        }
        // Up to ``progressRowsPerPart`` instances a statement (1,500 bound values, well under SQLite's limit).
        // Each row of the list carries the whole key, app and activity too, so that the only way to the instances is
        // the primary key, one lookup a row: given the app and activity once, PostgreSQL could also read all of the
        // activity's instances and match them, and did whenever its statistics said the activity had a handful.
        func update(_ chunk: ArraySlice<Row>, matchingToken: Bool = true) -> (sql: String, binds: [SQLiteData]) {
            var binds: [SQLiteData] = []
            binds.reserveCapacity(chunk.count * 6)
            for (instance, row) in chunk {
                binds += Self.progressRow(
                    appID: progress.appID, activityID: progress.activityID, deviceID: instance.deviceID, token: instance.token,
                    sequence: row.sequence, tally: row.tally
                )
            }
            return (
                """
                UPDATE instances SET
                    delivered_sequence = MAX(instances.delivered_sequence, COALESCE(v.column5, instances.delivered_sequence)),
                    priority10_tally = COALESCE(CAST(v.column6 AS BIGINT), instances.priority10_tally)
                FROM (VALUES \(Array(repeating: "(?, ?, ?, ?, ?, ?)", count: chunk.count).joined(separator: ","))) AS v
                WHERE instances.app_id = v.column1 AND instances.activity_id = v.column2
                  AND instances.device_id = v.column3\(matchingToken ? " AND instances.push_token = v.column4" : "")
                """,
                binds
            )
        }
        var parts = free.chunked(into: progressRowsPerPart).map { [update($0)] }
        // The marks of runs sent: facts of their own, like the delivered sequences (a mark lost only means its
        // instances are sent again).
        for chunk in progress.marks.chunked(into: marksPerStatement) {
            parts.append([markStatement(appID: progress.appID, activityID: progress.activityID, chunk)])
        }
        statements += last.chunked(into: progressRowsPerPart).map { update($0) }
        // Delivered starts, whatever token the instance holds by now (``DeliveryProgress/startsDelivered``).
        let starts: [Row] = progress.startsDelivered.map {
            (key: PushedToken(deviceID: $0.deviceID, token: $0.token), value: (sequence: $0.sequence, tally: nil))
        }
        statements += starts.chunked(into: progressRowsPerPart).map { update($0, matchingToken: false) }
        for (event, instances) in stateChanges {
            for chunk in instances.chunked(into: progressRowsPerPart) {
                statements.append(
                    Self.stateChangeStatement(event, chunk, appID: progress.appID, activityID: progress.activityID, at: nowMillis)
                )
            }
        }
        for (refused, reason) in progress.refusedTokens {
            statements += Self.dropDeviceTokenStatements(
                appID: progress.appID, deviceID: refused.deviceID, token: refused.token, reason: reason, at: now
            )
        }
        if progress.budgetWarnings > 0 {
            statements.append((
                "UPDATE activities SET budget_warned_at = ? WHERE app_id = ? AND activity_id = ?",
                [.integer(nowMillis), .text(progress.appID), .text(progress.activityID)]
            ))
        }
        statements += Self.timelineStatements(appID: progress.appID, activityID: progress.activityID, attempts: progress.attempts)
        statements += progress.events.map { Self.engineEventStatement($0, at: now) }
        if progress.budgetWarnings > 0 { return [parts.flatMap { $0 } + statements] }
        if !statements.isEmpty { parts.append(statements) }
        return parts
    }

    /// The change of state `event` makes to `instances` (each at the token pushed to, with the delivered sequence and
    /// priority-10 tally its push leaves, if any), as one statement: the state machine's rules (``InstanceState/applying(_:)``)
    /// as a `CASE` of the row's state, so that dismissed stays dismissed and so on; a row whose state changes keeps the
    /// sequence delivered by the marks and the settled pass that spoke for it (``effectiveDelivered(_:)``), as its state
    /// no longer lets them. Every row is written once: its sequence, tally and state together. Written as a statement for
    /// each state that changes, after one for the sequences and tallies, an end wrote each instance's row twice, and on
    /// PostgreSQL each write is a new version of the row in every index (the state is in `instances_by_age`).
    static func stateChangeStatement(
        _ event: InstanceEvent, _ instances: ArraySlice<(PushedInstance, (sequence: Int64?, tally: Priority10Tally?))>,
        appID: String, activityID: String, at nowMillis: Int
    ) -> (sql: String, binds: [SQLiteData]) {
        let changes = InstanceState.allCases.compactMap { state in
            let next = state.applying(event)
            return next == state ? nil : (from: state, to: next)
        }
        // Both events the engine records change some state (an empty CASE or IN list is no SQL).
        precondition(!changes.isEmpty, "\(event) changes no instance's state")
        let changing = changes.map { "'\($0.from.rawValue)'" }.joined(separator: ", ")
        var binds: [SQLiteData] = [.integer(nowMillis)]
        binds.reserveCapacity(1 + instances.count * 6)
        for (pushed, row) in instances {
            binds += progressRow(
                appID: appID, activityID: activityID, deviceID: pushed.deviceID, token: pushed.token, sequence: row.sequence, tally: row.tally
            )
        }
        return (
            """
            UPDATE instances SET
                state = CASE instances.state \(changes.map { "WHEN '\($0.from.rawValue)' THEN '\($0.to.rawValue)'" }.joined(separator: " ")) ELSE instances.state END,
                updated_at = CASE WHEN instances.state IN (\(changing)) THEN CAST(? AS BIGINT) ELSE instances.updated_at END,
                delivered_sequence = MAX(\(Self.effectiveDelivered("instances.")), COALESCE(CAST(v.column5 AS BIGINT), instances.delivered_sequence)),
                priority10_tally = COALESCE(CAST(v.column6 AS BIGINT), instances.priority10_tally)
            FROM (VALUES \(Array(repeating: "(?, ?, ?, ?, ?, ?)", count: instances.count).joined(separator: ","))) AS v
            WHERE instances.app_id = v.column1 AND instances.activity_id = v.column2
              AND instances.device_id = v.column3 AND instances.push_token = v.column4
              AND (instances.state IN (\(changing)) OR v.column5 IS NOT NULL OR v.column6 IS NOT NULL)
            """,
            binds
        )
    }

    /// One row of a progress statement's `VALUES` list, in its columns' order: the instance's key, the token pushed to,
    /// the delivered sequence and the priority-10 tally (each `NULL` when the push leaves none).
    static func progressRow(
        appID: String, activityID: String, deviceID: String, token: String, sequence: Int64?, tally: Priority10Tally?
    ) -> [SQLiteData] {
        [
            .text(appID), .text(activityID), .text(deviceID), .text(token),
            sequence.map { .integer(Int($0)) } ?? .null, tally.map { .integer(Int($0.packed)) } ?? .null,
        ]
    }

    /// Marks a statement inserts at most (``markStatement(appID:activityID:_:)``).
    static let marksPerStatement = 100

    /// The insert of one activity's marks (``DeliveryMark``). A mark already there (the same run written twice) stays.
    static func markStatement(appID: String, activityID: String, _ marks: ArraySlice<DeliveryMark>) -> (sql: String, binds: [SQLiteData]) {
        var binds: [SQLiteData] = []
        binds.reserveCapacity(marks.count * 9)
        for mark in marks {
            binds += [
                .text(appID), .text(activityID), .text(mark.platform.rawValue), .integer(Int(mark.sequence)), .text(mark.throughDevice),
                .integer(Int(mark.pass)), .text(mark.fromDevice), .integer(mark.priority), .integer(Int(mark.sentAt)),
            ]
        }
        return (
            """
            INSERT INTO delivery_marks (app_id, activity_id, platform, sequence, through_device, pass, from_device, priority, sent_at)
            VALUES \(Array(repeating: "(?, ?, ?, ?, ?, ?, ?, ?, ?)", count: marks.count).joined(separator: ","))
            ON CONFLICT (app_id, activity_id, platform, sequence, through_device, pass) DO NOTHING
            """,
            binds
        )
    }

    @discardableResult
    public func releaseClaim(
        appID: String, activityID: String, owner: String, platforms: [Platform], retryAt: Date?, claimedSequence: Int64?,
        sendStart: SendStart?, verified: SettledPass?
    ) async throws -> Bool {
        let release = Self.releaseStatement(
            appID: appID, activityID: activityID, owner: owner, platforms: platforms, retryAt: retryAt, claimedSequence: claimedSequence,
            sendStart: sendStart, verified: verified
        )
        // Under the engine's settings, so that PostgreSQL keeps one plan of it (by key, ``engineSettings``) rather than
        // plan it at every release: planned for its values, over 5,000 activities of one phone each
        // (`pg_stat_statements`), the releases took 1,318 ms of planning against 466 ms of running.
        // At REPEATABLE READ on PostgreSQL, one statement sent alone on the connections kept for the engine, without
        // `BEGIN` and `COMMIT` (``WriteIsolation/snapshotStatement``): what is behind is read on the statement's
        // snapshot, and a write that put something behind since has written the activity's row, so the release's
        // update of that row fails and runs again. Serializable, releases failed one another on the pages of
        // `activities_pkey` their lookups shared: about 5 % of them (247 of 5,247 over 5,000 activities of one phone
        // each; 223 – 237 serialization failures in PostgreSQL's log for each such run), each run again after a pause.
        let done = try await writer.write(
            durability: engineDurability, isolation: .snapshotStatement, under: Self.engineSettings
        ) { db in
            try db.query(release.sql, release.binds)
        }.first?.column("done")?.integer
        if done == 1, let verified {
            // The settled sequence speaks for the marks of it and of those before it: they go, but for the marks of
            // priority-10 pushes, which the instances' budgets count for an hour or so (``priority10Marks(appID:activityID:since:)``).
            // Bookkeeping: marks left by a lost deletion go with the periodic pruning.
            let since = Int(verified.at.timeIntervalSince1970) - Int(Priority10Tally.windowSeconds)
            try await writer.write(durability: .bookkeeping, isolation: .lockingRows, under: Self.engineSettings) { db in
                try db.execute(
                    """
                    DELETE FROM delivery_marks WHERE app_id = ? AND activity_id = ? AND sequence <= ? AND (priority <> 10 OR sent_at < ?)
                    """,
                    [.text(appID), .text(activityID), .integer(Int(verified.sequence)), .integer(since)]
                )
            }
        }
        return done == 1
    }

    /// The release of a claim (``releaseClaim(appID:activityID:owner:platforms:retryAt:sendStart:)``): the activity done,
    /// or, with something still behind for `platforms`, pending again from `retryAt` (nil: at once); the claim let go;
    /// the send's start recorded when there is one (one text either way). It returns one row, `done`, when `owner` held
    /// the claim.
    ///
    /// The send's start used to be a write of its own before the pass: on PostgreSQL a transaction of three statements
    /// (`BEGIN`, the `UPDATE`, `COMMIT`) of the eighteen or so an activity of one phone cost the engine.
    ///
    /// `LIMIT 1` keeps `pass` whole: PostgreSQL would otherwise pull the subquery up and copy `behind` into both CASEs,
    /// searching twice for an instance still behind (through all of an activity's instances when none is: 77 – 105 ms
    /// for 100,000, against 37 – 57 ms once).
    ///
    /// With `verified`, the engine read after its pass that nothing waited for the sequence it sent: then only what may
    /// have come since is looked for (a newer sequence, an instance that joined since the pass's claim, a start
    /// audience, a broadcast, slices), and the activity settles at that sequence (``SettledPass``) when nothing has, so
    /// that neither this search nor a later one seeks a mark for each of its instances.
    static func releaseStatement(
        appID: String, activityID: String, owner: String, platforms: [Platform], retryAt: Date?, claimedSequence: Int64? = nil,
        sendStart: SendStart? = nil, verified: SettledPass? = nil
    ) -> (sql: String, binds: [SQLiteData]) {
        let key: [SQLiteData] = [.text(appID), .text(activityID)]
        let behind =
            if let verified {
                sinceVerified(verified, platforms: platforms, keyBinds: key)
            } else {
                somethingBehind(app: "?", activity: "?", platforms: platforms, keyBinds: key)
            }
        let settle =
            if let verified {
                (
                    sql: """
                        settled_sequence = CASE WHEN pass.behind THEN activities.settled_sequence ELSE CAST(? AS BIGINT) END,
                            settled_pass = CASE WHEN pass.behind THEN activities.settled_pass ELSE CAST(? AS BIGINT) END,
                        """,
                    binds: [SQLiteData.integer(Int(verified.sequence)), .integer(Int(verified.pass))]
                )
            } else {
                (sql: "", binds: [SQLiteData]())
            }
        return (
            """
            UPDATE activities SET
                dispatched_sequence = CASE WHEN pass.behind THEN activities.dispatched_sequence ELSE activities.sequence END,
                next_dispatch_at = CASE WHEN pass.behind AND activities.sequence <= CAST(? AS BIGINT) THEN CAST(? AS BIGINT) ELSE NULL END,
                \(settle.sql)
                claim_owner = NULL, claim_expires_at = NULL,
                last_sent_sequence = COALESCE(CAST(? AS BIGINT), activities.last_sent_sequence),
                last_sent_at = COALESCE(CAST(? AS BIGINT), activities.last_sent_at)
            FROM (SELECT \(behind.sql) AS behind LIMIT 1) AS pass
            WHERE activities.app_id = ? AND activities.activity_id = ? AND activities.claim_owner = ?
            RETURNING dispatched_sequence = sequence AS done
            """,
            // Typed in the statement: a NULL bind (no retry time, no send's start) has no type of its own, and PostgreSQL
            // would read the CASE as text.
            // A newer sequence than the claimed one is due at once (none given: whatever sequence the activity has).
            [claimedSequence.map { .integer(Int($0)) } ?? .integer(Int(Int64.max)), retryAt.map { .integer(millis($0)) } ?? .null]
                + settle.binds
                + [sendStart.map { .integer(Int($0.sequence)) } ?? .null, sendStart.map { .integer(millis($0.at)) } ?? .null]
                + behind.binds + key + [.text(owner)]
        )
    }

    /// What may have put something behind on one activity since the engine found nothing waiting for `verified`'s
    /// sequence, as an SQL boolean: a newer sequence; an instance on `platforms` behind by its row that joined at or
    /// after the pass (an instance that joins, takes a token or becomes deliverable again takes the activity's pass
    /// counter); a start audience, a broadcast or slices (as ``somethingBehind(app:activity:platforms:keyBinds:)``).
    /// Binds: `keyBinds` (the app's value, then the activity's) go where the activity is named.
    static func sinceVerified(_ verified: SettledPass, platforms: [Platform], keyBinds: [SQLiteData]) -> (sql: String, binds: [SQLiteData]) {
        let placeholders = Array(repeating: "?", count: max(platforms.count, 1)).joined(separator: ",")
        let platformBinds: [SQLiteData] = platforms.isEmpty ? [.text("")] : platforms.map { .text($0.rawValue) }
        let sql = """
            (EXISTS (
                SELECT 1 FROM activities v WHERE v.app_id = ? AND v.activity_id = ? AND v.sequence <> ?
            ) OR EXISTS (
                SELECT 1 FROM instances i JOIN activities a ON a.app_id = i.app_id AND a.activity_id = i.activity_id
                WHERE i.app_id = ? AND i.activity_id = ? AND \(deliverable("i.")) AND i.delivered_sequence < a.sequence
                  AND i.joined_pass >= ? AND i.platform IN (\(placeholders))
            ) OR EXISTS (
                SELECT 1 FROM start_audiences s WHERE s.app_id = ? AND s.activity_id = ? AND s.admitted = 0
            ) OR EXISTS (
                SELECT 1 FROM activities b WHERE b.app_id = ? AND b.activity_id = ? AND b.channel_status = 'active'
                  AND b.broadcast_sequence < b.sequence AND 'ios' IN (\(placeholders))
            ) OR EXISTS (
                SELECT 1 FROM fanout_slices f WHERE f.app_id = ? AND f.activity_id = ?
            ))
            """
        let sequence = SQLiteData.integer(Int(verified.sequence))
        let pass = SQLiteData.integer(Int(verified.pass))
        return (
            sql,
            keyBinds + [sequence] + keyBinds + [pass] + platformBinds + keyBinds + keyBinds + platformBinds + keyBinds
        )
    }

    public func releaseAllClaims() async throws {
        // On a database several nodes share, the others' claims are theirs: a dead node's run out with their lease.
        guard dialect == .sqlite else { return }
        try await transaction { db in
            // Due at once again: a lease had moved its activity's dispatch time to its end (``leaseSetting``).
            _ = try db.query(
                "UPDATE activities SET claim_owner = NULL, claim_expires_at = NULL, next_dispatch_at = NULL WHERE claim_owner IS NOT NULL"
            )
            _ = try db.query("UPDATE fanout_slices SET claim_owner = NULL, claim_expires_at = NULL WHERE claim_owner IS NOT NULL")
        }
    }

    public func saveCredentials(_ credentials: StoredCredentials) async throws {
        try await transaction { db in
            let exists = try db.query("SELECT 1 FROM apps WHERE id = ?", [.text(credentials.appID)])
            if exists.isEmpty { throw StoreError.appNotFound }
            _ = try db.query(
                """
                INSERT INTO app_credentials (app_id, provider, settings, sealed_secret, healthy, health_reason, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (app_id, provider) DO UPDATE SET settings = excluded.settings, sealed_secret = excluded.sealed_secret,
                    healthy = excluded.healthy, health_reason = excluded.health_reason, updated_at = excluded.updated_at
                """,
                [.text(credentials.appID), .text(credentials.provider.rawValue), .text(credentials.settings.encodedString),
                 .blob(ByteBuffer(bytes: credentials.sealedSecret)), .integer(credentials.healthy ? 1 : 0),
                 Self.text(credentials.healthReason), .integer(Self.millis(credentials.updatedAt))]
            )
        }
    }

    public func masterKeyCheck(proposing proposed: [UInt8]) async throws -> [UInt8] {
        try await transaction { db in
            try db.query(
                "INSERT INTO store_secrets (name, value) VALUES ('master_key_check', ?) ON CONFLICT (name) DO NOTHING",
                [.blob(ByteBuffer(bytes: proposed))]
            )
            guard let stored = try db.query("SELECT value FROM store_secrets WHERE name = 'master_key_check'").first?.column("value")?.blob
            else { throw CorruptRow(column: "store_secrets.value") }
            return Array(buffer: stored)
        }
    }

    public func storedMasterKeyCheck() async throws -> [UInt8]? {
        try await reader.query("SELECT value FROM store_secrets WHERE name = 'master_key_check'").first?.column("value")?.blob.map { Array(buffer: $0) }
    }

    public func credentials(appID: String, provider: CredentialProvider) async throws -> StoredCredentials? {
        guard let row = try await readKeepingPlan(
            "SELECT * FROM app_credentials WHERE app_id = ? AND provider = ?", [.text(appID), .text(provider.rawValue)]
        ).first else { return nil }
        return StoredCredentials(
            appID: try row.string("app_id"), provider: provider,
            settings: try row.json("settings") ?? .object([:]),
            sealedSecret: Array(buffer: row.column("sealed_secret")?.blob ?? ByteBuffer()),
            healthy: (row.column("healthy")?.integer ?? 1) != 0, healthReason: row.column("health_reason")?.string,
            updatedAt: try row.date("updated_at")
        )
    }

    public func setCredentialsHealth(appID: String, provider: CredentialProvider, healthy: Bool, reason: String?, at now: Date) async throws {
        try await transaction { db in
            let was = try db.query(
                "SELECT healthy FROM app_credentials WHERE app_id = ? AND provider = ?", [.text(appID), .text(provider.rawValue)]
            ).first?.column("healthy")?.integer
            // `updated_at` is when the credentials were set, and the push directories' version of them: a change of
            // health is neither (a client rebuilt for it cut off the pushes in flight on the one it replaced).
            _ = try db.query(
                "UPDATE app_credentials SET healthy = ?, health_reason = ? WHERE app_id = ? AND provider = ?",
                [.integer(healthy ? 1 : 0), Self.text(reason), .text(appID), .text(provider.rawValue)]
            )
            // Told once, when they turn unhealthy.
            if !healthy, let was, was != 0 {
                try Self.record(
                    NewEvent(.credentialsUnhealthy, appID: appID, data: ["provider": .string(provider.rawValue), "reason": reason.map(JSONValue.string) ?? .null]),
                    at: now, on: db
                )
            }
        }
    }
}

extension Array {
    func chunked(into size: Int) -> [ArraySlice<Element>] {
        stride(from: 0, to: count, by: size).map { self[$0..<Swift.min($0 + size, count)] }
    }
}

extension SQLStore {
    public func deferClaim(appID: String, activityID: String, owner: String, sequence: Int64, until: Date) async throws {
        _ = try await write(
            """
            UPDATE activities SET claim_owner = NULL, claim_expires_at = NULL,
                next_dispatch_at = CASE WHEN sequence = ? THEN ? ELSE NULL END
            WHERE app_id = ? AND activity_id = ? AND claim_owner = ?
            """,
            [.integer(Int(sequence)), .integer(Self.millis(until)), .text(appID), .text(activityID), .text(owner)]
        )
    }
}

extension SQLStore {
    static func claimBudget(_ row: StoreRow) -> BudgetOverride {
        BudgetOverride(
            hourly: row.column("app_budget_hourly")?.integer, hourlyWithFrequentPushes: row.column("app_budget_hourly_frequent")?.integer
        )
    }

    public func setBudget(appID: String, _ budget: BudgetOverride) async throws {
        try await transaction { db in
            let rows = try db.query(
                "UPDATE apps SET budget_hourly = ?, budget_hourly_frequent = ? WHERE id = ? RETURNING id",
                [budget.hourly.map { .integer($0) } ?? .null, budget.hourlyWithFrequentPushes.map { .integer($0) } ?? .null, .text(appID)]
            )
            if rows.isEmpty { throw StoreError.appNotFound }
        }
    }
}
