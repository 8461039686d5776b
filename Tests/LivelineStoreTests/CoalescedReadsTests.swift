import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import Synchronization
import Testing

/// Reads by key asked for together go as one statement (``ReadBatching``, pure; ``CoalescedReads`` performs it), and
/// the Store's reads of activities answer as they did one by one.
@Suite("Coalesced reads")
struct CoalescedReadsTests {
    @Test("a read with nothing out goes at once, alone")
    func aloneAtOnce() {
        var batching = ReadBatching<String, Int>(concurrency: 2, maximumBatch: 10)
        let batch = batching.ask(for: "a", by: 1)
        #expect(batch?.keys == ["a"])
        #expect(batch?.waiters == ["a": [1]])
        #expect(batching.inFlight == 1)
        #expect(batching.batchReturned() == nil)
        #expect(batching.inFlight == 0)
    }

    @Test("reads asked while every batch is out wait, and go together when one comes back; a key asked twice is read once")
    func waitThenTogether() {
        var batching = ReadBatching<String, Int>(concurrency: 2, maximumBatch: 10)
        #expect(batching.ask(for: "a", by: 1)?.keys == ["a"])
        #expect(batching.ask(for: "b", by: 2)?.keys == ["b"])
        #expect(batching.ask(for: "c", by: 3) == nil)
        #expect(batching.ask(for: "d", by: 4) == nil)
        #expect(batching.ask(for: "c", by: 5) == nil)
        #expect(batching.waiting == 2)
        let next = batching.batchReturned()
        #expect(next?.keys == ["c", "d"])
        #expect(next?.waiters == ["c": [3, 5], "d": [4]])
        #expect(batching.inFlight == 2)
        #expect(batching.batchReturned() == nil)
        #expect(batching.batchReturned() == nil)
        #expect(batching.inFlight == 0)
    }

    @Test("a key asked for while a batch with it is out is not answered by that batch: it goes in the next")
    func neverJoinsABatchSent() {
        var batching = ReadBatching<String, Int>(concurrency: 1, maximumBatch: 10)
        #expect(batching.ask(for: "a", by: 1)?.waiters == ["a": [1]])
        // The statement for "a" may have begun before this read: a write committed between them must be seen.
        #expect(batching.ask(for: "a", by: 2) == nil)
        let next = batching.batchReturned()
        #expect(next?.keys == ["a"])
        #expect(next?.waiters == ["a": [2]])
    }

    @Test("a batch holds at most maximumBatch keys; the rest go in the next, in the order asked")
    func maximumBatch() {
        var batching = ReadBatching<Int, Int>(concurrency: 1, maximumBatch: 3)
        #expect(batching.ask(for: 0, by: 0)?.keys == [0])
        for key in 1...7 { #expect(batching.ask(for: key, by: key) == nil) }
        #expect(batching.batchReturned()?.keys == [1, 2, 3])
        #expect(batching.batchReturned()?.keys == [4, 5, 6])
        #expect(batching.batchReturned()?.keys == [7])
        #expect(batching.batchReturned() == nil)
    }

    @Test("concurrent reads share statements, each gets its own key's value, and a failure reaches every read of its batch")
    func coalescedReads() async throws {
        let calls = Mutex<[[Int]]>([])
        let failing = Mutex(false)
        let reads = CoalescedReads<Int, String>(concurrency: 1, maximumBatch: 100) { keys in
            calls.withLock { $0.append(keys) }
            // Long enough for the other reads to queue behind this one.
            try await Task.sleep(for: .milliseconds(20))
            if failing.withLock({ $0 }) { throw CancellationError() }
            return Dictionary(uniqueKeysWithValues: keys.filter { $0 % 3 != 0 }.map { ($0, "value \($0)") })
        }
        let values = try await withThrowingTaskGroup(of: (Int, String?).self) { group in
            for key in 0..<60 { group.addTask { (key, try await reads.value(for: key)) } }
            return try await group.reduce(into: [Int: String?]()) { $0[$1.0] = $1.1 }
        }
        for key in 0..<60 { #expect((values[key] ?? nil) == (key % 3 == 0 ? nil : "value \(key)")) }
        let statements = calls.withLock { $0 }
        #expect(statements.flatMap { $0 }.sorted() == Array(0..<60))
        #expect(statements.count < 60, "every read went alone: \(statements.count) statements")

        failing.withLock { $0 = true }
        let failures = await withTaskGroup(of: Bool.self) { group in
            for key in 0..<5 {
                group.addTask {
                    do {
                        _ = try await reads.value(for: key)
                        return false
                    } catch {
                        return true
                    }
                }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(failures == 5)
    }

    @Test("reads of activities asked for together answer each with its own record, or nil, and see what was committed before them", arguments: StoreKind.available)
    func storeReadsActivities(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for index in 0..<40 where index % 4 != 0 {
                _ = try await store.acceptUpdate(
                    ActivityUpdate(appID: "app_test", activityID: "read-\(index)", contentState: ["n": .integer(Int64(index))]), at: t0
                )
            }
            let found = try await withThrowingTaskGroup(of: (Int, ActivityRecord?).self) { group in
                for index in 0..<40 {
                    group.addTask { (index, try await store.activityWithoutInstanceCounts(appID: "app_test", activityID: "read-\(index)")) }
                }
                return try await group.reduce(into: [Int: ActivityRecord?]()) { $0[$1.0] = $1.1 }
            }
            for index in 0..<40 {
                let record = found[index] ?? nil
                if index % 4 == 0 {
                    #expect(record == nil)
                } else {
                    #expect(record?.activityID == "read-\(index)")
                    #expect(record?.contentState == ["n": .integer(Int64(index))])
                }
            }
            // Another app's activity of the same id is not this app's.
            try await makeApp(store, id: "app_other")
            #expect(try await store.activityWithoutInstanceCounts(appID: "app_other", activityID: "read-1") == nil)

            // Each update, then a read of its activity, while other reads keep the statements busy: the read sees the
            // update it follows.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<8 {
                    group.addTask {
                        for round in 1...5 {
                            let activity = "seen-\(writer)"
                            let accepted = try await store.acceptUpdate(
                                ActivityUpdate(appID: "app_test", activityID: activity, contentState: ["round": .integer(Int64(round))]),
                                at: t0.addingTimeInterval(Double(round))
                            )
                            let read = try await store.activityWithoutInstanceCounts(appID: "app_test", activityID: activity)
                            #expect(read?.sequence == accepted.sequence)
                        }
                    }
                }
                for reader in 0..<8 {
                    group.addTask {
                        for _ in 0..<10 { _ = try await store.activityWithoutInstanceCounts(appID: "app_test", activityID: "read-\(reader)") }
                    }
                }
                try await group.waitForAll()
            }
        }
    }
}
