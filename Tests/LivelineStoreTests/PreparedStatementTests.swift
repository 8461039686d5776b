import Foundation
import LivelineTestSupport
import PostgresNIO
import SQLiteNIO
import Testing

@testable import LivelineStore

/// A statement said again on one PostgreSQL connection is prepared, and then bound, planned and run without being parsed
/// again: what it answers and how it fails must not change.
@Suite("PostgreSQL prepared statements", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct PreparedStatementTests {
    /// A connection of its own to a fresh database, closed afterwards. The handle waits, so it runs off the cooperative pool.
    private func withHandle(_ body: @escaping @Sendable (PostgresHandle) throws -> Void) async throws {
        try await withTemporaryPostgresDatabaseOnAThread { databaseURL in
            let handle = try PostgresHandle(url: databaseURL, logger: PostgresTestServer.logger)
            defer { handle.close() }
            try body(handle)
        }
    }

    /// How many statements this connection has prepared, as PostgreSQL counts them.
    private func preparedCount(_ db: PostgresHandle) throws -> Int {
        // Itself not counted: said again, it is prepared too.
        try db.query("SELECT COUNT(*) AS n FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'", [])
            .first?.column("n")?.integer ?? -1
    }

    @Test("the second call prepares the statement, later calls reuse it, and every call answers alike")
    func preparedOnSecondCall() async throws {
        try await withHandle { db throws in
            for n in 1...5 {
                let row = try db.query("SELECT ? + 1 AS n, ? AS label, ? AS ratio, ? AS bytes", [
                    .integer(n), .text("call \(n)"), .float(Double(n) / 2), .blob(ByteBuffer(bytes: [UInt8(n), 0, 255])),
                ]).first
                #expect(row?.column("n")?.integer == n + 1)
                #expect(row?.column("label")?.string == "call \(n)")
                #expect(row?.column("ratio")?.double == Double(n) / 2)
                #expect(row?.column("bytes")?.blob == ByteBuffer(bytes: [UInt8(n), 0, 255]))
                // Not after the first call; once from the second on.
                #expect(try preparedCount(db) == (n == 1 ? 0 : 1))
            }
            // The same text bound to other types is another statement; NULL takes the type PostgreSQL infers.
            for _ in 1...2 {
                let row = try db.query("SELECT ? + 1 AS n, ? AS label, ? AS ratio, ? AS bytes", [.integer(1), .null, .float(1), .null]).first
                #expect(row?.column("n")?.integer == 2)
                #expect(row?.column("label")?.isNull == true && row?.column("bytes")?.isNull == true)
            }
            #expect(try preparedCount(db) == 2)
        }
    }

    @Test("prepared statements are planned for each call's values, so partial indexes naming values stay usable")
    func customPlans() async throws {
        try await withHandle { db throws in
            #expect(try db.query("SHOW plan_cache_mode", []).first?.column("plan_cache_mode")?.string == "force_custom_plan")
        }
    }

    @Test("a prepared statement fails as an unprepared one does: its SQLSTATE decides whether the write runs again")
    func failuresKeepTheirState() async throws {
        try await withHandle { db throws in
            try db.query("CREATE TABLE scratch (id BIGINT PRIMARY KEY, label TEXT NOT NULL)", [])
            try db.query("INSERT INTO scratch (id, label) VALUES (?, ?)", [.integer(1), .text("one")])
            try db.query("INSERT INTO scratch (id, label) VALUES (?, ?)", [.integer(2), .text("two")])
            #expect(try preparedCount(db) == 1)
            do {
                try db.query("INSERT INTO scratch (id, label) VALUES (?, ?)", [.integer(1), .text("again")])
                Issue.record("a duplicate key was accepted")
            } catch let failure as PostgresFailure {
                #expect(failure.sqlState == "23505" && failure.isRetryable)
            }
            // A failure in a transaction: the prepared statement sent without waiting reports it at the next settling,
            // and a ROLLBACK leaves the statement usable.
            try db.query("BEGIN", [])
            try db.execute("INSERT INTO scratch (id, label) VALUES (?, ?)", [.integer(2), .text("dup")])
            #expect(throws: PostgresFailure.self) { try db.settle() }
            try db.query("ROLLBACK", [])
            db.endTransaction()
            try db.query("INSERT INTO scratch (id, label) VALUES (?, ?)", [.integer(3), .text("three")])
            #expect(try db.query("SELECT COUNT(*) AS n FROM scratch", []).first?.column("n")?.integer == 3)
        }
    }

    @Test("a query without values is prepared too, and keeps its one plan; commands such as BEGIN and COMMIT are not")
    func preparedWithoutValues() async throws {
        try await withHandle { db throws in
            for n in 1...3 {
                try db.query("BEGIN", [])
                #expect(try db.query("SELECT 41 + 1 AS n", []).first?.column("n")?.integer == 42)
                try db.query("COMMIT", [])
                #expect(try preparedCount(db) == (n == 1 ? 0 : 1))
            }
        }
    }

    @Test("a read under settings has them in force, leaves none behind, and ends its transaction also when it fails")
    func readUnderSettings() async throws {
        try await withHandle { db throws in
            let setting = "SELECT current_setting('enable_seqscan') AS s"
            // Outside a transaction block, PostgreSQL refuses a savepoint.
            func expectOutsideATransaction() {
                #expect(throws: (any Error).self) { try db.query("SAVEPOINT probe", []) }
                db.endTransaction()
            }
            for _ in 1...3 {
                #expect(try db.query(setting, [], settings: [("enable_seqscan", "off")]).first?.column("s")?.string == "off")
                #expect(try db.query(setting, []).first?.column("s")?.string == "on")
                expectOutsideATransaction()
            }
            #expect(throws: (any Error).self) { try db.query("SELECT 1 / 0 AS n", [], settings: [("enable_seqscan", "off")]) }
            // As a pool's read ends, whatever its outcome.
            db.endTransaction()
            expectOutsideATransaction()
            #expect(try db.query("SELECT 41 + 1 AS n", []).first?.column("n")?.integer == 42)
        }
    }

    @Test("the statements PostgreSQL plans are told apart from commands by their first word")
    func plannedStatements() {
        for sql in ["SELECT MIN(due) AS due FROM t", "\n    WITH x AS (SELECT 1) SELECT * FROM x", "insert into t VALUES (1)",
                    "UPDATE t SET a = 1", "DELETE FROM t", "SELECT(1)"] {
            #expect(PostgresHandle.isPlanned(sql), "\(sql)")
        }
        for sql in ["BEGIN ISOLATION LEVEL READ COMMITTED", "COMMIT", "ROLLBACK", "CREATE TABLE t (a int)", "DO $$ BEGIN END $$",
                    "SET plan_cache_mode = auto", ""] {
            #expect(!PostgresHandle.isPlanned(sql), "\(sql)")
        }
    }

    @Test("at most preparedLimit statements are prepared on a connection; others still run, unprepared")
    func limit() async throws {
        try await withHandle { db throws in
            let statements = PostgresHandle.preparedLimit + 20
            for round in 0..<2 {
                for index in 0..<statements {
                    let sql = "SELECT ? + \(index) AS n"
                    #expect(try db.query(sql, [.integer(round)]).first?.column("n")?.integer == round + index)
                }
            }
            #expect(try preparedCount(db) == PostgresHandle.preparedLimit)
        }
    }

    @Test("a connection opened again after the server closed it prepares its statements anew")
    func afterReconnect() async throws {
        try await withHandle { db throws in
            for _ in 1...3 { try db.query("SELECT ? AS n", [.integer(7)]) }
            #expect(try preparedCount(db) == 1)
            // The connection's own backend ends it, as a server restart would.
            _ = try? db.query("SELECT pg_terminate_backend(pg_backend_pid())", [])
            // The client sees the end a moment later (longer on a loaded machine).
            let deadline = Date().addingTimeInterval(20)
            while !db.isConnectionLost, Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
            #expect(db.isConnectionLost)
            try db.reconnectIfNeeded()
            #expect(try db.query("SELECT ? AS n", [.integer(8)]).first?.column("n")?.integer == 8)
            #expect(try db.query("SELECT ? AS n", [.integer(9)]).first?.column("n")?.integer == 9)
            #expect(try preparedCount(db) == 1)
        }
    }

    @Test("a statement written to a connection that has closed fails as lost instead of waiting for an answer that never comes")
    func statementAfterTheClose() async throws {
        try await withTemporaryPostgresDatabase { url in
            let connection = try await PostgresConnection.connect(
                configuration: try PostgresDatabaseURL(url).configuration(), id: 1, logger: PostgresTestServer.logger
            )
            try await connection.close()
            // The channel's handlers are gone: PostgresNIO's write fails at the pipeline's head, and its failure is dropped.
            let query: PostgresQuery = "SELECT 1"
            let raw = connection.query(query, logger: PostgresTestServer.logger).map(\.rows)
            let guarded = LostAnswers(connection).guarding(raw)
            let outcome: Result<[PostgresRow], any Error> = await withTaskGroup(of: Result<[PostgresRow], any Error>?.self) { group in
                group.addTask {
                    do { return .success(try await guarded.get()) } catch { return .failure(error) }
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(30))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first ?? .success([])
            }
            guard case .failure(let error) = outcome else {
                Issue.record("the statement was answered, or not failed within 30 s")
                return
            }
            #expect(PostgresFailure(reported: error)?.isConnectionLost == true, "\(error)")
        }
    }


    @Test("an answer awaited when the connection closes fails as lost; one that came stays as it came")
    func answersAwaitedAtTheClose() async throws {
        try await withTemporaryPostgresDatabase { url in
            let connection = try await PostgresConnection.connect(
                configuration: try PostgresDatabaseURL(url).configuration(), id: 1, logger: PostgresTestServer.logger
            )
            let answers = LostAnswers(connection)
            // An answer that never comes, as a statement written after the close gets, and one that came.
            let never = connection.eventLoop.makePromise(of: Int.self)
            let awaited = answers.guarding(never.futureResult)
            let came = answers.guarding(connection.eventLoop.makeSucceededFuture(7))
            #expect(try await came.get() == 7)
            try await connection.close()
            await #expect(throws: ChannelError.self) { try await awaited.get() }
            #expect(try await came.get() == 7)
            never.succeed(1)
        }
    }

}
