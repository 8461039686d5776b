#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import NIOPosix
import SQLiteNIO
import Synchronization

/// How durable a write transaction's commit must be.
enum Durability: Sendable {
    /// Synced to disk before the write returns (``WALSyncer``): what the API acknowledges, such as an accepted update,
    /// survives a power cut.
    case full
    /// Committed without waiting for a sync: a crash of the process loses nothing, and the next full commit's sync
    /// covers it along with its own; only a power cut before then can lose it. For bookkeeping that is
    /// safe to lose, such as delivery progress (an instance whose progress is lost is sent its state again, and the
    /// phone ignores what it already shows).
    case bookkeeping
}

/// The one writer of a SQLite database, with group commit: writes that arrive together share one durable commit.
///
/// SQLite allows one writer at a time, and a durable commit costs a sync of the disk (about a millisecond here). One
/// commit per write caps a server at the disk's syncs per second, whatever the number of clients. So writes queue
/// here, and the writer's own thread takes every write queued so far as one batch: BEGIN, each write inside a
/// savepoint of its own, one COMMIT, one sync. A write that fails is rolled back to its savepoint alone and fails
/// alone; the others still commit. Each caller of a ``Durability/full`` write resumes only once the WAL is synced after
/// the commit that holds its write, so an acknowledgement still means synced to disk. The sync runs on a thread of its
/// own (``WALSyncer``): while one batch syncs, the writer runs the next, and the batches that commit during a sync share
/// the next one. (Under `synchronous = FULL` the writer's thread waited for each sync inside its COMMIT.) A batch whose
/// commit wrote nothing waits only for the commits before it to be synced (``SyncLedger``).
///
/// Every batch commits under `synchronous = NORMAL`; one of ``Durability/full`` writes then waits for the syncer, one of
/// ``Durability/bookkeeping`` writes does not.
///
/// What the API acknowledges goes first: while any ``Durability/full`` write waits, a batch takes the full writes (in
/// order) and nothing else; otherwise it takes at most ``bookkeepingPerBatch`` bookkeeping writes, the oldest. The
/// delivery engine queues large bookkeeping writes (a fan-out's progress, hundreds of instances each) many at a time;
/// an accepted update sharing a transaction with them, or queued behind all of them, would wait for every one to run.
///
/// Nor does a full write wait for the rest of a bookkeeping batch that is running when it arrives. Between one
/// bookkeeping write and the next, and between the parts of a bookkeeping write given in parts
/// (``writeStatements(parts:durability:isolation:settings:)``: a fan-out's progress, a few hundred instances a part), the
/// writer looks whether a full write waits; if one does, it commits what it has run so far and puts the rest back at
/// the head of the queue, behind the full writes. A large bookkeeping write then costs one commit when nothing else
/// waits, and an accepted update waits for one part of it at most, not for all of it.
final class SQLiteWriter: StoreWriter {
    /// The most writes one batch takes: a bound on how long the first of them waits for the last.
    static let batchLimit = 512
    /// The most bookkeeping writes one batch takes: a bound on how long an acknowledged write waits behind them.
    static let bookkeepingPerBatch = 4

    private let connection: HandleBox
    private let thread: NIOThreadPool
    /// Checkpoints the WAL on a thread of its own, so commits here never wait for one.
    private let checkpointer: SQLiteCheckpointer
    /// Syncs the WAL after the commits of full writes, on a thread of its own.
    private let syncer: WALSyncer
    private let queue = Mutex(Queue())
    private let committed = Atomic<Int>(0)
    /// Commit and write times, and commits, per durability.
    private let metrics: StoreCommitMetrics

    private struct Queue {
        var writes: [any QueuedWrite] = []
        /// Whether the writer's thread is working through the queue (and will look at it again before it rests).
        var draining = false
        var closed = false
    }

