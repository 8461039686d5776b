import Testing

@testable import LivelineDispatch

/// Which attempts of a pass go to the timeline: whatever the pass turns out to be, the newest `keep` attempts written
/// are the newest `keep` of all of them, and a large pass writes few more than that.
@Suite("Timeline thinning")
struct TimelineThinningTests {
    /// One batch of a simulated pass: its instances, and its attempts as numbers rising in the order they were made.
    struct Batch: Equatable {
        var instances: Int
        var attempts: [Int]
    }

    /// Batches of `sizes` instances, each with `attemptsPer(batch)` attempts, numbered in order.
    static func pass(_ sizes: [Int], attemptsPer: (Int) -> Int = { $0 }) -> [Batch] {
        var next = 0
        return sizes.map { size in
            let count = attemptsPer(size)
            defer { next += count }
            return Batch(instances: size, attempts: Array(next..<(next + count)))
        }
    }

    /// The attempts written for the timeline, in the order they are written, when `batches` are recorded in order and
    /// the Store's count `pending` arrives with batch `countedAt` (none when nil).
    static func written(_ batches: [Batch], keep: Int, pending: Int?, countedAt: Int = 0) -> [Int] {
        var thinning = TimelineThinning<Batch>(keep: keep)
        var written: [Int] = []
        for (index, batch) in batches.enumerated() {
            if let pending, index == countedAt { thinning.counted(pending: pending) }
            switch thinning.record(batch, instances: batch.instances, attempts: batch.attempts.count) {
            case .hold: break
            case .write(let earlier): written += (earlier + [batch]).flatMap(\.attempts)
            }
        }
        written += thinning.passEnded().flatMap(\.attempts)
        #expect(thinning.heldAttempts == 0)
        return written
    }

    /// The timeline's newest `keep` attempts are those it would hold had every attempt been written, in order.
    static func expectNewestKept(_ batches: [Batch], keep: Int, written: [Int], sourceLocation: SourceLocation = #_sourceLocation) {
        let all = batches.flatMap(\.attempts)
        #expect(written == written.sorted(), "attempts are written in the order they were made", sourceLocation: sourceLocation)
        #expect(Array(written.suffix(keep)) == Array(all.suffix(keep)), sourceLocation: sourceLocation)
    }

    @Test("A pass never counted writes every attempt as it comes")
    func uncounted() {
        let batches = Self.pass(Array(repeating: 250, count: 40))
        let written = Self.written(batches, keep: 1000, pending: nil)
        #expect(written == batches.flatMap(\.attempts))
    }

    @Test("A counted pass of ten times what the timeline keeps writes about twice what it keeps, the newest among them")
    func largePass() {
        let batches = Self.pass(Array(repeating: 250, count: 400))  // 100,000 instances
        let written = Self.written(batches, keep: 10_000, pending: 100_000)
        Self.expectNewestKept(batches, keep: 10_000, written: written)
        // The held 10,000 and the last 10,000 (less the batch that switched): 20,000 of 100,000.
        #expect(written.count <= 20_000)
        #expect(written.count >= 10_000)
    }

    @Test("A counted pass smaller than what the timeline keeps holds nothing back")
    func smallPass() {
        let batches = Self.pass([250, 250, 100])
        var thinning = TimelineThinning<Batch>(keep: 1000)
        thinning.counted(pending: 600)
        for batch in batches {
            guard case .write(let earlier) = thinning.record(batch, instances: batch.instances, attempts: batch.attempts.count) else {
                Issue.record("a batch was held back")
                return
            }
            #expect(earlier.isEmpty)
        }
        #expect(thinning.passEnded().isEmpty)
    }

