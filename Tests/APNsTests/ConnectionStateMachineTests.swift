import NIOCore
import NIOHTTP2
import Testing

@testable import APNs

/// A request as the state machine sees it: a name for messages, a deadline, and whether it was completed elsewhere.
private final class TestRequest: APNsConnectionStateMachineRequest, Equatable, CustomStringConvertible {
    let name: String
    let deadline: NIODeadline
    var isFinished = false

    init(_ name: String, deadline: NIODeadline = .distantFuture) {
        self.name = name
        self.deadline = deadline
    }

    static func == (lhs: TestRequest, rhs: TestRequest) -> Bool { lhs === rhs }
    var description: String { name }
}

private typealias Machine = APNsConnectionStateMachine<TestRequest>

/// Holds a machine and passes events to it. `#expect` cannot take a mutating call on a value
/// (swiftlang/swift-testing#1360), so the tests drive the machine through this reference; it adds no behaviour.
@dynamicMemberLookup
private final class Driver {
    var machine: Machine

    init(_ machine: Machine) {
        self.machine = machine
    }

    subscript<Value>(dynamicMember keyPath: KeyPath<Machine, Value>) -> Value {
        machine[keyPath: keyPath]
    }

    func request(on streamID: HTTP2StreamID) -> TestRequest? { machine.request(on: streamID) }
    func inboundWindowChanged(to size: Int?) -> Int? { machine.inboundWindowChanged(to: size) }
    func submit(_ request: TestRequest, now: NIODeadline = start) -> Machine.SubmitAction { machine.submit(request, now: now) }
    func nextQueuedWrite(now: NIODeadline = start) -> Machine.StreamWrite? { machine.nextQueuedWrite(now: now) }
    func takeUnsendable() -> [TestRequest] { machine.takeUnsendable() }
    func responseEnded(on streamID: HTTP2StreamID, now: NIODeadline = start) -> Machine.ConnectionAction {
        machine.responseEnded(on: streamID, now: now)
    }
    func streamResetByClient(_ streamID: HTTP2StreamID) -> Machine.ConnectionAction {
        machine.streamResetByClient(streamID)
    }
    func streamReset(_ streamID: HTTP2StreamID, code: HTTP2ErrorCode?) -> Machine.UnansweredStreamAction {
        machine.streamReset(streamID, code: code)
    }
    func streamFailed(_ streamID: HTTP2StreamID) -> Machine.UnansweredStreamAction { machine.streamFailed(streamID) }
    func frameReceived() { machine.frameReceived() }
    func readComplete() -> Machine.FlushAction { machine.readComplete() }
    func settingsReceived(maxConcurrentStreams: Int?) -> Machine.ConnectionAction {
        machine.settingsReceived(maxConcurrentStreams: maxConcurrentStreams)
    }
    func goAwayReceived(lastStreamID: HTTP2StreamID, errorCode: HTTP2ErrorCode, reason: String?) -> Machine.ConnectionAction {
        machine.goAwayReceived(lastStreamID: lastStreamID, errorCode: errorCode, reason: reason)
    }
    func pingAcknowledged() { machine.pingAcknowledged() }
    func writeNeedsFlush() -> Machine.FlushAction { machine.writeNeedsFlush() }
    func scheduledFlushRan() { machine.scheduledFlushRan() }
    func retire(because reason: Machine.CloseReason) -> Machine.ConnectionAction { machine.retire(because: reason) }
    func close(because reason: Machine.CloseReason) -> Bool { machine.close(because: reason) }
    func clientShutDown() -> Bool { machine.clientShutDown() }
    func errorCaught(_ error: any Error) -> Machine.ConnectionAction { machine.errorCaught(error) }
    func channelInactive() -> Machine.ClosedActions? { machine.channelInactive() }
    func timerFired(now: NIODeadline) -> Machine.TimerActions { machine.timerFired(now: now) }
}

private struct TestError: Error, CustomStringConvertible {
    var description: String { "boom" }
}

/// When the connection opened; every other time is relative to it.
private let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

private func at(_ offset: Duration) -> NIODeadline {
    start + TimeAmount(offset)
}