    /// Opens the writer's connection on `path` with the Store's settings (WAL, commits synced by ``WALSyncer`` with
    /// `sync`, foreign keys, and deleted content overwritten where that costs no extra I/O).
    ///
    /// sqlite-nio builds SQLite with `SQLITE_SECURE_DELETE`, which overwrites every freed page with zeros: pruning a
    /// large fan-out's timeline (megabytes of attempts in overflow pages) then wrote as many megabytes of zeros to the
    /// WAL and again to the database. `secure_delete = FAST` still clears deleted rows from the pages that hold live
    /// data (a deleted instance's push token does not linger beside its neighbours), but leaves freed pages as they
    /// were until they are reused.
    ///
    /// The WAL is checkpointed on a thread of its own past `checkpointThreshold` pages, and by the writer itself, between
    /// two transactions, past `walLimit` (``WALBound``). A WAL that grew past twice `walLimit` all the same (a reader
    /// held it) is cut back to that size when it next starts over (`journal_size_limit`). Its commits' and writes' times
    /// go to `metrics` (the process's metrics factory unless given one).
    init(
        path: String, checkpointThreshold: Int = SQLiteCheckpointer.defaultThreshold, walLimit: Int = WALBound.defaultLimit,
        sync: @escaping WALSyncer.Sync = WALSyncer.systemSync, metrics: StoreCommitMetrics = StoreCommitMetrics()
    ) throws {
        self.metrics = metrics
        try Self.createPrivately(path)
        let handle = try SQLiteHandle(path: path)
        // Durable commits are those the syncer has synced the WAL after (``WALSyncer``): in WAL mode only.
        let mode = try handle.query("PRAGMA journal_mode = WAL").first?.column("journal_mode")?.string
        guard mode == "wal" else {
            handle.close()
            throw SQLiteFailure(code: 1, message: "\(path) could not be switched to WAL mode (its journal mode is \(mode ?? "unknown"))")
        }
        let pragmas = [
            "PRAGMA synchronous = NORMAL", "PRAGMA foreign_keys = ON", "PRAGMA secure_delete = FAST",
            "PRAGMA journal_size_limit = \(Self.walSizeLimit(pages: walLimit))",
        ]
        for pragma in pragmas {
            try handle.query(pragma)
        }
        checkpointer = try SQLiteCheckpointer(path: path, threshold: checkpointThreshold, writerLimit: walLimit)
        handle.checkpoint(with: checkpointer)
        syncer = WALSyncer(databasePath: path, sync: sync)
        connection = HandleBox(handle: handle)
        thread = NIOThreadPool(numberOfThreads: 1)
        thread._start(threadNamePrefix: StoreThreadNames.sqliteWriter)
    }

    /// The size, in bytes, a WAL that has grown past twice `pages` of SQLite's 4 KB pages is cut to when it starts
    /// over.
    static func walSizeLimit(pages: Int) -> Int {
        let (bytes, overflow) = pages.multipliedReportingOverflow(by: 2 * 4096)
        return overflow ? Int.max : bytes
    }

    /// Creates the database file at `path`, empty, readable and writable by its owner alone (0600), unless it exists:
    /// it holds push tokens, user ids and content states, and SQLite gives its WAL and shared-memory files the database
    /// file's permissions. (Created by SQLite itself, it would be 0644 under the usual umask: readable by every user of
    /// the machine.) An existing file keeps the permissions its operator gave it.
    static func createPrivately(_ path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        if descriptor >= 0 {
            closeDescriptor(descriptor)
            return
        }
        let failure = errno
        guard failure == EEXIST else {
            throw SQLiteFailure(code: 14, message: "cannot create \(path): \(String(cString: strerror(failure)))")
        }
    }

    /// Runs `body` as one write on the writer's thread, inside a transaction it may share with other writes, and
    /// returns once that transaction is committed (and, for ``Durability/full``, the WAL synced to disk after it).
    ///
    /// Changes `body` made are rolled back when it throws. Once queued, the write runs to its end even if the caller
    /// is cancelled: the caller only learns the outcome. Every write is isolated from the others (one writer), whatever
    /// `isolation` asks.
    func write<T: Sendable>(
        durability: Durability = .full, isolation: WriteIsolation = .serializable, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        let started = ContinuousClock.now
        defer { metrics.wrote(durability, since: started) }
        return try await withCheckedThrowingContinuation { continuation in
            enqueue(Write(durability: durability, body: body, continuation: continuation), failing: continuation)
        }
    }

