import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// A client for FCM HTTP v1 `messages:send`.
///
/// Each ``send(projectID:body:)`` POSTs one message to `<base URL>/v1/projects/<project>/messages:send` with
/// `authorization: Bearer <access token>` and `content-type: application/json`, over HTTP/2 when the server offers
/// it with ALPN (HTTP/1.1 otherwise), on connections AsyncHTTPClient pools and reuses. Access tokens come from
/// ``tokens``; when FCM answers 401 (the token expired or was revoked), the client drops that token, obtains a fresh
/// one and tries once more, then returns whatever FCM said. It never retries anything else behind the caller's back.
///
/// Point it at the local emulator with ``Configuration/baseURL`` and ``Configuration/trustedCAPEM`` (the CA is
/// trusted for the token endpoint too). Call ``shutdown()`` when done.
public final class FCMClient: Sendable {
    /// Google's FCM host.
    public static let defaultBaseURL = "https://fcm.googleapis.com"

    /// Where and how the client connects.
    public struct Configuration: Sendable, Hashable {
        /// `https://host[:port]` of the FCM API; defaults to ``FCMClient/defaultBaseURL``.
        public var baseURL: String
        /// PEM of extra CA certificates to trust (for FCM and the token endpoint) besides the system's.
        public var trustedCAPEM: String?
        /// How long one request (send or token exchange) may take.
        public var requestTimeout: Duration
        /// How long opening a connection may take.
        public var connectTimeout: Duration
        /// The most sends handed to the connection pool at once; further sends wait their turn in the client, where
        /// a cancelled caller simply leaves (once handed over, a send runs to its end or its timeout).
        public var maximumConcurrentRequests: Int

        /// Creates a configuration.
        public init(
            baseURL: String = FCMClient.defaultBaseURL, trustedCAPEM: String? = nil, requestTimeout: Duration = .seconds(30),
            connectTimeout: Duration = .seconds(10), maximumConcurrentRequests: Int = 256
        ) {
            self.baseURL = baseURL
            self.trustedCAPEM = trustedCAPEM
            self.requestTimeout = requestTimeout
            self.connectTimeout = connectTimeout
            self.maximumConcurrentRequests = maximumConcurrentRequests
        }
    }

    /// The service account messages are sent with.
    public let serviceAccount: FCMServiceAccount
    /// The access tokens every request carries.
    public let tokens: FCMAccessTokens
    /// The configuration in effect (``Configuration/baseURL`` without a trailing `/`).
    public let configuration: Configuration

    private let httpClient: HTTPClient
    private let logger: Logger
    private let now: @Sendable () -> Date
    private let isShutDown = Atomic<Bool>(false)
    /// When the last warning that FCM (or its token endpoint) could not be reached was logged.
    private let unreachableWarnedAt = Mutex<ContinuousClock.Instant?>(nil)
    /// The least time between two such warnings: a fan-out fails thousands of sends a second while FCM is away.
    static let unreachableWarningInterval: Duration = .seconds(60)
    /// Keeps at most ``Configuration/maximumConcurrentRequests`` sends in the connection pool.
    private let limiter: RequestLimiter

    /// The largest response body read; FCM's answers are a few hundred bytes.
    static let maximumResponseBytes = 256 * 1024

