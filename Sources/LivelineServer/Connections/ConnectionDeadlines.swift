import NIOCore

/// How long a client connection may take over each part of its life, and how many may be open at once: what keeps
/// connections from being hoarded (idle ones, ones that send half their headers, ones that send half a body).
///
/// The header and body limits are deadlines, not idle timers: a client that sends one byte a second keeps a read-idle
/// timer from ever firing, but not a deadline.
public struct ConnectionLimits: Sendable, Hashable {
    /// The most time from a request's first byte until its header block is complete. When it passes the connection
    /// is closed without an answer (there is no request to answer yet).
    public var headerTimeout: TimeAmount
    /// The most time from a request's complete header block until the end of its body. When it passes the client
    /// gets a 408 `request_timeout` if no answer to the request has begun, and the connection is closed.
    public var bodyTimeout: TimeAmount
    /// How long a connection may stay open with no request in flight and nothing arriving, from its opening or from
    /// the end of the last answer.
    public var idleTimeout: TimeAmount
    /// The most connections open at once. Beyond it Liveline stops accepting: new connections wait in the kernel's
    /// listen backlog until one closes, and are refused once the backlog is full. Open ones keep working. (The server
    /// accepts up to four connections in one go, so the count can pass the cap by at most three.)
    public var maximumConnections: Int

    /// Creates limits; the defaults are 10 s for a header block, 30 s for a body, 60 s of keep-alive idleness and
    /// 10,000 connections.
    public init(
        headerTimeout: TimeAmount = .seconds(10), bodyTimeout: TimeAmount = .seconds(30), idleTimeout: TimeAmount = .seconds(60),
        maximumConnections: Int = 10_000
    ) {
        self.headerTimeout = headerTimeout
        self.bodyTimeout = bodyTimeout
        self.idleTimeout = idleTimeout
        self.maximumConnections = maximumConnections
    }
}

/// The deadlines of one HTTP/1.1 connection as a pure state machine: events in (the connection opened, bytes arrived,
/// a request's head or end was read, an answer's head or end was written, the timer fired), timer actions out. It
/// performs no I/O and reads no clock — every event carries its time — so each decision is tested without a socket
/// (`ConnectionDeadlinesTests`); `ConnectionTimeoutHandler` performs its actions on the channel's event loop.
///
/// At any moment at most one deadline runs, chosen by the connection's phase:
///
/// | phase | deadline |
/// |---|---|
/// | a request's body is being read (its head is in, its end is not) | ``ConnectionLimits/bodyTimeout`` after the head |
/// | an answer is being worked on or written, nothing being read | none: how long an answer takes is the route's business |
/// | no request in flight, part of the next one has arrived | ``ConnectionLimits/headerTimeout`` after its first byte (or after the last answer ended, if it came during that answer) |
/// | no request in flight, nothing arriving | ``ConnectionLimits/idleTimeout`` after the connection opened or the last answer ended |
///
/// Bytes are seen before HTTP decoding, so a read that finishes one request and starts the next counts for the one
/// it finishes; the next byte starts the header deadline. A client can so stretch one wait to at most the idle plus
/// the header timeout, never beyond.
///
/// The timer is set again only for a deadline earlier than the moment it is set for. A deadline that moves later
/// leaves it as it is: it fires early and is set for the deadline then (``Expiry/rearm(_:)``); one that goes away
/// leaves it to fire and find nothing to do. A keep-alive connection's requests so schedule and cancel no timer each
/// (they cost a measurable share of a request's CPU): the timer fires about once per header timeout while requests
/// come, and follows the deadline then.
struct ConnectionDeadlines {
    /// Which deadline passed.
    enum Kind: Sendable, Hashable {
        case header, body, idle
    }

    /// What the timer should do after an event.
    enum TimerAction: Sendable, Hashable {
        /// Fire at this moment (replacing any timer that was set).
        case arm(NIODeadline)
        /// Cancel the timer: the connection closed.
        case disarm
        /// Leave the timer as it is.
        case keep
    }

