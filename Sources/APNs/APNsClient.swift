import Foundation
import LivelineCore
import Logging
import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization

/// An HTTP/2 client for APNs.
///
/// It keeps a small pool of TLS connections (ALPN `h2`), each pinned to one event loop of the group, and spreads
/// requests over them round-robin. Each request is one HTTP/2 stream; a connection opens as many concurrent streams
/// as the server's `SETTINGS_MAX_CONCURRENT_STREAMS` allows at that moment (APNs starts at 1 and raises it after the
/// first successful request) and its own limit, which shrinks while answers are slow, allows; it queues the rest. A
/// queued request left with too little time for an answer fails unsent, rather than timing out on the wire after the
/// server took it. When APNs sends `GOAWAY` (the JSON reason in its debug data is logged) or the connection closes,
/// a new connection is opened: requests that never reached the server (queued, or above the `GOAWAY`'s last stream
/// id, or refused) move to it transparently; requests already on the wire fail with ``APNsTransportError``. An idle
/// connection is checked with `PING`; every request has a timeout.
///
/// Connections are opened lazily by the first ``send(_:)`` on them and reused for hours. Call ``shutdown()`` when
/// done.
///
/// Broadcast pushes (``send(_:)-(APNsBroadcast)``) go over the same connections as device pushes; channel
/// management has its own host and connections (``APNsChannelManager``).
///
/// Each request carries `authorization: bearer <jwt>` from ``tokens``, `apns-push-type`, `apns-topic`,
/// `apns-priority`, `apns-expiration` (if set) and `apns-id` (lowercase, if set: APNs makes one up otherwise), on
/// `POST /3/device/<token>`: the headers Apple documents, and no others. After a 403 `ExpiredProviderToken` or
/// `InvalidProviderToken` the client forces a new provider token (once for any number of concurrent refusals); after
/// `UnrelatedKeyIdInToken` it retires that connection. The response is returned as it is either way: the client never
/// retries behind the caller's back once APNs has answered.
public final class APNsClient: Sendable {
    /// Tuning for an ``APNsClient``; the defaults suit Apple's servers.
    public struct Configuration: Sendable, Hashable {
        /// How many TLS connections to keep (at least 1). They are spread over the event loop group.
        public var connections: Int
        /// How long one ``send(_:)`` may take, queueing included, before it fails with ``APNsTransportError``.
        public var requestTimeout: Duration
        /// How long opening a connection (TCP, TLS and the server's HTTP/2 settings) may take.
        public var connectTimeout: Duration
        /// After this long without any frame from the server, a `PING` checks the connection.
        public var idlePingInterval: Duration
        /// A connection whose `PING` is not acknowledged within this time is closed and replaced.
        public var pingTimeout: Duration
        /// After a connection could not be opened, how long its slot waits before the next attempt; the wait doubles
        /// with each failure in a row (less up to half of it at random), up to ``maximumReconnectDelay``. Requests
        /// wait meanwhile, up to ``requestTimeout``. Apple may block a server that opens and closes connections
        /// repeatedly.
        public var reconnectDelay: Duration
        /// The longest wait between two attempts to open a connection.
        public var maximumReconnectDelay: Duration
        /// The highest stream id one connection may use before it is retired and replaced (HTTP/2 allows 2³¹−1).
        var maximumStreamID: Int32 = Int32.max

        /// Creates a configuration.
        public init(
            connections: Int = 4,
            requestTimeout: Duration = .seconds(30),
            connectTimeout: Duration = .seconds(10),
            idlePingInterval: Duration = .seconds(60),
            pingTimeout: Duration = .seconds(20),
            reconnectDelay: Duration = .milliseconds(250),
            maximumReconnectDelay: Duration = .seconds(15)
        ) {
            self.connections = connections
            self.requestTimeout = requestTimeout
            self.connectTimeout = connectTimeout
            self.idlePingInterval = idlePingInterval
            self.pingTimeout = pingTimeout
            self.reconnectDelay = reconnectDelay
            self.maximumReconnectDelay = maximumReconnectDelay
        }
    }

