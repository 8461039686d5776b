import Foundation
import Logging
import NIOPosix
import SQLiteNIO
import Synchronization

/// Connections to PostgreSQL, each lent to one thread at a time: the Store's writes and reads run on them.
///
/// A write is one transaction, run again (after a short, random pause) when PostgreSQL reports a serialization
/// failure, a deadlock or a key another transaction inserted first; and at once on a new connection when its connection
/// was lost before its COMMIT was sent (a server restart, an operator ending it: the server rolled it back). Lost at the
/// COMMIT, it may have been committed, and it fails (``PostgresFailure/isCommitUnknown``) rather than run twice. A read
/// whose connection was lost runs again on a new one. By default it runs at `SERIALIZABLE` isolation, so
/// the Store's logic, written for SQLite's single writer, keeps its meaning with many writers on many nodes: every
/// committed write is as if the writes had run one after another. The hottest writes (registrations, updates) run at
/// `READ COMMITTED` and lock their activity's row first instead, and the event sequencer under an advisory lock
/// (``WriteIsolation``): serializable, they failed one another far more often than they committed. Concurrent commits
/// share the server's WAL flush (its own group commit); a ``Durability/bookkeeping`` write commits with
/// `synchronous_commit = off`. Statements whose answer nothing waits for are sent without waiting
/// (``SQLConnection/execute(_:_:)``) and settled at the commit.
///
/// Writes that may share a transaction (``WriteIsolation/grouped(key:)``: a registration, an update) have group
/// commit, as on SQLite: they queue, and a connection of their own (``groupConnections``) that comes free takes every
/// one queued so far (up to ``groupLimit``; a second connection joins only when more wait than that, or when the one
/// at work is held up: ``startsDrainer(queued:drainers:limit:sinceTaken:stalledAfter:)``) and runs those of each kind
/// (``byKind(_:)``) in one `READ COMMITTED` transaction (with cached plans, ``PostgresHandle/groupedWriteSettings``, as
/// a grouped write alone: those connections are opened with them, so the transaction sends none), in the order of their
/// keys, with one `COMMIT`.
/// Each caller resumes once that commit is done, so an acknowledgement still means committed and synced. Writes that
/// arrive together no longer pay a commit (and its round trip) each. When every write of a group belongs to one set
/// (``SetWrite``: registrations; updates without an `Idempotency-Key`), the set writes them all with a few multi-row
/// statements instead of a few statements each, and the writes it leaves out run their bodies after it. A
/// serialization failure, deadlock or concurrent insert runs the whole group again; a write whose body throws fails
/// alone, and the others run again without it; any other failure of the database runs each write of the group in a
/// transaction of its own, so that one write's fault is never another's.
///
/// Bookkeeping writes under one list of settings (the delivery engine's claims, progress and releases, several for
/// every activity it sends) run on connections of their own opened with those settings and `synchronous_commit = off`
/// (``write(durability:isolation:under:_:)``): their transactions send no settings, a statement and a round trip less
/// each. The claims, one statement each at `READ COMMITTED` (``WriteIsolation/lockingStatement``), have as many
/// connections again, whose transactions are `READ COMMITTED` by default; the others' are `REPEATABLE READ`.
final class PostgresPool: StoreWriter, StoreReader {
    private let connections: ConnectionLeases<PostgresHandle>
    /// The connections that run the grouped writes, opened with their settings (``PostgresHandle/groupedWriteSettings``)
    /// for the whole session, so that a shared transaction sends none (one round trip less); nil in a pool of one
    /// connection, whose grouped writes run on it with their settings sent each time.
    private let groupConnections: ConnectionLeases<PostgresHandle>?
    /// A connection for each lane (``ReadLane``) opened with ``settledReadSettings`` for the reads under them
    /// (``read(under:in:_:)``), or none: such a read is then its statement alone, where on another connection it is a
    /// transaction of four statements (`BEGIN`, the settings, the read, `COMMIT`), each a round trip.
    private let settledReads: [ReadLane: ConnectionLeases<PostgresHandle>]
    private let settledReadSettings: [(name: String, value: String)]
    /// Connections opened for the bookkeeping writes under ``bookkeepingSettings`` (the delivery engine's: its claims,
    /// the records of a send's start, its progress, its releases), or nil. Opened with those settings and with
    /// `synchronous_commit = off`, as each such write asks: its transaction sends no settings, a statement (and a
    /// round trip) less for each.
    private let bookkeepingConnections: ConnectionLeases<PostgresHandle>?
    /// Connections opened as the bookkeeping ones but `READ COMMITTED` by default, for the bookkeeping writes of one
    /// statement that locks its rows itself (``WriteIsolation/lockingStatement``: the engine's claims), sent alone; nil
    /// when there are no bookkeeping connections.
    private let claimConnections: ConnectionLeases<PostgresHandle>?
    private let bookkeepingSettings: [(name: String, value: String)]
    private let metrics: StoreCommitMetrics
    /// Grouped writes waiting for a connection, and how many connections are (or are about to be) taking them.
    private let groups = Mutex(GroupQueue())
    /// At most this many connections run grouped writes at once: the rest stay free for the other writes.
    private let groupDrainers: Int
    /// The connections a pool of `count` opens for its grouped writes (``groupConnections``), besides its `count` for
    /// the others: as many as may run grouped writes at once (``groupDrainerLimit``), and fewer than `count`. A pool of
    /// one runs both on its one connection.
    static func groupConnectionCount(of count: Int) -> Int {
        count < 2 ? 0 : min(groupDrainerLimit, count - 1)
    }
    /// At most this many connections of a pool run grouped writes at once. A set (``SetWrite``) costs a few round
    /// trips however many writes it holds, so a few large groups cost less than many small ones: a second connection
    /// starts only when more writes wait than the first takes in one group, or the first is held up
    /// (``startsDrainer(queued:drainers:limit:sinceTaken:stalledAfter:)``).
    /// (`bench api`, 64 clients, 8 writers: 16 writes a group on 7 connections registered 20,000 instances in 4.46 –
    /// 4.83 s and accepted 10,000 updates in 4.81 – 5.11 s; 64 on 3, taken alternately, 3.53 – 3.55 s and 3.72 –
    /// 4.22 s.)
    static let groupDrainerLimit = 3

