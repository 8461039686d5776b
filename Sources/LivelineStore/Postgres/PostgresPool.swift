import Foundation
import Logging
import NIOPosix
import Synchronization

/// Connections to PostgreSQL, each lent to one thread at a time: the Store's writes and reads run on them.
///
/// A write is one transaction at `SERIALIZABLE` isolation, run again (after a short, random pause) when PostgreSQL
/// reports a serialization failure, a deadlock or a key another transaction inserted first. So the Store's logic,
/// written for SQLite's single writer, keeps its meaning with many writers on many nodes: every committed write is as
/// if the writes had run one after another. Concurrent commits share the server's WAL flush (its own group commit);
/// a ``Durability/bookkeeping`` write commits with `synchronous_commit = off`.
final class PostgresPool: StoreWriter, StoreReader {
    private let threads: NIOThreadPool
    private let idle: Mutex<[HandleLease]>
    private let writes: Bool
    /// How many times a write runs at most before its serialization failure is the caller's.
    static let attempts = 30

    /// Opens `count` connections to `url`; `writes` tells whether they run write transactions or reads.
    init(url: PostgresDatabaseURL, count: Int, writes: Bool, logger: Logger) async throws {
        self.writes = writes
        let threads = NIOThreadPool(numberOfThreads: max(count, 1))
        threads.start()
        self.threads = threads
        // Connecting waits for the server: on the pool's threads, not the caller's. When one connection fails, those
        // made are closed again.
        let made = await withTaskGroup(of: Result<HandleLease, any Error>.self) { group in
            for _ in 0..<max(count, 1) {
                group.addTask {
                    do {
                        return .success(try await threads.runIfActive { HandleLease(handle: try PostgresHandle(url: url, logger: logger)) })
                    } catch {
                        return .failure(error)
                    }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        let handles = made.compactMap { try? $0.get() }
        if let failure = made.lazy.compactMap({ result -> (any Error)? in
            if case .failure(let error) = result { return error }
            return nil
        }).first {
            try? await threads.runIfActive { for lease in handles { lease.handle.close() } }
            try? await threads.shutdownGracefully()
            throw failure
        }
        idle = Mutex(handles)
    }

    func write<T: Sendable>(durability: Durability, _ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await withLease { db in
            var attempt = 1
            while true {
                do {
                    try db.query("BEGIN ISOLATION LEVEL SERIALIZABLE")
                    if durability == .bookkeeping { try db.query("SET LOCAL synchronous_commit = off") }
                    let result = try body(db)
                    try db.query("COMMIT")
                    return result
                } catch let failure as PostgresFailure where failure.isRetryable && attempt < Self.attempts {
                    _ = try? db.query("ROLLBACK")
                    // A short pause, longer each time and never in step with the other writer: 0.1 ms – 25 ms.
                    let ceiling = min(25_000, 100 << min(attempt, 8))
                    usleep(UInt32.random(in: 100...UInt32(ceiling)))
                    attempt += 1
                } catch {
                    _ = try? db.query("ROLLBACK")
                    throw error
                }
            }
        }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await withLease(body)
    }

    private func withLease<T: Sendable>(_ body: @escaping @Sendable (PostgresHandle) throws -> T) async throws -> T {
        try await threads.runIfActive { [self] in
            guard let lease = idle.withLock({ $0.popLast() }) else {
                throw PostgresFailure(sqlState: nil, message: "no database connection is free")
            }
            defer { idle.withLock { $0.append(lease) } }
            return try body(lease.handle)
        }
    }

    func close() async throws {
        try await threads.shutdownGracefully()
        for lease in idle.withLock({ $0 }) { lease.handle.close() }
    }
}

/// A connection, lent to one thread at a time (hence unchecked).
private final class HandleLease: @unchecked Sendable {
    let handle: PostgresHandle

    init(handle: PostgresHandle) {
        self.handle = handle
    }
}
