import Foundation
import Logging
import NIOPosix
import Synchronization

/// Connections to PostgreSQL, each lent to one thread at a time: the Store's writes and reads run on them.
///
/// A write is one transaction, run again (after a short, random pause) when PostgreSQL reports a serialization
/// failure, a deadlock or a key another transaction inserted first. By default it runs at `SERIALIZABLE` isolation, so
/// the Store's logic, written for SQLite's single writer, keeps its meaning with many writers on many nodes: every
/// committed write is as if the writes had run one after another. The hottest writes (registrations, updates) run at
/// `READ COMMITTED` and lock their activity's row first instead, and the event sequencer under an advisory lock
/// (``WriteIsolation``): serializable, they failed one another far more often than they committed. Concurrent commits
/// share the server's WAL flush (its own group commit); a ``Durability/bookkeeping`` write commits with
/// `synchronous_commit = off`. Statements whose answer nothing waits for are sent without waiting
/// (``SQLConnection/execute(_:_:)``) and settled at the commit.
final class PostgresPool: StoreWriter, StoreReader {
    private let connections: ConnectionLeases<PostgresHandle>
    private let metrics: StoreCommitMetrics
    /// How many times a write runs at most before its serialization failure is the caller's.
    static let attempts = 30

    /// Opens `count` connections to `url`.
    init(url: PostgresDatabaseURL, count: Int, logger: Logger, metrics: StoreCommitMetrics = StoreCommitMetrics()) async throws {
        self.metrics = metrics
        let threads = NIOThreadPool(numberOfThreads: max(count, 1))
        threads.start()
        // Connecting waits for the server: on a pool thread, not the caller's. When one connection fails, those
        // made are closed again.
        let opened: HandleBox
        do {
            opened = try await threads.runIfActive {
                var handles: [PostgresHandle] = []
                do {
                    for _ in 0..<max(count, 1) { handles.append(try PostgresHandle(url: url, logger: logger)) }
                } catch {
                    for handle in handles { handle.close() }
                    throw error
                }
                return HandleBox(handles: handles)
            }
        } catch {
            try? await threads.shutdownGracefully()
            throw error
        }
        let handles = opened.handles
        connections = ConnectionLeases(handles: handles, threads: threads)
    }

    func write<T: Sendable>(
        durability: Durability, isolation: WriteIsolation, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        try await connections.run { db in
            try db.reconnectIfNeeded()
            var attempt = 1
            while true {
                do {
                    // BEGIN and the bookkeeping setting go out with the body's first statement, without a round trip
                    // each; the body's other statements whose outcome nothing waits for too (``SQLConnection/execute``).
                    switch isolation {
                    case .serializable:
                        try db.execute("BEGIN ISOLATION LEVEL SERIALIZABLE", [])
                    case .lockingRows:
                        try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", [])
                    case .exclusive(let lock):
                        try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", [])
                        try db.execute("SELECT pg_advisory_xact_lock(\(lock))", [])
                    }
                    if durability == .bookkeeping { try db.execute("SET LOCAL synchronous_commit = off", []) }
                    let result = try body(db)
                    let committing = ContinuousClock.now
                    // PostgreSQL answers COMMIT with success even for a transaction a failed statement aborted (it
                    // rolls back): the statements sent without waiting are settled after it, and a failure among them
                    // means nothing was committed.
                    try db.query("COMMIT")
                    try db.settle()
                    db.endTransaction()
                    self.metrics.committed(durability, took: ContinuousClock.now - committing)
                    return result
                } catch let failure as PostgresFailure where failure.isRetryable && attempt < Self.attempts {
                    Self.rollBack(db)
                    self.metrics.retried(sqlState: failure.sqlState ?? "?")
                    // A short pause, longer each time and never in step with the other writer: 0.1 ms – 25 ms.
                    let ceiling = min(25_000, 100 << min(attempt, 8))
                    usleep(UInt32.random(in: 100...UInt32(ceiling)))
                    attempt += 1
                } catch {
                    Self.rollBack(db)
                    throw error
                }
            }
        }
    }

    /// Ends a failed write's transaction. The connection answers ROLLBACK after what the write sent without waiting, so
    /// those answers are in when it returns.
    private static func rollBack(_ db: PostgresHandle) {
        _ = try? db.query("ROLLBACK")
        db.endTransaction()
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await connections.run { db in
            try db.reconnectIfNeeded()
            defer { db.endTransaction() }
            let result = try body(db)
            try db.settle()
            return result
        }
    }

    func close() async throws {
        try await connections.close { $0.close() }
    }
}

/// Connections crossing from the thread that opened them (hence unchecked: one thread uses each at a time).
private final class HandleBox: @unchecked Sendable {
    let handles: [PostgresHandle]

    init(handles: [PostgresHandle]) {
        self.handles = handles
    }
}