    /// The connections a pool of `count` opens for its bookkeeping writes under their settings
    /// (``bookkeepingConnections``), besides its `count`: four, at most half of `count` (each runs one such write at a
    /// time; the delivery engine's workers, 8 on PostgreSQL by default, spend most of their time on reads and on APNs'
    /// answers), and as many for the engine's claims (``claimConnections``). A pool of one runs them on its one.
    static func bookkeepingConnectionCount(of count: Int) -> Int {
        min(4, count / 2)
    }
    /// How many times a write runs at most before its serialization failure is the caller's.
    static let attempts = 30
    /// The most writes one shared transaction takes (a bound on how long the first waits for the last, and on the
    /// locks one transaction holds).
    static let groupLimit = 64

    private struct GroupQueue {
        var writes: [any GroupedWrite] = []
        var drainers = 0
        /// When a connection last took a group from the queue.
        var lastTaken = ContinuousClock.now
    }

    /// How long the connections at work may go without taking more grouped writes before another one starts, whatever
    /// the queue holds (``startsDrainer(queued:drainers:limit:sinceTaken:stalledAfter:)``).
    private let stalledAfter: Duration
    /// ``stalledAfter``'s default: a group takes a few round trips and one sync, a few milliseconds; this machine's disk
    /// took up to 265 ms for its slowest syncs, and a row lock held by a long transaction can hold a group longer still.
    static let groupStalledAfter: Duration = .milliseconds(100)

