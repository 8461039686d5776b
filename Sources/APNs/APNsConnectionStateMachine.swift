import NIOCore
import NIOHTTP2
import NIOSSL

/// What ``APNsConnectionStateMachine`` needs to know of a request: when it times out, and whether it was completed
/// elsewhere (cancelled or timed out) while it waited in the queue.
protocol APNsConnectionStateMachineRequest {
    /// When the request fails with a timeout.
    var deadline: NIODeadline { get }
    /// Completed already; the queue skips it rather than sending it.
    var isFinished: Bool { get }
}

extension PendingRequest: APNsConnectionStateMachineRequest {}

/// The bookkeeping of one HTTP/2 connection to APNs, without the connection: which request is on which stream,
/// which wait for a free stream, when to flush, when to `PING`, when to stop taking requests and when to close.
///
/// A value type in the style of AsyncHTTPClient's connection state machines: ``APNsConnection`` reports what happened
/// on the channel (an **event**, one `mutating` method each) and performs what the machine answers (an **action**:
/// write a request on a stream, fail or move a request, flush, ping, retire, close). The machine holds no channel,
/// promise or clock; time comes in with the events that need it. It is generic over the request so tests can use
/// plain values.
///
/// The hot path (``submit(_:now:)``, ``request(on:)``, ``responseEnded(on:now:)``, ``writeNeedsFlush()``) answers with
/// one enum or optional value and allocates nothing; requests waiting for a free stream are pulled one at a time with
/// ``nextQueuedWrite(now:)``.
///
/// A stream is free when fewer are open than the server allows (`SETTINGS_MAX_CONCURRENT_STREAMS`) and than the
/// connection's own ``StreamLimit``, which shrinks when answers slow down so that requests wait here, unsent, rather
/// than on the wire past their timeout.
///
/// Lifecycle: *starting* (waiting for the server's first `SETTINGS`) → *ready* (takes requests) → *retiring* (no new
/// streams: `GOAWAY`, stream ids used up, or credentials bound to this connection; closes once its streams are done)
/// → *closed* (the channel is inactive). A connection may close from any state.
struct APNsConnectionStateMachine<Request: APNsConnectionStateMachineRequest> {
    /// The limits the machine enforces.
    struct Configuration {
        /// The highest stream id to use; the connection retires after using it.
        var maximumStreamID: Int
        /// How long the server may take to send its first `SETTINGS`.
        var connectTimeout: Duration
        /// After this long without a frame from the server, a `PING` checks the connection.
        var idlePingInterval: Duration
        /// How long a `PING` may go unacknowledged before the connection is closed.
        var pingTimeout: Duration
        /// How the connection's own limit on streams follows the answer times.
        var streamLimit: StreamLimit.Configuration

        init(
            maximumStreamID: Int, connectTimeout: Duration, idlePingInterval: Duration, pingTimeout: Duration,
            streamLimit: StreamLimit.Configuration
        ) {
            self.maximumStreamID = maximumStreamID
            self.connectTimeout = connectTimeout
            self.idlePingInterval = idlePingInterval
            self.pingTimeout = pingTimeout
            self.streamLimit = streamLimit
        }

        init(_ client: APNsClient.Configuration) {
            self.init(
                maximumStreamID: Int(client.maximumStreamID),
                connectTimeout: client.connectTimeout,
                idlePingInterval: client.idlePingInterval,
                pingTimeout: client.pingTimeout,
                streamLimit: StreamLimit.Configuration(requestTimeout: TimeAmount(client.requestTimeout))
            )
        }
    }