private func makeMachine(
    maximumStreamID: Int = Int(Int32.max),
    connectTimeout: Duration = .seconds(10),
    idlePingInterval: Duration = .seconds(60),
    pingTimeout: Duration = .seconds(20),
    streamLimit: StreamLimit.Configuration = anyTimeLeft
) -> Driver {
    Driver(Machine(
        configuration: .init(
            maximumStreamID: maximumStreamID,
            connectTimeout: connectTimeout,
            idlePingInterval: idlePingInterval,
            pingTimeout: pingTimeout,
            streamLimit: streamLimit
        ),
        now: start
    ))
}

/// The client's stream limit for a 30 s timeout, except that a request is written with any time left: most tests here
/// are about other things, with deadlines a few seconds off.
private let anyTimeLeft: StreamLimit.Configuration = {
    var configuration = StreamLimit.Configuration(requestTimeout: .seconds(30))
    configuration.leastTimeLeft = .nanoseconds(0)
    return configuration
}()

/// A machine that received the server's first SETTINGS (allowing `limit` streams) in one read.
private func makeReadyMachine(
    limit: Int? = 100, maximumStreamID: Int = Int(Int32.max),
    streamLimit: StreamLimit.Configuration = anyTimeLeft
) -> Driver {
    let machine = makeMachine(maximumStreamID: maximumStreamID, streamLimit: streamLimit)
    machine.frameReceived()
    let action = machine.settingsReceived(maxConcurrentStreams: limit)
    #expect(action == .notifyReady)
    #expect(machine.nextQueuedWrite() == nil)
    #expect(machine.readComplete() == .none)
    return machine
}

/// Submits `request`, expecting it to be written at once; returns its stream id.
private func submitWritten(
    _ machine: Driver,
    _ request: TestRequest,
    sourceLocation: SourceLocation = #_sourceLocation
) -> Int {
    guard case .write(let write) = machine.submit(request) else {
        Issue.record("\(request) was not written at once", sourceLocation: sourceLocation)
        return -1
    }
    #expect(write.request == request, sourceLocation: sourceLocation)
    #expect(write.then == .none, sourceLocation: sourceLocation)
    return Int(write.streamID)
}

/// Pulls every queued request that may be written now: `(request, stream id)` in order.
private func drainQueue(_ machine: Driver) -> [String] {
    var written: [String] = []
    while let write = machine.nextQueuedWrite() {
        written.append("\(write.request)@\(Int(write.streamID))")
    }
    return written
}

@Suite("APNs connection state machine")
struct ConnectionStateMachineTests {
    // MARK: Starting

    @Test("not ready until the server's first SETTINGS; requests submitted before wait and then go out")
    func readyOnFirstSettings() {
        let machine = makeMachine()
        #expect(!machine.isReady)
        let early = TestRequest("early")
        #expect(machine.submit(early) == .queued)
        #expect(machine.nextQueuedWrite() == nil, "nothing is written before SETTINGS")
        #expect(machine.openStreams == 0)

        machine.frameReceived()
        #expect(machine.settingsReceived(maxConcurrentStreams: 1) == .notifyReady)
        #expect(machine.isReady)
        #expect(drainQueue(machine) == ["early@1"])
        // Later SETTINGS do not announce readiness again.
        #expect(machine.settingsReceived(maxConcurrentStreams: 1) == .none)
        #expect(machine.maxConcurrentStreams == 1)
    }

    @Test("a connection without SETTINGS within the connect timeout closes")
    func connectTimeout() {
        let machine = makeMachine(connectTimeout: .seconds(10))
        #expect(machine.timerFired(now: at(.seconds(9))).then == .none)
        #expect(machine.closeReason == nil)
        let actions = machine.timerFired(now: at(.seconds(10)))
        #expect(actions.then == .close)
        #expect(actions.ping == nil, "no PING before the connection is ready")
        #expect(machine.closeReason == .noSettings(within: .seconds(10)))
        #expect(machine.closeDescription == "no HTTP/2 settings from the server within 10.0 seconds")
    }

