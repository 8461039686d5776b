import Foundation
import LivelineTestSupport
import MetricsTestKit
import Testing

@testable import LivelineStore

/// `liveline_store_write_duration_seconds`: every write the Store hands a writer is timed once, from its call until its
/// caller has the outcome, whichever of the writer's paths it takes (the entry points that hand a write on to another
/// must not time it twice).
@Suite("The Store's write times, once a write")
struct WriteDurationMetricsTests {
    private struct Refused: Error {}

    /// How long a write's body holds its transaction (seconds), so that the time recorded has a floor the test can check.
    private static let hold = 0.03

    private func writeTimes(_ metrics: TestMetrics, _ durability: String) throws -> [Int64] {
        try metrics.expectTimer(StoreCommitMetrics.writeDurationName, [("durability", durability)]).values
    }

    @Test("SQLite: a write, one that fails, one of statements and a bookkeeping write in parts are each timed once, waits included")
    func sqlite() async throws {
        try await withTemporaryDirectory(prefix: "liveline-write-times") { directory in
            let metrics = TestMetrics()
            let writer = try SQLiteWriter(path: directory.appendingPathComponent("store.sqlite").path, metrics: StoreCommitMetrics(factory: metrics))
            do {
                try await writer.write { db in try db.execute("CREATE TABLE scratch (n INTEGER)", []) }
                try await writer.write(durability: .full) { db in
                    Thread.sleep(forTimeInterval: Self.hold)
                    try db.execute("INSERT INTO scratch (n) VALUES (1)", [])
                }
                await #expect(throws: Refused.self) { try await writer.write(durability: .full) { _ in throw Refused() } }
                // One transaction of statements, through the writer's default path (`writeInOneTransaction`).
                try await writer.writeStatements(
                    parts: [[(sql: "INSERT INTO scratch (n) VALUES (2)", binds: [])]], durability: .full, isolation: .serializable, settings: []
                )
                // A bookkeeping write of several parts, on the writer's own path for them.
                try await writer.writeStatements(
                    parts: [[(sql: "INSERT INTO scratch (n) VALUES (3)", binds: [])], [(sql: "INSERT INTO scratch (n) VALUES (4)", binds: [])]],
                    durability: .bookkeeping, isolation: .serializable, settings: []
                )
                let full = try writeTimes(metrics, "full")
                #expect(full.count == 4, "\(full)")
                #expect(full.count > 1 && full[1] >= Int64(Self.hold * 1e9), "the held write: \(full) ns")
                #expect(try writeTimes(metrics, "bookkeeping").count == 1)
                let rows = try await writer.write { db in try db.query("SELECT count(*) AS n FROM scratch", []).first?.column("n")?.integer }
                #expect(rows == 4)
                #expect(try writeTimes(metrics, "full").count == 5)
            } catch {
                try? await writer.close()
                throw error
            }
            try await writer.close()
        }
    }

    @Test(
        "PostgreSQL: a grouped write, a write alone, one of statements and one under settings are each timed once",
        .enabled(if: StoreKind.available.contains(.postgres))
    )
    func postgres() async throws {
        try await withTemporaryPostgresPool(count: 2) { pool, metrics in
            _ = try await pool.write(durability: .full) { db in try db.query("CREATE TABLE scratch (n BIGINT)") }
            // A grouped write queues for a group's connection.
            _ = try await pool.write(durability: .full, isolation: .grouped(key: WriteIsolation.groupKey("app", "a"))) { db in
                try db.query("INSERT INTO scratch (n) VALUES (1)")
            }
            // Statements, and a write under settings: both handed on to the write above.
            try await pool.writeStatements(
                parts: [[(sql: "INSERT INTO scratch (n) VALUES (2)", binds: [])]], durability: .full, isolation: .serializable, settings: []
            )
            _ = try await pool.write(durability: .bookkeeping, isolation: .lockingRows, under: [("lock_timeout", "5s")]) { db in
                try db.query("INSERT INTO scratch (n) VALUES (3)")
            }
            #expect(try writeTimes(metrics, "full").count == 3)
            #expect(try writeTimes(metrics, "bookkeeping").count == 1)
            let rows = try await pool.read { db in try db.query("SELECT count(*) AS n FROM scratch").first?.column("n")?.integer }
            #expect(rows == 3)
        }
    }
}
