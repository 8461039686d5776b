import Foundation
import LivelineTestSupport
import SQLiteNIO
import Testing

@testable import LivelineStore

/// The settings a PostgreSQL connection is opened with, and the grouped writes' connections opened with theirs.
@Suite("PostgreSQL session settings")
struct SessionSettingsTests {
    @Test("a connection opens with plans for values and no JIT; settings given replace those of the same name")
    func sessionSettings() {
        let plain = PostgresHandle.sessionSettings([])
        #expect(plain.map(\.name) == ["plan_cache_mode", "jit"])
        #expect(plain.map(\.value) == ["force_custom_plan", "off"])

        let grouped = PostgresHandle.sessionSettings(PostgresHandle.groupedWriteSettings)
        #expect(grouped.filter { $0.name == "plan_cache_mode" }.map(\.value) == ["auto"])
        #expect(grouped.filter { $0.name == "jit" }.map(\.value) == ["off"])
        #expect(grouped.contains { $0 == ("enable_seqscan", "off") })
    }

    @Test("a pool sets connections apart for its grouped writes: up to 3, fewer than its others, none in a pool of one")
    func groupConnectionCount() {
        #expect([1, 2, 3, 4, 8, 16].map(PostgresPool.groupConnectionCount(of:)) == [0, 1, 2, 3, 3, 3])
    }

    @Test("a pool sets connections apart for the engine's bookkeeping: up to 4, half its others at most, none in a pool of one")
    func bookkeepingConnectionCount() {
        #expect([1, 2, 3, 4, 8, 16].map(PostgresPool.bookkeepingConnectionCount(of:)) == [0, 1, 1, 2, 4, 4])
    }

    @Test("a write runs on the bookkeeping connections when it is bookkeeping, not grouped, and asks for exactly their settings")
    func runsAsBookkeeping() {
        let engine = SQLStore.engineSettings
        func runs(
            _ durability: Durability, _ isolation: WriteIsolation, _ settings: [(name: String, value: String)],
            _ theirs: [(name: String, value: String)] = engine
        ) -> Bool {
            PostgresPool.runsAsBookkeeping(durability: durability, isolation: isolation, settings: settings, theirs)
        }
        #expect(runs(.bookkeeping, .lockingRows, engine))
        #expect(runs(.bookkeeping, .serializable, engine.reversed()))
        #expect(runs(.bookkeeping, .exclusive(lock: 7), engine))
        // A full write waits for the WAL's flush: those connections are opened not to.
        #expect(!runs(.full, .lockingRows, engine))
        #expect(!runs(.bookkeeping, .grouped(key: "k"), engine))
        // Fewer settings than the connections hold: theirs would rule the write.
        #expect(!runs(.bookkeeping, .lockingRows, Array(engine.dropFirst())))
        #expect(!runs(.bookkeeping, .lockingRows, engine + [("enable_nestloop", "off")]))
        #expect(!runs(.bookkeeping, .lockingRows, [("enable_sort", "on")] + engine.dropFirst()))
        #expect(!runs(.bookkeeping, .lockingRows, [], []))
        #expect(!runs(.bookkeeping, .lockingRows, engine, []))
    }

    @Test("a second connection takes grouped writes only when more wait than the first takes in one group, or the first is held up")
    func drainersStartWhenOneGroupIsNotEnough() {
        let limit = PostgresPool.groupLimit
        func starts(_ queued: Int, _ drainers: Int, limit drainerLimit: Int = 3, since: Duration = .milliseconds(5)) -> Bool {
            PostgresPool.startsDrainer(
                queued: queued, drainers: drainers, limit: drainerLimit, sinceTaken: since, stalledAfter: .milliseconds(100)
            )
        }
        // The first write finds nobody at work.
        #expect(starts(1, 0))
        // One at work: the queue waits for it while its next group holds them all.
        #expect(!starts(2, 1))
        #expect(!starts(limit, 1))
        #expect(starts(limit + 1, 1))
        #expect(!starts(2 * limit, 2))
        #expect(starts(2 * limit + 1, 2))
        // Held up: the one at work has not come back for more within the stall's time.
        #expect(!starts(2, 1, since: .milliseconds(100)))
        #expect(starts(2, 1, since: .milliseconds(101)))
        #expect(starts(2, 2, since: .seconds(3)))
        // Never more than the limit.
        #expect(!starts(10 * limit, 3))
        #expect(!starts(2, 3, since: .seconds(3)))
        #expect(!starts(limit + 1, 1, limit: 1))
    }
}

