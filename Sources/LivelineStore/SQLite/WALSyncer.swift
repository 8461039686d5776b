#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import NIOPosix
import Synchronization

/// Syncs the writer's WAL to disk after its commits, on a thread of its own, so that the writer runs its next batch
/// while the last one's sync is under way.
///
/// A durable commit was a COMMIT under `synchronous = FULL`: SQLite wrote the transaction's pages to the WAL, synced it,
/// and only then did the writer's thread take the next batch. That thread then spent a sync's time (about a millisecond
/// here, more for a commit of many pages) waiting for the disk on every batch, and the writes queued behind it waited
/// with it. Now the writer commits under `synchronous = NORMAL` (the pages written to the WAL, not synced) and hands the
/// batch's callers here: they resume once a sync of the WAL that began after their commit has ended (``afterSync(_:)``).
/// Syncs coalesce: the commits that end while one sync runs are all covered by the next. A caller still resumes only
/// once its write is on disk, and in the order of the commits.
///
/// The writer no longer waits for the disk, so it takes smaller batches: about twice the commits for as many writes.
/// Where each write lands on a page of its own (registrations in an order other than the device ids', as phones
/// register: three pages of the WAL a registration) the writer's time saved is worth more than the commits cost, about
/// a tenth more registrations a second; where writes share pages (updates creating activities one after another) the
/// two about cancel out (docs/benchmarks.md, 2026-12-07). A writer that waited for the last commit's sync to begin
/// before it took its next batch, to keep the batches large, was slower at both.
///
/// The WAL is append-only between two checkpoints, and a sync of the file covers every frame written to it before the
/// sync began, so one sync after a commit makes that commit and every earlier one durable. SQLite syncs the WAL itself
/// before a checkpoint copies it into the database (and the WAL's header when it starts over), so no checkpoint copies
/// a frame this syncer has not synced without syncing it first.
///
/// What a commit makes visible to readers is visible before it is synced (for about the time of a sync): a reader, or
/// the delivery engine, may see a write whose caller has not been answered yet. A power cut in that window loses the
/// write, which was never acknowledged; a crash of the process loses nothing (the pages are in the kernel's cache).
///
/// A full write whose commit wrote nothing to the WAL waits for no sync of its own: it resumes at once when every commit
/// before it is synced, and with the next sync otherwise (``SyncLedger``).
///
/// A sync that fails (an I/O error of the disk) leaves it unknown what reached the disk, and a later sync may succeed
/// without having written what the failed one did not (a WAL with a hole, whose recovery stops at the hole): from then on
/// every waiting and later durable write fails with that error (``failure``), as PostgreSQL stops rather than retry a
/// failed sync. The writes of the failed sync's commits stay committed and visible; whether they survive a restart
/// depends on what reached the disk.
final class WALSyncer: Sendable {
    /// Syncs the file open at a descriptor; 0 on success, as `fdatasync(2)` (a test's failing disk otherwise).
    typealias Sync = @Sendable (Int32) -> Int32

    /// The sync of a system whose `fdatasync(2)` also writes out the file's size (Linux), else `fsync(2)`.
    static let systemSync: Sync = { descriptor in
        #if os(Linux)
        fdatasync(descriptor)
        #else
        fsync(descriptor)
        #endif
    }

    /// What a caller waiting for a sync learns: its write is on disk, or the failure.
    typealias Completion = @Sendable (Result<Void, SQLiteFailure>) -> Void

    private let walPath: String
    private let sync: Sync
    private let state = Mutex(State())
    private let completedSyncs = Atomic<Int>(0)
    private let thread: NIOThreadPool

    private struct State {
        /// Callers whose commits ended since the last sync began.
        var waiting: [Completion] = []
        /// Whether the syncer's thread is working through `waiting` (and will look at it again before it rests).
        var syncing = false
        /// The WAL, opened at the first sync.
        var descriptor: Int32 = -1
        /// The first sync that failed: every later one fails with it.
        var failure: SQLiteFailure?
        /// Which commits the syncs so far cover.
        var ledger = SyncLedger()
    }

    /// A syncer of the WAL of the database at `databasePath` (the file `<databasePath>-wal`), with `sync`.
    init(databasePath: String, sync: @escaping Sync = WALSyncer.systemSync) {
        walPath = databasePath + "-wal"
        self.sync = sync
        thread = NIOThreadPool(numberOfThreads: 1)
        thread._start(threadNamePrefix: StoreThreadNames.walSyncer)
    }

