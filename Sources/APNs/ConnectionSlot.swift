import Logging
import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL

/// One place in the client's pool, pinned to one event loop: at most one connection taking new requests, plus
/// connections that were retired (GOAWAY, exhausted stream ids) and are finishing their streams.
///
/// Every method runs on ``eventLoop``; all mutable state is confined to it.
final class ConnectionSlot: @unchecked Sendable {
    let index: Int
    let eventLoop: any EventLoop
    let shared: ClientContext
    private let logger: Logger

    private enum State {
        /// No connection; the next request opens one.
        case idle
        /// A connection is being opened; requests wait in ``waiting``.
        case connecting(APNsConnection)
        /// The last attempts to open one failed: the next waits until this task runs (``ReconnectBackoff``);
        /// requests wait in ``waiting``.
        case backingOff(Scheduled<Void>)
        /// The connection takes requests.
        case ready(APNsConnection)
        /// ``shutdown()`` was called; every request fails.
        case shutDown
    }

    private var state: State = .idle
    /// Requests waiting for a connection to become ready, oldest first.
    private var waiting = CircularBuffer<PendingRequest>()
    /// Retired connections still finishing the streams they have.
    private var draining: [APNsConnection] = []
    /// The timer that enforces deadlines and keepalive; started by the first request.
    private var sweeper: RepeatedTask?
    private var connectionCount = 0
    /// When the next connection may be opened after failed attempts.
    private var backoff: ReconnectBackoff

    /// How many times a request may move to a new connection before it fails.
    static let maximumMoves = 3

    init(index: Int, eventLoop: any EventLoop, shared: ClientContext) {
        self.index = index
        self.eventLoop = eventLoop
        self.shared = shared
        self.backoff = shared.reconnectBackoff
        var logger = shared.logger
        logger[metadataKey: "apns.slot"] = "\(index)"
        self.logger = logger
    }

    // MARK: Requests

    /// A request arrives from a single ``APNsClient/send(_:)-(APNsNotification)``.
    func enqueue(_ request: PendingRequest, continuation: UnsafeContinuation<APNsResponse, any Error>) {
        request.completion = .single(continuation)
        accept(request)
    }

    /// Requests arrive from a batch ``APNsClient/send(_:)-([APNsNotification])``; they are written together and
    /// flushed once.
    func enqueue(batch requests: [PendingRequest]) {
        for request in requests {
            accept(request)
        }
    }

    private func accept(_ request: PendingRequest) {
        request.isEnqueued = true
        if request.isCancelledEarly {
            request.finish(.failure(CancellationError()))
            return
        }
        if sweeper == nil, !isShutDown {
            startSweeper()
        }
        route(request)
    }

    /// The calling task was cancelled.
    func cancel(_ request: PendingRequest) {
        guard !request.isFinished else { return }
        guard request.isEnqueued else {
            // `enqueue` has not run yet; it will see this and fail the request with CancellationError.
            request.isCancelledEarly = true
            return
        }
        for connection in connections where connection.cancelStream(of: request) {
            break
        }
        request.finish(.failure(CancellationError()))
    }

    private func route(_ request: PendingRequest) {
        switch state {
        case .ready(let connection):
            connection.submit(request)
        case .connecting, .backingOff:
            waiting.append(request)
        case .idle:
            waiting.append(request)
            connectWhenAllowed()
        case .shutDown:
            request.finish(.failure(APNsTransportError("The APNs client has been shut down.")))
        }
    }

    /// Sends a request that never reached APNs on a new connection (or fails it after too many moves).
    func move(_ request: PendingRequest) {
        guard !request.isFinished else { return }
        request.resetForResend()
        request.moves += 1
        if request.moves > Self.maximumMoves {
            request.finish(
                .failure(
                    APNsTransportError(
                        "\(request.moves - 1) connections to \(shared.endpoint.host):\(shared.endpoint.port) went away before this request could be sent."
                    )
                )
            )
            return
        }
        route(request)
    }

    private func failWaiting(_ error: APNsTransportError) {
        while let request = waiting.popFirst() {
            request.finish(.failure(error))
        }
    }

    private var isShutDown: Bool {
        if case .shutDown = state { return true }
        return false
    }