    /// Opens `count` connections to `url`, and with `groupsWrites` ``groupConnectionCount(of:)`` more for the grouped
    /// writes (a pool for reads has none); with `readsUnder` settings, one more for each ``ReadLane`` opened with them,
    /// for the reads under them (``read(under:in:_:)``); with `bookkeepingUnder` settings,
    /// ``bookkeepingConnectionCount(of:)`` more opened with them, for the bookkeeping writes under them
    /// (``write(durability:isolation:under:_:)``). When the connections at work on grouped writes take no more for
    /// `stalledAfter`, another starts.
    init(
        url: PostgresDatabaseURL, count: Int, groupsWrites: Bool = true, readsUnder: [(name: String, value: String)] = [],
        bookkeepingUnder: [(name: String, value: String)] = [], stalledAfter: Duration = groupStalledAfter, logger: Logger,
        metrics: StoreCommitMetrics = StoreCommitMetrics()
    ) async throws {
        self.metrics = metrics
        self.stalledAfter = stalledAfter
        settledReadSettings = readsUnder
        bookkeepingSettings = bookkeepingUnder
        let count = max(count, 1)
        let grouping = groupsWrites ? Self.groupConnectionCount(of: count) : 0
        // One connection for each lane of the reads under settings, when there are any.
        let lanes = readsUnder.isEmpty ? [] : ReadLane.allCases
        let bookkeeping = bookkeepingUnder.isEmpty ? 0 : Self.bookkeepingConnectionCount(of: count)
        let claiming = bookkeeping
        let bookkeepingSession = bookkeepingUnder + Self.bookkeepingDefaults
        let claimSession = bookkeepingUnder + Self.claimDefaults
        // What each connection is opened with, in the order they are set apart below.
        let sessions: [[(name: String, value: String)]] =
            Array(repeating: PostgresHandle.groupedWriteSettings, count: grouping) + Array(repeating: [], count: count)
            + Array(repeating: readsUnder, count: lanes.count) + Array(repeating: bookkeepingSession, count: bookkeeping)
            + Array(repeating: claimSession, count: claiming)
        let threads = NIOThreadPool(numberOfThreads: count)
        threads._start(threadNamePrefix: StoreThreadNames.postgresConnections)
        // Connecting waits for the server: on a pool thread, not the caller's. When one connection fails, those
        // made are closed again.
        let opened: HandleBox
        do {
            opened = try await threads.runIfActive {
                var handles: [PostgresHandle] = []
                do {
                    for settings in sessions {
                        handles.append(try PostgresHandle(url: url, logger: logger, settings: settings))
                    }
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
        var handles = opened.handles
        claimConnections = Self.setApart(last: claiming, of: &handles)
        bookkeepingConnections = Self.setApart(last: bookkeeping, of: &handles)
        var settled: [ReadLane: ConnectionLeases<PostgresHandle>] = [:]
        for lane in lanes { settled[lane] = Self.setApart(last: 1, of: &handles) }
        settledReads = settled
        if grouping > 0 {
            let groupThreads = NIOThreadPool(numberOfThreads: grouping)
            groupThreads._start(threadNamePrefix: StoreThreadNames.postgresConnections)
            groupConnections = ConnectionLeases(handles: Array(handles.prefix(grouping)), threads: groupThreads)
            connections = ConnectionLeases(handles: Array(handles.dropFirst(grouping)), threads: threads)
            groupDrainers = grouping
        } else {
            groupConnections = nil
            connections = ConnectionLeases(handles: handles, threads: threads)
            groupDrainers = max(1, min(Self.groupDrainerLimit, count - 1))
        }
    }

    func write<T: Sendable>(
        durability: Durability, isolation: WriteIsolation, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        let started = ContinuousClock.now
        defer { metrics.wrote(durability, since: started) }
        if case .grouped(let key) = isolation, durability == .full {
            return try await withCheckedThrowingContinuation { continuation in
                enqueue(GroupWrite(key: key, body: body, continuation: continuation))
            }
        }
        return try await connections.run { db in
            try self.runAlone(durability: durability, isolation: isolation, body, on: db)
        }
    }

    /// The last `count` of `handles`, taken out of them, lent on threads of their own; nil when `count` is 0.
    private static func setApart(last count: Int, of handles: inout [PostgresHandle]) -> ConnectionLeases<PostgresHandle>? {
        guard count > 0 else { return nil }
        let threads = NIOThreadPool(numberOfThreads: count)
        threads._start(threadNamePrefix: StoreThreadNames.postgresConnections)
        defer { handles.removeLast(count) }
        return ConnectionLeases(handles: Array(handles.suffix(count)), threads: threads)
    }

    /// What a bookkeeping connection is opened with besides its settings: what each of its writes asks
    /// (``Durability/bookkeeping``: no wait for the WAL's flush).
    ///
    /// Their transactions are `REPEATABLE READ` unless they say otherwise (every transaction of
    /// ``runAlone(durability:isolation:_:on:)`` says), so that a ``WriteIsolation/snapshotStatement`` write goes as its
    /// statement alone.
    static let bookkeepingDefaults: [(name: String, value: String)] = [
        ("synchronous_commit", "off"), snapshotByDefault,
    ]

    /// The session setting under which a statement sent alone is a `REPEATABLE READ` transaction.
    static let snapshotByDefault = (name: "default_transaction_isolation", value: "repeatable read")

    /// What a claim connection (``claimConnections``) is opened with besides the bookkeeping settings: no wait for the
    /// WAL's flush, and transactions `READ COMMITTED` unless they say otherwise (PostgreSQL's own default, said
    /// whatever the server's), so that a ``WriteIsolation/lockingStatement`` write goes as its statement alone.
    static let claimDefaults: [(name: String, value: String)] = [
        ("synchronous_commit", "off"), lockingByDefault,
    ]

    /// The session setting under which a statement sent alone is a `READ COMMITTED` transaction.
    static let lockingByDefault = (name: "default_transaction_isolation", value: "read committed")

    /// On a bookkeeping connection (``bookkeepingConnections``) when `settings` are theirs and the write is
    /// ``Durability/bookkeeping`` (not a grouped write), else as ``write(durability:isolation:_:)`` with the settings set.
    func write<T: Sendable>(
        durability: Durability, isolation: WriteIsolation, under settings: [(name: String, value: String)],
        _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        let withSettings: @Sendable (any SQLConnection) throws -> T = { db in
            try db.setLocal(settings)
            return try body(db)
        }
        // The claim connections are opened beside the bookkeeping ones, as many: both are there, or neither.
        guard let bookkeepingConnections, let claimConnections,
            Self.runsAsBookkeeping(durability: durability, isolation: isolation, settings: settings, bookkeepingSettings)
        else { return try await write(durability: durability, isolation: isolation, withSettings) }
        let started = ContinuousClock.now
        defer { metrics.wrote(durability, since: started) }
        let connections = isolation == .lockingStatement ? claimConnections : bookkeepingConnections
        return try await connections.run { db in
            try self.runAlone(durability: durability, isolation: isolation, withSettings, on: db)
        }
    }

    /// Whether a write of `durability` and `isolation` under `settings` runs on the connections opened with
    /// `bookkeeping` settings: a ``Durability/bookkeeping`` write (those connections commit without waiting for the
    /// WAL's flush) asking for exactly those settings (no fewer: the connections' own would rule the write), and not
    /// a grouped write (which runs under settings of its own).
    static func runsAsBookkeeping(
        durability: Durability, isolation: WriteIsolation, settings: [(name: String, value: String)],
        _ bookkeeping: [(name: String, value: String)]
    ) -> Bool {
        guard durability == .bookkeeping, !bookkeeping.isEmpty else { return false }
        if case .grouped = isolation { return false }
        func keyed(_ list: [(name: String, value: String)]) -> [String: String] {
            Dictionary(list.map { ($0.name, $0.value) }, uniquingKeysWith: { _, last in last })
        }
        return keyed(settings) == keyed(bookkeeping)
    }

    /// A grouped, acknowledged write queues as ``write(durability:isolation:_:)``'s do, and may run as one of a set:
    /// when every write of a shared transaction is of `W`'s set, `W.runTogether` writes them all (``SetWrite``).
    func write<W: SetWrite>(
        durability: Durability, isolation: WriteIsolation, member: W, _ body: @escaping @Sendable (any SQLConnection) throws -> W.Outcome
    ) async throws -> W.Outcome {
        guard case .grouped(let key) = isolation, durability == .full else {
            return try await write(durability: durability, isolation: isolation, body)
        }
        let started = ContinuousClock.now
        defer { metrics.wrote(durability, since: started) }
        return try await withCheckedThrowingContinuation { continuation in
            enqueue(GroupWrite(key: key, body: body, continuation: continuation, member: member))
        }
    }

    /// Queues a grouped write for the next shared transaction, and has one more connection take them when
    /// ``startsDrainer(queued:drainers:limit:sinceTaken:stalledAfter:)`` says so.
    private func enqueue(_ write: any GroupedWrite) {
        let startDrainer = groups.withLock { queue in
            queue.writes.append(write)
            guard
                Self.startsDrainer(
                    queued: queue.writes.count, drainers: queue.drainers, limit: groupDrainers,
                    sinceTaken: .now - queue.lastTaken, stalledAfter: stalledAfter
                )
            else { return false }
            queue.drainers += 1
            // The new one is about to take its group: the stall is counted afresh from now.
            queue.lastTaken = .now
            return true
        }
        if startDrainer { drainGroups() }
    }

    /// Whether one more connection takes the grouped writes, the queue holding `queued` of them with `drainers`
    /// connections taking them already (at most `limit`), the last of which took its group `sinceTaken` ago: the first
    /// always; another only when the queue holds more than the connections at work take in their next groups
    /// (``groupLimit`` each), or when none of them has come back for more within `stalledAfter` (a group held up by a
    /// slow sync, or by a row lock a long transaction holds, does not hold up every write queued behind it).
    ///
    /// Until then the writes wait for the connection at work, which takes them all as its next group once its commit
    /// is done. A group costs a few round trips and a commit however many writes it holds, so one large group costs
    /// less than several small ones: with another connection starting at each write while fewer than three were at
    /// work, 64 clients' writes went out in groups a third the size, and on this two-core machine, where PostgreSQL,
    /// the server and the clients share the CPU, `bench api` registered 5,015 – 6,366 instances a second against 6,224 –
    /// 8,796 with the groups large (`docs/benchmarks.md`, 2026-12-02, 20:32 – 21:41 UTC).
    static func startsDrainer(queued: Int, drainers: Int, limit: Int, sinceTaken: Duration, stalledAfter: Duration) -> Bool {
        guard drainers < limit else { return false }
        return queued > drainers * groupLimit || sinceTaken > stalledAfter
    }

    /// Runs `body` in a transaction of its own on `db`, again after a retryable failure, and returns once it is committed.
    fileprivate func runAlone<T>(
        durability: Durability, isolation: WriteIsolation, _ body: (any SQLConnection) throws -> T, on db: PostgresHandle
    ) throws -> T {
        var attempt = 1
        while true {
            // A connection found closed is opened again here, between transactions; one that cannot be opened fails the
            // write at once.
            try db.reconnectIfNeeded()
            // A statement sent alone, on a connection whose transactions are REPEATABLE READ by default, is its own
            // transaction: no BEGIN, no COMMIT (two statements of the three it was).
            let alone =
                (isolation == .snapshotStatement && db.holds([Self.snapshotByDefault]))
                || (isolation == .lockingStatement && db.holds([Self.lockingByDefault]))
            // Once COMMIT is sent (or a statement sent alone, which commits itself), a lost connection leaves the
            // write's outcome unknown: it is not run again.
            var commitSent = alone
            // After a failure: a transaction begun is rolled back; a statement sent alone rolled back by itself, and a
            // ROLLBACK after it would be a round trip for PostgreSQL's warning that no transaction is in progress.
            func abandon() {
                if alone { db.endTransaction() } else { Self.rollBack(db) }
            }
            do {
                // BEGIN goes out with the body's first statement, without a round trip of its own, and the bookkeeping
                // setting in one statement with the body's own settings (``SQLConnection/setLocal(_:)``); the body's
                // other statements whose outcome nothing waits for too (``SQLConnection/execute``).
                switch isolation {
                case .serializable:
                    try db.execute("BEGIN ISOLATION LEVEL SERIALIZABLE", [])
                case .lockingRows:
                    try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", [])
                case .snapshotStatement:
                    if !alone { try db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ", []) }
                case .lockingStatement:
                    if !alone { try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", []) }
                case .grouped:
                    try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", [])
                    try db.setLocal(PostgresHandle.groupedWriteSettings)
                case .exclusive(let lock):
                    try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", [])
                    try db.execute("SELECT pg_advisory_xact_lock(\(lock))", [])
                }
                if durability == .bookkeeping { try db.setLocal([("synchronous_commit", "off")]) }
                if alone {
                    // Its commit is the statement's own: timed with it.
                    let started = ContinuousClock.now
                    let result = try body(db)
                    precondition(db.statementsInTransaction <= 1, "a write sent alone is one statement")
                    try db.settle()
                    db.endTransaction()
                    self.metrics.committed(durability, took: ContinuousClock.now - started)
                    return result
                }
                let result = try body(db)
                let committing = ContinuousClock.now
                // PostgreSQL answers COMMIT with success even for a transaction a failed statement aborted (it
                // rolls back): the statements sent without waiting are settled after it, and a failure among them
                // means nothing was committed.
                commitSent = true
                try db.query("COMMIT")
                try db.settle()
                db.endTransaction()
                self.metrics.committed(durability, took: ContinuousClock.now - committing)
                return result
            } catch let failure as PostgresFailure where failure.isRetryable && attempt < Self.attempts {
                abandon()
                self.metrics.retried(sqlState: failure.sqlState ?? "?")
                Self.pauseBeforeRetry(attempt)
                attempt += 1
            } catch let failure as PostgresFailure where failure.isConnectionLost {
                db.dropConnection()
                switch Self.afterLostConnection(failure, commitSent: commitSent, attempt: attempt) {
                case .fail(let error):
                    throw error
                case .runAgain:
                    self.metrics.retried(sqlState: failure.sqlState ?? PostgresFailure.connectionFailure)
                    attempt += 1
                }
            } catch {
                abandon()
                throw error
            }
        }
    }

    // MARK: Group commit

    /// Grouped writes waiting for a connection.
    var queuedGroupedWrites: Int { groups.withLock { $0.writes.count } }

    /// Has a connection take the grouped writes queued so far, once one is free; it asks for another turn while writes
    /// are left, so the other writes waiting for a connection get theirs in between.
    private func drainGroups() {
        (groupConnections ?? connections).submit { [self] db in
            guard let db else {
                // The pool is closing: nothing more runs.
                let left = groups.withLock { queue in
                    defer { queue.writes = []; queue.drainers = 0 }
                    return queue.writes
                }
                for write in left { write.fail(PostgresFailure(sqlState: nil, message: "the store is closed")) }
                return
            }
            let batch = groups.withLock { queue in
                let taken = Array(queue.writes.prefix(Self.groupLimit))
                queue.writes.removeFirst(taken.count)
                queue.lastTaken = .now
                return taken
            }
            for group in Self.byKind(batch) { commitGroup(group, on: db) }
            let again = groups.withLock { queue in
                if queue.writes.isEmpty {
                    queue.drainers -= 1
                    return false
                }
                return true
            }
            if again { drainGroups() }
        }
    }

    /// Runs `batch` in one transaction, in the order of the writes' keys, and completes each write once its outcome is
    /// known: committed, failed by its own body, or run alone after a database failure.
    private func commitGroup(_ batch: [any GroupedWrite], on db: PostgresHandle) {
        var pending = Self.lockOrder(batch)
        var attempt = 1
        while !pending.isEmpty {
            if pending.count == 1 {
                pending[0].runAlone(in: self, on: db)
                return
            }
            do {
                try db.reconnectIfNeeded()
            } catch {
                for write in pending { write.fail(error) }
                return
            }
            // The write whose body is running, when one is.
            var running: (any GroupedWrite)?
            // Once COMMIT is sent, a lost connection leaves the writes' outcome unknown: they are not run again.
            var commitSent = false
            do {
                try db.execute("BEGIN ISOLATION LEVEL READ COMMITTED", [])
                try db.setLocal(PostgresHandle.groupedWriteSettings)
                for write in pending { write.forget() }
                var bodies = pending
                var setMembers = 0
                // A group of one set's members runs as that set (its leftovers by their bodies, after it). Only a whole
                // group (``byKind(_:)`` makes them): a set locks all its rows first, and writes of other kinds beside it
                // would take theirs after, out of the key order that keeps shared transactions from waiting for one
                // another in a cycle.
                if let kind = pending[0].setKind, pending.allSatisfy({ $0.setKind == kind }) {
                    bodies = try pending[0].runSet(pending, on: db)
                    setMembers = pending.count
                }
                for write in bodies {
                    running = write
                    try write.run(on: db)
                }
                running = nil
                let committing = ContinuousClock.now
                commitSent = true
                try db.query("COMMIT")
                try db.settle()
                db.endTransaction()
                metrics.committed(.full, took: ContinuousClock.now - committing)
                if setMembers > 0 { metrics.setCommitted(bySet: setMembers - bodies.count, byBody: bodies.count) }
                for write in pending { write.succeed() }
                return
            } catch let failure as PostgresFailure where failure.isRetryable && attempt < Self.attempts {
                Self.rollBack(db)
                metrics.retried(sqlState: failure.sqlState ?? "?")
                Self.pauseBeforeRetry(attempt)
                attempt += 1
            } catch let failure as PostgresFailure where failure.isConnectionLost {
                db.dropConnection()
                switch Self.afterLostConnection(failure, commitSent: commitSent, attempt: attempt) {
                case .fail(let error):
                    for write in pending { write.fail(error) }
                    return
                case .runAgain:
                    metrics.retried(sqlState: failure.sqlState ?? PostgresFailure.connectionFailure)
                    attempt += 1
                }
            } catch is PostgresFailure {
                // The database failed (not a write's own logic), and which write caused it is not known: a statement
                // sent without waiting fails at a later statement, perhaps another write's. Each runs alone.
                Self.rollBack(db)
                for write in pending {
                    write.runAlone(in: self, on: db)
                }
                return
            } catch {
                Self.rollBack(db)
                if let running {
                    // The write running refused (its activity ended, say): it fails alone; the others run again without
                    // what it may have changed.
                    pending.removeAll { $0 === running }
                    running.fail(error)
                } else {
                    // A set failed otherwise than in the database (a row it could not read): each runs alone, so that
                    // the failure is only the writes' it belongs to.
                    for write in pending {
                        write.runAlone(in: self, on: db)
                    }
                    return
                }
            }
        }
    }

    /// `writes` split into groups of one kind each (the members of one set, ``SetWrite``; or the writes that run only by
    /// their bodies), in the order each kind first came, each group in the order its writes came: each group is a
    /// shared transaction of its own, so that registrations and updates arriving together are each written as a set.
    static func byKind(_ writes: [any GroupedWrite]) -> [[any GroupedWrite]] {
        var groups: [[any GroupedWrite]] = []
        var index: [ObjectIdentifier?: Int] = [:]
        for write in writes {
            if let at = index[write.setKind] {
                groups[at].append(write)
            } else {
                index[write.setKind] = groups.count
                groups.append([write])
            }
        }
        return groups
    }

    /// `writes` in the order a shared transaction runs them: by key (ties in the order they arrived), so that every
    /// shared transaction takes its row locks in one order.
    static func lockOrder(_ writes: [any GroupedWrite]) -> [any GroupedWrite] {
        writes.enumerated().sorted { a, b in
            a.element.key != b.element.key ? a.element.key < b.element.key : a.offset < b.offset
        }.map(\.element)
    }

    /// What a write (or a shared transaction) does once its connection was lost.
    enum AfterLostConnection {
        /// Run it again, on a new connection.
        case runAgain
        /// Give its callers this failure.
        case fail(PostgresFailure)
    }

    /// Decides for a write whose connection was lost (``PostgresFailure/isConnectionLost``) at its `attempt`th run:
    /// before its COMMIT was sent, the server rolled it back, so it runs again (a new connection each time, at most
    /// ``attempts`` runs); once the COMMIT was sent it may have been committed, so it fails as such
    /// (``PostgresFailure/isCommitUnknown``) and never runs twice.
    static func afterLostConnection(_ failure: PostgresFailure, commitSent: Bool, attempt: Int) -> AfterLostConnection {
        if commitSent { return .fail(.commitUnknown(failure)) }
        return attempt < attempts ? .runAgain : .fail(failure)
    }

    /// Waits before running a transaction again: a short pause, longer with each `attempt` and never in step with the
    /// other writers, 0.1 ms – 25 ms.
    private static func pauseBeforeRetry(_ attempt: Int) {
        let ceiling = min(25_000, 100 << min(attempt, 8))
        usleep(UInt32.random(in: 100...UInt32(ceiling)))
    }

    /// Ends a failed write's transaction. The connection answers ROLLBACK after what the write sent without waiting, so
    /// those answers are in when it returns.
    private static func rollBack(_ db: PostgresHandle) {
        _ = try? db.query("ROLLBACK")
        db.endTransaction()
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await read(on: connections, body)
    }

    /// On `lane`'s connection opened with `settings` when this pool has one (``settledReads``), else on any.
    func read<T: Sendable>(
        under settings: [(name: String, value: String)], in lane: ReadLane, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        guard let settled = settledReads[lane], settings.allSatisfy({ setting in settledReadSettings.contains { $0 == setting } }) else {
            return try await read(body)
        }
        return try await read(on: settled, body)
    }

    private func read<T: Sendable>(
        on leases: ConnectionLeases<PostgresHandle>, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        try await leases.run { db in
            var attempt = 1
            while true {
                try db.reconnectIfNeeded()
                defer { db.endTransaction() }
                do {
                    let result = try body(db)
                    try db.settle()
                    return result
                } catch let failure as PostgresFailure where failure.isConnectionLost && attempt < Self.attempts {
                    // A read changes nothing: it runs again on a new connection.
                    db.dropConnection()
                    attempt += 1
                }
            }
        }
    }

    func close() async throws {
        try await groupConnections?.close { $0.close() }
        for lane in settledReads.values { try await lane.close { $0.close() } }
        try await bookkeepingConnections?.close { $0.close() }
        try await claimConnections?.close { $0.close() }
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

/// A grouped write waiting for a shared transaction, whatever its result type.
protocol GroupedWrite: AnyObject, Sendable {
    /// Orders the writes of one transaction (``WriteIsolation/grouped(key:)``).
    var key: String { get }
    /// The set (``SetWrite``) this write may run in, or nil for a write that runs only by its body.
    var setKind: ObjectIdentifier? { get }
    /// Runs `members` (this write among them, all of its ``setKind``) as one set inside the shared transaction, keeping
    /// each one's outcome until the commit; returns those the set left to their bodies, in order.
    func runSet(_ members: [any GroupedWrite], on db: PostgresHandle) throws -> [any GroupedWrite]
    /// Runs the write's body inside the shared transaction, keeping its result until the commit.
    func run(on db: PostgresHandle) throws
    /// Runs the write in a transaction of its own on `db`, and completes it.
    func runAlone(in pool: PostgresPool, on db: PostgresHandle)
    /// Forgets the outcome kept by a run of the shared transaction that did not commit.
    func forget()
    /// The shared transaction committed: the write's kept outcome is its caller's.
    func succeed()
    func fail(_ error: any Error)
}

/// A grouped write and its caller. Its outcome is set and read on one pool thread at a time (hence unchecked).
private final class GroupWrite<T: Sendable>: GroupedWrite, @unchecked Sendable {
    let key: String
    let setKind: ObjectIdentifier?
    private let body: @Sendable (any SQLConnection) throws -> T
    private let continuation: CheckedContinuation<T, any Error>
    /// The write as a member of its set, and how its set runs (both nil for a write that runs only by its body).
    private let member: (any Sendable)?
    private let together: (@Sendable ([any Sendable], any SQLConnection) throws -> [SetWriteOutcome<T>])?
    private var outcome: Result<T, any Error>?

    init(key: String, body: @escaping @Sendable (any SQLConnection) throws -> T, continuation: CheckedContinuation<T, any Error>) {
        self.key = key
        self.body = body
        self.continuation = continuation
        setKind = nil
        member = nil
        together = nil
    }

    init<W: SetWrite>(
        key: String, body: @escaping @Sendable (any SQLConnection) throws -> T, continuation: CheckedContinuation<T, any Error>,
        member: W
    ) where W.Outcome == T {
        self.key = key
        self.body = body
        self.continuation = continuation
        setKind = ObjectIdentifier(W.self)
        self.member = member
        together = { members, db in try W.runTogether(members.compactMap { $0 as? W }, on: db) }
    }

    func runSet(_ members: [any GroupedWrite], on db: PostgresHandle) throws -> [any GroupedWrite] {
        // Members of one set kind are writes of one set type, hence of this class with the same outcome type.
        let writes = members.compactMap { $0 as? GroupWrite<T> }
        let items = writes.compactMap(\.member)
        guard let together, writes.count == members.count, items.count == members.count else { return members }
        let outcomes = try together(items, db)
        guard outcomes.count == writes.count else { return members }
        var left: [any GroupedWrite] = []
        for (write, outcome) in zip(writes, outcomes) {
            switch outcome {
            case .done(let result): write.outcome = .success(result)
            case .refused(let error): write.outcome = .failure(error)
            case .alone: left.append(write)
            }
        }
        return left
    }

    func run(on db: PostgresHandle) throws {
        outcome = .success(try body(db))
    }

    func runAlone(in pool: PostgresPool, on db: PostgresHandle) {
        do {
            continuation.resume(returning: try pool.runAlone(durability: .full, isolation: .grouped(key: key), body, on: db))
        } catch {
            continuation.resume(throwing: error)
        }
    }

    func forget() {
        outcome = nil
    }

    func succeed() {
        switch outcome {
        case .success(let result): continuation.resume(returning: result)
        case .failure(let error): continuation.resume(throwing: error)
        case nil: fail(PostgresFailure(sqlState: nil, message: "a write committed without its result"))
        }
    }

    func fail(_ error: any Error) {
        continuation.resume(throwing: error)
    }
}