    /// Syncs run so far (each covering one commit or more).
    var syncs: Int { completedSyncs.load(ordering: .relaxed) }

    /// The failure of a sync, after which no write is durable any more (``WALSyncer``).
    var failure: SQLiteFailure? { state.withLock { $0.failure } }

    /// Runs `completion` on the syncer's thread once the WAL is synced after a full write's commit that has just ended
    /// (or with the failure that stops every sync); when that commit wrote no frame (`wroteFrames` false) and every
    /// commit before it is synced, at once, on the caller's thread (``SyncLedger``). Called on the writer's thread, after
    /// the COMMIT; it only queues the work.
    func afterSync(wroteFrames: Bool, _ completion: @escaping Completion) {
        let (now, start) = state.withLock { state in
            if state.ledger.fullCommitted(wroteFrames: wroteFrames) == .now, state.failure == nil { return (true, false) }
            state.waiting.append(completion)
            defer { state.syncing = true }
            return (false, !state.syncing)
        }
        if now { completion(.success(())) }
        if start { thread.submit { [self] _ in drain() } }
    }

    /// A bookkeeping write's commit has just ended: its frames, if it wrote any, are synced by the next sync, which a
    /// later write that changed nothing waits for (``SyncLedger``). Called on the writer's thread, after the COMMIT.
    func bookkeepingCommitted(wroteFrames: Bool) {
        guard wroteFrames else { return }
        state.withLock { $0.ledger.bookkeepingCommitted(wroteFrames: true) }
    }

    /// Lets the syncs under way and queued finish, and closes the WAL's descriptor.
    func close() async throws {
        // The thread runs one work item at a time: this one after the queue is drained (as ``drain()`` runs until the
        // queue is empty, and no commit queues more once the writer is closed).
        try await thread.runIfActive { [self] in
            state.withLock { state in
                if state.descriptor >= 0 { _ = closeWAL(state.descriptor) }
                state.descriptor = -1
            }
        }
        try await thread.shutdownGracefully()
    }

    // MARK: On the syncer's thread

    private func drain() {
        while true {
            let next: (waiting: [Completion], descriptor: Int32, failure: SQLiteFailure?, mark: Int)? = state.withLock { state in
                guard !state.waiting.isEmpty else {
                    state.syncing = false
                    return nil
                }
                defer { state.waiting = [] }
                return (state.waiting, state.descriptor, state.failure, state.ledger.syncMark)
            }
            guard let batch = next else { return }
            let result = batch.failure.map { Result<Void, SQLiteFailure>.failure($0) } ?? syncOnce(batch.descriptor)
            if case .success = result { state.withLock { $0.ledger.succeeded(through: batch.mark) } }
            for completion in batch.waiting { completion(result) }
        }
    }

    /// One sync of the WAL, opening it first if need be; a failed sync is kept for every later one. A WAL that could not
    /// be opened (no descriptor left, say) fails the writes waiting, and the next sync tries again: nothing was synced,
    /// so nothing is in doubt, and the next sync that succeeds covers their commits too.
    private func syncOnce(_ known: Int32) -> Result<Void, SQLiteFailure> {
        var descriptor = known
        if descriptor < 0 {
            // Read-only is enough for a sync (Linux); this descriptor never writes.
            descriptor = open(walPath, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else {
                return .failure(SQLiteFailure(code: 10, message: "cannot open \(walPath) to sync it: \(Self.errorText())"))
            }
            state.withLock { $0.descriptor = descriptor }
        }
        guard sync(descriptor) == 0 else { return failed("the disk did not sync \(walPath): \(Self.errorText())") }
        completedSyncs.add(1, ordering: .relaxed)
        return .success(())
    }

    private func failed(_ message: String) -> Result<Void, SQLiteFailure> {
        // SQLITE_IOERR (10): what SQLite's own COMMIT reports when its sync fails.
        let failure = SQLiteFailure(code: 10, message: message)
        state.withLock { state in
            if state.failure == nil { state.failure = failure }
        }
        return .failure(failure)
    }

    private static func errorText() -> String {
        String(cString: strerror(errno))
    }
}

/// `close(2)`, out of reach of ``WALSyncer/close()`` inside the class.
private func closeWAL(_ descriptor: Int32) -> Int32 {
    close(descriptor)
}