    private var connections: [APNsConnection] {
        var all = draining
        switch state {
        case .connecting(let connection), .ready(let connection):
            all.append(connection)
        case .idle, .backingOff, .shutDown:
            break
        }
        return all
    }

    // MARK: Connections

    /// Opens a connection now, or once the wait after failed attempts is over.
    private func connectWhenAllowed() {
        switch backoff.decision(at: .now()) {
        case .connect:
            connect()
        case .wait(let until):
            let attempt = eventLoop.scheduleTask(deadline: until) { self.backoffEnded() }
            state = .backingOff(attempt)
        }
    }

    /// The wait after failed attempts is over: the next attempt goes if a request still waits for it.
    private func backoffEnded() {
        guard case .backingOff = state else { return }
        state = .idle
        if waiting.contains(where: { !$0.isFinished }) {
            connect()
        }
    }

    /// An attempt to open `connection` failed: the next waits (``ReconnectBackoff``). Returns the wait, for the log.
    private func attemptFailed() -> TimeAmount {
        state = .idle
        return backoff.failed(at: .now(), random: Double.random(in: 0...1))
    }

    private func connect() {
        connectionCount += 1
        let connection = APNsConnection(slot: self, name: "\(index).\(connectionCount)")
        state = .connecting(connection)
        let bound = NIOLoopBound(connection, eventLoop: eventLoop)
        let shared = self.shared
        logger.debug("Opening an APNs connection", metadata: ["apns.connection": "\(connection.name)"])
        let future = ClientBootstrap(group: eventLoop)
            .connectTimeout(shared.connectTimeout)
            .channelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(
                        NIOSSLClientHandler(context: shared.sslContext, serverHostname: shared.serverHostname)
                    )
                    // The frames of one flush leave as one TLS write (``WriteCoalescer``).
                    try pipeline.addHandler(WriteCoalescer())
                    var configuration = NIOHTTP2Handler.ConnectionConfiguration()
                    // Our header blocks are built from validated parts (hex token, printable topic and push type),
                    // and re-validating every character of every header costs about a tenth of the client's time.
                    configuration.headerBlockValidation = .disabled
                    // Nor is a stream's `content-length` checked against its DATA frames: our requests carry none, and
                    // an answer's body is read up to a bound whatever it claims. Finding the header in every block,
                    // both ways, took about 1 % of the server's CPU during a fan-out (`perf`, 2026-12-04).
                    configuration.contentLengthValidation = .disabled
                    configuration.initialSettings = [
                        HTTP2Setting(parameter: .enablePush, value: 0),
                        HTTP2Setting(parameter: .maxHeaderListSize, value: 16384),
                    ]
                    // A server may end every stream with RST_STREAM(NO_ERROR) once it has answered without reading
                    // the body (RFC 9113 §8.1; nginx does). swift-nio-http2's default of 200 resets per 30 s guards
                    // servers against rapid-reset floods and would close a busy client connection; a client pays
                    // for each of its own requests anyway, so allow more resets than one connection carries streams:
                    // up to 10,000 in any 100 ms (100,000 a second; one connection here carries about 25,000 requests
                    // a second, and 20,000 a second was once exceeded). swift-nio-http2 keeps a timestamp for each
                    // reset in the window, so a short window keeps that small (80 KB).
                    var streamConfiguration = NIOHTTP2Handler.StreamConfiguration()
                    streamConfiguration.streamResetFrameRateLimit.maximumCount = 10_000
                    streamConfiguration.streamResetFrameRateLimit.windowLength = .milliseconds(100)
                    try pipeline.addHandler(
                        NIOHTTP2Handler(
                            mode: .client, frameDelegate: nil, connectionConfiguration: configuration, streamConfiguration: streamConfiguration
                        )
                    )
                    try pipeline.addHandler(bound.value)
                }
            }
            .connect(host: shared.endpoint.host, port: shared.endpoint.port)
        connection.channelFuture = future
        future.whenComplete { result in
            switch result {
            case .success(let channel):
                self.connected(bound.value, channel: channel)
            case .failure(let error):
                self.connectFailed(bound.value, error: error)
            }
        }
    }

    private func connected(_ connection: APNsConnection, channel: any Channel) {
        if case .shutDown = state {
            channel.close(promise: nil)
        }
    }

    private func connectFailed(_ connection: APNsConnection, error: any Error) {
        guard case .connecting(let current) = state, current === connection else { return }
        let wait = attemptFailed()
        logger.warning(
            "Could not connect to APNs",
            metadata: [
                "apns.connection": "\(connection.name)", "error": "\(error)", "apns.next_attempt_in_ms": "\(wait.nanoseconds / 1_000_000)",
            ]
        )
        failWaiting(
            APNsTransportError(
                "Could not connect to \(shared.endpoint.host):\(shared.endpoint.port): \(error)"
            )
        )
    }

    /// The connection has the server's settings and takes requests.
    func connectionReady(_ connection: APNsConnection) {
        guard case .connecting(let current) = state, current === connection else {
            connection.close(because: .noLongerNeeded)
            return
        }
        state = .ready(connection)
        backoff.opened()
        logger.debug("APNs connection ready", metadata: ["apns.connection": "\(connection.name)"])
        while case .ready(let ready) = state, ready === connection, let request = waiting.popFirst() {
            if !request.isFinished {
                connection.submit(request)
            }
        }
    }

    /// The connection takes no new requests (GOAWAY, exhausted stream ids, a connection-bound credential error).
    /// `requests` never reached the server and move to a new connection.
    func connectionRetired(_ connection: APNsConnection, requests: [PendingRequest]) {
        if case .ready(let current) = state, current === connection {
            state = .idle
        }
        if !draining.contains(where: { $0 === connection }) {
            draining.append(connection)
        }
        for request in requests {
            move(request)
        }
    }

    /// The connection's channel closed. `unsent` requests never reached the server.
    func connectionClosed(_ connection: APNsConnection, unsent: [PendingRequest], reason: String) {
        draining.removeAll { $0 === connection }
        switch state {
        case .connecting(let current) where current === connection:
            // It never became usable: TLS, ALPN or HTTP/2 setup failed.
            let wait = attemptFailed()
            logger.warning(
                "Could not open an APNs connection",
                metadata: [
                    "apns.connection": "\(connection.name)", "reason": "\(reason)", "apns.next_attempt_in_ms": "\(wait.nanoseconds / 1_000_000)",
                ]
            )
            let error = APNsTransportError(
                "Could not open an HTTP/2 connection to \(shared.endpoint.host):\(shared.endpoint.port): \(reason)"
            )
            failWaiting(error)
            for request in unsent {
                request.finish(.failure(error))
            }
            return
        case .ready(let current) where current === connection:
            state = .idle
            logger.info(
                "APNs connection closed",
                metadata: ["apns.connection": "\(connection.name)", "reason": "\(reason)"]
            )
        default:
            break
        }
        for request in unsent {
            move(request)
        }
    }

    // MARK: Deadlines and keepalive

    private func startSweeper() {
        sweeper = eventLoop.scheduleRepeatedTask(initialDelay: shared.sweepInterval, delay: shared.sweepInterval) {
            _ in
            self.sweep()
        }
    }

    private func sweep() {
        let now = NIODeadline.now()
        waiting.failExpired(now: now) {
            APNsTransportError(
                "Timed out after \(shared.configuration.requestTimeout) waiting for a connection to \(shared.endpoint.host):\(shared.endpoint.port)."
            )
        }
        for connection in connections {
            connection.sweep(now: now)
        }
    }

    // MARK: Shutdown

    /// Fails everything queued and closes every connection. The future completes when they are closed.
    func shutdown() -> EventLoopFuture<Void> {
        let open = connections
        if case .backingOff(let attempt) = state {
            attempt.cancel()
        }
        state = .shutDown
        sweeper?.cancel()
        sweeper = nil
        failWaiting(APNsTransportError("The APNs client was shut down."))
        let closed = open.map { $0.shutdown() }
        return EventLoopFuture.andAllComplete(closed, on: eventLoop)
    }
}

extension CircularBuffer where Element == PendingRequest {
    /// Drops finished requests and fails those past their deadline, keeping the rest in order.
    mutating func failExpired(now: NIODeadline, _ timeout: () -> APNsTransportError) {
        guard !isEmpty else { return }
        var kept = CircularBuffer<PendingRequest>(initialCapacity: count)
        while let request = popFirst() {
            if request.isFinished { continue }
            if request.deadline <= now {
                request.finish(.failure(timeout()))
            } else {
                kept.append(request)
            }
        }
        self = kept
    }
}