    /// Why the connection stops taking requests or closes, when the machine knows better than the channel.
    enum CloseReason: Hashable, CustomStringConvertible {
        /// The server sent `GOAWAY` with this error code and, if its debug data was APNs' JSON, this reason.
        case goAway(HTTP2ErrorCode, reason: String?)
        /// The stream ids allowed by the configuration are used up.
        case streamIDsUsedUp
        /// APNs answered `UnrelatedKeyIdInToken`: the key is bound to this connection, so a new one is needed.
        case unrelatedKeyIDInToken
        /// The server sent no `SETTINGS` within the connect timeout.
        case noSettings(within: Duration)
        /// A `PING` went unacknowledged.
        case noPingAcknowledgement(within: Duration)
        /// The slot already has another connection.
        case noLongerNeeded
        /// The client is shutting down.
        case clientShutDown

        var description: String {
            switch self {
            case .goAway(let code, let reason):
                return "GOAWAY \(code)" + (reason.map { " \($0)" } ?? "")
            case .streamIDsUsedUp:
                return "stream ids used up"
            case .unrelatedKeyIDInToken:
                return "APNs answered UnrelatedKeyIdInToken"
            case .noSettings(let timeout):
                return "no HTTP/2 settings from the server within \(timeout)"
            case .noPingAcknowledgement(let timeout):
                return "no PING acknowledgement within \(timeout)"
            case .noLongerNeeded:
                return "no longer needed"
            case .clientShutDown:
                return "the client was shut down"
            }
        }
    }

    // MARK: Actions

    /// What the connection does next, as a whole.
    enum ConnectionAction {
        /// Nothing.
        case none
        /// Streams are free and requests wait for them: write each one ``nextQueuedWrite(now:)`` hands out.
        case sendQueued
        /// The server's first `SETTINGS` arrived: tell the slot the connection takes requests, then send the queued
        /// ones as for ``sendQueued``.
        case notifyReady
        /// The connection takes no new streams: tell the slot it is retiring and hand it `moving`, requests that
        /// never reached the server, to send on another connection. When `closeNow` is set no stream is left, so
        /// close the channel as well.
        case retire(moving: [Request], closeNow: Bool)
        /// Close the channel (requests still in flight fail when it is inactive).
        case close
    }

    /// A request to write: its `HEADERS` (and `DATA`) frames go on `streamID`; then `then` is done.
    struct StreamWrite {
        var request: Request
        var streamID: HTTP2StreamID
        /// ``ConnectionAction/none``, or ``ConnectionAction/retire(moving:closeNow:)`` when this request used the last
        /// stream id.
        var then: ConnectionAction
    }

    /// The answer to ``submit(_:now:)``.
    enum SubmitAction {
        /// Write the request now.
        case write(StreamWrite)
        /// The server's concurrency limit, or the connection's own, is reached (or the connection is not ready yet):
        /// the request waits.
        case queued
        /// The connection takes no new requests: send it on another connection (the slot's `move`).
        case moveToAnotherConnection(Request)
        /// The request has less time left than ``StreamLimit/answerAllowance`` (it waited for a connection): fail it,
        /// unsent, as ``takeUnsendable()``'s.
        case tooLate(Request)
    }

    /// The answer to an event that ended a stream before APNs answered.
    enum UnansweredStreamAction {
        /// No request is on that stream (it was already finished): nothing to do.
        case none
        /// The request may have reached the server: fail it, then do `then`.
        case failRequest(Request, then: ConnectionAction)
        /// The server guarantees it did not process the request (`REFUSED_STREAM`): send it on another connection,
        /// then do `then`.
        case moveRequest(Request, then: ConnectionAction)
    }

    /// When to flush what was written.
    enum FlushAction: Hashable {
        /// Nothing now: a flush is already due at the end of the read, or already scheduled.
        case none
        /// Flush now.
        case flushNow
        /// Schedule one flush on the event loop, after everything written in this tick; report it with
        /// ``scheduledFlushRan()``.
        case scheduleFlush
    }