    /// Queues `write`, and has the writer's thread drain the queue unless it already does; when the writer is closed,
    /// fails `continuation` instead.
    private func enqueue<T>(_ write: any QueuedWrite, failing continuation: CheckedContinuation<T, any Error>) {
        let startDraining: Bool? = queue.withLock { queue in
            guard !queue.closed else { return nil }
            queue.writes.append(write)
            defer { queue.draining = true }
            return !queue.draining
        }
        switch startDraining {
        case nil: continuation.resume(throwing: SQLiteFailure(code: 21, message: "the store is closed"))
        case true?: thread.submit { [self] _ in drain() }
        case false?: break
        }
    }

    /// Whether a full write waits in the queue (asked between the writes and parts of a bookkeeping batch).
    private var fullWriteWaits: Bool { queue.withLock { queue in queue.writes.contains { $0.durability == .full } } }

    /// Puts `writes` back at the head of the queue, in their order (the parts of a bookkeeping batch that gave way).
    private func requeueAtHead(_ writes: some Collection<any QueuedWrite>) {
        guard !writes.isEmpty else { return }
        queue.withLock { $0.writes.insert(contentsOf: writes, at: 0) }
    }

    /// Runs the statements of `parts` in order, as ``write(durability:isolation:_:)`` runs a body (`settings` are
    /// PostgreSQL's: SQLite has none). A ``Durability/bookkeeping`` write may commit part by part, when a full write
    /// arrives while it runs (see ``SQLiteWriter``); it returns once its last part is committed, or throws when a
    /// statement fails (the parts it committed before it last gave way stay committed). A full write is one transaction.
    func writeStatements(
        parts: [[(sql: String, binds: [SQLiteData])]], durability: Durability, isolation: WriteIsolation,
        settings: [(name: String, value: String)]
    ) async throws {
        guard durability == .bookkeeping, parts.count > 1 else {
            return try await writeInOneTransaction(parts: parts, durability: durability, isolation: isolation, settings: settings)
        }
        let started = ContinuousClock.now
        defer { metrics.wrote(durability, since: started) }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            enqueue(PartsWrite(parts: parts, continuation: continuation), failing: continuation)
        }
    }

    /// Writes waiting for the writer's thread.
    var queuedWrites: Int { queue.withLock { $0.writes.count } }

    /// WAL checkpoints run so far on the checkpointer's thread.
    var checkpoints: Int { checkpointer.checkpoints }

    /// WAL checkpoints the writer ran itself so far (``WALBound``).
    var checkpointsByWriter: Int { checkpointer.checkpointsByWriter }

    /// Transactions committed so far: fewer than the writes when they shared commits.
    var commits: Int { committed.load(ordering: .relaxed) }

    /// Syncs of the WAL so far (``WALSyncer``): fewer than the commits of full writes when they shared syncs.
    var syncs: Int { syncer.syncs }

    /// Refuses new writes, lets the queued ones commit and their syncs end, and closes the connection.
    func close() async throws {
        queue.withLock { $0.closed = true }
        try await checkpointer.close()
        // The thread runs one work item at a time: this one after the queue is drained.
        try await thread.runIfActive {}
        // Every commit has handed its callers to the syncer: they resume once their sync ends.
        try await syncer.close()
        try await thread.runIfActive { [connection] in connection.handle.close() }
        try await thread.shutdownGracefully()
    }

    // MARK: On the writer's thread

    private func drain() {
        while true {
            let batch: [any QueuedWrite] = queue.withLock { queue in
                guard !queue.writes.isEmpty else {
                    queue.draining = false
                    return []
                }
                return Self.takeBatch(from: &queue.writes) { $0.durability }
            }
            guard !batch.isEmpty else { return }
            if checkpointer.writerCheckpointDue { checkpointTheRest() }
            commit(batch)
        }
    }

    /// Copies into the database what the checkpointer has not copied of the WAL yet, so that the next transaction
    /// writes the WAL from its beginning (``WALBound``). `PASSIVE` neither waits for nor blocks a reader; when the
    /// checkpointer is copying, it does nothing and says so (`busy`), and the writer tries again before its next batch.
    private func checkpointTheRest() {
        let busy = (try? connection.handle.query("PRAGMA wal_checkpoint(PASSIVE)", []))?.first?.column("busy")?.integer
        checkpointer.writerCheckpointed(busy == 1 ? .busy : .ran)
    }

    /// Takes the next batch out of `writes` (each write's durability given by `durability`): the full writes (up to
    /// ``batchLimit``) if there are any, else at most ``bookkeepingPerBatch`` bookkeeping writes; each in the order it
    /// arrived, and the rest stay queued in order.
    static func takeBatch<W>(from writes: inout [W], durability: (W) -> Durability) -> [W] {
        let anyFull = writes.contains { durability($0) == .full }
        var batch: [W] = []
        var left: [W] = []
        for write in writes {
            let kind = durability(write)
            let fits = anyFull ? kind == .full && batch.count < batchLimit : batch.count < bookkeepingPerBatch
            if fits { batch.append(write) } else { left.append(write) }
        }
        writes = left
        return batch
    }

    /// Commits `batch` in as few transactions as it takes: one, unless SQLite itself rolls one back, in which case the
    /// writes it held fail and the rest go on in a new one.
    private func commit(_ batch: [any QueuedWrite]) {
        let db = connection.handle
        let durability: Durability = batch.contains { $0.durability == .full } ? .full : .bookkeeping
        var pending = batch[...]
        // After a failed sync no commit is durable: full writes fail without running (``WALSyncer``).
        if durability == .full, let failure = syncer.failure {
            for write in pending { write.fail(failure) }
            return
        }
        while !pending.isEmpty {
            do {
                try db.query("BEGIN IMMEDIATE")
            } catch {
                for write in pending { write.fail(error) }
                return
            }
            // The writes run so far whose changes this transaction holds, and those that gave way to a full write (the
            // one that gave way mid-write has its parts so far here too).
            var held: [any QueuedWrite] = []
            var gaveWay: [any QueuedWrite] = []
            var lost: (any Error)?
            // A bookkeeping batch gives way to a full write between its writes and its statements (see `SQLiteWriter`).
            let givesWay: () -> Bool = durability == .bookkeeping ? { self.fullWriteWaits } : { false }
            while let write = pending.first, lost == nil {
                if !held.isEmpty, givesWay() {
                    gaveWay = Array(pending)
                    pending = []
                    break
                }
                pending.removeFirst()
                do {
                    try db.query("SAVEPOINT write")
                    do {
                        let finished = try write.run(on: db, givingWayIf: givesWay)
                        try db.query("RELEASE write")
                        if finished {
                            held.append(write)
                        } else {
                            // Its parts so far commit with this transaction; the rest run after the full writes.
                            gaveWay = [write] + pending
                            pending = []
                        }
                    } catch {
                        if db.isInTransaction {
                            _ = try? db.query("ROLLBACK TO write")
                            _ = try? db.query("RELEASE write")
                        } else {
                            // SQLite rolled the whole transaction back (a full disk, say): the writes held are lost too.
                            lost = error
                        }
                        write.fail(error)
                    }
                } catch {
                    write.fail(error)
                    if !db.isInTransaction { lost = error }
                }
            }
            if let lost {
                for write in held { write.fail(lost) }
                for write in gaveWay { write.fail(lost) }
                continue
            }
            do {
                let commitStarted = ContinuousClock.now
                let framedBefore = checkpointer.framedCommits
                try db.query("COMMIT")
                let wroteFrames = checkpointer.framedCommits != framedBefore
                committed.add(1, ordering: .relaxed)
                requeueAtHead(gaveWay)
                switch durability {
                case .full:
                    // Its callers resume once the WAL is synced (at once when it wrote nothing and every commit before it
                    // is synced: ``SyncLedger``); meanwhile the writer takes the next batch.
                    syncer.afterSync(wroteFrames: wroteFrames) { [metrics, held] synced in
                        metrics.committed(.full, took: ContinuousClock.now - commitStarted)
                        switch synced {
                        case .success: for write in held { write.succeed() }
                        case .failure(let failure): for write in held { write.fail(failure) }
                        }
                    }
                case .bookkeeping:
                    syncer.bookkeepingCommitted(wroteFrames: wroteFrames)
                    metrics.committed(.bookkeeping, took: ContinuousClock.now - commitStarted)
                    for write in held { write.succeed() }
                }
            } catch {
                _ = try? db.query("ROLLBACK")
                for write in held { write.fail(error) }
                for write in gaveWay { write.fail(error) }
            }
        }
    }
}

