import Synchronization

/// Which reads of one kind go to the database together: a pure state, performed by ``CoalescedReads``.
///
/// A read asked for while fewer than `concurrency` batches are out goes at once, alone; one asked for while they are
/// all out waits with the others that arrive meanwhile, and the first batch to come back sends all of them as the next
/// batch (up to `maximumBatch` keys; the same key asked for twice is read once and answers both). A read never joins a
/// batch already sent: that statement may have begun before the read was asked for, and could miss a write committed
/// in between, which the read must see.
///
/// `Waiter` is whoever waits for a key's value (a continuation; a number in the tests).
struct ReadBatching<Key: Hashable, Waiter> {
    /// Keys sent together, and who waits for each.
    struct Batch {
        /// The keys to read, each once, in the order they were first asked for.
        var keys: [Key]
        /// Who waits for each key.
        var waiters: [Key: [Waiter]]
    }

    /// Batches out at once, at most.
    let concurrency: Int
    /// Keys in one batch, at most.
    let maximumBatch: Int
    /// Batches sent and not yet back.
    private(set) var inFlight = 0
    /// Keys waiting for a batch, in the order they were first asked for.
    private var waitingKeys: [Key] = []
    private var waiters: [Key: [Waiter]] = [:]

    init(concurrency: Int, maximumBatch: Int) {
        self.concurrency = max(1, concurrency)
        self.maximumBatch = max(1, maximumBatch)
    }

    /// How many keys wait for a batch.
    var waiting: Int { waitingKeys.count }

    /// `waiter` asks for `key`: the batch to send now, if one can go.
    mutating func ask(for key: Key, by waiter: Waiter) -> Batch? {
        if waiters[key] == nil { waitingKeys.append(key) }
        waiters[key, default: []].append(waiter)
        return nextBatch()
    }

    /// A batch came back (its waiters answered): the next batch to send, if any waits.
    mutating func batchReturned() -> Batch? {
        precondition(inFlight > 0, "a batch came back that was not sent")
        inFlight -= 1
        return nextBatch()
    }

    private mutating func nextBatch() -> Batch? {
        guard inFlight < concurrency, !waitingKeys.isEmpty else { return nil }
        let keys = Array(waitingKeys.prefix(maximumBatch))
        waitingKeys.removeFirst(keys.count)
        var taken: [Key: [Waiter]] = [:]
        taken.reserveCapacity(keys.count)
        for key in keys { taken[key] = waiters.removeValue(forKey: key) }
        inFlight += 1
        return Batch(keys: keys, waiters: taken)
    }
}

extension ReadBatching.Batch: Equatable where Waiter: Equatable {}

/// Reads of one kind by key, coalesced: while the database is busy with such reads, those asked for meanwhile go as one
/// statement (``ReadBatching``), instead of one round trip each.
///
/// On PostgreSQL a read by key costs a round trip, a hop to a pool thread and back, and the server's parse, plan and
/// run of its statement, whatever the number of rows: 64 clients posting updates, each read of its activity alone,
/// spent more of the server's CPU on those reads than on the writes. Under no load a read goes at once, alone, as
/// before.
final class CoalescedReads<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private typealias Waiter = CheckedContinuation<Value?, any Error>

    private let batching: Mutex<ReadBatching<Key, Waiter>>
    private let fetch: @Sendable ([Key]) async throws -> [Key: Value]

    /// Reads through `fetch`, which answers the value of each of the keys it is given that has one; at most
    /// `concurrency` calls of it run at once, each for at most `maximumBatch` keys.
    init(concurrency: Int, maximumBatch: Int, fetch: @escaping @Sendable ([Key]) async throws -> [Key: Value]) {
        batching = Mutex(ReadBatching(concurrency: concurrency, maximumBatch: maximumBatch))
        self.fetch = fetch
    }

    /// The value of `key`, or nil when it has none, read after this call began.
    func value(for key: Key) async throws -> Value? {
        try await withCheckedThrowingContinuation { (waiter: Waiter) in
            if let batch = batching.withLock({ $0.ask(for: key, by: waiter) }) {
                Task { await self.send(batch) }
            }
        }
    }

    /// Sends `batch`, answers its waiters, then sends whatever batch waited for it to come back, and so on.
    private func send(_ batch: ReadBatching<Key, Waiter>.Batch) async {
        var next: ReadBatching<Key, Waiter>.Batch? = batch
        while let current = next {
            let result: Result<[Key: Value], any Error>
            do {
                result = .success(try await fetch(current.keys))
            } catch {
                result = .failure(error)
            }
            for (key, waiters) in current.waiters {
                let answer = result.map { $0[key] }
                for waiter in waiters { waiter.resume(with: answer) }
            }
            next = batching.withLock { $0.batchReturned() }
        }
    }
}
