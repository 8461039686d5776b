import NIOPosix
import Synchronization

/// Connections to the Store's database, each lent to one call at a time on a thread of the pool: as many threads as
/// connections, so a call that runs always finds a connection free.
final class ConnectionLeases<Handle: SQLConnection & SendableMetatype>: Sendable {
    private let threads: NIOThreadPool
    private let idle: Mutex<[Lease]>

    /// A connection, lent to one thread at a time (hence unchecked).
    private final class Lease: @unchecked Sendable {
        let handle: Handle
        init(handle: Handle) { self.handle = handle }
    }

    /// No connection was free: a call ran on more threads than there are connections (never, by construction).
    struct NoFreeConnection: Error, CustomStringConvertible {
        var description: String { "no database connection is free" }
    }

    /// Lends `handles` on `threads`, which must be started and as many as the handles.
    init(handles: [Handle], threads: NIOThreadPool) {
        self.threads = threads
        idle = Mutex(handles.map(Lease.init(handle:)))
    }

    /// Runs `body` with a free connection, on a thread of the pool.
    func run<T: Sendable>(_ body: @escaping @Sendable (Handle) throws -> T) async throws -> T {
        try await threads.runIfActive { [self] in
            guard let lease = idle.withLock({ $0.popLast() }) else { throw NoFreeConnection() }
            defer { idle.withLock { $0.append(lease) } }
            return try body(lease.handle)
        }
    }

    /// Runs `body` with a free connection on a thread of the pool, without waiting for it: `body` gets nil instead when
    /// the pool is shutting down and will run nothing more.
    func submit(_ body: @escaping @Sendable (Handle?) -> Void) {
        threads.submit { [self] state in
            guard case .active = state, let lease = idle.withLock({ $0.popLast() }) else { return body(nil) }
            defer { idle.withLock { $0.append(lease) } }
            body(lease.handle)
        }
    }

    /// Waits for the calls under way, stops the threads and closes every connection with `close`.
    func close(_ close: (Handle) -> Void) async throws {
        try await threads.shutdownGracefully()
        for lease in idle.withLock({ $0 }) { close(lease.handle) }
    }
}
