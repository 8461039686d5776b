import NIOPosix
import Synchronization

/// Checkpoints the writer's WAL on a connection and a thread of its own, so that the writer seldom does.
///
/// Left to itself, SQLite checkpoints at the commit that brings the WAL to 1,000 pages, on the committing connection:
/// the writer's thread copied the WAL into the database file and synced it before it took the next write, and an
/// accepted update queued behind that commit waited for it (during a fan-out the progress writes fill the WAL every
/// fraction of a second). The writer now turns that off and tells this checkpointer its WAL's size after each commit
/// (``walGrew(to:)``); past the same 1,000 pages it runs a `PASSIVE` checkpoint here, which never blocks the writer or a
/// reader. The WAL starts over from its beginning, as before, at the first write after a checkpoint that copied it all.
/// Under a steady stream of writes that write never comes; past ``WALBound/limit`` pages the writer copies what is left
/// itself, between two transactions (``writerCheckpointDue``), so the WAL starts over.
final class SQLiteCheckpointer: Sendable {
    /// The WAL's size, in pages, past which a checkpoint runs: SQLite's own default for its automatic checkpoint.
    static let defaultThreshold = 1000

    /// The WAL's size, in pages, past which a checkpoint runs here.
    let threshold: Int

    private let connection: Connection
    private let thread: NIOThreadPool
    private let state = Mutex(State())
    private let completed = Atomic<Int>(0)
    /// When the writer checkpoints itself; read and written on the writer's thread alone (the lock is never contended).
    private let bound: Mutex<WALBound>
    private let completedByWriter = Atomic<Int>(0)
    private let framed = Atomic<Int>(0)

    private struct State {
        /// Whether a checkpoint is queued or running: the WAL's growth meanwhile asks for no second one.
        var running = false
        var closed = false
    }

    /// The checkpointer's connection, used only on its thread (hence unchecked).
    private final class Connection: @unchecked Sendable {
        let handle: SQLiteHandle

        init(handle: SQLiteHandle) {
            self.handle = handle
        }
    }

    /// Opens a connection of its own on the database at `path`; it checkpoints past `threshold` pages, and the writer
    /// itself once its WAL holds `writerLimit` pages (``WALBound``).
    init(path: String, threshold: Int = defaultThreshold, writerLimit: Int = WALBound.defaultLimit) throws {
        self.threshold = threshold
        bound = Mutex(WALBound(limit: writerLimit))
        connection = Connection(handle: try SQLiteHandle(path: path))
        thread = NIOThreadPool(numberOfThreads: 1)
        thread._start(threadNamePrefix: StoreThreadNames.sqliteCheckpointer)
    }

    /// Checkpoints run so far on the checkpointer's thread.
    var checkpoints: Int { completed.load(ordering: .relaxed) }

    /// The writer's commits that wrote frames to the WAL so far: SQLite reports each one (``walGrew(to:)``) before
    /// its COMMIT returns, and none that wrote nothing. Read on the writer's thread.
    var framedCommits: Int { framed.load(ordering: .relaxed) }

    /// The writer's WAL holds `pages` pages after a commit: a checkpoint starts past ``threshold``, unless one is under
    /// way. Called on the writer's thread; it only queues the work.
    func walGrew(to pages: Int) {
        framed.add(1, ordering: .relaxed)
        bound.withLock { $0.walGrew(to: pages) }
        guard pages >= threshold else { return }
        let start = state.withLock { state in
            guard !state.running, !state.closed else { return false }
            state.running = true
            return true
        }
        guard start else { return }
        thread.submit { [self] _ in checkpoint() }
    }

    /// Whether the writer checkpoints the WAL itself before its next transaction (``WALBound``). On the writer's thread.
    var writerCheckpointDue: Bool { bound.withLock { $0.checkpointDue } }

    /// The writer's own checkpoint went as `outcome`. On the writer's thread.
    func writerCheckpointed(_ outcome: WALBound.Outcome) {
        bound.withLock { $0.writerCheckpointed(outcome) }
        if outcome == .ran { completedByWriter.add(1, ordering: .relaxed) }
    }

    /// Checkpoints the writer ran itself so far.
    var checkpointsByWriter: Int { completedByWriter.load(ordering: .relaxed) }

    /// On the checkpointer's thread.
    private func checkpoint() {
        // PASSIVE copies what no reader still needs, without waiting for anyone; what it leaves, the next one takes. A
        // failure (the disk, say) leaves the WAL as it was, and the next commit past the threshold tries again.
        if (try? connection.handle.query("PRAGMA wal_checkpoint(PASSIVE)", [])) != nil {
            completed.add(1, ordering: .relaxed)
        }
        state.withLock { $0.running = false }
    }

    /// Lets a checkpoint under way finish and closes the connection; later growth starts none.
    func close() async throws {
        state.withLock { $0.closed = true }
        try await thread.runIfActive { [connection] in connection.handle.close() }
        try await thread.shutdownGracefully()
    }
}
