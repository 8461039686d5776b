import Foundation
@testable import LivelineStore
import LivelineTestSupport
import MetricsTestKit
import SQLiteNIO
import Synchronization
import Testing

/// PostgreSQL's group commit (``WriteIsolation/grouped(key:)``): writes queued together share one transaction, run
/// in the order of their keys, and one write's failure is never another's.
@Suite("PostgreSQL group commit", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct GroupCommitTests {
    /// A refusal of a write's own logic, as a Store body throws one.
    struct Refused: Error, Equatable {}

    /// Set by the write holding the connection once it holds it.
    final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    /// Runs `body` with a one-connection pool on a fresh database holding the table `log (seq, key)`, and the pool's
    /// metrics.
    private func withPool(_ body: (PostgresPool, TestMetrics) async throws -> Void) async throws {
        try await withTemporaryPostgresPool(count: 1) { pool, metrics in
            _ = try await pool.write(durability: .full) { db in
                try db.query("CREATE TABLE log (seq BIGSERIAL PRIMARY KEY, key TEXT NOT NULL UNIQUE)")
            }
            try await body(pool, metrics)
        }
    }

    /// Holds one of `pool`'s connections with a write (`isolation`'s) that waits for a gate, and runs `body` once it
    /// holds it, given whether it still does; then opens the gate, also when `body` throws (a connection left waiting at
    /// the gate would hang the pool's close), and waits for that write.
    private func whileHolding<T: Sendable>(
        _ pool: PostgresPool, isolation: WriteIsolation, _ body: (_ stillHeld: @escaping @Sendable () -> Bool) async throws -> T
    ) async throws -> T {
        let gate = DispatchSemaphore(value: 0)
        let holding = Flag()
        let released = Flag()
        async let held: Void = pool.write(durability: .full, isolation: isolation) { _ in
            holding.value.store(true, ordering: .releasing)
            gate.wait()
            released.value.store(true, ordering: .releasing)
        }
        let result: T
        do {
            while !holding.value.load(ordering: .acquiring) { try await Task.sleep(for: .milliseconds(5)) }
            result = try await body { !released.value.load(ordering: .acquiring) }
        } catch {
            gate.signal()
            try? await held
            throw error
        }
        gate.signal()
        try await held
        return result
    }

    /// Holds the pool's one connection with a write that waits for a gate, queues a grouped write for each of `keys`
    /// (each logging its key; `refusing` ones throw after that, `failingInDatabase` ones first send a statement that
    /// fails), opens the gate once all are queued, and returns each write's outcome by key.
    private func queueBehindGate(
        _ pool: PostgresPool, keys: [String], refusing: Set<String> = [], failingInDatabase: Set<String> = []
    ) async throws -> [String: Result<Int, any Error>] {
        try await withThrowingTaskGroup(of: (String, Result<Int, any Error>).self) { group in
            try await whileHolding(pool, isolation: .serializable) { _ in
                for key in keys {
                    group.addTask {
                        do {
                            let seq = try await pool.write(durability: .full, isolation: .grouped(key: key)) { db in
                                if failingInDatabase.contains(key) {
                                    // Sent without waiting: its failure shows at a later statement, perhaps another write's.
                                    try db.execute("INSERT INTO no_such_table (key) VALUES (?)", [.text(key)])
                                }
                                let row = try db.query("INSERT INTO log (key) VALUES (?) RETURNING seq", [.text(printable(key))]).first
                                if refusing.contains(key) { throw Refused() }
                                return row?.column("seq")?.integer ?? -1
                            }
                            return (key, .success(seq))
                        } catch {
                            return (key, .failure(error))
                        }
                    }
                }
                while pool.queuedGroupedWrites < keys.count { try await Task.sleep(for: .milliseconds(5)) }
            }
            var outcomes: [String: Result<Int, any Error>] = [:]
            for try await (key, result) in group { outcomes[key] = result }
            return outcomes
        }
    }

    /// A key as the log keeps it: PostgreSQL's text holds no NUL.
    private func printable(_ key: String) -> String {
        key.replacingOccurrences(of: "\u{0}", with: "/")
    }

    private func committed(_ metrics: TestMetrics) throws -> Int64 {
        try metrics.expectCounter(StoreCommitMetrics.commitsName, [("durability", "full")]).totalValue
    }

    @Test("grouped writes queued together commit once, in the order of their keys")
    func shareOneCommitInKeyOrder() async throws {
        try await withPool { pool, metrics in
            let keys = (0..<12).map { WriteIsolation.groupKey("app", "activity-\($0 % 3)", "device-\(11 - $0)") }.shuffled()
            #expect(keys.count <= PostgresPool.groupLimit)
            let before = try committed(metrics)
            let outcomes = try await queueBehindGate(pool, keys: keys)
            // The gate's write and one for the twelve.
            #expect(try committed(metrics) - before == 2)
            let logged = try await pool.read { db in try db.query("SELECT key FROM log ORDER BY seq").map { try $0.string("key") } }
            #expect(logged == keys.sorted().map(printable))
            for (key, outcome) in outcomes { #expect(throws: Never.self, "\(key)") { try outcome.get() } }
        }
    }

    /// Makes `pool`'s log table, holds one of its grouped writes' connections with a grouped write that waits for a
    /// gate (``whileHolding(_:isolation:_:)``), queues a grouped write logging each of `keys` behind it (`after` that
    /// write holds the connection), and runs `whileHeld`, given whether the gate still holds the connection; then waits
    /// for every write.
    private func queueBehindHeldGroup(
        _ pool: PostgresPool, keys: [String], after pause: Duration = .zero,
        whileHeld: (_ stillHeld: @escaping @Sendable () -> Bool) async throws -> Void
    ) async throws {
        _ = try await pool.write(durability: .full) { db in
            try db.query("CREATE TABLE log (seq BIGSERIAL PRIMARY KEY, key TEXT NOT NULL UNIQUE)")
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            try await whileHolding(pool, isolation: .grouped(key: WriteIsolation.groupKey("app", "gate"))) { stillHeld in
                try await Task.sleep(for: pause)
                for key in keys {
                    group.addTask {
                        try await pool.write(durability: .full, isolation: .grouped(key: key)) { db in
                            try db.execute("INSERT INTO log (key) VALUES (?)", [.text(printable(key))])
                        }
                    }
                }
                try await whileHeld(stillHeld)
            }
            try await group.waitForAll()
        }
    }

    /// The rows of `pool`'s log table.
    private func logged(_ pool: PostgresPool) async throws -> Int {
        try await pool.read { db in try db.query("SELECT COUNT(*) AS n FROM log").first?.column("n")?.integer } ?? 0
    }

    @Test("writes queued while a group is at work wait for its connection, though others are free: then one group takes them all")
    func queuedWritesWaitForTheConnectionAtWork() async throws {
        // A pool of 8 sets 3 connections apart for its grouped writes; the one at work is not taken for held up.
        try await withTemporaryPostgresPool(count: 8, stalledAfter: .seconds(60)) { pool, metrics in
            let keys = (0..<20).map { WriteIsolation.groupKey("app", "activity-\($0)") }
            let before = try committed(metrics)
            try await queueBehindHeldGroup(pool, keys: keys) { _ in
                // Every write queued (or, were a free connection started, some taken): then long enough for such a
                // connection to take what is queued.
                let deadline = ContinuousClock.now + .seconds(5)
                while pool.queuedGroupedWrites < keys.count, ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(5))
                }
                try await Task.sleep(for: .milliseconds(200))
                #expect(pool.queuedGroupedWrites == keys.count)
            }
            // The log table's, the held group's, then one for the twenty.
            #expect(try committed(metrics) - before == 3)
            #expect(try await logged(pool) == keys.count)
        }
    }

    @Test("writes queued behind a group that is held up are taken by another connection and commit meanwhile")
    func heldUpGroupDoesNotHoldUpTheQueue() async throws {
        try await withTemporaryPostgresPool(count: 8, stalledAfter: .milliseconds(50)) { pool, _ in
            let keys = (0..<5).map { WriteIsolation.groupKey("app", "activity-\($0)") }
            // Past the stall's time, so the first write queued already finds the group at work held up.
            try await queueBehindHeldGroup(pool, keys: keys, after: .milliseconds(100)) { stillHeld in
                // Committed while the first group is still held (looked for 10 s at most: held up behind it, they would
                // wait for as long as it is).
                let deadline = ContinuousClock.now + .seconds(10)
                var count = 0
                while count < keys.count, ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(10))
                    count = try await logged(pool)
                }
                #expect(count == keys.count)
                #expect(stillHeld())
            }
        }
    }

    @Test("a write whose body throws fails alone and leaves nothing; the rest of its group commits")
    func refusalFailsAlone() async throws {
        try await withPool { pool, _ in
            let keys = (0..<12).map { WriteIsolation.groupKey("app", "activity-\($0)") }
            let refusing: Set = [keys[3], keys[8]]
            let outcomes = try await queueBehindGate(pool, keys: keys, refusing: refusing)
            for key in keys {
                let outcome = try #require(outcomes[key])
                if refusing.contains(key) {
                    #expect(throws: Refused.self) { try outcome.get() }
                } else {
                    #expect((try? outcome.get()) != nil, "\(key) committed")
                }
            }
            let logged = try await pool.read { db in try db.query("SELECT key FROM log ORDER BY seq").map { try $0.string("key") } }
            #expect(logged == keys.sorted().filter { !refusing.contains($0) }.map(printable))
        }
    }

    @Test("a database failure inside a group fails only the write that caused it: the others run alone and commit")
    func databaseFailureRunsEachAlone() async throws {
        try await withPool { pool, _ in
            let keys = (0..<8).map { WriteIsolation.groupKey("app", "activity-\($0)") }
            let outcomes = try await queueBehindGate(pool, keys: keys, failingInDatabase: [keys[2]])
            #expect(throws: PostgresFailure.self) { try outcomes[keys[2]]?.get() }
            for key in keys where key != keys[2] {
                #expect((try? outcomes[key]?.get()) != nil, "\(key) committed")
            }
            let logged = try await pool.read { db in try db.query("SELECT key FROM log ORDER BY seq").map { try $0.string("key") } }
            #expect(Set(logged) == Set(keys.map(printable)).subtracting([printable(keys[2])]))
        }
    }

    @Test("group keys compare part by part: an activity's key before its devices', and before a longer activity id")
    func groupKeysOrderPartByPart() {
        let activity = WriteIsolation.groupKey("app", "match")
        let device = WriteIsolation.groupKey("app", "match", "device")
        let longer = WriteIsolation.groupKey("app", "match2")
        #expect(activity < device)
        #expect(device < longer)
        #expect([longer, device, activity].sorted() == [activity, device, longer])
    }

    /// A member of a set that reports the plan setting its statements ran with: in the set, or in its body (when the set
    /// leaves it out, or when it runs alone).
    struct PlanSettingProbe: SetWrite {
        var leftOut: Bool

        static func runTogether(_ members: [Self], on db: any SQLConnection) throws -> [SetWriteOutcome<String>] {
            let mode = try db.query("SELECT current_setting('plan_cache_mode') AS mode").first?.string("mode") ?? "?"
            return members.map { $0.leftOut ? .alone : .done("set: " + mode) }
        }

        static func body(_ db: any SQLConnection) throws -> String {
            "body: " + (try db.query("SELECT current_setting('plan_cache_mode') AS mode").first?.string("mode") ?? "?")
        }
    }

    @Test("grouped writes run with cached plans (their foreign-key checks are not planned row by row), as a set, after it or alone; other writes with plans for their values")
    func groupedWritesRunWithCachedPlans() async throws {
        try await withOneWriter(.postgres) { store, queued, _ in
            let leftOut: Set = [2, 5]
            let writes: [@Sendable () async throws -> String] = (0..<8).map { index in
                {
                    try await store.writer.write(
                        durability: .full, isolation: .grouped(key: WriteIsolation.groupKey("app", "activity-\(index)")),
                        member: PlanSettingProbe(leftOut: leftOut.contains(index)), PlanSettingProbe.body
                    )
                }
            }
            let outcomes = try await queuedTogether(store, queued: queued, writes)
            for (index, outcome) in outcomes.enumerated() {
                #expect(try outcome.get() == (leftOut.contains(index) ? "body: auto" : "set: auto"), "write \(index)")
            }
            let alone = try await store.writer.write(
                durability: .full, isolation: .grouped(key: WriteIsolation.groupKey("app", "alone")),
                member: PlanSettingProbe(leftOut: false), PlanSettingProbe.body
            )
            #expect(alone == "body: auto")
            // The setting ended with each grouped write's transaction.
            let other = try await store.writer.write(durability: .full) { db in try PlanSettingProbe.body(db) }
            #expect(other == "body: force_custom_plan")
        }
    }
}