@Suite(
    "PostgreSQL session settings, on a server",
    .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set")
)
struct SessionSettingsOnServerTests {
    /// The value of `name` on `db` now.
    private func setting(_ name: String, _ db: any SQLConnection) throws -> String? {
        try db.query("SELECT current_setting(?) AS value", [.text(name)]).first?.column("value")?.string
    }

    @Test("a connection keeps the settings it opened with, in every transaction and once opened again; a transaction's own hold until it ends")
    func connectionKeepsItsSettings() async throws {
        try await withTemporaryPostgresDatabaseOnAThread { databaseURL in
            let db = try PostgresHandle(
                url: databaseURL, logger: PostgresTestServer.logger, settings: [("enable_seqscan", "off")]
            )
            defer { db.close() }
            #expect(try setting("enable_seqscan", db) == "off")
            #expect(try setting("plan_cache_mode", db) == "force_custom_plan")
            #expect(try setting("jit", db) == "off")

            try db.query("BEGIN")
            // Off already: nothing to send.
            try db.setLocal([("enable_seqscan", "off")])
            #expect(try setting("enable_seqscan", db) == "off")
            // On for this transaction, then off again within it: the second is sent too.
            try db.setLocal([("enable_seqscan", "on"), ("enable_hashjoin", "off")])
            #expect(try setting("enable_seqscan", db) == "on")
            #expect(try setting("enable_hashjoin", db) == "off")
            try db.setLocal([("enable_seqscan", "off")])
            #expect(try setting("enable_seqscan", db) == "off")
            try db.setLocal([("enable_seqscan", "on")])
            try db.query("COMMIT")
            db.endTransaction()

            // The transaction's own settings ended with it; the session's stay.
            try db.query("BEGIN")
            #expect(try setting("enable_seqscan", db) == "off")
            #expect(try setting("enable_hashjoin", db) == "on")
            try db.setLocal([("enable_seqscan", "on")])
            #expect(try setting("enable_seqscan", db) == "on")
            try db.query("ROLLBACK")
            db.endTransaction()

            // Reads under settings, one after another, each in a transaction of its own: each has them.
            for _ in 1...3 {
                let rows = try db.query(
                    "SELECT current_setting('enable_hashjoin') AS value", [], settings: [("enable_hashjoin", "off")]
                )
                #expect(rows.first?.column("value")?.string == "off")
                #expect(try setting("enable_hashjoin", db) == "on")
            }
            db.endTransaction()

            // A connection opened again opens with them.
            db.dropConnection()
            try db.reconnectIfNeeded()
            #expect(try setting("enable_seqscan", db) == "off")
            #expect(try setting("plan_cache_mode", db) == "force_custom_plan")
        }
    }

    @Test("a read under settings is its statement alone on a connection opened with them, a transaction of its own on another")
    func readUnderSettingsAlone() async throws {
        try await withTemporaryPostgresDatabaseOnAThread { databaseURL in
            // Alone, the statement is a transaction of its own, as the session's are (read-write); under
            // settings it sets itself, in the read-only transaction that holds them.
            let read = "SELECT current_setting('transaction_read_only') AS readOnly, current_setting('enable_seqscan') AS seqscan"
            let settings = [(name: "enable_seqscan", value: "off")]
            let opened = try PostgresHandle(url: databaseURL, logger: PostgresTestServer.logger, settings: settings)
            defer { opened.close() }
            let plain = try PostgresHandle(url: databaseURL, logger: PostgresTestServer.logger)
            defer { plain.close() }
            #expect(opened.holds(settings))
            #expect(!plain.holds(settings))
            #expect(!opened.holds(settings + [("enable_hashjoin", "off")]))
            for _ in 1...2 {
                let alone = try opened.query(read, [], settings: settings).first
                #expect(alone?.column("readonly")?.string == "off")
                #expect(alone?.column("seqscan")?.string == "off")
                let inTransaction = try plain.query(read, [], settings: settings).first
                #expect(inTransaction?.column("readonly")?.string == "on")
                #expect(inTransaction?.column("seqscan")?.string == "off")
                // The ended transaction's settings are not the session's.
                #expect(!plain.holds(settings))
            }
        }
    }