    @Test(
        "Whatever the count and however the pass ends, the newest attempts are written",
        arguments: [
            // (batches of instances, attempts per instance, keep, count, counted at batch)
            (Array(repeating: 10, count: 50), 1, 40, 500, 0),  // as counted
            (Array(repeating: 10, count: 50), 1, 40, 5_000, 0),  // counted ten times too many: the pass stopped early
            (Array(repeating: 10, count: 50), 1, 40, 100, 0),  // counted too few: instances came meanwhile
            (Array(repeating: 10, count: 50), 3, 40, 500, 0),  // retries: more attempts than instances
            (Array(repeating: 10, count: 50), 0, 40, 500, 0),  // no attempt at all (starts cancelled)
            (Array(repeating: 10, count: 50), 1, 40, 400, 10),  // counted after the first batches were written
            ([1, 7, 3, 40, 2, 33, 9, 1, 1, 64, 5, 12, 90, 4], 1, 25, 272, 0),  // batches of every size
            ([1, 7, 3, 40, 2, 33, 9, 1, 1, 64, 5, 12, 90, 4], 2, 25, 10_000, 2),
            (Array(repeating: 100, count: 5), 1, 40, 500, 0),  // batches larger than what the timeline keeps
            (Array(repeating: 10, count: 50), 1, 1, 500, 0),  // a timeline of one
        ]
    )
    func newestKept(sizes: [Int], perInstance: Int, keep: Int, pending: Int, countedAt: Int) {
        let batches = Self.pass(sizes) { $0 * perInstance }
        let written = Self.written(batches, keep: keep, pending: pending, countedAt: countedAt)
        Self.expectNewestKept(batches, keep: keep, written: written)
    }

    @Test("A pass that stops early writes the newest attempts it held when it ends")
    func stoppedEarly() {
        // Counted 100,000; stopped after 20 batches of 250, all held back.
        let batches = Self.pass(Array(repeating: 250, count: 20))
        var thinning = TimelineThinning<Batch>(keep: 1000)
        thinning.counted(pending: 100_000)
        for batch in batches {
            #expect(thinning.record(batch, instances: batch.instances, attempts: batch.attempts.count) == .hold)
        }
        #expect(thinning.heldAttempts == 1000)
        #expect(thinning.passEnded() == Array(batches.suffix(4)))
    }

    @Test("A slice's pass takes its slice's size as its count, unread; a whole activity's pass is counted by the Store")
    func countWithoutReading() {
        #expect(TimelineThinning<Batch>.countWithoutReading(slice: true, sliceSize: 10_000) == 10_000)
        #expect(TimelineThinning<Batch>.countWithoutReading(slice: false, sliceSize: 10_000) == nil)
        #expect(TimelineThinning<Batch>.countWithoutReading(slice: true, sliceSize: nil) == nil)
        #expect(TimelineThinning<Batch>.countWithoutReading(slice: true, sliceSize: 0) == nil)
        // The last slice of a plan holds fewer than the size: the slice's newest attempts are still those written.
        let lastSlice = Self.pass(Array(repeating: 500, count: 7))
        let size = TimelineThinning<Batch>.countWithoutReading(slice: true, sliceSize: 10_000)
        let written = Self.written(lastSlice, keep: 1_000, pending: size)
        Self.expectNewestKept(lastSlice, keep: 1_000, written: written)
        #expect(written.count == 1_000)
    }

    @Test("A second count is ignored; a count below nothing is nothing")
    func counts() {
        var thinning = TimelineThinning<Batch>(keep: 10)
        thinning.counted(pending: -5)
        #expect(thinning.toCome == 0)
        thinning.counted(pending: 1000)
        #expect(thinning.toCome == 0)
        var other = TimelineThinning<Batch>(keep: 10)
        other.counted(pending: 100)
        _ = other.record(Batch(instances: 30, attempts: []), instances: 30, attempts: 0)
        #expect(other.toCome == 70)
    }
}

extension TimelineThinning.Decision: Equatable where Batch: Equatable {
    public static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case (.hold, .hold): true
        case (.write(let a), .write(let b)): a == b
        default: false
        }
    }
}