    // MARK: Streams

    @Test("stream ids start at 1 and advance by 2")
    func streamIDs() {
        let machine = makeReadyMachine()
        let requests = (0..<4).map { TestRequest("r\($0)") }
        let ids = requests.map { submitWritten(machine, $0) }
        #expect(ids == [1, 3, 5, 7])
        #expect(machine.nextStreamID == 9)
        #expect(machine.openStreams == 4)
        #expect(machine.request(on: 3) == requests[1])
        #expect(machine.request(on: 2) == nil)
        #expect(machine.request(on: 9) == nil)
        // Answered streams are forgotten; the others stay findable.
        #expect(machine.responseEnded(on: 1) == .none)
        #expect(machine.request(on: 1) == nil)
        #expect(machine.request(on: 5) == requests[2])
        #expect(machine.responseEnded(on: 1) == .none, "a stream ends once")
        #expect(machine.openStreams == 3)
    }

    @Test("at the server's limit requests queue, in order, and go out as streams finish")
    func queueAtLimit() {
        let machine = makeReadyMachine(limit: 2)
        let (a, b, c, d, e) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"), TestRequest("e"))
        #expect(submitWritten(machine, a) == 1)
        #expect(submitWritten(machine, b) == 3)
        #expect(machine.submit(c) == .queued)
        #expect(machine.submit(d) == .queued)
        #expect(machine.nextQueuedWrite() == nil, "no stream is free")

        #expect(machine.responseEnded(on: 1) == .sendQueued)
        // A request submitted now queues behind the ones waiting, although a stream is free.
        #expect(machine.submit(e) == .queued)
        #expect(drainQueue(machine) == ["c@5"])
        #expect(machine.responseEnded(on: 3) == .sendQueued)
        #expect(drainQueue(machine) == ["d@7"])
        #expect(machine.responseEnded(on: 5) == .sendQueued)
        #expect(drainQueue(machine) == ["e@9"])
        #expect(machine.responseEnded(on: 7) == .none, "nothing waits")
        #expect(machine.queuedRequests == 0)
    }

    @Test("a queued request that finished meanwhile (cancelled, timed out) is skipped")
    func finishedQueuedRequestsAreSkipped() {
        let machine = makeReadyMachine(limit: 1)
        let (a, b, c) = (TestRequest("a"), TestRequest("b"), TestRequest("c"))
        #expect(submitWritten(machine, a) == 1)
        #expect(machine.submit(b) == .queued)
        #expect(machine.submit(c) == .queued)
        b.isFinished = true
        #expect(machine.responseEnded(on: 1) == .sendQueued)
        #expect(drainQueue(machine) == ["c@3"])
    }

    @Test("SETTINGS raising the limit sends queued requests; lowering it holds new streams back")
    func settingsChangeTheLimit() {
        let machine = makeReadyMachine(limit: 1)
        let (a, b, c, d) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"))
        #expect(submitWritten(machine, a) == 1)
        #expect(machine.submit(b) == .queued)
        #expect(machine.submit(c) == .queued)

        #expect(machine.settingsReceived(maxConcurrentStreams: 3) == .sendQueued)
        #expect(drainQueue(machine) == ["b@3", "c@5"])
        #expect(machine.maxConcurrentStreams == 3)
        // SETTINGS without the parameter keep the limit.
        #expect(machine.settingsReceived(maxConcurrentStreams: nil) == .none)
        #expect(machine.maxConcurrentStreams == 3)

        #expect(machine.settingsReceived(maxConcurrentStreams: 1) == .none)
        #expect(machine.submit(d) == .queued, "3 streams are open, 1 is allowed")
        #expect(machine.responseEnded(on: 1) == .none)
        #expect(machine.responseEnded(on: 3) == .none, "still 1 open")
        #expect(machine.responseEnded(on: 5) == .sendQueued)
        #expect(drainQueue(machine) == ["d@7"])
    }