/// The writer's connection, used only on the writer's thread (hence unchecked).
private final class HandleBox: @unchecked Sendable {
    let handle: SQLiteHandle

    init(handle: SQLiteHandle) {
        self.handle = handle
    }
}

/// A write waiting in the queue, whatever its result type.
private protocol QueuedWrite: Sendable {
    var durability: Durability { get }
    /// Runs the write (or its next part), keeping its result until the commit. Answers false when it stopped early, after
    /// one of its parts, because `givingWayIf` answered true: the parts run so far commit, and the write runs again for
    /// the rest.
    func run(on db: SQLiteHandle, givingWayIf: () -> Bool) throws -> Bool
    func succeed()
    func fail(_ error: any Error)
}

/// A write and its caller. Its result is set on the writer's thread, and read there or, for a full write, on the
/// syncer's thread after the commit (the syncer's lock, taken by both in turn, orders the two; hence unchecked).
private final class Write<T: Sendable>: QueuedWrite, @unchecked Sendable {
    let durability: Durability
    private let body: @Sendable (any SQLConnection) throws -> T
    private let continuation: CheckedContinuation<T, any Error>
    private var result: T?

    init(durability: Durability, body: @escaping @Sendable (any SQLConnection) throws -> T, continuation: CheckedContinuation<T, any Error>) {
        self.durability = durability
        self.body = body
        self.continuation = continuation
    }