    @Test("a pool with a connection for reads under settings runs those reads there, and the others elsewhere")
    func poolReadsUnderSettings() async throws {
        try await withTemporaryPostgresDatabase { url in
            let settings = [(name: "enable_seqscan", value: "off")]
            let pool = try await PostgresPool(
                url: try PostgresDatabaseURL(url), count: 2, groupsWrites: false, readsUnder: settings, logger: PostgresTestServer.logger
            )
            do {
                for lane in ReadLane.allCases {
                    let under = try await pool.read(under: settings, in: lane) { db in
                        [db.holds(settings), try setting("enable_seqscan", db) == "off"]
                    }
                    #expect(under == [true, true])
                }
                // Settings the connection was not opened with: any connection, the read setting them itself.
                let other = try await pool.read(under: [("enable_hashjoin", "off")], in: .requests) { db in db.holds(settings) }
                #expect(other == false)
                let plain = try await pool.read { db in try setting("enable_seqscan", db) }
                #expect(plain == "on")
            } catch {
                try? await pool.close()
                throw error
            }
            try await pool.close()
        }
    }

    @Test("a read of one lane never waits behind the other lane's: the requests' reads run while a delivery read is held up")
    func readLanesAreApart() async throws {
        try await withTemporaryPostgresDatabase { url in
            let databaseURL = try PostgresDatabaseURL(url)
            let settings = [(name: "enable_seqscan", value: "off")]
            let pool = try await PostgresPool(
                url: databaseURL, count: 1, groupsWrites: false, readsUnder: settings, logger: PostgresTestServer.logger
            )
            let holder = try PostgresHandle(url: databaseURL, logger: PostgresTestServer.logger)
            defer { holder.close() }
            // Waits for this test's lock, in this test's database (other tests run beside it on the same server).
            let waitingForLock = """
                SELECT COUNT(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = 7
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                """
            do {
                _ = try holder.query("SELECT pg_advisory_lock(7)", [])
                // The delivery lane's read waits for the lock (giving up after 20 s, so that a read queued behind it, as
                // on one shared connection, would run then, and find nothing waiting).
                let held = Task {
                    try await pool.read(under: settings, in: .delivery) { db in
                        _ = try db.query("SELECT pg_advisory_xact_lock(7)", [], settings: [("lock_timeout", "20s")])
                    }
                }
                var polls = 0
                while try holder.query(waitingForLock, []).first?.column("n")?.integer == 0, polls < 1_000 {
                    try await Task.sleep(for: .milliseconds(10))
                    polls += 1
                }
                let seen = try await pool.read(under: settings, in: .requests) { db in
                    try db.query(waitingForLock, []).first?.column("n")?.integer
                }
                #expect(seen == 1)
                _ = try holder.query("SELECT pg_advisory_unlock(7)", [])
                try await held.value
            } catch {
                try? await pool.close()
                throw error
            }
            try await pool.close()
        }
    }

