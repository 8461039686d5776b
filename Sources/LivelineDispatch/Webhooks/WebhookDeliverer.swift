import AsyncHTTPClient
import CoreMetrics
import FCM
import Foundation
import LivelineCore
import LivelineStore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle

/// When a webhook delivery is tried again, and when it is given up: exponential backoff with jitter, never sooner than
/// the endpoint's `Retry-After`, for `retryFor` after the delivery's first attempt. Pure.
public struct WebhookRetryPolicy: Sendable, Hashable {
    /// How long a delivery is retried before it fails and its endpoint is disabled (Standard Webhooks' senders retry
    /// for about a day).
    public var retryFor: TimeInterval
    /// The wait after the first failed attempt (before jitter); it doubles with each attempt…
    public var baseDelay: TimeInterval
    /// …up to this.
    public var maximumDelay: TimeInterval

    public init(retryFor: TimeInterval = 24 * 3600, baseDelay: TimeInterval = 5, maximumDelay: TimeInterval = 3600) {
        self.retryFor = retryFor
        self.baseDelay = baseDelay
        self.maximumDelay = maximumDelay
    }

    /// What follows attempt number `attempt` (1-based) of a delivery first tried at `firstAttemptAt`: a 2xx answer is
    /// delivered; anything else (another status, a timeout, no connection) is retried until `retryFor` has passed since
    /// the first attempt (the time a delivery waited behind an earlier one of its activity, untried, does not count).
    public func decide(
        statusCode: Int?, error: String?, retryAfter: TimeInterval?, attempt: Int, firstAttemptAt: Date, now: Date, random: Double
    ) -> WebhookAttemptResult {
        if let statusCode, (200..<300).contains(statusCode) { return .delivered }
        let exponent = Double(min(max(attempt - 1, 0), 30))
        let backoff = min(baseDelay * pow(2, exponent), maximumDelay) * (0.5 + 0.5 * min(max(random, 0), 1))
        let delay = max(backoff, min(retryAfter ?? 0, maximumDelay))
        let next = now.addingTimeInterval(delay)
        guard next <= firstAttemptAt.addingTimeInterval(retryFor) else {
            let last = statusCode.map { "HTTP \($0)" } ?? error ?? "no answer"
            return .failed(reason: "Deliveries failed for \(Int(retryFor)) s; the last attempt: \(last). Delete and create the webhook to resume.")
        }
        return .retry(next: next)
    }
}

/// Sends the apps' lifecycle events to their webhook endpoints: at least once, in order per activity, signed as the
/// Standard Webhooks specification says, retried with backoff for a day, then the endpoint is disabled. It runs on its
/// own (a `Service`), so a slow or dead endpoint never slows pushes; events are read from the Store's outbox, so a
/// crash between a commit and a send only delays the send.
public final class WebhookDeliverer: Service, DeliveryWaking, Sendable {
    /// How it behaves.
    public struct Configuration: Sendable {
        public var urls = WebhookURLPolicy(allowsPrivateNetworks: false)
        public var retry = WebhookRetryPolicy()
        /// The longest one attempt may take, from sending the request to the last byte of the answer: an endpoint that
        /// has not answered by then has the attempt counted as failed; one that trickles its answer's body is cut off
        /// then (its status stands).
        public var timeout: Duration = .seconds(10)
        /// Deliveries sent at once…
        public var concurrency = 16
        /// …and at most about this many to one endpoint (twice it at worst: a slow endpoint holds at most that many of
        /// the slots, and the others go on).
        public var concurrencyPerEndpoint = 4
        /// The longest it rests before looking for new events when nothing is due.
        public var pollInterval: Duration = .seconds(1)
        /// The least time from one look for new events to the next when it rests with nothing to send: the wake-ups of
        /// a burst of updates (one for each shared transaction, several hundred a second on PostgreSQL) are taken
        /// together, at the cost of up to this much later deliveries.
        public var restAtLeast: Duration = .milliseconds(50)
        /// The addresses a host name resolves to (`getaddrinfo` by default); the request goes to them, as the URL
        /// policy checked them (IPv4 first, the next when one cannot be connected to), never to a fresh answer.
        public var resolve: @Sendable (_ host: String) async throws -> [[UInt8]] = { try await WebhookDeliverer.resolve($0) }

        public init() {}
    }