    @Test("REFUSED_STREAM moves the request to another connection; other resets and stream errors fail it")
    func resets() {
        let machine = makeReadyMachine(limit: 3)
        let (a, b, c, d) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"))
        _ = [a, b, c].map { submitWritten(machine, $0) }
        #expect(machine.submit(d) == .queued)

        #expect(machine.streamReset(1, code: .refusedStream) == .moveRequest(a, then: .sendQueued))
        #expect(drainQueue(machine) == ["d@7"])
        #expect(machine.streamReset(3, code: .internalError) == .failRequest(b, then: .none))
        #expect(machine.streamReset(5, code: nil) == .failRequest(c, then: .none), "closed without an error code")
        #expect(machine.streamReset(5, code: .refusedStream) == .none, "the stream is already over")
        #expect(machine.streamFailed(7) == .failRequest(d, then: .none))
        #expect(machine.streamFailed(7) == .none)
        #expect(machine.openStreams == 0)
    }

    @Test("the client resetting a stream (cancelled, malformed answer) frees it for queued requests")
    func clientReset() {
        let machine = makeReadyMachine(limit: 1)
        let (a, b) = (TestRequest("a"), TestRequest("b"))
        #expect(submitWritten(machine, a) == 1)
        #expect(machine.submit(b) == .queued)
        #expect(machine.streamResetByClient(1) == .sendQueued)
        #expect(machine.request(on: 1) == nil)
        #expect(drainQueue(machine) == ["b@3"])
        #expect(machine.streamResetByClient(1) == .none)
    }

    // MARK: GOAWAY and retiring

    @Test("GOAWAY: streams above the last stream id move, those below finish, no new streams, close when drained")
    func goAway() {
        let machine = makeReadyMachine(limit: 3)
        let (a, b, c, d, e) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"), TestRequest("e"))
        _ = [a, b, c].map { submitWritten(machine, $0) }
        #expect(machine.submit(d) == .queued)

        let action = machine.goAwayReceived(lastStreamID: 3, errorCode: .noError, reason: "Shutdown")
        #expect(action == .retire(moving: [c, d], closeNow: false), "stream 5 first, then the queue")
        #expect(machine.isRetiring)
        #expect(machine.closeReason == .goAway(.noError, reason: "Shutdown"))
        #expect(machine.request(on: 5) == nil)
        #expect(machine.submit(e) == .moveToAnotherConnection(e))
        #expect(machine.settingsReceived(maxConcurrentStreams: 10) == .none)
        #expect(machine.nextQueuedWrite() == nil)

        #expect(machine.responseEnded(on: 1) == .none, "stream 3 is still open")
        #expect(machine.responseEnded(on: 3) == .close)
        let closed = machine.channelInactive()
        #expect(closed?.failing == [])
        #expect(closed?.moving == [])
        #expect(closed?.reason == machine.closeReason?.description)
        #expect(closed?.reason.hasPrefix("GOAWAY") == true)
        #expect(closed?.reason.hasSuffix(" Shutdown") == true)
    }

    @Test("GOAWAY on an idle connection closes it at once; the first GOAWAY's reason is kept")
    func goAwayIdle() {
        let machine = makeReadyMachine()
        #expect(machine.goAwayReceived(lastStreamID: 0, errorCode: .noError, reason: nil) == .retire(moving: [], closeNow: true))
        #expect(machine.goAwayReceived(lastStreamID: 0, errorCode: .internalError, reason: "Later") == .retire(moving: [], closeNow: true))
        #expect(machine.closeReason == .goAway(.noError, reason: nil))
    }

    @Test("GOAWAY during setup closes the connection without retiring it")
    func goAwayDuringSetup() {
        let machine = makeMachine()
        let early = TestRequest("early")
        #expect(machine.submit(early) == .queued)
        #expect(machine.goAwayReceived(lastStreamID: 0, errorCode: .enhanceYourCalm, reason: "TooManyRequests") == .close)
        #expect(!machine.isRetiring)
        let closed = machine.channelInactive()
        #expect(closed?.moving == [early])
        #expect(closed?.reason == Machine.CloseReason.goAway(.enhanceYourCalm, reason: "TooManyRequests").description)
    }