    /// The answer to ``timerFired(now:)``.
    struct TimerActions {
        /// Flush writes left unflushed.
        var flush = false
        /// Streams past their request's deadline: reset each (`CANCEL`) and fail its request with a timeout.
        var timedOutStreams: [(streamID: HTTP2StreamID, request: Request)] = []
        /// Queued requests past their deadline: fail each with a timeout.
        var timedOutQueued: [Request] = []
        /// Send this `PING`.
        var ping: HTTP2PingData? = nil
        /// The connection's own stream limit was cut since the last timer (the latest cut): log it.
        var streamLimitCut: StreamLimit.Cut? = nil
        /// Then: ``ConnectionAction/none``, ``ConnectionAction/sendQueued`` or ``ConnectionAction/close``.
        var then: ConnectionAction = .none
    }

    /// The answer to ``channelInactive()``.
    struct ClosedActions {
        /// Requests on the wire: fail each with the reason.
        var failing: [Request]
        /// Queued requests that never reached the server: hand them to the slot to move.
        var moving: [Request]
        /// Why the connection closed, for messages and logs.
        var reason: String
    }

    // MARK: State

    private enum State {
        /// Waiting for the server's first `SETTINGS`.
        case starting
        /// Takes requests.
        case ready
        /// Takes no new streams; closes once the streams it has are done.
        case retiring
        /// The channel is inactive.
        case closed
    }

    let configuration: Configuration
    private let connectTimeout: TimeAmount
    private let idlePingInterval: TimeAmount
    private let pingTimeout: TimeAmount

    private var state = State.starting
    /// The server's first `SETTINGS` arrived (the connection stays ready in that sense while retiring).
    private(set) var isReady = false

    /// A request on the wire, and when it was written.
    private struct OnTheWire {
        var request: Request
        var sentAt: NIODeadline
    }

    /// Requests on the wire, by stream id.
    private var streams = StreamTable<OnTheWire>()
    /// Requests waiting for a free stream, oldest first.
    private var pending = CircularBuffer<Request>()
    /// The server's `SETTINGS_MAX_CONCURRENT_STREAMS`; 100 (what swift-nio-http2 assumes) until the server says.
    private(set) var maxConcurrentStreams = 100
    /// The stream id the next request gets. An `Int`, so adding 2 after the last one cannot overflow.
    private(set) var nextStreamID = 1
    /// The connection's own limit on open streams, from the answer times.
    private(set) var streamLimit: StreamLimit
    /// The latest cut of ``streamLimit`` not yet reported by ``timerFired(now:)``.
    private var unreportedCut: StreamLimit.Cut?
    /// Queued requests that had too little time left when a stream came free (``takeUnsendable()``).
    private var unsendable: [Request] = []

    /// How many streams may be open now: the server's limit or the connection's own, whichever is lower.
    var openStreamLimit: Int { min(maxConcurrentStreams, streamLimit.value) }

    private var inRead = false
    private var needsFlush = false
    private var flushScheduled = false

    private let createdAt: NIODeadline
    private var sawFrame = false
    private var lastFrameAt: NIODeadline
    private var pingSentAt: NIODeadline?

    /// Why the connection retires or closes, when known better than the channel's error.
    private(set) var closeReason: CloseReason?
    /// The first connection error, for the close description.
    private(set) var firstError: (any Error)?

    /// A machine for a connection opened at `now`.
    init(configuration: Configuration, now: NIODeadline) {
        self.configuration = configuration
        self.connectTimeout = TimeAmount(configuration.connectTimeout)
        self.idlePingInterval = TimeAmount(configuration.idlePingInterval)
        self.pingTimeout = TimeAmount(configuration.pingTimeout)
        self.createdAt = now
        self.lastFrameAt = now
        self.streamLimit = StreamLimit(configuration.streamLimit)
    }

    /// Takes no new streams (`GOAWAY`, stream ids used up, credentials bound to this connection).
    var isRetiring: Bool {
        if case .retiring = state { return true }
        return false
    }

    /// The channel is inactive.
    var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    /// How many requests are on the wire.
    var openStreams: Int { streams.count }
    /// How many requests wait for a free stream (finished ones not yet skipped included).
    var queuedRequests: Int { pending.count }

