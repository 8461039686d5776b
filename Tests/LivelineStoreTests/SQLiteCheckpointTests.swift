import Foundation
import LivelineTestSupport
import Testing

@testable import LivelineStore

@Suite("The writer's WAL, checkpointed on a thread of its own")
struct SQLiteCheckpointTests {
    /// Commits about `pages` pages of new rows in one write.
    private func fill(_ store: SQLStore, pages: Int) async throws {
        try await store.transaction(statements: [(
            sql: """
                INSERT INTO scratch (b) SELECT randomblob(3000)
                FROM (WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) SELECT x FROM n)
                """,
            binds: [.integer(pages)]
        )])
    }

    private func checkpoints(_ store: SQLStore) -> Int { (store.writer as! SQLiteWriter).checkpoints }

    @Test("the writer never checkpoints; past 1,000 pages the checkpointer does, and the WAL is written again from its start")
    func checkpointsApart() async throws {
        try await withTemporaryStore { store, path in
            let automatic = try await store.transaction(durability: .full) { db in
                try db.query("PRAGMA wal_autocheckpoint").first?.column("wal_autocheckpoint")?.integer
            }
            #expect(automatic == 0, "the writer's own connection does not checkpoint")
            _ = try await store.write("CREATE TABLE scratch (b BLOB)", [])
            #expect(checkpoints(store) == 0)
            // Each round adds 1,500 pages (6 MB): past the threshold, so the checkpointer copies them into the database,
            // and the next round's write starts the WAL over rather than growing it.
            for round in 1...5 {
                try await fill(store, pages: 1500)
                let deadline = ContinuousClock.now + .seconds(60)
                while checkpoints(store) < round, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
                #expect(checkpoints(store) >= round, "round \(round)")
            }
            let wal = try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int ?? 0
            #expect(wal > 1500 * 3000 && wal < 3 * 1500 * 4200, "the WAL holds about one round, not five: \(wal) bytes")
            let rows = try await store.transaction(durability: .full) { db in try db.query("SELECT count(*) AS n FROM scratch").first?.column("n")?.integer }
            #expect(rows == 7500)
        }
    }
}
