import Foundation
import LivelineTestSupport
import Synchronization
import SQLiteNIO
import Testing

@testable import LivelineStore

@Suite("The writer: group commit and durability")
struct DurabilityTests {
    @Test("a full write resumes only once the WAL is synced after its commit; a bookkeeping write does not wait for a sync")
    func fullWritesWaitForTheirSync() async throws {
        let gate = SyncGate()
        try await withScratchWriter(sync: gate.sync) { writer in
            gate.close()
            let resumed = Flag()
            let full = Task {
                try await writer.write(durability: .full) { db in _ = try db.query("INSERT INTO scratch VALUES (1)", []) }
                resumed.raise()
            }
            // The commit ends and its sync begins, held at the gate: the write has not returned.
            while gate.waiting == 0 { try await Task.sleep(for: .milliseconds(1)) }
            try await Task.sleep(for: .milliseconds(50))
            #expect(!resumed.isRaised)
            #expect(writer.commits == 2)
            // A bookkeeping write commits and returns while the full write's sync is still held.
            try await writer.write(durability: .bookkeeping) { db in _ = try db.query("INSERT INTO scratch VALUES (2)", []) }
            #expect(!resumed.isRaised)
            gate.open()
            try await full.value
            #expect(resumed.isRaised)
            let count = try await writer.write { db in try db.query("SELECT COUNT(*) AS n FROM scratch", []).first?.column("n")?.integer }
            #expect(count == 2)
        }
    }

    @Test("commits that end while a sync runs share the next sync")
    func syncsCoalesce() async throws {
        let gate = SyncGate()
        try await withScratchWriter(sync: gate.sync) { writer in
            let before = writer.syncs
            gate.close()
            var writes: [Task<Void, any Error>] = []
            for value in 0..<4 {
                let commits = writer.commits
                writes.append(Task { try await writer.write { db in _ = try db.query("INSERT INTO scratch VALUES (?)", [.integer(value)]) } })
                // Each write commits on its own while the first one's sync is held.
                while writer.commits == commits { try await Task.sleep(for: .milliseconds(1)) }
            }
            gate.open()
            for write in writes { try await write.value }
            // The first commit's sync, then one for the three that committed while it was held.
            #expect(writer.syncs - before == 2)
        }
    }

    @Test("a full write that changes nothing returns without a sync of its own once every commit before it is synced")
    func unchangedWriteTakesNoSync() async throws {
        let gate = SyncGate()
        try await withScratchWriter(sync: gate.sync) { writer in
            // The table's creation was synced before it returned. From here every sync is held at the gate: a write
            // that waited for one would not return.
            let syncs = writer.syncs
            gate.close()
            let done = Flag()
            let unchanged = Task {
                try await writer.write { db in _ = try db.query("UPDATE scratch SET x = 5 WHERE x = -1", []) }
                done.raise()
            }
            let deadline = ContinuousClock.now + .seconds(10)
            while !done.isRaised, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
            #expect(done.isRaised)
            #expect(gate.waiting == 0)
            gate.open()
            try await unchanged.value
            #expect(writer.syncs == syncs)
        }
    }

    @Test("a full write that changes nothing waits for the sync of a commit before it, full or bookkeeping")
    func unchangedWriteWaitsForEarlierCommits() async throws {
        let gate = SyncGate()
        try await withScratchWriter(sync: gate.sync) { writer in
            gate.close()
            let inserted = Task { try await writer.write { db in _ = try db.query("INSERT INTO scratch VALUES (1)", []) } }
            while gate.waiting == 0 { try await Task.sleep(for: .milliseconds(1)) }
            let done = Flag()
            let unchanged = Task {
                // It reads the row whose commit is not synced yet.
                let count = try await writer.write { db in try db.query("SELECT COUNT(*) AS n FROM scratch", []).first?.column("n")?.integer }
                done.raise()
                return count
            }
            try await Task.sleep(for: .milliseconds(50))
            #expect(!done.isRaised)
            gate.open()
            try await inserted.value
            #expect(try await unchanged.value == 1)
            // A bookkeeping commit is synced only by the next full write's sync: a write that changes nothing after it
            // waits for one.
            try await writer.write(durability: .bookkeeping) { db in _ = try db.query("INSERT INTO scratch VALUES (2)", []) }
            let syncs = writer.syncs
            _ = try await writer.write { db in try db.query("SELECT COUNT(*) AS n FROM scratch", []) }
            #expect(writer.syncs == syncs + 1)
            // Now everything is synced: the next one takes none.
            _ = try await writer.write { db in try db.query("SELECT COUNT(*) AS n FROM scratch", []) }
            #expect(writer.syncs == syncs + 1)
        }
    }