    /// The request on `streamID`, if it is still on the wire: where the connection gathers its response.
    func request(on streamID: HTTP2StreamID) -> Request? {
        streams[streamID]?.request
    }

    // MARK: Requests

    /// A request for this connection (the slot sends only to a ready connection), at `now`.
    mutating func submit(_ request: Request, now: NIODeadline) -> SubmitAction {
        switch state {
        case .ready:
            if pending.isEmpty && streams.count < openStreamLimit {
                if request.deadline - now < streamLimit.answerAllowance {
                    return .tooLate(request)
                }
                return .write(open(request, now: now))
            }
            pending.append(request)
            return .queued
        case .starting:
            pending.append(request)
            return .queued
        case .retiring, .closed:
            return .moveToAnotherConnection(request)
        }
    }

    /// The next queued request to write at `now`, while streams are free; `nil` when none is left or may be sent.
    /// The connection calls it after ``ConnectionAction/sendQueued`` and ``ConnectionAction/notifyReady`` until `nil`,
    /// then fails what ``takeUnsendable()`` hands it.
    ///
    /// A request with less time left than ``StreamLimit/answerAllowance`` is not written: it would likely time out on
    /// the wire after the server took it. It is kept for ``takeUnsendable()`` instead.
    mutating func nextQueuedWrite(now: NIODeadline) -> StreamWrite? {
        guard case .ready = state else { return nil }
        let allowance = streamLimit.answerAllowance
        while streams.count < openStreamLimit, let request = pending.popFirst() {
            if request.isFinished {
                continue
            }
            if request.deadline - now < allowance {
                unsendable.append(request)
                continue
            }
            return open(request, now: now)
        }
        return nil
    }

    /// The queued requests ``nextQueuedWrite(now:)`` found with too little time left: fail each, unsent.
    mutating func takeUnsendable() -> [Request] {
        guard !unsendable.isEmpty else { return [] }
        defer { unsendable.removeAll() }
        return unsendable
    }

    /// Gives `request` the next stream id; retires the connection when that was the last one.
    private mutating func open(_ request: Request, now: NIODeadline) -> StreamWrite {
        let streamID = HTTP2StreamID(nextStreamID)
        nextStreamID += 2
        streams.append(OnTheWire(request: request, sentAt: now), streamID: streamID)
        var write = StreamWrite(request: request, streamID: streamID, then: .none)
        if nextStreamID > configuration.maximumStreamID {
            write.then = retire(because: .streamIDsUsedUp)
        }
        return write
    }

    // MARK: Streams

    /// The response on `streamID` is complete (its final frame carried `END_STREAM`) at `now`: its answer time goes
    /// to the connection's ``StreamLimit``. Call it before completing the request with the response.
    mutating func responseEnded(on streamID: HTTP2StreamID, now: NIODeadline) -> ConnectionAction {
        guard let answered = streams.removeValue(forKey: streamID) else { return .none }
        answerTook(now - answered.sentAt, at: now)
        return streamFinished()
    }

    /// Feeds one answer time to the stream limit and keeps a cut for the next timer to report.
    private mutating func answerTook(_ answerTime: TimeAmount, at now: NIODeadline) {
        if let cut = streamLimit.answered(after: answerTime, at: now, serverLimit: maxConcurrentStreams) {
            if let earlier = unreportedCut {
                unreportedCut = StreamLimit.Cut(from: earlier.from, to: cut.to, smoothedAnswer: cut.smoothedAnswer, slowMark: cut.slowMark)
            } else {
                unreportedCut = cut
            }
        }
    }

    /// The connection resets `streamID` itself (the caller cancelled, or the response was malformed): the stream is
    /// over. The connection writes the `RST_STREAM` and fails or cancels the request.
    mutating func streamResetByClient(_ streamID: HTTP2StreamID) -> ConnectionAction {
        guard streams.removeValue(forKey: streamID) != nil else { return .none }
        return streamFinished()
    }

