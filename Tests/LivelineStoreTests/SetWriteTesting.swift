import Foundation
@testable import LivelineStore
import LivelineTestSupport
import MetricsTestKit
import Testing

// Helpers for the tests of writes queued together (``SetWrite``) on either store.

/// Holds the store's one write connection (SQLite's writer) with a write that waits for a gate, runs `writes` once
/// each is queued behind it, then opens the gate and returns their outcomes in order.
func queuedTogether<T: Sendable>(
    _ store: SQLStore, queued: @escaping @Sendable () -> Int, _ writes: [@Sendable () async throws -> T]
) async throws -> [Result<T, any Error>] {
    let gate = DispatchSemaphore(value: 0)
    let holding = GroupCommitTests.Flag()
    return try await withThrowingTaskGroup(of: (Int, Result<T, any Error>)?.self) { group in
        group.addTask {
            try await store.writer.write(durability: .full) { _ in
                holding.value.store(true, ordering: .releasing)
                gate.wait()
            }
            return nil
        }
        while !holding.value.load(ordering: .acquiring) { try await Task.sleep(for: .milliseconds(5)) }
        for (index, write) in writes.enumerated() {
            group.addTask {
                do { return (index, .success(try await write())) } catch { return (index, .failure(error)) }
            }
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while queued() < writes.count, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        gate.signal()
        var outcomes: [Int: Result<T, any Error>] = [:]
        for try await outcome in group {
            if let (index, result) = outcome { outcomes[index] = result }
        }
        return writes.indices.map { outcomes[$0]! }
    }
}

/// Runs `body` on a store of `kind` whose writes go through one connection, with a way to count the writes queued for
/// it, and the metrics of PostgreSQL's writer.
func withOneWriter(
    _ kind: StoreKind, _ body: (SQLStore, @escaping @Sendable () -> Int, TestMetrics?) async throws -> Void
) async throws {
    switch kind {
    case .sqlite:
        try await withTemporaryStore(.sqlite) { store, _ in
            let writer = try #require(store.writer as? SQLiteWriter)
            try await body(store, { writer.queuedWrites }, nil)
        }
    case .postgres:
        try await withTemporaryPostgresDatabase { url in
            let metrics = TestMetrics()
            let writer = try await PostgresPool(
                url: try PostgresDatabaseURL(url), count: 1, logger: PostgresTestServer.logger,
                metrics: StoreCommitMetrics(factory: metrics)
            )
            let reader = try await PostgresPool(url: try PostgresDatabaseURL(url), count: 2, logger: PostgresTestServer.logger)
            let store = SQLStore(dialect: .postgres, location: url, writer: writer, reader: reader)
            do {
                try await store.migrate(logger: PostgresTestServer.logger)
                try await body(store, { writer.queuedGroupedWrites }, metrics)
            } catch {
                try? await store.close()
                throw error
            }
            try await store.close()
        }
    }
}
