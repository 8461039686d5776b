import Foundation
import LivelineTestSupport
import Testing

@testable import LivelineStore

/// ``SQLConnection/execute(_:_:)`` sends a statement without waiting on PostgreSQL; a write must fail all the same
/// when such a statement fails, and commit nothing of itself.
@Suite("Statements sent without waiting")
struct PipelinedStatementTests {
    private func scratch(_ store: SQLStore) async throws {
        _ = try await store.transaction { db in
            try db.query("CREATE TABLE scratch (n INTEGER NOT NULL)", [])
        }
    }

    private func scratchCount(_ store: SQLStore) async throws -> Int {
        try await store.reader.query("SELECT COUNT(*) AS n FROM scratch").first?.column("n")?.integer ?? -1
    }

    @Test("a failed statement sent without waiting fails the write, and what the write sent before it is not committed", arguments: StoreKind.available)
    func failureFailsTheWrite(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await scratch(store)
            await #expect(throws: (any Error).self) {
                try await store.transaction { db in
                    try db.execute("INSERT INTO scratch (n) VALUES (1)", [])
                    try db.execute("INSERT INTO scratch (n) VALUES (NULL)", [])  // NOT NULL
                    try db.execute("INSERT INTO scratch (n) VALUES (2)", [])
                }
            }
            #expect(try await scratchCount(store) == 0)
            // The connection is fine afterwards.
            try await store.transaction { db in try db.execute("INSERT INTO scratch (n) VALUES (3)", []) }
            #expect(try await scratchCount(store) == 1)
        }
    }

    /// PostgreSQL only: SQLite fails a statement alone, and a write that swallows its error goes on.
    @Test("on PostgreSQL a write that swallows the error its next statement reports still fails", arguments: StoreKind.available.filter { $0 == .postgres })
    func swallowedFailureStillFails(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await scratch(store)
            await #expect(throws: (any Error).self) {
                try await store.transaction { db in
                    try db.execute("INSERT INTO scratch (n) VALUES (1)", [])
                    do {
                        try db.execute("INSERT INTO scratch (n) VALUES (NULL)", [])
                        _ = try db.query("SELECT COUNT(*) AS n FROM scratch", [])
                    } catch {
                        // Swallowed: the transaction is aborted all the same, and its COMMIT only rolls it back.
                    }
                }
            }
            #expect(try await scratchCount(store) == 0)
        }
    }

    @Test("statements sent without waiting run in order, and a read after them sees them", arguments: StoreKind.available)
    func order(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await scratch(store)
            let seen = try await store.transaction { db in
                for n in 1...50 { try db.execute("INSERT INTO scratch (n) VALUES (?)", [.integer(n)]) }
                try db.execute("DELETE FROM scratch WHERE n > ?", [.integer(40)])
                return try db.query("SELECT COUNT(*) AS n, MAX(n) AS top FROM scratch", []).first.map {
                    [$0.column("n")?.integer, $0.column("top")?.integer]
                }
            }
            #expect(seen == [40, 40])
            #expect(try await scratchCount(store) == 40)
        }
    }

    /// PostgreSQL only: SQLite has no such settings, and `setLocal` does nothing there.
    @Test("on PostgreSQL a write's settings hold for its transaction only; one PostgreSQL refuses fails the write", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
    func settingsHoldForTheTransaction() async throws {
        // One connection: each write below runs on the one before's.
        try await withTemporaryPostgresPool(count: 1) { pool, _ in
            _ = try await pool.write(durability: .full) { db in try db.query("CREATE TABLE scratch (n INTEGER NOT NULL)") }
            let inside = try await pool.write(durability: .full) { db in
                try db.setLocal([("enable_seqscan", "off"), ("enable_hashjoin", "off")])
                try db.execute("INSERT INTO scratch (n) VALUES (1)", [])
                return try db.query("SELECT current_setting('enable_seqscan') AS s, current_setting('enable_hashjoin') AS h")
                    .first.map { [$0.column("s")?.string, $0.column("h")?.string] }
            }
            #expect(inside == ["off", "off"])
            let after = try await pool.write(durability: .full) { db in
                try db.query("SELECT current_setting('enable_seqscan') AS s").first?.column("s")?.string
            }
            #expect(after == "on", "a write's setting stays out of the next write on its connection")
            await #expect(throws: (any Error).self) {
                try await pool.write(durability: .full) { db in
                    try db.setLocal([("enable_seqscan", "perhaps")])
                    try db.execute("INSERT INTO scratch (n) VALUES (2)", [])
                }
            }
            let count = try await pool.read { db in try db.query("SELECT COUNT(*) AS n FROM scratch").first?.column("n")?.integer }
            #expect(count == 1, "nothing of the write whose setting was refused is committed")
        }
    }
}