    /// What to do when the timer fires.
    enum Expiry: Sendable, Hashable {
        /// The deadline has not passed after all (it moved): fire again at this moment.
        case rearm(NIODeadline)
        /// No deadline runs any more.
        case nothing
        /// Close the connection without an answer.
        case close(Kind)
        /// Answer the request being read with a 408 `request_timeout`, then close the connection.
        case answerTimeoutAndClose
    }

    let limits: ConnectionLimits

    private var isOpen = false
    private var isClosed = false
    /// Requests whose head was read and whose answer has not ended.
    private var requestsInFlight = 0
    /// When the head of the request whose body is being read arrived.
    private var bodyStartedAt: NIODeadline?
    /// Whether the answer to the oldest request in flight has begun (its head was written).
    private var answerStarted = false
    /// When the connection last had no request in flight (it opened, or the last answer ended).
    private var idleSince: NIODeadline?
    /// When the first byte of a request whose head is not yet complete arrived.
    private var nextRequestStartedAt: NIODeadline?
    /// The moment the timer is set for: never later than the deadline that runs (it may be earlier).
    private var armed: NIODeadline?

    init(limits: ConnectionLimits) {
        self.limits = limits
    }

    /// The deadline that runs in the connection's phase, and which one it is.
    var deadline: (at: NIODeadline, kind: Kind)? {
        guard isOpen, !isClosed else { return nil }
        if let bodyStartedAt { return (bodyStartedAt + limits.bodyTimeout, .body) }
        guard requestsInFlight == 0 else { return nil }
        if let nextRequestStartedAt { return (nextRequestStartedAt + limits.headerTimeout, .header) }
        if let idleSince { return (idleSince + limits.idleTimeout, .idle) }
        return nil
    }

    /// The connection is open (more than one report of it counts once).
    mutating func opened(at now: NIODeadline) -> TimerAction {
        if !isOpen {
            isOpen = true
            idleSince = now
        }
        return timerAction()
    }

    /// Bytes arrived from the client (before HTTP decoding).
    mutating func bytesReceived(at now: NIODeadline) -> TimerAction {
        if bodyStartedAt == nil, nextRequestStartedAt == nil { nextRequestStartedAt = now }
        return timerAction()
    }

    /// A request's header block is complete.
    mutating func requestHeadReceived(at now: NIODeadline) -> TimerAction {
        requestsInFlight += 1
        bodyStartedAt = now
        nextRequestStartedAt = nil
        idleSince = nil
        return timerAction()
    }

    /// A request's body (or the request, if it has none) has ended.
    mutating func requestEndReceived(at now: NIODeadline) -> TimerAction {
        bodyStartedAt = nil
        return timerAction()
    }

    /// The head of an answer was written.
    mutating func responseHeadWritten(at now: NIODeadline) -> TimerAction {
        answerStarted = true
        return timerAction()
    }

    /// An answer has ended.
    mutating func responseEndWritten(at now: NIODeadline) -> TimerAction {
        requestsInFlight = max(0, requestsInFlight - 1)
        answerStarted = false
        if requestsInFlight == 0 {
            idleSince = now
            // Part of the next request came while this answer was being written: its header deadline counts from now.
            if nextRequestStartedAt != nil { nextRequestStartedAt = now }
        }
        return timerAction()
    }

    /// The connection closed.
    mutating func closed() -> TimerAction {
        isClosed = true
        return timerAction()
    }

    /// The timer fired at `now`.
    mutating func timerFired(at now: NIODeadline) -> Expiry {
        armed = nil
        guard let deadline else { return .nothing }
        guard now >= deadline.at else {
            armed = deadline.at
            return .rearm(deadline.at)
        }
        // The only request in flight is the one being read, and nothing of its answer is written: it can be answered.
        let canAnswer = deadline.kind == .body && requestsInFlight == 1 && !answerStarted
        isClosed = true
        return canAnswer ? .answerTimeoutAndClose : .close(deadline.kind)
    }

    private mutating func timerAction() -> TimerAction {
        if isClosed {
            defer { armed = nil }
            return armed == nil ? .keep : .disarm
        }
        // No deadline, or a later one than the timer's: the timer finds out when it fires.
        guard let next = deadline?.at, armed.map({ next < $0 }) ?? true else { return .keep }
        armed = next
        return .arm(next)
    }
}