    func run(on db: SQLiteHandle, givingWayIf: () -> Bool) throws -> Bool {
        result = try body(db)
        return true
    }

    func succeed() {
        guard let result else { return fail(SQLiteFailure(code: 1, message: "a write committed without its result")) }
        continuation.resume(returning: result)
    }

    func fail(_ error: any Error) {
        continuation.resume(throwing: error)
    }
}

/// A bookkeeping write given in parts, which gives way between them (``SQLiteWriter``). How far it has run is kept on
/// the writer's thread only (hence unchecked).
private final class PartsWrite: QueuedWrite, @unchecked Sendable {
    var durability: Durability { .bookkeeping }
    private let parts: [[(sql: String, binds: [SQLiteData])]]
    private let continuation: CheckedContinuation<Void, any Error>
    /// The first part not yet run.
    private var next = 0

    init(parts: [[(sql: String, binds: [SQLiteData])]], continuation: CheckedContinuation<Void, any Error>) {
        self.parts = parts
        self.continuation = continuation
    }

    func run(on db: SQLiteHandle, givingWayIf: () -> Bool) throws -> Bool {
        let first = next
        while next < parts.count {
            if next > first, givingWayIf() { return false }
            try db.execute(parts: [parts[next]])
            next += 1
        }
        return true
    }

    func succeed() {
        continuation.resume()
    }

    func fail(_ error: any Error) {
        continuation.resume(throwing: error)
    }
}

/// `close(2)`, out of reach of ``SQLiteWriter/close()`` inside the class.
private func closeDescriptor(_ descriptor: Int32) {
    _ = close(descriptor)
}
