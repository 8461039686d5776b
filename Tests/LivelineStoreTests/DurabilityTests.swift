import Foundation
import LivelineTestSupport
import Testing

@testable import LivelineStore

@Suite("Commit durability on the writer")
struct DurabilityTests {
    /// The writer's `synchronous` setting: 2 is FULL, 1 is NORMAL.
    private func synchronous(_ store: SQLiteStore) async throws -> Int? {
        try await store.writer.query("PRAGMA synchronous").get().first?.column("synchronous")?.integer
    }

    @Test("a bookkeeping transaction commits with synchronous NORMAL and leaves the writer at FULL")
    func bookkeepingIsLoweredThenRestored() async throws {
        try await withTemporaryStore { store, _ in
            #expect(try await synchronous(store) == 2)
            let during = try await store.chainedTransaction(durability: .bookkeeping) { writer in
                writer.query("PRAGMA synchronous").map { $0.first?.column("synchronous")?.integer }
            }
            #expect(during == 1)
            #expect(try await synchronous(store) == 2)
            let full = try await store.chainedTransaction { writer in
                writer.query("PRAGMA synchronous").map { $0.first?.column("synchronous")?.integer }
            }
            #expect(full == 2)
        }
    }

    @Test("a bookkeeping transaction that fails is rolled back and still leaves the writer at FULL")
    func failedBookkeepingRestores() async throws {
        try await withTemporaryStore { store, _ in
            await #expect(throws: (any Error).self) {
                try await store.transaction(
                    statements: [
                        (sql: "CREATE TABLE scratch (x INTEGER)", binds: []),
                        (sql: "INSERT INTO no_such_table VALUES (1)", binds: []),
                    ],
                    durability: .bookkeeping
                )
            }
            #expect(try await synchronous(store) == 2)
            let scratch = try await store.writer.query("SELECT name FROM sqlite_master WHERE name = 'scratch'").get()
            #expect(scratch.isEmpty, "rolled back")
        }
    }
}