    /// The provider token source whose current token authorizes every request.
    public let tokens: APNsProviderTokens
    /// Where requests go.
    public let endpoint: APNsEndpoint
    /// The configuration in effect.
    public let configuration: Configuration

    private let slots: [ConnectionSlot]
    private let nextSlot = Atomic<Int>(0)
    private let isShutDown = Atomic<Bool>(false)
    private let requestTimeout: TimeAmount

    /// Creates a client. No connection is opened until the first ``send(_:)``.
    ///
    /// - Parameters:
    ///   - endpoint: Apple's production or sandbox host, or a custom endpoint.
    ///   - tokens: Provider tokens for the app's team and key.
    ///   - connections: How many TLS connections to keep (at least 1).
    ///   - requestTimeout: How long one send may take before it fails with ``APNsTransportError``.
    ///   - eventLoopGroup: Where the connections live; they are spread over its loops.
    ///   - logger: Where connection events (GOAWAY, reconnects, failures) are logged.
    /// - Throws: ``APNsConfigurationError`` when `endpoint.trustedCAPEM` holds no valid certificate or TLS cannot
    ///   be configured.
    public convenience init(
        endpoint: APNsEndpoint,
        tokens: APNsProviderTokens,
        connections: Int = 4,
        requestTimeout: Duration = .seconds(30),
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "liveline.apns")
    ) throws {
        try self.init(
            endpoint: endpoint,
            tokens: tokens,
            configuration: Configuration(connections: connections, requestTimeout: requestTimeout),
            eventLoopGroup: eventLoopGroup,
            logger: logger
        )
    }

    /// Creates a client with full tuning. No connection is opened until the first ``send(_:)``.
    ///
    /// - Throws: ``APNsConfigurationError`` when `endpoint.trustedCAPEM` holds no valid certificate or TLS cannot
    ///   be configured.
    public init(
        endpoint: APNsEndpoint,
        tokens: APNsProviderTokens,
        configuration: Configuration,
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "liveline.apns")
    ) throws {
        var configuration = configuration
        configuration.connections = max(1, configuration.connections)
        self.tokens = tokens
        self.endpoint = endpoint
        self.configuration = configuration
        self.requestTimeout = TimeAmount(configuration.requestTimeout)

        var tls = TLSConfiguration.makeClientConfiguration()
        tls.applicationProtocols = ["h2"]
        tls.minimumTLSVersion = .tlsv12
        if let pem = endpoint.trustedCAPEM {
            let certificates: [NIOSSLCertificate]
            do {
                certificates = try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8))
            } catch {
                throw APNsConfigurationError("The endpoint's trusted CA PEM could not be read: \(error).")
            }
            guard !certificates.isEmpty else {
                throw APNsConfigurationError("The endpoint's trusted CA PEM holds no certificate.")
            }
            tls.additionalTrustRoots = [.certificates(certificates)]
        }
        let sslContext: NIOSSLContext
        do {
            sslContext = try NIOSSLContext(configuration: tls)
        } catch {
            throw APNsConfigurationError("TLS could not be configured for \(endpoint.host): \(error).")
        }

        var logger = logger
        logger[metadataKey: "apns.endpoint"] = "\(endpoint.host):\(endpoint.port)"
        let shared = ClientContext(
            endpoint: endpoint,
            tokens: tokens,
            sslContext: sslContext,
            configuration: configuration,
            logger: logger
        )
        self.slots = (0..<configuration.connections).map { index in
            ConnectionSlot(index: index, eventLoop: eventLoopGroup.next(), shared: shared)
        }
    }

    deinit {
        // Without an explicit shutdown, stop the timers and close the connections rather than leaking them.
        if !isShutDown.load(ordering: .acquiring) {
            for slot in slots {
                slot.eventLoop.execute { _ = slot.shutdown() }
            }
        }
    }

    /// Sends one notification and returns APNs' answer, whatever its HTTP status.
    ///
    /// - Throws: ``APNsTransportError`` when no answer arrived (connection failure, connection closed or went away
    ///   after the request was written, timeout, shutdown); ``APNsInvalidNotificationError`` when the device token
    ///   is not hexadecimal or the topic or push type cannot be sent as a header; `CancellationError` when the
    ///   calling task is cancelled (the stream is reset).
    public func send(_ notification: APNsNotification) async throws -> APNsResponse {
        try Self.validate(notification)
        guard !isShutDown.load(ordering: .relaxed) else {
            throw APNsTransportError("The APNs client has been shut down.")
        }
        return try await perform(PendingRequest(notification: notification, deadline: .now() + requestTimeout))
    }

    /// Hands one request to the next connection slot and waits for its answer; cancelling the task resets the stream.
    private func perform(_ request: PendingRequest) async throws -> APNsResponse {
        let slot = slots[nextSlot.wrappingAdd(1, ordering: .relaxed).oldValue % slots.count]
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                slot.eventLoop.execute {
                    slot.enqueue(request, continuation: continuation)
                }
            }
        } onCancel: {
            slot.eventLoop.execute {
                slot.cancel(request)
            }
        }
    }

    /// Sends a request other than a device push (a broadcast, a channel management request) and returns APNs'
    /// answer with the request, whose `body` and `channelID` hold what the response carried.
    func send(_ head: APNsRequestHead) async throws -> (response: APNsResponse, request: PendingRequest) {
        guard !isShutDown.load(ordering: .relaxed) else {
            throw APNsTransportError("The APNs client has been shut down.")
        }
        let request = PendingRequest(other: head, deadline: .now() + requestTimeout)
        return (try await perform(request), request)
    }

    /// Sends many notifications at once and returns each one's outcome, in order: APNs' answer, or the error a single
    /// ``send(_:)-(APNsNotification)`` would have thrown (``APNsTransportError``, ``APNsInvalidNotificationError``,
    /// `CancellationError`).
    ///
    /// Semantically the same as sending each notification concurrently, but cheaper per push: one task, one hop to
    /// each connection's event loop and one flush per connection for the whole batch. Use it to fan one update out
    /// to many tokens (a few hundred per call is a good size).
    public func send(_ notifications: [APNsNotification]) async -> [Result<APNsResponse, any Error>] {
        guard !notifications.isEmpty else { return [] }
        if isShutDown.load(ordering: .relaxed) {
            return notifications.map { _ in .failure(APNsTransportError("The APNs client has been shut down.")) }
        }
        let deadline = NIODeadline.now() + requestTimeout
        let first = nextSlot.wrappingAdd(notifications.count, ordering: .relaxed).oldValue
        let slotCount = slots.count
        var bySlot: [[(index: Int, request: PendingRequest)]] = Array(repeating: [], count: slotCount)
        var invalid: [(index: Int, error: any Error)] = []
        // A fan-out's batch has one topic and one push type: each distinct one is checked once.
        var checked: (topic: String, pushType: String)?
        for (index, notification) in notifications.enumerated() {
            do {
                try Self.validate(
                    notification, headersChecked: checked?.topic == notification.topic && checked?.pushType == notification.pushType
                )
                checked = (notification.topic, notification.pushType)
            } catch {
                invalid.append((index, error))
                continue
            }
            let request = PendingRequest(notification: notification, deadline: deadline)
            bySlot[(first &+ index) % slotCount].append((index, request))
        }
        let slots = self.slots
        let all = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<[Result<APNsResponse, any Error>], Never>) in
                let collector = BatchCollector(count: notifications.count, continuation: continuation)
                for (index, error) in invalid {
                    collector.complete(index, with: .failure(error))
                }
                for (slotIndex, items) in bySlot.enumerated() where !items.isEmpty {
                    let requests = items.map { item in
                        item.request.completion = .batch(collector, index: item.index)
                        return item.request
                    }
                    let slot = slots[slotIndex]
                    slot.eventLoop.execute {
                        slot.enqueue(batch: requests)
                    }
                }
            }
        } onCancel: { [bySlot] in
            for (slotIndex, items) in bySlot.enumerated() where !items.isEmpty {
                let slot = slots[slotIndex]
                let requests = items.map(\.request)
                slot.eventLoop.execute {
                    for request in requests {
                        slot.cancel(request)
                    }
                }
            }
        }
        return all
    }

    /// Closes every connection; sends in flight or queued fail with ``APNsTransportError``, and so does every later
    /// send. Returns once the connections are closed. Calling it again does nothing more.
    public func shutdown() async {
        isShutDown.store(true, ordering: .releasing)
        let group = slots.map { slot in
            slot.eventLoop.flatSubmit { slot.shutdown() }
        }
        for future in group {
            try? await future.get()
        }
    }

    /// Throws ``APNsInvalidNotificationError`` for a token that is not hexadecimal, and (unless `headersChecked` says
    /// they passed already) a topic or push type that cannot be sent as a header.
    private static func validate(_ notification: APNsNotification, headersChecked: Bool = false) throws {
        let token = notification.deviceToken.utf8
        let tokenIsHex = !token.isEmpty && token.count <= 512
            && token.allSatisfy { byte in
                // A digit, or a letter a – f in either case (`| 0x20` lowers an ASCII capital; the subtractions wrap
                // below their range, so one comparison each checks both ends).
                byte &- UInt8(ascii: "0") < 10 || (byte | 0x20) &- UInt8(ascii: "a") < 6
            }
        guard tokenIsHex else {
            throw APNsInvalidNotificationError("The device token must be 1 to 512 hexadecimal characters.")
        }
        if headersChecked { return }
        guard isHeaderSafe(notification.topic) else {
            throw APNsInvalidNotificationError("The topic \"\(notification.topic)\" must be non-empty printable ASCII.")
        }
        guard isHeaderSafe(notification.pushType) else {
            throw APNsInvalidNotificationError(
                "The push type \"\(notification.pushType)\" must be non-empty printable ASCII."
            )
        }
    }

    private static func isHeaderSafe(_ value: String) -> Bool {
        !value.utf8.isEmpty && value.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }
}

