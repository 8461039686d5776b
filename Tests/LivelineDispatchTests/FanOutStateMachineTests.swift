import LivelineCore
import Testing

@testable import LivelineDispatch

/// The fan-out's decisions, case by case, without a socket or a database: events in, actions out.
@Suite("Fan-out state machine")
struct FanOutStateMachineTests {
    struct Rendition: FanOutRendition, Equatable {
        var sequence: Int64
    }

    struct Result: FanOutResult, Equatable {
        var device: String
        var fanOutOutcome: FanOutInstanceOutcome
    }

    typealias Machine = FanOutStateMachine<String, Rendition, Result>

    /// The actions up to the next `wait` or `release`.
    static func drain(_ machine: inout Machine) -> [Machine.Action] {
        var actions: [Machine.Action] = []
        while true {
            let action = machine.nextAction()
            actions.append(action)
            switch action {
            case .wait, .release: return actions
            default: continue
            }
        }
    }

    static func devices(_ range: ClosedRange<Int>) -> [String] { range.map { String(format: "d%05d", $0) } }

    static func limits(
        pageSize: Int = 4, pushesPerCall: Int = 2, pushesInFlight: Int = 4, progressBatchSize: Int = 2, progressBatchesBehind: Int = 2
    ) -> FanOutLimits {
        FanOutLimits(
            pageSize: pageSize, pushesPerCall: pushesPerCall, pushesInFlight: pushesInFlight, progressBatchSize: progressBatchSize,
            progressBatchesBehind: progressBatchesBehind
        )
    }

    static func done(_ devices: [String]) -> [Result] { devices.map { Result(device: $0, fanOutOutcome: .done) } }

    // MARK: Shapes of actions

    static func sent(_ actions: [Machine.Action]) -> [[String]] {
        actions.compactMap { if case .send(let instances, _) = $0 { Array(instances) } else { nil } }
    }

    static func reads(_ actions: [Machine.Action]) -> [(Platform, Int64?, String?)] {
        actions.compactMap { if case .readPage(let platform, let below, let after) = $0 { (platform, below, after) } else { nil } }
    }

    static func recorded(_ actions: [Machine.Action]) -> [[Result]] {
        actions.compactMap { if case .recordProgress(let batch) = $0 { batch } else { nil } }
    }

    static func release(_ actions: [Machine.Action]) -> Machine.ReleaseTiming? {
        if case .release(let timing) = actions.last { timing } else { nil }
    }

    // MARK: Cases