    @Test("the engine's bookkeeping writes run on connections opened with their settings and without waiting for the WAL's flush; the others set them")
    func bookkeepingWritesHaveTheirConnections() async throws {
        try await withTemporaryPostgresDatabase { url in
            let settings = SQLStore.engineSettings
            let pool = try await PostgresPool(
                url: try PostgresDatabaseURL(url), count: 4, bookkeepingUnder: settings, logger: PostgresTestServer.logger
            )
            do {
                func ask(_ durability: Durability, _ settings: [(name: String, value: String)]) async throws -> [String] {
                    try await pool.write(durability: durability, isolation: .lockingRows, under: settings) { db in
                        [
                            db.holds(settings) ? "held" : "set", try setting("enable_sort", db) ?? "",
                            try setting("synchronous_commit", db) ?? "",
                        ]
                    }
                }
                let bookkeeping = try await withThrowingTaskGroup(of: [String].self) { group in
                    for _ in 0..<8 { group.addTask { try await ask(.bookkeeping, settings) } }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(bookkeeping == Array(repeating: ["held", "off", "off"], count: 8))
                // Acknowledged: a connection of the others, the settings set in the transaction, the commit synced.
                #expect(try await ask(.full, settings) == ["set", "off", "on"])
                // Other settings: the others' connections too, and the engine's are not theirs.
                #expect(try await ask(.bookkeeping, [("enable_hashjoin", "off")]) == ["set", "on", "off"])
                let plain = try await pool.write(durability: .full) { db in try setting("enable_sort", db) }
                #expect(plain == "on")
                // Isolation there: what each write asks (its BEGIN says), and a write of one statement at REPEATABLE READ
                // goes alone, without BEGIN or COMMIT; elsewhere it is a transaction of its own.
                func isolation(_ durability: Durability, _ isolation: WriteIsolation) async throws -> [String] {
                    try await pool.write(durability: durability, isolation: isolation, under: settings) { db in
                        let level = try db.query("SELECT current_setting('transaction_isolation') AS level", []).first?.column("level")?.string
                        return [level ?? "", "\((db as? PostgresHandle)?.statementsInTransaction ?? -1)"]
                    }
                }
                #expect(try await isolation(.bookkeeping, .lockingRows) == ["read committed", "2"])
                #expect(try await isolation(.bookkeeping, .snapshotStatement) == ["repeatable read", "1"])
                #expect(try await isolation(.full, .snapshotStatement) == ["repeatable read", "3"])
                // A write of one statement at READ COMMITTED (the engine's claim) goes alone on the claims' connections,
                // held with the engine's settings and without waiting for the WAL's flush; elsewhere it is a transaction.
                #expect(try await isolation(.bookkeeping, .lockingStatement) == ["read committed", "1"])
                #expect(try await isolation(.full, .lockingStatement) == ["read committed", "3"])
                let claiming = try await pool.write(durability: .bookkeeping, isolation: .lockingStatement, under: settings) { db in
                    [db.holds(settings) ? "held" : "set", try setting("synchronous_commit", db) ?? ""]
                }
                #expect(claiming == ["held", "off"])
            } catch {
                try? await pool.close()
                throw error
            }
            try await pool.close()
        }
    }

    @Test("grouped writes run with their settings, alone or shared, in a pool of one or more; the other writes without them", arguments: [1, 4])
    func groupedWritesHaveTheirSettings(count: Int) async throws {
        try await withTemporaryPostgresPool(count: count) { pool, _ in
            let grouped = try await withThrowingTaskGroup(of: String?.self) { group in
                for n in 0..<20 {
                    group.addTask {
                        try await pool.write(durability: .full, isolation: .grouped(key: "k\(n)")) { db in
                            try setting("enable_seqscan", db)
                        }
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(grouped == Array(repeating: "off", count: 20))
            let planned = try await pool.write(durability: .full, isolation: .grouped(key: "k")) { db in
                try setting("plan_cache_mode", db)
            }
            #expect(planned == "auto")

            let others = try await withThrowingTaskGroup(of: [String?].self) { group in
                for _ in 0..<8 {
                    group.addTask {
                        try await pool.write(durability: .full) { db in
                            [try setting("enable_seqscan", db), try setting("plan_cache_mode", db)]
                        }
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(others == Array(repeating: ["on", "force_custom_plan"], count: 8))
            let read = try await pool.read { db in try setting("enable_seqscan", db) }
            #expect(read == "on")
        }
    }
}
