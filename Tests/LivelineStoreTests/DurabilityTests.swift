import Foundation
import LivelineTestSupport
import Synchronization
import SQLiteNIO
import Testing

@testable import LivelineStore

@Suite("The writer: group commit and durability")
struct DurabilityTests {
    /// The writer's `synchronous` setting inside a write: 2 is FULL, 1 is NORMAL.
    private func synchronous(_ store: SQLStore, _ durability: Durability) async throws -> Int? {
        try await store.transaction(durability: durability) { db in try db.query("PRAGMA synchronous").first?.column("synchronous")?.integer }
    }

    @Test("a bookkeeping write commits with synchronous NORMAL; a full write after it with FULL")
    func durabilityPerBatch() async throws {
        try await withTemporaryStore { store, _ in
            let first = try await synchronous(store, .full)
            let bookkeeping = try await synchronous(store, .bookkeeping)
            let after = try await synchronous(store, .full)
            #expect(first == 2)
            #expect(bookkeeping == 1)
            #expect(after == 2)
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