    private let store: any WebhookStore
    private let sealer: CredentialSealer
    private let configuration: Configuration
    /// For URLs whose host is an address.
    private let http: HTTPClient
    /// For URLs whose host is a name: connected to the address that was checked.
    private let pinned: PinnedHTTPClients
    private let logger: Logger
    private let now: @Sendable () -> Date
    private let random: @Sendable () -> Double
    private let wakeSignal = WakeSignal()
    /// `liveline_webhook_deliveries_total{status}` per attempt, and `liveline_webhook_delivery_duration_seconds`.
    private let attemptCounters: [String: Counter]
    private let attemptDuration: CoreMetrics.Timer

    public init(
        store: any WebhookStore, sealer: CredentialSealer, configuration: Configuration = Configuration(),
        logger: Logger = Logger(label: "liveline.webhooks"), now: @escaping @Sendable () -> Date = { Date() },
        random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) }
    ) {
        self.store = store
        self.sealer = sealer
        self.configuration = configuration
        var client = HTTPClient.Configuration()
        client.redirectConfiguration = .disallow
        client.timeout = .init(connect: .seconds(5), read: .seconds(Int64(configuration.timeout.components.seconds)))
        self.http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: client)
        self.pinned = PinnedHTTPClients(configuration: client, drain: configuration.timeout + .seconds(5))
        self.logger = logger
        self.now = now
        self.random = random
        let factory = MetricsSystem.factory
        attemptCounters = Dictionary(
            uniqueKeysWithValues: ["delivered", "retrying", "failed"].map { status in
                (status, Counter(label: "liveline_webhook_deliveries_total", dimensions: [("status", status)], factory: factory))
            }
        )
        attemptDuration = CoreMetrics.Timer(label: "liveline_webhook_delivery_duration_seconds", preferredDisplayUnit: .seconds, factory: factory)
    }

    /// Looks for new events at once.
    public func wake() { wakeSignal.wake() }

    /// Closes its HTTP client: call it once when it is used without ``run()`` (which does so when it returns).
    public func shutdown() async {
        try? await http.shutdown()
        await pinned.shutdown()
    }

    /// Sends deliveries as they fall due, each as soon as a slot is free: an attempt that takes long (up to
    /// ``Configuration/timeout``) holds its own slot only, never the others' deliveries. Graceful shutdown cancels the
    /// attempts in flight; they stay pending, handed back so that they are due at once (for another node, or after the
    /// restart), and are sent again.
    public func run() async throws {
        let inFlight = NIOLockedValueBox<[Int64: String]>([:])
        let cancelled = NIOLockedValueBox<[Int64]>([])
        await withDiscardingTaskGroup { group in
            while !Task.isShuttingDownGracefully && !Task.isCancelled {
                let running = inFlight.withLockedValue { $0 }
                let looked = ContinuousClock.now
                var started = 0
                var found = false
                if running.count < configuration.concurrency, let due = try? await fetchDue(inFlight: running) {
                    found = !due.isEmpty
                    for delivery in due {
                        inFlight.withLockedValue { $0[delivery.delivery.id] = delivery.delivery.webhookID }
                        started += 1
                        group.addTask {
                            if await !self.send(delivery) { cancelled.withLockedValue { $0.append(delivery.delivery.id) } }
                            inFlight.withLockedValue { _ = $0.removeValue(forKey: delivery.delivery.id) }
                            self.wakeSignal.wake()
                        }
                    }
                }
                if started > 0 { continue }
                // Nothing could start: every slot is taken, or what is due is in flight already (its end wakes this).
                if found || running.count >= configuration.concurrency || !running.isEmpty {
                    await wakeSignal.wait(atMost: configuration.pollInterval)
                } else {
                    await rest(lookedAt: looked)
                }
            }
            group.cancelAll()
        }
        // On a database several nodes share, the deliveries taken are the taker's for two minutes: those whose attempts
        // were cancelled go back at once.
        let handedBack = cancelled.withLockedValue { $0 }
        do {
            try await store.handBackWebhookDeliveries(handedBack, at: now())
        } catch {
            logger.warning(
                "Handing back webhook deliveries failed; they are sent again when their hold runs out",
                metadata: ["deliveries": "\(handedBack.count)", "error": "\(error)"]
            )
        }
        await shutdown()
    }

    /// One pass: turns new events into deliveries, sends those due and waits for their attempts. Returns whether
    /// anything was sent.
    @discardableResult
    public func pass() async throws -> Bool {
        let due = try await fetchDue(inFlight: [:])
        guard !due.isEmpty else { return false }
        await withTaskGroup(of: Void.self) { group in
            for delivery in due {
                group.addTask { await self.send(delivery) }
            }
        }
        return true
    }

    /// Turns new events into deliveries, then takes the due ones that fit beside the attempts `inFlight` (delivery id →
    /// endpoint).
    private func fetchDue(inFlight: [Int64: String]) async throws -> [DueWebhookDelivery] {
        _ = try await store.enqueueWebhookDeliveries(limit: 500, at: now())
        let perEndpoint = max(configuration.concurrencyPerEndpoint, 1)
        let busy = Dictionary(inFlight.map { ($0.value, 1) }, uniquingKeysWith: +).filter { $0.value >= perEndpoint }.keys
        return try await store.dueWebhookDeliveries(
            now: now(), limit: configuration.concurrency - inFlight.count, perEndpoint: perEndpoint, excluding: Set(inFlight.keys),
            excludingEndpoints: Set(busy)
        )
    }

    /// Rests with nothing to send, after a look at `looked`: until a wake-up, the next delivery's time or the poll
    /// interval, and at least until ``Configuration/restAtLeast`` after the look (a wake-up meanwhile is kept).
    private func rest(lookedAt looked: ContinuousClock.Instant) async {
        var wait = configuration.pollInterval
        if let next = try? await store.nextWebhookDeliveryAt() {
            let seconds = max(0, next.timeIntervalSince(now()))
            wait = min(wait, .milliseconds(Int64(seconds * 1000)))
        }
        await wakeSignal.wait(atMost: wait)
        let earliest = looked + configuration.restAtLeast
        if ContinuousClock.now < earliest, !Task.isShuttingDownGracefully { try? await Task.sleep(until: earliest) }
    }

    /// Sends one delivery and records what followed; false when the attempt was cancelled (graceful shutdown) and
    /// nothing was recorded.
    @discardableResult
    private func send(_ due: DueWebhookDelivery) async -> Bool {
        let delivery = due.delivery
        let started = ContinuousClock.now
        let firstAttemptAt = delivery.firstAttemptAt ?? now()
        var statusCode: Int?
        var failure: String?
        var retryAfter: TimeInterval?
        do {
            let secret = try sealer.open(due.sealedSecret, appID: due.appID, webhookID: delivery.webhookID)
            guard let key = StandardWebhooks.key(of: String(decoding: secret, as: UTF8.self)) else { throw WebhookSendError("the stored secret is unreadable") }
            let url = try configuration.urls.check(due.url)
            // A name is resolved here, its addresses checked, and the request sent to them: AsyncHTTPClient resolving
            // it again could get another answer (a name that points inward a moment after it pointed out).
            var clients = [http]
            if let host = url.host, WebhookURLPolicy.parse(host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))) == nil {
                let addresses = try await configuration.resolve(host)
                try configuration.urls.check(resolved: addresses)
                let texts = WebhookURLPolicy.connectionOrder(addresses).compactMap(WebhookURLPolicy.text(of:))
                guard !texts.isEmpty else { throw WebhookURLPolicy.Refusal("the host did not resolve.") }
                clients = try texts.map { try pinned.client(host: host, address: $0) }
            }
            let timestamp = Int64(now().timeIntervalSince1970)
            let body = Array(delivery.payload.utf8)
            var request = HTTPClientRequest(url: due.url)
            request.method = .POST
            request.headers.add(name: "content-type", value: "application/json")
            request.headers.add(name: "user-agent", value: "Liveline-Webhooks/1")
            request.headers.add(name: "webhook-id", value: delivery.eventID)
            request.headers.add(name: "webhook-timestamp", value: String(timestamp))
            request.headers.add(
                name: "webhook-signature", value: StandardWebhooks.signature(key: key, id: delivery.eventID, timestamp: timestamp, body: body)
            )
            request.body = .bytes(ByteBuffer(bytes: body))
            let answer = try await exchange(request, on: clients, deadline: started + configuration.timeout)
            statusCode = answer.status
            // Seconds or an HTTP date, as RFC 9110 allows (the same reading as FCM's).
            retryAfter = answer.retryAfter.flatMap { FCMResponse.retryAfter($0, now: now()) }.map(\.seconds)
        } catch let refusal as WebhookURLPolicy.Refusal {
            failure = "refused: \(refusal.description)"
        } catch {
            failure = FailureText.of(error)
        }
        // Cancelled by graceful shutdown: nothing is recorded; the delivery stays pending and is sent again.
        guard !Task.isCancelled else { return false }
        let latency = (ContinuousClock.now - started).seconds * 1000
        let result = configuration.retry.decide(
            statusCode: statusCode, error: failure, retryAfter: retryAfter, attempt: delivery.attempts + 1, firstAttemptAt: firstAttemptAt,
            now: now(), random: random()
        )
        attemptDuration.recordNanoseconds(Int64(latency * 1_000_000))
        switch result {
        case .delivered: attemptCounters["delivered"]?.increment()
        case .retry: attemptCounters["retrying"]?.increment()
        case .failed: attemptCounters["failed"]?.increment()
        }
        if case .failed(let reason) = result {
            logger.warning("A webhook endpoint is disabled", metadata: ["webhook": "\(delivery.webhookID)", "reason": "\(reason)"])
        }
        do {
            try await store.recordWebhookAttempt(
                deliveryID: delivery.id, statusCode: statusCode, error: failure, latencyMilliseconds: latency, result: result, at: now()
            )
        } catch {
            logger.error("Recording a webhook attempt failed; it will be sent again", metadata: ["error": "\(error)"])
        }
        return true
    }

    /// What one attempt got: the status and the `Retry-After` header.
    private struct Answer: Sendable {
        var status: Int
        var retryAfter: String?
    }

    /// Sends `request` and reads its answer, all of it by `deadline`: the head through the client's own deadline, then
    /// the body (up to 64 KiB) raced against the time left, so a body trickled a byte at a time ends the attempt at the
    /// deadline (the connection is dropped; the status stands, since the endpoint has answered).
    ///
    /// `clients` connect to one address each, in order: the next is tried only when the one before could not connect
    /// (nothing was sent), as a resolver's caller tries a name's addresses.
    private func exchange(_ request: HTTPClientRequest, on clients: [HTTPClient], deadline: ContinuousClock.Instant) async throws -> Answer {
        var response: HTTPClientResponse?
        for (index, http) in clients.enumerated() {
            let left = max(deadline - ContinuousClock.now, .zero)
            do {
                response = try await http.execute(request, deadline: .now() + .nanoseconds(Int64(left.seconds * 1e9)))
                break
            } catch where index < clients.count - 1 && Self.couldNotConnect(error) {
                continue
            }
        }
        guard let response else { throw WebhookSendError("no address of the host could be reached") }
        let body = response.body
        await withTaskGroup(of: Void.self) { group in
            group.addTask { _ = try? await body.collect(upTo: 64 * 1024) }
            group.addTask { try? await Task.sleep(until: deadline, clock: .continuous) }
            await group.next()
            group.cancelAll()
        }
        return Answer(status: Int(response.status.code), retryAfter: response.headers.first(name: "retry-after"))
    }

    /// Whether `error` says a connection was never made (so the request was not sent).
    static func couldNotConnect(_ error: any Error) -> Bool {
        switch error {
        case is NIOConnectionError: return true
        case let error as IOError: return [ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, EADDRNOTAVAIL].contains(error.errnoCode)
        case let error as HTTPClientError: return error == .connectTimeout
        case let error as ChannelError: if case .connectTimeout = error { return true } else { return false }
        default: return false
        }
    }

    /// The addresses `host` resolves to (on NIO's thread pool: getaddrinfo blocks).
    static func resolve(_ host: String) async throws -> [[UInt8]] {
        try await NIOThreadPool.singleton.runIfActive {
            var hints = addrinfo()
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
            var result: UnsafeMutablePointer<addrinfo>?
            guard getaddrinfo(host, nil, &hints, &result) == 0, let first = result else { return [] }
            defer { freeaddrinfo(first) }
            var addresses: [[UInt8]] = []
            var cursor: UnsafeMutablePointer<addrinfo>? = first
            while let entry = cursor {
                if let address = entry.pointee.ai_addr {
                    switch Int32(address.pointee.sa_family) {
                    case AF_INET:
                        address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { v4 in
                            addresses.append(withUnsafeBytes(of: v4.pointee.sin_addr) { Array($0) })
                        }
                    case AF_INET6:
                        address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { v6 in
                            addresses.append(withUnsafeBytes(of: v6.pointee.sin6_addr) { Array($0) })
                        }
                    default:
                        break
                    }
                }
                cursor = entry.pointee.ai_next
            }
            return addresses
        }
    }
}

struct WebhookSendError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