/// What every connection of one client shares. Immutable.
final class ClientContext: Sendable {
    let endpoint: APNsEndpoint
    let tokens: APNsProviderTokens
    let sslContext: NIOSSLContext
    let configuration: APNsClient.Configuration
    let logger: Logger
    let authority: String
    let serverHostname: String?
    let requestTimeout: TimeAmount
    let connectTimeout: TimeAmount
    let idlePingInterval: TimeAmount
    let pingTimeout: TimeAmount
    /// How often each slot checks deadlines and keepalive.
    let sweepInterval: TimeAmount
    /// The waits between failed attempts to open a connection, as each slot starts them.
    let reconnectBackoff: ReconnectBackoff

    init(
        endpoint: APNsEndpoint,
        tokens: APNsProviderTokens,
        sslContext: NIOSSLContext,
        configuration: APNsClient.Configuration,
        logger: Logger
    ) {
        self.endpoint = endpoint
        self.tokens = tokens
        self.sslContext = sslContext
        self.configuration = configuration
        self.logger = logger
        self.authority = endpoint.authority
        self.serverHostname = endpoint.hostIsIPAddress ? nil : endpoint.host
        self.requestTimeout = TimeAmount(configuration.requestTimeout)
        self.connectTimeout = TimeAmount(configuration.connectTimeout)
        self.idlePingInterval = TimeAmount(configuration.idlePingInterval)
        self.pingTimeout = TimeAmount(configuration.pingTimeout)
        let shortest = min(requestTimeout, connectTimeout, idlePingInterval, pingTimeout)
        self.sweepInterval = min(max(.nanoseconds(shortest.nanoseconds / 4), .milliseconds(10)), .seconds(1))
        self.reconnectBackoff = ReconnectBackoff(
            initialDelay: TimeAmount(configuration.reconnectDelay), maximumDelay: TimeAmount(configuration.maximumReconnectDelay)
        )
    }
}