    @Test("using the last stream id retires the connection; it closes once its streams are done")
    func streamIDsUsedUp() {
        let machine = makeReadyMachine(limit: 2, maximumStreamID: 5)
        let (a, b, c, d) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"))
        #expect(submitWritten(machine, a) == 1)
        #expect(submitWritten(machine, b) == 3)
        #expect(machine.submit(c) == .queued)
        #expect(machine.submit(d) == .queued)
        #expect(machine.responseEnded(on: 1) == .sendQueued)

        let write = machine.nextQueuedWrite()
        #expect(write?.request == c)
        #expect(write?.streamID == 5)
        #expect(write?.then == .retire(moving: [d], closeNow: false), "d never got a stream")
        #expect(machine.nextQueuedWrite() == nil)
        #expect(machine.isRetiring)
        #expect(machine.closeReason == .streamIDsUsedUp)
        #expect(machine.responseEnded(on: 3) == .none)
        #expect(machine.responseEnded(on: 5) == .close)
    }

    @Test("retiring for new credentials moves the queue, finishes the streams, then closes")
    func retireForCredentials() {
        let machine = makeReadyMachine(limit: 2)
        let (a, b, c, d) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"))
        #expect(submitWritten(machine, a) == 1)
        #expect(submitWritten(machine, b) == 3)
        #expect(machine.submit(c) == .queued)
        #expect(machine.submit(d) == .queued)
        d.isFinished = true

        // As the connection does on UnrelatedKeyIdInToken: retire first, then end the stream that said so.
        #expect(machine.retire(because: .unrelatedKeyIDInToken) == .retire(moving: [c], closeNow: false))
        #expect(machine.responseEnded(on: 1) == .none)
        #expect(machine.submit(TestRequest("late")) != .queued)
        #expect(machine.responseEnded(on: 3) == .close)
        #expect(machine.closeDescription == "APNs answered UnrelatedKeyIdInToken")
    }

    // MARK: Flushing

    @Test("writes inside a read are flushed once, when the read completes")
    func flushCoalescingInRead() {
        let machine = makeReadyMachine()
        machine.frameReceived()
        #expect(machine.writeNeedsFlush() == .none)
        #expect(machine.writeNeedsFlush() == .none)
        #expect(machine.readComplete() == .flushNow)
        #expect(machine.readComplete() == .none, "flushed already")
        // A read without writes flushes nothing.
        machine.frameReceived()
        #expect(machine.readComplete() == .none)
    }

    @Test("writes outside a read schedule one flush until it runs")
    func flushCoalescingOutsideRead() {
        let machine = makeReadyMachine()
        #expect(machine.writeNeedsFlush() == .scheduleFlush)
        #expect(machine.writeNeedsFlush() == .none)
        #expect(machine.writeNeedsFlush() == .none)
        machine.scheduledFlushRan()
        #expect(machine.writeNeedsFlush() == .scheduleFlush)
    }

    @Test("the receive window is topped up once half of it is used")
    func receiveWindow() {
        let machine = makeReadyMachine()
        let target = Machine.targetReceiveWindow
        #expect(machine.inboundWindowChanged(to: nil) == nil)
        #expect(machine.inboundWindowChanged(to: target) == nil)
        #expect(machine.inboundWindowChanged(to: target / 2 + 1) == nil)
        #expect(machine.inboundWindowChanged(to: target / 2) == target / 2)
        #expect(machine.inboundWindowChanged(to: 100) == target - 100)
    }

    // MARK: Deadlines and keepalive

    @Test("requests past their deadline time out, on the wire and in the queue; the freed streams take queued ones")
    func requestTimeouts() {
        let machine = makeReadyMachine(limit: 2)
        let a = TestRequest("a", deadline: at(.seconds(5)))
        let b = TestRequest("b", deadline: at(.seconds(100)))
        let c = TestRequest("c", deadline: at(.seconds(5)))
        let d = TestRequest("d", deadline: at(.seconds(100)))
        #expect(submitWritten(machine, a) == 1)
        #expect(submitWritten(machine, b) == 3)
        #expect(machine.submit(c) == .queued)
        #expect(machine.submit(d) == .queued)

        let early = machine.timerFired(now: at(.seconds(4)))
        #expect(early.timedOutStreams.isEmpty && early.timedOutQueued.isEmpty)
        let actions = machine.timerFired(now: at(.seconds(5)))
        #expect(actions.timedOutStreams.map(\.streamID) == [1])
        #expect(actions.timedOutStreams.map(\.request) == [a])
        #expect(actions.timedOutQueued == [c])
        #expect(actions.then == .sendQueued)
        #expect(drainQueue(machine) == ["d@5"])
        #expect(machine.request(on: 1) == nil)
    }