    @Test("a failed sync fails its writes, and every full write after it fails without running")
    func failedSyncStopsFullWrites() async throws {
        let failing = Flag()
        let sync: WALSyncer.Sync = { descriptor in
            guard !failing.isRaised else {
                errno = EIO
                return -1
            }
            return fdatasync(descriptor)
        }
        try await withScratchWriter(sync: sync) { writer in
            failing.raise()
            await #expect(throws: SQLiteFailure.self) {
                try await writer.write { db in _ = try db.query("INSERT INTO scratch VALUES (1)", []) }
            }
            let ran = Flag()
            await #expect(throws: SQLiteFailure.self) {
                try await writer.write { db in
                    ran.raise()
                    _ = try db.query("INSERT INTO scratch VALUES (2)", [])
                }
            }
            #expect(!ran.isRaised)
            // Bookkeeping writes, which wait for no sync, still run.
            let values = try await writer.write(durability: .bookkeeping) { db in
                try db.query("SELECT x FROM scratch", []).map { $0.column("x")?.integer }
            }
            #expect(values == [1])
        }
    }

    @Test("a failed write is rolled back alone: the writes it shared a commit with keep their changes")
    func failureIsRolledBackAlone() async throws {
        try await withTemporaryStore { store, _ in
            _ = try await store.write("CREATE TABLE scratch (x INTEGER)", [])
            try await holdingTheWriter(store, whileQueueing: 3) {
                let first = Task { try await store.transaction(statements: [(sql: "INSERT INTO scratch VALUES (1)", binds: [])]) }
                let failing = Task {
                    try await store.transaction(statements: [
                        (sql: "INSERT INTO scratch VALUES (2)", binds: []), (sql: "INSERT INTO no_such_table VALUES (1)", binds: []),
                    ])
                }
                let third = Task { try await store.transaction(statements: [(sql: "INSERT INTO scratch VALUES (3)", binds: [])]) }
                try await first.value
                await #expect(throws: SQLiteFailure.self) { try await failing.value }
                try await third.value
            }
            let rows = try await store.reader.query("SELECT x FROM scratch ORDER BY x")
            #expect(rows.map { $0.column("x")?.integer } == [1, 3])
        }
    }

    @Test("writes that arrive while the writer is busy share one commit, and each returns its own result")
    func groupCommit() async throws {
        try await withTemporaryStore { store, _ in
            _ = try await store.write("CREATE TABLE scratch (x INTEGER)", [])
            let before = (store.writer as! SQLiteWriter).commits
            let results = try await holdingTheWriter(store, whileQueueing: 50) {
                try await withThrowingTaskGroup(of: Int.self) { group in
                    for value in 0..<50 {
                        group.addTask {
                            try await store.transaction { db in
                                try db.query("INSERT INTO scratch VALUES (?)", [.integer(value)])
                                return value
                            }
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
            }
            #expect(results.sorted() == Array(0..<50))
            // The holding write's commit, then one for the fifty.
            #expect((store.writer as! SQLiteWriter).commits - before == 2)
            let count = try await store.reader.query("SELECT COUNT(*) AS n FROM scratch").first?.column("n")?.integer
            #expect(count == 50)
        }
    }

    @Test("a write acknowledged before the store is closed is in the file when it is opened again")
    func acknowledgedWritesSurviveReopening() async throws {
        try await withTemporaryStore { store, path in
            _ = try await store.write("CREATE TABLE scratch (x INTEGER)", [])
            try await withThrowingTaskGroup(of: Void.self) { group in
                for value in 0..<100 {
                    group.addTask { _ = try await store.write("INSERT INTO scratch VALUES (?)", [.integer(value)]) }
                }
                try await group.waitForAll()
            }
            try await store.close()
            let reopened = try await SQLStore.open(path: path)
            let count = try await reopened.reader.query("SELECT COUNT(*) AS n FROM scratch").first?.column("n")?.integer
            try await reopened.close()
            #expect(count == 100)
        }
    }

    @Test("a full write that arrives while a bookkeeping write in parts runs commits between its parts, not after all of them")
    func bookkeepingGivesWayBetweenParts() async throws {
        try await withTemporaryStore { store, _ in
            _ = try await store.write("CREATE TABLE scratch (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT)", [])
            let writer = store.writer as! SQLiteWriter
            // A first part that keeps the writer busy for a while (counting to two million), then a thousand small ones.
            let slow = """
                INSERT INTO scratch (kind)
                SELECT 'first' FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT MAX(x) FROM c)
                """
            let parts = [[(sql: slow, binds: [SQLiteData]())]]
                + Array(repeating: [(sql: "INSERT INTO scratch (kind) VALUES ('part')", binds: [SQLiteData]())], count: 1000)
            let before = writer.commits
            let bookkeeping = try await holdingTheWriter(store, whileQueueing: 1) {
                Task { try await store.transaction(parts: parts, durability: .bookkeeping) }
            }
            // The writer has taken the bookkeeping write (nothing is queued): it is in its first part.
            while writer.queuedWrites > 0 { try await Task.sleep(for: .milliseconds(1)) }
            _ = try await store.write("INSERT INTO scratch (kind) VALUES ('full')", [])
            try await bookkeeping.value

            let rows = try await store.reader.query("SELECT kind, COUNT(*) AS n, MIN(id) AS low, MAX(id) AS high FROM scratch GROUP BY kind")
            let byKind = Dictionary(uniqueKeysWithValues: rows.map { ($0.column("kind")?.string ?? "", $0) })
            #expect(byKind["part"]?.column("n")?.integer == 1000)
            let first = try #require(byKind["first"]?.column("low")?.integer)
            let full = try #require(byKind["full"]?.column("low")?.integer)
            let others = try #require(byKind["part"]?.column("low")?.integer)
            // The full write went between the first part and the others: it waited for one part, not for all of them.
            #expect(first < full && full < others)
            // The holding write's commit, the first part's, the full write's, the other parts'.
            #expect(writer.commits - before == 4)
        }
    }

    /// Runs `body` with a writer of its own on a new database (syncing its WAL with `sync`) that holds an empty table
    /// `scratch (x INTEGER)`, and closes the writer after it.
    private func withScratchWriter(sync: @escaping WALSyncer.Sync, _ body: (SQLiteWriter) async throws -> Void) async throws {
        try await withTemporaryDirectory(prefix: "liveline-sync") { directory in
            let writer = try SQLiteWriter(path: directory.appendingPathComponent("store.sqlite").path, sync: sync)
            try await writer.write { db in _ = try db.query("CREATE TABLE scratch (x INTEGER)", []) }
            do {
                try await body(writer)
            } catch {
                try? await writer.close()
                throw error
            }
            try await writer.close()
        }
    }

    /// Runs `body` while a write holds the writer's thread, and lets that write finish once `count` more writes are
    /// queued behind it, so they are taken as one batch.
    private func holdingTheWriter<T: Sendable>(
        _ store: SQLStore, whileQueueing count: Int, _ body: @Sendable () async throws -> T
    ) async throws -> T {
        let held = Flag()
        let release = Flag()
        let holding = Task {
            try await store.transaction { _ in
                held.raise()
                while !release.isRaised { usleep(1000) }
            }
        }
        while !held.isRaised { try await Task.sleep(for: .milliseconds(5)) }
        async let result = body()
        while (store.writer as! SQLiteWriter).queuedWrites < count { try await Task.sleep(for: .milliseconds(5)) }
        release.raise()
        try await holding.value
        return try await result
    }
}

/// A sync of the WAL that can be held (``close()``) until the test lets it go (``open()``); it then syncs for real.
private final class SyncGate: Sendable {
    private let held = Atomic<Bool>(false)
    private let waitingSyncs = Atomic<Int>(0)

    /// Syncs held at the gate now.
    var waiting: Int { waitingSyncs.load(ordering: .acquiring) }

    func close() { held.store(true, ordering: .releasing) }
    func open() { held.store(false, ordering: .releasing) }

    var sync: WALSyncer.Sync {
        { [self] descriptor in
            if held.load(ordering: .acquiring) {
                waitingSyncs.add(1, ordering: .releasing)
                while held.load(ordering: .acquiring) { usleep(1000) }
                waitingSyncs.subtract(1, ordering: .releasing)
            }
            return fdatasync(descriptor)
        }
    }
}

/// A flag one thread raises and another sees.
private final class Flag: Sendable {
    private let raised = Atomic<Bool>(false)
    var isRaised: Bool { raised.load(ordering: .acquiring) }
    func raise() { raised.store(true, ordering: .releasing) }
}

/// Which writes a batch takes, without a database.
@Suite("The writer's batches")
struct WriterBatchTests {
    @Test("every full write waiting goes in the next batch, alone; bookkeeping writes follow a few at a time, oldest first")
    func fullWritesFirst() {
        var queue: [(Int, Durability)] = (0..<10).map { ($0, .bookkeeping) } + [(10, .full)] + [(11, .bookkeeping), (12, .full)]
        let first = SQLiteWriter.takeBatch(from: &queue) { $0.1 }
        #expect(first.map(\.0) == [10, 12])
        #expect(queue.map(\.0) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11])
        let second = SQLiteWriter.takeBatch(from: &queue) { $0.1 }
        #expect(second.map(\.0) == [0, 1, 2, 3])
        #expect(queue.map(\.0) == [4, 5, 6, 7, 8, 9, 11])
    }

    @Test("a batch never takes more than the limit, full writes included")
    func limit() {
        var queue: [Durability] = Array(repeating: .full, count: SQLiteWriter.batchLimit + 3)
        #expect(SQLiteWriter.takeBatch(from: &queue) { $0 }.count == SQLiteWriter.batchLimit)
        #expect(queue.count == 3)
    }
}

/// When a full write's callers resume, without a disk (``SyncLedger``).
@Suite("The syncer's ledger")
struct SyncLedgerTests {
    @Test("a commit that wrote frames waits for the next sync; one that wrote none resumes at once when everything before it is synced")
    func framesWait() {
        var ledger = SyncLedger()
        #expect(ledger.fullCommitted(wroteFrames: false) == .now)
        #expect(ledger.fullCommitted(wroteFrames: true) == .afterNextSync)
        // The first commit is not synced yet: a write that changed nothing after it waits too.
        #expect(ledger.fullCommitted(wroteFrames: false) == .afterNextSync)
        ledger.succeeded(through: ledger.syncMark)
        #expect(ledger.fullCommitted(wroteFrames: false) == .now)
    }

    @Test("a sync covers the commits recorded before it began, not those after")
    func syncCoversWhatCameBefore() {
        var ledger = SyncLedger()
        _ = ledger.fullCommitted(wroteFrames: true)
        let mark = ledger.syncMark
        _ = ledger.fullCommitted(wroteFrames: true)
        ledger.succeeded(through: mark)
        #expect(ledger.fullCommitted(wroteFrames: false) == .afterNextSync)
        ledger.succeeded(through: ledger.syncMark)
        #expect(ledger.fullCommitted(wroteFrames: false) == .now)
        // An older sync that ends late takes nothing back.
        ledger.succeeded(through: mark)
        #expect(ledger.synced == ledger.written)
    }

    @Test("a failed sync records nothing: writes that changed nothing keep waiting")
    func failedSyncCoversNothing() {
        var ledger = SyncLedger()
        _ = ledger.fullCommitted(wroteFrames: true)
        _ = ledger.syncMark  // a sync begins, and fails: nothing is recorded
        #expect(ledger.fullCommitted(wroteFrames: false) == .afterNextSync)
        #expect(ledger.synced == 0)
    }

    @Test("a bookkeeping commit's frames wait for the next full write's sync, and a write that changed nothing with them")
    func bookkeepingFramesCount() {
        var ledger = SyncLedger()
        ledger.bookkeepingCommitted(wroteFrames: false)
        #expect(ledger.fullCommitted(wroteFrames: false) == .now)
        ledger.bookkeepingCommitted(wroteFrames: true)
        #expect(ledger.fullCommitted(wroteFrames: false) == .afterNextSync)
        ledger.succeeded(through: ledger.syncMark)
        #expect(ledger.fullCommitted(wroteFrames: false) == .now)
    }
}