    @Test("a pass with no instances behind reads one page per platform and releases at once")
    func nothingBehind() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits())
        var actions = Self.drain(&machine)
        #expect(Self.reads(actions).map(\.0) == [.ios])
        #expect(Self.reads(actions).first?.1 == nil && Self.reads(actions).first?.2 == nil)
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        actions = Self.drain(&machine)
        #expect(Self.reads(actions).map(\.0) == [.android])
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        #expect(Self.release(Self.drain(&machine)) == .now)
    }

    @Test("a first page that says the later platforms have nothing behind ends the pass without reading theirs")
    func laterPlatformsSkipped() {
        // Nothing behind anywhere: one read for the whole pass.
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits())
        #expect(Self.reads(Self.drain(&machine)).map(\.0) == [.ios])
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil, nothingBehind: [.android]))
        var actions = Self.drain(&machine)
        #expect(Self.reads(actions).isEmpty && Self.release(actions) == .now)

        // One phone: its page is sent and recorded, and the pass ends without a read for Android.
        machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 4, progressBatchSize: 1))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: ["d00001"], cursor: "d00001", rendition: Rendition(sequence: 3), nothingBehind: [.android]))
        actions = Self.drain(&machine)
        #expect(Self.sent(actions) == [["d00001"]] && Self.reads(actions).isEmpty)
        machine.receive(.resultsReceived(Self.done(["d00001"])))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(["d00001"])])
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.reads(actions).isEmpty && Self.release(actions) == .now)

        // Only a later page's word is not taken: a read-ahead says nothing of other platforms.
        machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 1, progressBatchSize: 1))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: ["d00001"], cursor: "d00001", rendition: Rendition(sequence: 3)))
        actions = Self.drain(&machine)
        #expect(Self.reads(actions).map(\.0) == [.ios])
        machine.receive(.resultsReceived(Self.done(["d00001"])))
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil, nothingBehind: [.android]))
        actions = Self.drain(&machine)
        machine.receive(.progressRecorded)
        actions += Self.drain(&machine)
        #expect(Self.reads(actions).map(\.0) == [.android], "\(actions)")
    }

    @Test("one read of a first page with the later platforms' says what it can: all of them when it is short, this platform's page when it is full of it")
    func firstPageReadTogether() {
        // Instances as "platform:device".
        func platform(_ instance: String) -> Platform { instance.hasPrefix("ios:") ? .ios : .android }
        func look(_ read: [String], pageSize: Int = 3) -> ([String], [Platform])? {
            Machine.firstPage(of: .ios, in: read, readWith: [.android], pageSize: pageSize, platformOf: platform)
                .map { ($0.instances, $0.nothingBehind) }
        }
        // Short: everything behind is in it.
        #expect(look([]).map { $0.0 == [] && $0.1 == [.android] } == true)
        #expect(look(["ios:a", "ios:b"]).map { $0.0 == ["ios:a", "ios:b"] && $0.1 == [.android] } == true)
        #expect(look(["ios:a", "android:b"]).map { $0.0 == ["ios:a"] && $0.1 == [] } == true)
        #expect(look(["android:a"]).map { $0.0 == [] && $0.1 == [] } == true)
        // Full, all iOS: iOS's first page, nothing said of Android.
        #expect(look(["ios:a", "ios:b", "ios:c"]).map { $0.0 == ["ios:a", "ios:b", "ios:c"] && $0.1 == [] } == true)
        // Full and mixed: iOS's part is short of a page, though more may follow: read alone.
        #expect(look(["ios:a", "android:b", "ios:c"]) == nil)
        #expect(look(["android:a", "android:b", "android:c"]) == nil)
    }

    @Test("a pass asks for slices only when some are left, or when its first read did not hold every instance to send, or held more than a slice")
    func slicesAskedFor() {
        // The first read held all 40 behind: no more than a slice of 50, or of 40, is sent alone.
        #expect(!Machine.asksForSlices(slicesLeft: false, pending: 40, sliceSize: 50))
        #expect(!Machine.asksForSlices(slicesLeft: false, pending: 40, sliceSize: 40))
        #expect(!Machine.asksForSlices(slicesLeft: false, pending: 0, sliceSize: 40))
        // More than a slice: the Store plans them.
        #expect(Machine.asksForSlices(slicesLeft: false, pending: 41, sliceSize: 40))
        // A full page may have more behind it; slices left by a holder that stopped are adopted, whatever the read.
        #expect(Machine.asksForSlices(slicesLeft: false, pending: nil, sliceSize: 10_000))
        #expect(Machine.asksForSlices(slicesLeft: true, pending: 1, sliceSize: 10_000))
        #expect(Machine.asksForSlices(slicesLeft: true, pending: nil, sliceSize: 10_000))
    }

    @Test("a page goes out in chunks within the in-flight limit while the next page is read ahead")
    func chunksAndReadAhead() {
        var machine = Machine(platforms: [.ios], limits: Self.limits(pageSize: 4, pushesPerCall: 2, pushesInFlight: 3))
        _ = Self.drain(&machine)
        let page = Self.devices(1...4)
        machine.receive(.pageRead(instances: page, cursor: "d00004", rendition: Rendition(sequence: 7)))
        let actions = Self.drain(&machine)
        // The read-ahead first, after the page's last device, below the sequence being sent.
        let reads = Self.reads(actions)
        #expect(reads.count == 1)
        #expect(reads.first?.1 == 7 && reads.first?.2 == "d00004")
        // Two pushes, then one (the in-flight limit of 3), then wait.
        #expect(Self.sent(actions) == [["d00001", "d00002"], ["d00003"]])
        if case .wait = actions.last {} else { Issue.record("expected to wait, got \(String(describing: actions.last))") }
        // Results free the window: the last device goes.
        machine.receive(.resultsReceived(Self.done(["d00001", "d00002"])))
        let next = Self.drain(&machine)
        #expect(Self.sent(next) == [["d00004"]])
        #expect(Self.recorded(next) == [Self.done(["d00001", "d00002"])])
    }

    @Test("every send carries the rendition of the page it belongs to; a newer one takes over (coalescing)")
    func newerSequenceCoalesces() {
        var machine = Machine(platforms: [.ios], limits: Self.limits(pageSize: 2, pushesPerCall: 2, pushesInFlight: 8))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...2), cursor: "d00002", rendition: Rendition(sequence: 1)))
        var actions = Self.drain(&machine)
        #expect(actions.contains { if case .send(_, let rendition) = $0 { rendition.sequence == 1 } else { false } })
        // The next page was read after sequence 2 was accepted.
        machine.receive(.pageRead(instances: Self.devices(3...4), cursor: "d00004", rendition: Rendition(sequence: 2)))
        actions = Self.drain(&machine)
        let sends = actions.compactMap { if case .send(let instances, let rendition) = $0 { (Array(instances), rendition.sequence) } else { nil } }
        #expect(sends.count == 1)
        #expect(sends.first?.0 == ["d00003", "d00004"] && sends.first?.1 == 2)
        // The read after it asks for instances below the newer sequence.
        #expect(Self.reads(actions).first?.1 == 2 && Self.reads(actions).first?.2 == "d00004")
    }

    @Test("progress is written one batch at a time, in order, and sends wait while too many batches are behind")
    func progressBackPressure() {
        var machine = Machine(
            platforms: [.ios],
            limits: Self.limits(pageSize: 100, pushesPerCall: 1, pushesInFlight: 100, progressBatchSize: 1, progressBatchesBehind: 1)
        )
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...6), cursor: "d00006", rendition: Rendition(sequence: 3)))
        var actions = Self.drain(&machine)
        #expect(Self.sent(actions).count == 6)
        machine.receive(.resultsReceived(Self.done(["d00001"])))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(["d00001"])])
        // A second batch waits behind the first: only one write at a time.
        machine.receive(.resultsReceived(Self.done(["d00002"])))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions).isEmpty)
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(["d00002"])])
    }

    @Test("sends stop while more batches wait than allowed, and resume as they are written")
    func sendsWaitForTheStore() {
        var machine = Machine(
            platforms: [.ios],
            limits: Self.limits(pageSize: 10, pushesPerCall: 1, pushesInFlight: 2, progressBatchSize: 1, progressBatchesBehind: 1)
        )
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...5), cursor: "d00005", rendition: Rendition(sequence: 1)))
        var actions = Self.drain(&machine)
        #expect(Self.sent(actions) == [["d00001"], ["d00002"]])
        machine.receive(.resultsReceived(Self.done(["d00001"])))  // batch 1 written now
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions).count == 1)
        #expect(Self.sent(actions) == [["d00003"]])  // one batch behind: allowed
        machine.receive(.resultsReceived(Self.done(["d00002"])))  // batch 2 queued: two behind
        actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty)
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(["d00002"])])
        #expect(Self.sent(actions) == [["d00004"]])
    }

    @Test("the pass ends when the last page is short: remaining results are recorded, then the next platform")
    func lastPageThenNextPlatform() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 4, pushesPerCall: 4, progressBatchSize: 10))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...3), cursor: "d00003", rendition: Rendition(sequence: 1)))
        var actions = Self.drain(&machine)
        #expect(Self.reads(actions).isEmpty, "a short page is the last one")
        #expect(Self.sent(actions) == [Self.devices(1...3)])
        machine.receive(.resultsReceived(Self.done(Self.devices(1...3))))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(Self.devices(1...3))], "the partial batch is forced out at the end")
        #expect(Self.reads(actions).isEmpty, "the next platform waits for the write")
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.reads(actions).map(\.0) == [.android])
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        #expect(Self.release(Self.drain(&machine)) == .now)
    }

    @Test("an empty read-ahead page ends the platform's pass")
    func emptyReadAhead() {
        var machine = Machine(platforms: [.ios], limits: Self.limits(pageSize: 2, pushesPerCall: 2, progressBatchSize: 10))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...2), cursor: "d00002", rendition: Rendition(sequence: 1)))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        machine.receive(.resultsReceived(Self.done(Self.devices(1...2))))
        var actions = Self.drain(&machine)
        #expect(Self.recorded(actions).count == 1)
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.release(actions) == .now)
    }

    @Test("results that ran out of retries release the activity after the pass-retry delay")
    func exhaustedRetriesLater() {
        var machine = Machine(platforms: [.ios], limits: Self.limits(pageSize: 4, pushesPerCall: 4, progressBatchSize: 10))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: ["a"], cursor: "a", rendition: Rendition(sequence: 1)))
        _ = Self.drain(&machine)
        machine.receive(.resultsReceived([Result(device: "a", fanOutOutcome: .retryLater)]))
        _ = Self.drain(&machine)
        machine.receive(.progressRecorded)
        #expect(Self.release(Self.drain(&machine)) == .afterPassRetryDelay)
    }

    @Test("refused credentials stop the platform's sends, are reported once, and the next platform still goes")
    func credentialsRefused() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 10, pushesPerCall: 1, pushesInFlight: 2))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...5), cursor: "d00005", rendition: Rendition(sequence: 1)))
        _ = Self.drain(&machine)
        machine.receive(.resultsReceived([Result(device: "d00001", fanOutOutcome: .credentialsRefused)]))
        var actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty, "no push after the credentials were refused")
        machine.receive(.resultsReceived(Self.done(["d00002"])))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions).count == 1)
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        let reports = actions.compactMap { if case .reportCredentialsRefused(let platform) = $0 { platform } else { nil } }
        #expect(reports == [.ios])
        #expect(Self.reads(actions).map(\.0) == [.android])
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        #expect(Self.release(Self.drain(&machine)) == .afterPassRetryDelay)
    }

    @Test("a lost claim stops the pass: what is in flight is recorded, the activity is left to its new holder")
    func claimLost() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 2, pushesPerCall: 2, progressBatchSize: 10))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...2), cursor: "d00002", rendition: Rendition(sequence: 1)))
        _ = Self.drain(&machine)
        machine.receive(.claimLost)
        var actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty && Self.reads(actions).isEmpty)
        machine.receive(.resultsReceived(Self.done(Self.devices(1...2))))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions).count == 1)
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.reads(actions).isEmpty, "no other platform after the claim is lost")
        #expect(Self.release(actions) == .unscheduled)
    }

    @Test("a lease found lost while pushes are in flight: nothing new goes out, what is in flight is recorded, no other platform")
    func leaseLost() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 5, pushesPerCall: 1, pushesInFlight: 1))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...5), cursor: "d00005", rendition: Rendition(sequence: 1)))
        var actions = Self.drain(&machine)
        #expect(Self.sent(actions) == [["d00001"]])
        #expect(Self.reads(actions).count == 1, "the next page is read ahead")
        machine.receive(.leaseLost)
        machine.receive(.resultsReceived(Self.done(["d00001"])))
        actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty && Self.reads(actions).isEmpty)
        // The page read ahead before the loss still arrives; nothing of it is sent, and what came back is recorded.
        machine.receive(.pageRead(instances: Self.devices(6...7), cursor: "d00007", rendition: nil))
        actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty && Self.reads(actions).isEmpty)
        #expect(Self.recorded(actions) == [Self.done(["d00001"])])
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.reads(actions).isEmpty, "no other platform after the lease is lost")
        #expect(Self.release(actions) == .unscheduled)
    }

    @Test("a Store failure on a page ends the platform's pass and retries soon")
    func storeFailure() {
        var machine = Machine(platforms: [.ios], limits: Self.limits(pageSize: 2, pushesPerCall: 2, progressBatchSize: 10))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...2), cursor: "d00002", rendition: Rendition(sequence: 1)))
        _ = Self.drain(&machine)
        machine.receive(.storeFailed)
        machine.receive(.resultsReceived(Self.done(Self.devices(1...2))))
        _ = Self.drain(&machine)
        machine.receive(.progressRecorded)
        #expect(Self.release(Self.drain(&machine)) == .afterStoreRetryDelay)
    }

    @Test("a platform without a transport waits for the pass-retry delay; the others still go")
    func transportUnavailable() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits())
        _ = Self.drain(&machine)
        machine.receive(.transportUnavailable)
        let actions = Self.drain(&machine)
        #expect(Self.reads(actions).map(\.0) == [.android])
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        #expect(Self.release(Self.drain(&machine)) == .afterPassRetryDelay)
    }

    @Test("an activity with no state to send ends the pass")
    func nothingToSend() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits())
        _ = Self.drain(&machine)
        machine.receive(.nothingToSend)
        #expect(Self.release(Self.drain(&machine)) == .now)
    }

    @Test("on shutdown nothing new goes out; in-flight results are recorded and the claim handed back unscheduled")
    func shutdown() {
        var machine = Machine(platforms: [.ios, .android], limits: Self.limits(pageSize: 10, pushesPerCall: 1, pushesInFlight: 1))
        _ = Self.drain(&machine)
        machine.receive(.pageRead(instances: Self.devices(1...5), cursor: "d00005", rendition: Rendition(sequence: 1)))
        var actions = Self.drain(&machine)
        #expect(Self.sent(actions) == [["d00001"]])
        machine.receive(.shutdown)
        machine.receive(.resultsReceived(Self.done(["d00001"])))
        actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty)
        #expect(Self.recorded(actions) == [Self.done(["d00001"])])
        machine.receive(.progressRecorded)
        #expect(Self.release(Self.drain(&machine)) == .unscheduled)
    }

    @Test("shutdown before the first page arrives: the page is not sent")
    func shutdownBeforeFirstPage() {
        var machine = Machine(platforms: [.ios], limits: Self.limits())
        _ = Self.drain(&machine)
        machine.receive(.shutdown)
        machine.receive(.pageRead(instances: ["a"], cursor: "a", rendition: Rendition(sequence: 1)))
        let actions = Self.drain(&machine)
        #expect(Self.sent(actions).isEmpty)
        #expect(Self.release(actions) == .unscheduled)
    }

    @Test("a call that brings back more results than a batch holds is recorded in batches of the batch size, the rest with the next")
    func batchesKeepTheirSize() {
        var machine = Machine(
            platforms: [.ios], limits: Self.limits(pageSize: 10, pushesPerCall: 10, pushesInFlight: 10, progressBatchSize: 4, progressBatchesBehind: 8)
        )
        _ = Self.drain(&machine)
        let page = Self.devices(1...10)
        machine.receive(.pageRead(instances: page, cursor: "d00010", rendition: Rendition(sequence: 1)))
        #expect(Self.sent(Self.drain(&machine)) == [page])
        machine.receive(.resultsReceived(Self.done(page)))
        var actions = Self.drain(&machine)
        // Two batches of 4; the other 2 wait for more results (or the end of the pass). One write at a time.
        #expect(Self.recorded(actions) == [Self.done(Array(page[0..<4]))])
        machine.receive(.progressRecorded)
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(Array(page[4..<8]))])
        machine.receive(.progressRecorded)
        // The read-ahead finds no more: the pass ends with the last 2.
        machine.receive(.pageRead(instances: [], cursor: nil, rendition: nil))
        actions = Self.drain(&machine)
        #expect(Self.recorded(actions) == [Self.done(Array(page[8..<10]))])
    }

    @Test("a fan-out of 10,000 instances sends each exactly once and records each exactly once")
    func largeFanOut() {
        let all = Self.devices(1...10_000)
        var machine = Machine(
            platforms: [.ios],
            limits: Self.limits(pageSize: 1000, pushesPerCall: 64, pushesInFlight: 512, progressBatchSize: 250, progressBatchesBehind: 4)
        )
        var sent: [String] = []
        var recorded: [String] = []
        var pendingResults: [[Result]] = []
        var pendingPage: Machine.Event?
        var writing = false
        var released: Machine.ReleaseTiming?
        var pageStart = 0
        func page(after cursor: String?) -> Machine.Event {
            let start = cursor.map { all.firstIndex(of: $0)! + 1 } ?? 0
            pageStart = start
            let instances = Array(all[start..<min(start + 1000, all.count)])
            return .pageRead(instances: instances, cursor: instances.last, rendition: cursor == nil ? Rendition(sequence: 1) : nil)
        }
        var steps = 0
        while released == nil, steps < 100_000 {
            steps += 1
            switch machine.nextAction() {
            case .readPage(_, _, let after): pendingPage = page(after: after)
            case .send(let instances, _):
                sent += instances
                pendingResults.append(Self.done(Array(instances)))
            case .recordProgress(let batch):
                #expect(!writing)
                writing = true
                recorded += batch.map(\.device)
            case .reportCredentialsRefused: Issue.record("no credentials were refused")
            case .release(let timing): released = timing
            case .wait:
                // Answer the oldest outstanding thing, alternating kinds.
                if writing, steps % 3 == 0 {
                    writing = false
                    machine.receive(.progressRecorded)
                } else if let event = pendingPage, steps % 2 == 0 || pendingResults.isEmpty {
                    pendingPage = nil
                    machine.receive(event)
                } else if !pendingResults.isEmpty {
                    machine.receive(.resultsReceived(pendingResults.removeFirst()))
                } else if writing {
                    writing = false
                    machine.receive(.progressRecorded)
                } else {
                    Issue.record("the machine waits with nothing outstanding")
                    return
                }
            }
        }
        _ = pageStart
        #expect(released == .now)
        #expect(sent == all)
        #expect(recorded.sorted() == all)
    }
}