/// One request from `send` until it is answered, failed or cancelled. Created on the caller's thread; from then on
/// touched only on its slot's event loop.
final class PendingRequest: @unchecked Sendable {
    /// Who is waiting for the result.
    enum Completion {
        /// Not known yet (a single send sets it when the request reaches its event loop), or already delivered.
        case none
        /// A single ``APNsClient/send(_:)-(APNsNotification)``.
        case single(UnsafeContinuation<APNsResponse, any Error>)
        /// Item `index` of a batch send.
        case batch(BatchCollector, index: Int)
    }

    let notification: APNsNotification
    /// A request other than a device push (a broadcast, a channel management request); `nil` for a device push,
    /// whose request is built from ``notification`` alone.
    let other: APNsRequestHead?
    let path: String
    /// The `apns-id` header's value; nil sends none.
    let apnsIDString: String?
    let priorityString: String
    let deadline: NIODeadline

    var completion: Completion
    /// The request reached its slot's event loop.
    var isEnqueued = false
    /// The caller was cancelled before the request reached its event loop.
    var isCancelledEarly = false
    /// Completed (answered, failed, timed out or cancelled). Queues skip finished requests.
    var isFinished = false
    /// How often the request was moved to a new connection because the old one went away before it was sent.
    var moves = 0

    // While on the wire:
    var streamID: HTTP2StreamID?
    var tokenUsed: String?