    @Test("a retiring connection whose last stream times out closes")
    func timeoutWhileRetiring() {
        let machine = makeReadyMachine()
        let a = TestRequest("a", deadline: at(.seconds(5)))
        #expect(submitWritten(machine, a) == 1)
        #expect(machine.goAwayReceived(lastStreamID: 1, errorCode: .noError, reason: nil) == .retire(moving: [], closeNow: false))
        let actions = machine.timerFired(now: at(.seconds(5)))
        #expect(actions.timedOutStreams.map(\.request) == [a])
        #expect(actions.then == .close)
    }

    @Test("a quiet connection is PINGed, and closed when the PING is not acknowledged in time")
    func pingNotAnswered() {
        let machine = makeReadyMachine()
        // The SETTINGS frame counts as traffic at the first tick.
        #expect(machine.timerFired(now: at(.seconds(1))).ping == nil)
        #expect(machine.timerFired(now: at(.seconds(60))).ping == nil, "59 s quiet")
        let ping = machine.timerFired(now: at(.seconds(61))).ping
        #expect(ping?.integer == at(.seconds(61)).uptimeNanoseconds)
        #expect(machine.timerFired(now: at(.seconds(70))).ping == nil, "one PING at a time")
        #expect(machine.timerFired(now: at(.seconds(80))).then == .none)
        let actions = machine.timerFired(now: at(.seconds(81)))
        #expect(actions.then == .close)
        #expect(machine.closeReason == .noPingAcknowledgement(within: .seconds(20)))
    }

    @Test("an acknowledged PING keeps the connection; the next one follows after another quiet interval")
    func pingAnswered() {
        let machine = makeReadyMachine()
        _ = machine.timerFired(now: at(.seconds(1)))
        #expect(machine.timerFired(now: at(.seconds(61))).ping != nil)
        machine.frameReceived()
        machine.pingAcknowledged()
        _ = machine.readComplete()
        #expect(machine.timerFired(now: at(.seconds(85))).then == .none, "acknowledged")
        #expect(machine.timerFired(now: at(.seconds(144))).ping == nil)
        #expect(machine.timerFired(now: at(.seconds(145))).ping != nil)
        #expect(machine.closeReason == nil)
    }

    @Test("no PING while frames keep arriving")
    func noPingWhenBusy() {
        let machine = makeReadyMachine()
        for second in stride(from: 30, through: 300, by: 30) {
            machine.frameReceived()
            _ = machine.readComplete()
            #expect(machine.timerFired(now: at(.seconds(second))).ping == nil)
        }
    }

    // MARK: The connection's own stream limit

