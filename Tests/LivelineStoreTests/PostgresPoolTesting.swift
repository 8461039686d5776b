import LivelineTestSupport
import MetricsTestKit

@testable import LivelineStore

/// Runs `body` with a pool of `count` connections to a fresh PostgreSQL database and the metrics it reports, and closes
/// the pool afterwards, whether `body` succeeded or threw.
func withTemporaryPostgresPool(count: Int, _ body: (PostgresPool, TestMetrics) async throws -> Void) async throws {
    try await withTemporaryPostgresDatabase { url in
        let metrics = TestMetrics()
        let pool = try await PostgresPool(
            url: try PostgresDatabaseURL(url), count: count, logger: PostgresTestServer.logger, metrics: StoreCommitMetrics(factory: metrics)
        )
        do {
            try await body(pool, metrics)
        } catch {
            try? await pool.close()
            throw error
        }
        try await pool.close()
    }
}
