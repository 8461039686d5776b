import NIOPosix
import SQLiteNIO
import Synchronization

/// Read connections to a SQLite database in WAL mode, each on a thread of its own: reads run side by side, and see
/// the last committed state, while the writer writes.
///
/// A fan-out's pages, the API's reads and the sweepers' queries each take a free connection; none waits behind
/// another's read unless all are busy.
final class SQLiteReaders: StoreReader {
    private let threads: NIOThreadPool
    private let idle: Mutex<[HandleLease]>

    /// Opens `count` read connections on `path` (which the writer has already created).
    init(path: String, count: Int) throws {
        var handles: [HandleLease] = []
        for _ in 0..<max(count, 1) {
            let handle = try SQLiteHandle(path: path)
            try handle.query("PRAGMA foreign_keys = ON")
            handles.append(HandleLease(handle: handle))
        }
        idle = Mutex(handles)
        // As many threads as connections: a read that runs always finds a connection free.
        threads = NIOThreadPool(numberOfThreads: handles.count)
        threads.start()
    }

    /// Runs `body` with a free read connection, on that connection's thread.
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await threads.runIfActive { [self] in
            guard let lease = idle.withLock({ $0.popLast() }) else {
                throw SQLiteFailure(code: 21, message: "no read connection is free")
            }
            defer { idle.withLock { $0.append(lease) } }
            return try body(lease.handle)
        }
    }

    /// Closes every connection once the reads under way are done.
    func close() async throws {
        try await threads.shutdownGracefully()
        for lease in idle.withLock({ $0 }) { lease.handle.close() }
    }
}

/// A read connection, lent to one read at a time (hence unchecked).
private final class HandleLease: @unchecked Sendable {
    let handle: SQLiteHandle

    init(handle: SQLiteHandle) {
        self.handle = handle
    }
}