    /// The server reset `streamID` (`RST_STREAM`), or the stream closed some other way with `code` (`nil` when
    /// there was none), before the response was complete.
    mutating func streamReset(_ streamID: HTTP2StreamID, code: HTTP2ErrorCode?) -> UnansweredStreamAction {
        guard let request = streams.removeValue(forKey: streamID)?.request else { return .none }
        let then = streamFinished()
        if code == .refusedStream {
            // REFUSED_STREAM guarantees the request was not processed.
            return .moveRequest(request, then: then)
        }
        return .failRequest(request, then: then)
    }

    /// swift-nio-http2 reported an error on `streamID` alone (for example a late frame on a stream that was reset);
    /// the connection carries on.
    mutating func streamFailed(_ streamID: HTTP2StreamID) -> UnansweredStreamAction {
        guard let request = streams.removeValue(forKey: streamID)?.request else { return .none }
        return .failRequest(request, then: streamFinished())
    }

    /// A stream is over: a retiring connection closes when it was the last one, otherwise queued requests may go.
    private mutating func streamFinished() -> ConnectionAction {
        switch state {
        case .retiring:
            return streams.isEmpty ? .close : .none
        case .ready:
            return !pending.isEmpty && streams.count < openStreamLimit ? .sendQueued : .none
        case .starting, .closed:
            return .none
        }
    }

    // MARK: Connection frames

    /// A frame arrived: the connection is alive, and writes until ``readComplete()`` are flushed then.
    mutating func frameReceived() {
        sawFrame = true
        inRead = true
    }

    /// The channel read is over.
    mutating func readComplete() -> FlushAction {
        inRead = false
        if needsFlush {
            needsFlush = false
            return .flushNow
        }
        return .none
    }

    /// The server's `SETTINGS`, with its `SETTINGS_MAX_CONCURRENT_STREAMS` if it sent one.
    mutating func settingsReceived(maxConcurrentStreams: Int?) -> ConnectionAction {
        if let maxConcurrentStreams {
            self.maxConcurrentStreams = maxConcurrentStreams
        }
        if case .starting = state {
            state = .ready
            isReady = true
            return .notifyReady
        }
        if case .ready = state, !pending.isEmpty, streams.count < openStreamLimit {
            return .sendQueued
        }
        return .none
    }

    /// The server sent `GOAWAY`: streams above `lastStreamID` were not processed and move to another connection;
    /// those up to it finish here; no new stream opens. `reason` is APNs' reason from the debug data, if any.
    mutating func goAwayReceived(lastStreamID: HTTP2StreamID, errorCode: HTTP2ErrorCode, reason: String?) -> ConnectionAction {
        if closeReason == nil {
            closeReason = .goAway(errorCode, reason: reason)
        }
        switch state {
        case .starting:
            // Refused during setup: the requests waiting for this connection fail with the reason.
            return .close
        case .closed:
            return .none
        case .ready, .retiring:
            var unprocessed: [Request] = []
            for streamID in streams.streamIDs(where: { streamID, _ in streamID > lastStreamID }) {
                if let request = streams.removeValue(forKey: streamID)?.request {
                    unprocessed.append(request)
                }
            }
            return retire(because: closeReason!, moving: unprocessed)
        }
    }

    /// The server acknowledged our `PING`.
    mutating func pingAcknowledged() {
        pingSentAt = nil
    }

    /// The connection-level receive window changed; answers the `WINDOW_UPDATE` increment to send, if any, to keep
    /// ``targetReceiveWindow`` open.
    func inboundWindowChanged(to size: Int?) -> Int? {
        guard let size, size <= Self.targetReceiveWindow / 2 else { return nil }
        return Self.targetReceiveWindow - size
    }

    /// The connection-level receive window kept open for responses.
    static var targetReceiveWindow: Int { 1 << 20 }