    // The response as it arrives:
    var status: Int?
    var echoedAPNsID: String?
    var apnsUniqueID: String?
    var retryAfter: Duration?
    var requestID: String?
    var channelID: String?
    var body: ByteBuffer?

    init(notification: APNsNotification, deadline: NIODeadline, completion: Completion = .none) {
        self.notification = notification
        self.other = nil
        self.completion = completion
        self.path = "/3/device/" + notification.deviceToken
        self.apnsIDString = notification.apnsID?.lowercasedString
        self.priorityString = String(notification.priority)
        self.deadline = deadline
    }

    /// A request other than a device push, written as `head` says.
    init(other head: APNsRequestHead, deadline: NIODeadline) {
        self.notification = Self.placeholderNotification
        self.other = head
        self.completion = .none
        self.path = head.path
        self.apnsIDString = nil
        self.priorityString = ""
        self.deadline = deadline
    }

    /// Stands in for the notification of a request that is not a device push; never written.
    private static let placeholderNotification = APNsNotification(
        deviceToken: "",
        topic: "",
        priority: 0,
        apnsID: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
        payload: ByteBuffer()
    )

    /// The most of a response body kept: error bodies are tiny JSON objects, but a channel list can be long.
    var maximumBodyBytes: Int {
        other == nil ? 16 * 1024 : 4 * 1024 * 1024
    }

    /// Completes the request once; later calls are ignored.
    func finish(_ result: Result<APNsResponse, any Error>) {
        guard !isFinished else { return }
        isFinished = true
        let completion = self.completion
        self.completion = .none
        switch completion {
        case .single(let continuation):
            continuation.resume(with: result)
        case .batch(let collector, let index):
            collector.complete(index, with: result)
        case .none:
            assertionFailure("a request finished before anyone waited for it")
        }
    }

    /// Forgets everything about a previous attempt, before the request moves to another connection.
    func resetForResend() {
        streamID = nil
        tokenUsed = nil
        status = nil
        echoedAPNsID = nil
        apnsUniqueID = nil
        retryAfter = nil
        requestID = nil
        channelID = nil
        body = nil
    }
}

/// Gathers the results of one batch send and resumes the caller once all are in. Items complete on different
/// event loops, hence the lock.
final class BatchCollector: Sendable {
    private struct State {
        var results: [Result<APNsResponse, any Error>?]
        var remaining: Int
        var continuation: UnsafeContinuation<[Result<APNsResponse, any Error>], Never>?
    }

    private let state: Mutex<State>

    init(count: Int, continuation: UnsafeContinuation<[Result<APNsResponse, any Error>], Never>) {
        state = Mutex(State(results: Array(repeating: nil, count: count), remaining: count, continuation: continuation))
    }

    func complete(_ index: Int, with result: Result<APNsResponse, any Error>) {
        let done = state.withLock { state -> (UnsafeContinuation<[Result<APNsResponse, any Error>], Never>, [Result<APNsResponse, any Error>])? in
            guard state.results[index] == nil else { return nil }
            state.results[index] = result
            state.remaining -= 1
            guard state.remaining == 0, let continuation = state.continuation else { return nil }
            state.continuation = nil
            return (continuation, state.results.map { $0! })
        }
        if let (continuation, results) = done {
            continuation.resume(returning: results)
        }
    }
}