    @Test("slow answers hold requests back: fewer streams open than the server allows, the rest wait unsent")
    func slowAnswersHoldRequestsBack() throws {
        // Four streams at first; answers are slow past 1 s (the mark at most 2 s).
        let machine = makeReadyMachine(
            limit: 1000, streamLimit: .init(initial: 4, minimum: 1, slowAnswer: .seconds(1), slowestMark: .seconds(2), leastTimeLeft: .seconds(1), mostTimeLeft: .seconds(60))
        )
        #expect(machine.openStreamLimit == 4)
        let requests = (0..<5).map { TestRequest("r\($0)") } + [TestRequest("r5", deadline: at(.seconds(8)))]
        for request in requests.prefix(4) {
            _ = submitWritten(machine, request)
        }
        #expect(machine.submit(requests[4]) == .queued, "the connection's own limit, under the server's 1,000")
        #expect(machine.submit(requests[5]) == .queued)

        // The first answer takes 3 s: past the mark (2 s, twice the fastest answer but capped), the limit halves.
        #expect(machine.responseEnded(on: 1, now: at(.seconds(3))) == .none, "3 open, 2 allowed: nothing more goes out")
        #expect(machine.openStreamLimit == 2)
        #expect(machine.nextQueuedWrite(now: at(.seconds(3))) == nil)
        #expect(machine.streamLimit.value == 2)

        // The next timer reports the cut, once.
        let reported = try #require(machine.timerFired(now: at(.seconds(3))).streamLimitCut)
        #expect(reported.from == 4)
        #expect(reported.to == 2)
        #expect(reported.smoothedAnswer == .seconds(3))
        #expect(reported.slowMark == .seconds(2))
        #expect(machine.timerFired(now: at(.seconds(3))).streamLimitCut == nil)

        // The answers to streams opened before the cut cut nothing more; a stream frees up once only one is open.
        #expect(machine.responseEnded(on: 3, now: at(.seconds(3))) == .none)
        #expect(machine.responseEnded(on: 5, now: at(.seconds(3))) == .sendQueued)
        #expect(drainQueue(machine) == ["r4@9"])
        #expect(machine.openStreams == 2)
        #expect(machine.queuedRequests == 1)
        #expect(machine.streamLimit.value == 2)
        #expect(machine.takeUnsendable().isEmpty)

        // r5 has 5 s left when the next stream frees up, and answers take 3 s: twice that is more than it has left.
        // It is not sent (it would likely time out on the wire after the server took it); the connection fails it.
        #expect(machine.responseEnded(on: 7, now: at(.seconds(3))) == .sendQueued)
        #expect(machine.nextQueuedWrite(now: at(.seconds(3))) == nil)
        #expect(machine.takeUnsendable() == [requests[5]])
        #expect(machine.takeUnsendable().isEmpty)
        #expect(machine.queuedRequests == 0)
        #expect(machine.openStreams == 1)
    }

    @Test("a request that waited for its connection until less than the least time is left is not written")
    func tooLateToSubmit() {
        let machine = makeReadyMachine(
            limit: 1000, streamLimit: .init(initial: 4, minimum: 1, slowAnswer: .seconds(1), slowestMark: .seconds(2), leastTimeLeft: .seconds(5), mostTimeLeft: .seconds(60))
        )
        let late = TestRequest("late", deadline: at(.seconds(4)))
        let inTime = TestRequest("in time", deadline: at(.seconds(5)))
        #expect(machine.submit(late) == .tooLate(late))
        #expect(submitWritten(machine, inTime) == 1)
        #expect(machine.openStreams == 1)
    }

    @Test("a stream that times out counts as an answer as slow as its timeout")
    func timeoutCutsTheLimit() throws {
        let machine = makeReadyMachine(
            limit: 1000, streamLimit: .init(initial: 4, minimum: 1, slowAnswer: .seconds(1), slowestMark: .seconds(2), leastTimeLeft: .seconds(1), mostTimeLeft: .seconds(60))
        )
        let a = TestRequest("a", deadline: at(.seconds(5)))
        let b = TestRequest("b", deadline: at(.seconds(5)))
        #expect(submitWritten(machine, a) == 1)
        #expect(submitWritten(machine, b) == 3)
        let actions = machine.timerFired(now: at(.seconds(5)))
        #expect(actions.timedOutStreams.map(\.request) == [a, b])
        let cut = try #require(actions.streamLimitCut)
        #expect(cut.from == 4)
        #expect(cut.to == 2)
        #expect(machine.openStreamLimit == 2)
    }