    // MARK: Flushing

    /// Something was written. Inside a read it is flushed at ``readComplete()``; otherwise once, after everything
    /// written in this event loop tick.
    mutating func writeNeedsFlush() -> FlushAction {
        if inRead {
            needsFlush = true
            return .none
        }
        if flushScheduled {
            return .none
        }
        flushScheduled = true
        return .scheduleFlush
    }

    /// The flush scheduled by ``FlushAction/scheduleFlush`` ran.
    mutating func scheduledFlushRan() {
        flushScheduled = false
    }

    // MARK: Retiring and closing

    /// Stops taking new streams because of `reason`: the queued requests move to another connection (with
    /// `moving`), and the connection closes once its streams are done.
    mutating func retire(because reason: CloseReason, moving: [Request] = []) -> ConnectionAction {
        switch state {
        case .closed:
            return .none
        case .starting, .ready, .retiring:
            break
        }
        state = .retiring
        if closeReason == nil {
            closeReason = reason
        }
        var moving = moving
        while let request = pending.popFirst() {
            if !request.isFinished {
                moving.append(request)
            }
        }
        return .retire(moving: moving, closeNow: streams.isEmpty)
    }

    /// The connection is to close because of `reason` (kept unless a reason is known already). Answers whether to
    /// close the channel: not once it is closed.
    mutating func close(because reason: CloseReason) -> Bool {
        guard !isClosed else { return false }
        if closeReason == nil {
            closeReason = reason
        }
        return true
    }

    /// The client is shutting down: that is the reason given from now on, whatever happened before. Answers whether
    /// to close the channel.
    mutating func clientShutDown() -> Bool {
        closeReason = .clientShutDown
        return !isClosed
    }

    /// An error on the connection as a whole (TLS, HTTP/2 protocol): close it. The first error explains the close.
    mutating func errorCaught(_ error: any Error) -> ConnectionAction {
        if firstError == nil {
            firstError = error
        }
        return .close
    }

    /// The channel is inactive: everything on the wire fails, everything queued moves; exactly once. `nil` when it
    /// was already closed.
    mutating func channelInactive() -> ClosedActions? {
        guard !isClosed else { return nil }
        let reason = closeDescription
        state = .closed
        let failing = streams.removeAll().map(\.request)
        var moving: [Request] = []
        while let request = pending.popFirst() {
            if !request.isFinished {
                moving.append(request)
            }
        }
        return ClosedActions(failing: failing, moving: moving, reason: reason)
    }

    /// Why the connection closed or is closing, in words.
    var closeDescription: String {
        if let closeReason {
            return closeReason.description
        }
        if let firstError {
            if !isReady, !(firstError is NIOSSLError) {
                return "\(firstError) (is the server speaking HTTP/2 over TLS with ALPN h2?)"
            }
            return "\(firstError)"
        }
        return isReady ? "the server closed the connection" : "the server closed the connection during setup"
    }

    // MARK: Deadlines and keepalive

