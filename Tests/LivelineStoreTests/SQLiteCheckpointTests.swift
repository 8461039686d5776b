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
            #expect((store.writer as! SQLiteWriter).checkpointsByWriter == 0, "the WAL never reached the writer's limit")
            let wal = try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int ?? 0
            #expect(wal > 1500 * 3000 && wal < 3 * 1500 * 4200, "the WAL holds about one round, not five: \(wal) bytes")
            let rows = try await store.transaction(durability: .full) { db in try db.query("SELECT count(*) AS n FROM scratch").first?.column("n")?.integer }
            #expect(rows == 7500)
        }
    }

    /// The size of the WAL beside the database at `path`, in bytes.
    private func walSize(_ path: String) throws -> Int {
        try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int ?? 0
    }

    /// Commits `writes` writes of about `pages` pages each, one after another, on a writer of its own at `path` with
    /// the given checkpoint threshold and WAL limit; returns the WAL's largest size after a commit and the writer's
    /// checkpoints.
    private func writeInTurn(
        at path: String, writes: Int, pages: Int, checkpointThreshold: Int, walLimit: Int
    ) async throws -> (largestWAL: Int, byWriter: Int, rows: Int?) {
        let writer = try SQLiteWriter(path: path, checkpointThreshold: checkpointThreshold, walLimit: walLimit)
        do {
            try await writer.write { db in try db.execute("CREATE TABLE scratch (b BLOB)", []) }
            var largest = 0
            for _ in 0..<writes {
                try await writer.write { db in
                    try db.execute(
                        """
                        INSERT INTO scratch (b) SELECT randomblob(3000)
                        FROM (WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) SELECT x FROM n)
                        """,
                        [.integer(pages)]
                    )
                }
                largest = max(largest, try walSize(path))
            }
            let rows = try await writer.write { db in try db.query("SELECT count(*) AS n FROM scratch", []).first?.column("n")?.integer }
            let byWriter = writer.checkpointsByWriter
            try await writer.close()
            return (largest, byWriter, rows)
        } catch {
            try? await writer.close()
            throw error
        }
    }

    @Test("under writes that leave the checkpointer no pause, the writer copies the rest past its limit and the WAL starts over")
    func writerBoundsTheWAL() async throws {
        try await withTemporaryDirectory(prefix: "liveline-wal") { directory in
            // The checkpointer never runs here (its threshold is out of reach), as when it never catches up with the
            // writes: what keeps the WAL small is the writer's own checkpoint past 500 pages. Twelve writes of 200 pages.
            let bounded = try await writeInTurn(
                at: directory.appendingPathComponent("bounded.sqlite").path, writes: 12, pages: 200, checkpointThreshold: .max, walLimit: 500)
            #expect(bounded.rows == 2400)
            #expect(bounded.byWriter >= 3, "the writer checkpointed every three writes or so: \(bounded.byWriter)")
            #expect(bounded.largestWAL < (500 + 200 + 50) * 4200, "the WAL held its limit and one write at most: \(bounded.largestWAL) bytes")
            // Without the limit the WAL holds every write.
            let unbounded = try await writeInTurn(
                at: directory.appendingPathComponent("unbounded.sqlite").path, writes: 12, pages: 200, checkpointThreshold: .max, walLimit: .max)
            #expect(unbounded.byWriter == 0)
            #expect(unbounded.largestWAL > 2400 * 3000, "\(unbounded.largestWAL) bytes")
        }
    }
}
