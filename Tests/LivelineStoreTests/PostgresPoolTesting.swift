import Foundation
import LivelineTestSupport
import MetricsTestKit

@testable import LivelineStore

/// Runs `body` with a pool of `count` connections to a fresh PostgreSQL database (its grouped writes' connections
/// starting after `stalledAfter`) and the metrics it reports, and closes the pool afterwards, whether `body` succeeded
/// or threw.
func withTemporaryPostgresPool(
    count: Int, stalledAfter: Duration = PostgresPool.groupStalledAfter, _ body: (PostgresPool, TestMetrics) async throws -> Void
) async throws {
    try await withTemporaryPostgresDatabase { url in
        let metrics = TestMetrics()
        let pool = try await PostgresPool(
            url: try PostgresDatabaseURL(url), count: count, stalledAfter: stalledAfter, logger: PostgresTestServer.logger,
            metrics: StoreCommitMetrics(factory: metrics)
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

/// Runs `body` with the URL of a fresh PostgreSQL database, on a thread of its own: a ``PostgresHandle`` waits for its
/// answers, so it is used off the cooperative pool.
func withTemporaryPostgresDatabaseOnAThread(_ body: @escaping @Sendable (PostgresDatabaseURL) throws -> Void) async throws {
    try await withTemporaryPostgresDatabase { url in
        let databaseURL = try PostgresDatabaseURL(url)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            Thread.detachNewThread {
                do {
                    try body(databaseURL)
                    continuation.resume()
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }
}