    /// The slot's periodic timer: writes left unflushed are flushed; a connection that got no `SETTINGS` within the
    /// connect timeout closes; requests past their deadline time out; a quiet connection is checked with `PING`, and
    /// one whose `PING` went unanswered closes.
    mutating func timerFired(now: NIODeadline) -> TimerActions {
        var actions = TimerActions()
        if isClosed {
            return actions
        }
        if needsFlush && !inRead {
            needsFlush = false
            actions.flush = true
        }
        if case .starting = state {
            if now - createdAt >= connectTimeout, close(because: .noSettings(within: configuration.connectTimeout)) {
                actions.then = .close
            }
            return actions
        }

        for streamID in streams.streamIDs(where: { _, onTheWire in onTheWire.request.deadline <= now }) {
            if let timedOut = streams.removeValue(forKey: streamID) {
                actions.timedOutStreams.append((streamID, timedOut.request))
                // No answer within the timeout: as slow an answer as there can be.
                answerTook(now - timedOut.sentAt, at: now)
            }
        }
        if !pending.isEmpty {
            var kept = CircularBuffer<Request>(initialCapacity: pending.count)
            while let request = pending.popFirst() {
                if request.isFinished { continue }
                if request.deadline <= now {
                    actions.timedOutQueued.append(request)
                } else {
                    kept.append(request)
                }
            }
            pending = kept
        }
        actions.streamLimitCut = unreportedCut
        unreportedCut = nil
        if !actions.timedOutStreams.isEmpty {
            actions.then = streamFinished()
            if case .close = actions.then {
                return actions
            }
        }

        if sawFrame {
            sawFrame = false
            lastFrameAt = now
        }
        if let pingSentAt {
            if now - pingSentAt >= pingTimeout, close(because: .noPingAcknowledgement(within: configuration.pingTimeout)) {
                actions.then = .close
            }
        } else if now - lastFrameAt >= idlePingInterval {
            pingSentAt = now
            actions.ping = HTTP2PingData(withInteger: UInt64(now.uptimeNanoseconds))
        }
        return actions
    }
}

extension APNsConnectionStateMachine.ConnectionAction: Equatable where Request: Equatable {}
extension APNsConnectionStateMachine.StreamWrite: Equatable where Request: Equatable {}
extension APNsConnectionStateMachine.SubmitAction: Equatable where Request: Equatable {}
extension APNsConnectionStateMachine.UnansweredStreamAction: Equatable where Request: Equatable {}

/// The requests on the wire of one connection, by stream id.
///
/// A client's stream ids are consecutive odd numbers, so a ring buffer indexed by `(id - first) / 2` finds a stream
/// without hashing; answered slots are cleared and trimmed from the front. (Its length spans the oldest unanswered
/// stream to the newest, which request timeouts bound.)
struct StreamTable<Request> {
    private var slots = CircularBuffer<Request?>(initialCapacity: 64)
    /// The stream id of the first slot.
    private var firstID: Int = 1
    /// How many slots hold a request.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// Adds the request for the next stream id; ids must be added in increasing order.
    mutating func append(_ request: Request, streamID: HTTP2StreamID) {
        let id = Int(streamID)
        if slots.isEmpty {
            firstID = id
        }
        assert(id == firstID + 2 * slots.count, "stream ids are added in order")
        slots.append(request)
        count += 1
    }

    private func index(of streamID: HTTP2StreamID) -> CircularBuffer<Request?>.Index? {
        let offset = Int(streamID) - firstID
        guard offset >= 0, offset & 1 == 0, offset / 2 < slots.count else { return nil }
        return slots.index(slots.startIndex, offsetBy: offset / 2)
    }

    subscript(streamID: HTTP2StreamID) -> Request? {
        guard let index = index(of: streamID) else { return nil }
        return slots[index]
    }

    @discardableResult
    mutating func removeValue(forKey streamID: HTTP2StreamID) -> Request? {
        guard let index = index(of: streamID), let request = slots[index] else { return nil }
        slots[index] = nil
        count -= 1
        while let first = slots.first, first == nil {
            slots.removeFirst()
            firstID += 2
        }
        return request
    }

    /// The ids of the streams whose request matches, in increasing order.
    func streamIDs(where matches: (HTTP2StreamID, Request) -> Bool) -> [HTTP2StreamID] {
        var result: [HTTP2StreamID] = []
        var id = firstID
        for slot in slots {
            if let request = slot, matches(HTTP2StreamID(id), request) {
                result.append(HTTP2StreamID(id))
            }
            id += 2
        }
        return result
    }

    /// Empties the table, returning the requests in stream order.
    mutating func removeAll() -> [Request] {
        let requests = slots.compactMap { $0 }
        slots.removeAll(keepingCapacity: true)
        count = 0
        return requests
    }
}
