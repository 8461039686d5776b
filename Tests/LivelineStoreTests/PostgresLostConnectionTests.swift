import Foundation
import LivelineTestSupport
import MetricsTestKit
import NIOCore
import Synchronization
import Testing

@testable import LivelineStore

/// A connection lost mid-transaction, made so on purpose: the backend ends itself (`pg_terminate_backend` of its own
/// pid, as an operator or a server shutdown would), before the COMMIT or, from a deferred trigger, at it.
@Suite("PostgreSQL connections lost mid-transaction", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct PostgresLostConnectionTests {
    /// Ends the connection it runs on. The server reports it (SQLSTATE 57P01) and closes the connection.
    static let endThisConnection = "SELECT pg_terminate_backend(pg_backend_pid())"

    @Test("a write whose connection is lost before its COMMIT runs again on a new connection, and is committed once")
    func writeBeforeCommit() async throws {
        try await withTemporaryPostgresPool(count: 1) { pool, metrics in
            _ = try await pool.write(durability: .full) { db in try db.query("CREATE TABLE t (attempt BIGINT NOT NULL)") }
            let attempts = Attempts()
            let result = try await pool.write(durability: .full) { db in
                let attempt = attempts.next()
                try db.query("INSERT INTO t (attempt) VALUES (?)", [.integer(attempt)])
                if attempt == 1 { try db.query(Self.endThisConnection) }
                return attempt
            }
            #expect(result == 2)
            let rows = try await pool.read { db in try db.query("SELECT attempt FROM t").map { $0.column("attempt")?.integer } }
            #expect(rows == [2], "the lost attempt's insert was rolled back")
            let retries = metrics.counters(label: StoreCommitMetrics.writeRetriesName, dimensions: [("sqlstate", "57P01")])
            #expect(retries.map(\.totalValue).reduce(0, +) == 1)
        }
    }

    @Test("grouped writes whose shared connection is lost before the COMMIT all run again; each is committed once")
    func groupBeforeCommit() async throws {
        try await withTemporaryPostgresPool(count: 2) { pool, _ in
            _ = try await pool.write(durability: .full) { db in try db.query("CREATE TABLE t (k BIGINT NOT NULL)") }
            let attempts = Attempts()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for k in 0..<24 {
                    group.addTask {
                        try await pool.write(durability: .full, isolation: .grouped(key: "k\(k)")) { db in
                            try db.query("INSERT INTO t (k) VALUES (?)", [.integer(k)])
                            if k == 7, attempts.next() == 1 { try db.query(Self.endThisConnection) }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let keys = try await pool.read { db in try db.query("SELECT k FROM t ORDER BY k").compactMap { $0.column("k")?.integer } }
            #expect(keys == Array(0..<24))
            #expect(attempts.count == 2)
        }
    }

    @Test("a read whose connection is lost runs again on a new connection")
    func read() async throws {
        try await withTemporaryPostgresPool(count: 1) { pool, _ in
            let attempts = Attempts()
            let answer = try await pool.read { db in
                if attempts.next() == 1 { try db.query(Self.endThisConnection) }
                return try db.query("SELECT 41 + 1 AS n").first?.column("n")?.integer
            }
            #expect(answer == 42)
            #expect(attempts.count == 2)
        }
    }

    @Test("a write whose connection is lost at its COMMIT fails as perhaps committed, and is not run again")
    func atCommit() async throws {
        try await withTemporaryPostgresPool(count: 2) { pool, _ in
            // A deferred constraint trigger runs at the COMMIT: this one ends the connection there.
            try await pool.write(durability: .full) { db in
                try db.query("CREATE TABLE t (k BIGINT NOT NULL)")
                try db.query(
                    """
                    CREATE FUNCTION end_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); RETURN NULL; END $$
                    """
                )
                try db.query(
                    "CREATE CONSTRAINT TRIGGER ends_at_commit AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION end_at_commit()"
                )
            }
            for isolation in [WriteIsolation.serializable, .grouped(key: "k")] {
                let attempts = Attempts()
                do {
                    try await pool.write(durability: .full, isolation: isolation) { db in
                        _ = attempts.next()
                        try db.query("INSERT INTO t (k) VALUES (1)")
                    }
                    Issue.record("the write was answered as committed")
                } catch let failure as PostgresFailure {
                    #expect(failure.isCommitUnknown && failure.isConnectionLost, "\(failure)")
                }
                #expect(attempts.count == 1, "a write perhaps committed is never run twice")
            }
            // The pool's connections work again.
            #expect(try await pool.read { db in try db.query("SELECT count(*) AS n FROM t").first?.column("n")?.integer } == 0)
        }
    }

    @Test("a database the server does not have: the server's refusal, the server named, not taken for a lost connection")
    func refusedByTheServer() async throws {
        let url = try PostgresDatabaseURL(#require(PostgresTestServer.url)).with(database: "liveline_no_such_database")
        do {
            _ = try await PostgresPool(url: url, count: 1, logger: PostgresTestServer.logger)
            Issue.record("a pool opened on a database that does not exist")
        } catch let failure as PostgresFailure {
            #expect(failure.sqlState == "3D000" && !failure.isConnectionLost, "\(failure)")
            #expect(failure.message.contains("\(url)") && failure.message.contains("does not exist"), "\(failure)")
        }
    }

    @Test("the failures that say a connection was lost")
    func lostConnectionStates() {
        for state in ["57P01", "57P02", "57P03", "08006", "08003"] { #expect(PostgresFailure.endsTheConnection(state)) }
        for state in ["40001", "23505", "57014", nil] { #expect(!PostgresFailure.endsTheConnection(state)) }
        #expect(!PostgresFailure(sqlState: "40001", message: "").isConnectionLost)
        // The socket's or the channel's own failure, passed on bare (a reset as the server went away): lost, not a 500.
        for error: any Error in [IOError(errnoCode: ECONNRESET, reason: "read(descriptor:pointer:size:)"), ChannelError.ioOnClosedChannel, ChannelError.eof] {
            #expect(PostgresFailure(reported: error)?.isConnectionLost == true, "\(error)")
        }
        #expect(PostgresFailure(reported: ChannelError.operationUnsupported) == nil)
        let unknown = PostgresFailure.commitUnknown(PostgresFailure(sqlState: nil, message: "closed", isConnectionLost: true))
        #expect(unknown.isCommitUnknown && unknown.sqlState == PostgresFailure.connectionFailure && !unknown.isRetryable)
    }
}

/// Counts a body's runs across the pool's threads.
private final class Attempts: Sendable {
    private let runs = Mutex(0)

    /// This run's number, from 1.
    func next() -> Int {
        runs.withLock { runs in
            runs += 1
            return runs
        }
    }

    var count: Int { runs.withLock { $0 } }
}
