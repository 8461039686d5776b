import NIOPosix
import SQLiteNIO
import Synchronization

/// Read connections to a SQLite database in WAL mode, each on a thread of its own: reads run side by side, and see
/// the last committed state, while the writer writes.
///
/// A fan-out's pages, the API's reads and the sweepers' queries each take a free connection; none waits behind
/// another's read unless all are busy.
final class SQLiteReaders: StoreReader {
    private let connections: ConnectionLeases<SQLiteHandle>

    /// Opens `count` read connections on `path` (which the writer has already created).
    init(path: String, count: Int) throws {
        var handles: [SQLiteHandle] = []
        for _ in 0..<max(count, 1) {
            let handle = try SQLiteHandle(path: path)
            try handle.query("PRAGMA foreign_keys = ON")
            handles.append(handle)
        }
        let threads = NIOThreadPool(numberOfThreads: handles.count)
        threads._start(threadNamePrefix: StoreThreadNames.sqliteReaders)
        connections = ConnectionLeases(handles: handles, threads: threads)
    }

    /// Runs `body` with a free read connection, on that connection's thread.
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await connections.run(body)
    }

    /// Closes every connection once the reads under way are done.
    func close() async throws {
        try await connections.close { $0.close() }
    }
}