    /// Creates a client for `serviceAccount`. No connection is opened until the first send.
    ///
    /// - Parameters:
    ///   - serviceAccount: The account whose key signs OAuth assertions.
    ///   - configuration: Base URL, trusted CA, timeouts.
    ///   - refreshMargin: How long before expiry an access token is replaced.
    ///   - now: The wall clock for assertions and token expiry; tests inject their own.
    ///   - eventLoopGroup: Where connections live.
    ///   - logger: Where request failures are logged (never tokens or keys).
    /// - Throws: ``FCMConfigurationError`` when the base URL is not `https://host[:port]` or the CA PEM holds no
    ///   certificate.
    public init(
        serviceAccount: FCMServiceAccount,
        configuration: Configuration = Configuration(),
        refreshMargin: Duration = .seconds(300),
        now: @escaping @Sendable () -> Date = { Date() },
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "liveline.fcm")
    ) throws {
        var configuration = configuration
        configuration.baseURL = try Self.normalizedBaseURL(configuration.baseURL)
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        if let pem = configuration.trustedCAPEM {
            let certificates: [NIOSSLCertificate]
            do {
                certificates = try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8))
            } catch {
                throw FCMConfigurationError("The trusted CA PEM could not be read: \(error).")
            }
            guard !certificates.isEmpty else { throw FCMConfigurationError("The trusted CA PEM holds no certificate.") }
            tls.additionalTrustRoots = [.certificates(certificates)]
        }
        var clientConfiguration = HTTPClient.Configuration(
            tlsConfiguration: tls,
            redirectConfiguration: .disallow,
            timeout: HTTPClient.Configuration.Timeout(connect: TimeAmount(configuration.connectTimeout))
        )
        clientConfiguration.httpVersion = .automatic
        var logger = logger
        logger[metadataKey: "fcm.project"] = "\(serviceAccount.projectID)"
        self.serviceAccount = serviceAccount
        self.configuration = configuration
        self.logger = logger
        self.now = now
        self.limiter = RequestLimiter(limit: configuration.maximumConcurrentRequests)
        let httpClient = HTTPClient(eventLoopGroup: eventLoopGroup, configuration: clientConfiguration, backgroundActivityLogger: logger)
        self.httpClient = httpClient
        self.tokens = FCMAccessTokens(
            serviceAccount: serviceAccount,
            exchange: FCMHTTPTokenExchange(httpClient: httpClient, timeout: configuration.requestTimeout),
            refreshMargin: refreshMargin,
            now: now
        )
    }

    deinit {
        // Without an explicit shutdown, close the pool rather than leaking it (AsyncHTTPClient requires a shutdown).
        if !isShutDown.load(ordering: .acquiring) {
            _ = httpClient.shutdown()
        }
    }

    /// `https://host[:port]` without a trailing slash; `http://` only to a loopback host.
    static func normalizedBaseURL(_ text: String) throws -> String {
        var base = text
        if base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base), let scheme = url.scheme?.lowercased(), let host = url.host, !host.isEmpty,
            url.path.isEmpty, url.query == nil, url.fragment == nil, url.user == nil
        else {
            throw FCMConfigurationError("The FCM base URL \"\(text)\" must look like https://host[:port], without a path.")
        }
        let loopback = ["127.0.0.1", "::1", "[::1]", "localhost"].contains(host.lowercased())
        guard scheme == "https" || (scheme == "http" && loopback) else {
            throw FCMConfigurationError("The FCM base URL \"\(text)\" must be https (http only to a loopback address).")
        }
        return base
    }

    /// The `messages:send` URL for a project.
    public func sendURL(projectID: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove("/")
        let project = projectID.addingPercentEncoding(withAllowedCharacters: allowed) ?? projectID
        return configuration.baseURL + "/v1/projects/" + project + "/messages:send"
    }

    /// Sends one message for the service account's own project; see ``send(projectID:body:)``.
    public func send(body: ByteBuffer) async throws -> FCMResponse {
        try await send(projectID: serviceAccount.projectID, body: body)
    }

    /// Sends one message and returns FCM's answer, whatever its HTTP status.
    ///
    /// - Parameters:
    ///   - projectID: The Firebase project (normally the service account's).
    ///   - body: The JSON body `{"message": {...}}`, token included.
    /// - Throws: ``FCMAuthenticationError`` when the token endpoint refuses the service account;
    ///   ``FCMTransportError`` when no answer came (connection, TLS, timeout, shutdown); `CancellationError`.
    public func send(projectID: String, body: ByteBuffer) async throws -> FCMResponse {
        guard !isShutDown.load(ordering: .relaxed) else { throw FCMTransportError("The FCM client has been shut down.") }
        do {
            return try await exchange(projectID: projectID, body: body)
        } catch let error as FCMTransportError {
            // No answer (a connection, TLS or timeout failure): said in the log, at most once a minute, since the
            // pushes only show it as retries in their timelines.
            let now = ContinuousClock.now
            let warns = !isShutDown.load(ordering: .relaxed) && unreachableWarnedAt.withLock { last in
                guard Self.warns(lastWarning: last, now: now) else { return false }
                last = now
                return true
            }
            if warns {
                logger.warning("FCM could not be reached; its pushes are retried", metadata: ["error": "\(error)"])
            }
            throw error
        }
    }

    /// Whether a warning is due `now`, the last one given at `lastWarning` (nil: none yet).
    static func warns(lastWarning: ContinuousClock.Instant?, now: ContinuousClock.Instant) -> Bool {
        guard let lastWarning else { return true }
        return now - lastWarning >= unreachableWarningInterval
    }

    /// ``send(projectID:body:)``'s request, after one 401 again with a fresh access token.
    private func exchange(projectID: String, body: ByteBuffer) async throws -> FCMResponse {
        let url = sendURL(projectID: projectID)
        var token = try await tokens.current()
        var refreshed = false
        while true {
            let response = try await post(url: url, body: body, accessToken: token)
            // A 401 is an access token FCM no longer takes, except THIRD_PARTY_AUTH_ERROR: a refusal of the target (an
            // iOS or web token), which a new access token does not change.
            if response.status == 401, response.errorCode != .thirdPartyAuthError, !refreshed {
                refreshed = true
                await tokens.invalidate(token)
                token = try await tokens.current()
                continue
            }
            if !response.isSuccess {
                logger.debug(
                    "FCM refused a message",
                    metadata: ["status": "\(response.status)", "reason": "\(response.reason)"]
                )
            }
            return response
        }
    }

    /// Sends one message given as bytes; see ``send(projectID:body:)``.
    public func send(projectID: String, body: [UInt8]) async throws -> FCMResponse {
        try await send(projectID: projectID, body: ByteBuffer(bytes: body))
    }

    private func post(url: String, body: ByteBuffer, accessToken: String) async throws -> FCMResponse {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "authorization", value: "Bearer " + accessToken)
        request.headers.add(name: "content-type", value: "application/json; charset=utf-8")
        request.headers.add(name: "accept", value: "application/json")
        request.body = .bytes(body)
        // The exchange runs to its end (or its timeout) even when the caller is cancelled: a request cancelled
        // mid-stream was seen to leave the pooled HTTP/2 connection unusable, every later send hanging on it. So only
        // a bounded number are handed over; a caller cancelled while waiting for its turn leaves without sending.
        // Unstructured on purpose (a documented exception) for that reason: a child task would be cancelled with its
        // caller. It is bounded by the request timeout and awaited by the caller.
        try await limiter.acquire()
        let httpClient = self.httpClient
        let timeout = TimeAmount(configuration.requestTimeout)
        let logger = self.logger
        let limiter = self.limiter
        let exchange = Task {
            defer { limiter.release() }
            let response = try await httpClient.execute(request, timeout: timeout, logger: logger)
            let bytes = try await response.body.collect(upTo: Self.maximumResponseBytes)
            return (Int(response.status.code), bytes, response.headers.first(name: "retry-after"))
        }
        do {
            let (status, bytes, retryAfter) = try await exchange.value
            return FCMResponse(status: status, body: bytes.readableBytesView, retryAfterHeader: retryAfter, now: now())
        } catch {
            throw FCMTransportError("The FCM request to \(url) failed: \(error)")
        }
    }

    /// Closes the client's connections; later sends throw ``FCMTransportError``. Idempotent.
    public func shutdown() async {
        guard !isShutDown.exchange(true, ordering: .acquiringAndReleasing) else { return }
        do {
            try await httpClient.shutdown()
        } catch {
            logger.warning("Closing the FCM client's connections failed", metadata: ["error": "\(error)"])
        }
    }
}