    @Test("quick answers open more streams, up to the server's limit")
    func quickAnswersOpenMoreStreams() {
        let machine = makeReadyMachine(
            limit: 6, streamLimit: .init(initial: 2, minimum: 1, slowAnswer: .seconds(1), slowestMark: .seconds(2), leastTimeLeft: .seconds(1), mostTimeLeft: .seconds(60))
        )
        let requests = (0..<10).map { TestRequest("r\($0)") }
        #expect(submitWritten(machine, requests[0]) == 1)
        #expect(submitWritten(machine, requests[1]) == 3)
        for request in requests.dropFirst(2) {
            #expect(machine.submit(request) == .queued)
        }
        // Each quick answer frees its stream and adds one: two go out for each answer.
        #expect(machine.responseEnded(on: 1, now: at(.milliseconds(10))) == .sendQueued)
        #expect(drainQueue(machine) == ["r2@5", "r3@7"])
        #expect(machine.responseEnded(on: 3, now: at(.milliseconds(10))) == .sendQueued)
        #expect(drainQueue(machine) == ["r4@9", "r5@11"])
        #expect(machine.openStreamLimit == 4)
        for streamID in [5, 7, 9] {
            _ = machine.responseEnded(on: HTTP2StreamID(streamID), now: at(.milliseconds(10)))
        }
        #expect(drainQueue(machine) == ["r6@13", "r7@15", "r8@17", "r9@19"])
        #expect(machine.openStreamLimit == 6, "the server's limit: \(machine.streamLimit.value) of its own")
        #expect(machine.openStreams == 5)
    }

    // MARK: Closing and errors

    @Test("channel inactive fails what is on the wire and moves what is queued, exactly once")
    func channelInactive() {
        let machine = makeReadyMachine(limit: 2)
        let (a, b, c, d) = (TestRequest("a"), TestRequest("b"), TestRequest("c"), TestRequest("d"))
        #expect(submitWritten(machine, a) == 1)
        #expect(submitWritten(machine, b) == 3)
        #expect(machine.submit(c) == .queued)
        #expect(machine.submit(d) == .queued)
        d.isFinished = true

        let closed = machine.channelInactive()
        #expect(closed?.failing == [a, b])
        #expect(closed?.moving == [c], "d finished already")
        #expect(closed?.reason == "the server closed the connection")
        #expect(machine.isClosed)

        #expect(machine.channelInactive() == nil, "once")
        #expect(machine.responseEnded(on: 1) == .none)
        #expect(machine.streamReset(3, code: .refusedStream) == .none)
        #expect(machine.goAwayReceived(lastStreamID: 0, errorCode: .noError, reason: nil) == .none)
        #expect(machine.retire(because: .unrelatedKeyIDInToken) == .none)
        let e = TestRequest("e")
        #expect(machine.submit(e) == .moveToAnotherConnection(e))
        let tick = machine.timerFired(now: at(.seconds(3600)))
        #expect(tick.ping == nil && tick.then == .none)
        #expect(!machine.close(because: .noLongerNeeded))
        #expect(!machine.clientShutDown())
    }

    @Test("a connection error closes the connection; the first error explains it")
    func connectionErrors() {
        let starting = makeMachine()
        #expect(starting.errorCaught(TestError()) == .close)
        #expect(starting.errorCaught(CancellationError()) == .close)
        #expect(starting.closeDescription == "boom (is the server speaking HTTP/2 over TLS with ALPN h2?)")
        #expect(starting.channelInactive()?.reason == "boom (is the server speaking HTTP/2 over TLS with ALPN h2?)")

        let ready = makeReadyMachine()
        #expect(ready.errorCaught(TestError()) == .close)
        #expect(ready.closeDescription == "boom")

        // A reason the machine knows beats the error.
        let retired = makeReadyMachine()
        _ = retired.retire(because: .streamIDsUsedUp)
        _ = retired.errorCaught(TestError())
        #expect(retired.closeDescription == "stream ids used up")

        #expect(makeMachine().closeDescription == "the server closed the connection during setup")
    }

    @Test("closing keeps the first reason; client shutdown overrides it")
    func closeReasons() {
        let machine = makeReadyMachine()
        #expect(machine.close(because: .noLongerNeeded))
        #expect(machine.close(because: .streamIDsUsedUp))
        #expect(machine.closeReason == .noLongerNeeded)
        #expect(machine.clientShutDown())
        #expect(machine.closeReason == .clientShutDown)
        #expect(machine.channelInactive()?.reason == "the client was shut down")
    }
}
