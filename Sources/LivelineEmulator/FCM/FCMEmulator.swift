import Foundation
import Hummingbird
import HummingbirdHTTP2
import LivelineCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import ServiceLifecycle
import Synchronization
import _CryptoExtras

/// A local stand-in for Firebase Cloud Messaging (HTTP v1) and Google's OAuth token endpoint, for Android live updates.
///
/// One HTTPS listener (HTTP/2 or HTTP/1.1, chosen with ALPN) serves `POST /token` (the JWT bearer grant, verified
/// against registered service accounts' public keys) and `POST /v1/projects/<project>/messages:send` (with FCM's
/// checks and answers, errors in Google's JSON shape). Behind it sit simulated Android phones — one per registration
/// token — that keep each activity's ongoing notification as an app following Liveline's data contract would. A JSON
/// control API (HTTP/1.1, its own port) registers service accounts and devices, unregisters tokens, dismisses
/// notifications, injects faults and shows what each phone displays.
///
/// It is written from Google's documents, independently of Liveline's sender, so a misreading in the sender is caught
/// rather than repeated.
///
/// Run it as a `Service` in a `ServiceGroup`, or call ``start()`` and ``shutdown()`` directly.
public final class FCMEmulator: Service, Sendable {
    /// The configuration it was created with.
    public let configuration: FCMEmulatorConfiguration
    let core: FCMEmulatorCore
    private let logger: Logger
    private let identity: EmulatorTLSIdentity
    private let tlsConfiguration: TLSConfiguration
    private let lifecycle = ListenerLifecycle<Running>()
    private let demo = Mutex<FCMDemoServiceAccount?>(nil)
    private let registrar: LivelineRegistrar
    private let phoneFile: PhoneFile?

    struct Ports: Sendable, Hashable {
        var fcm: Int
        var control: Int
    }

    private struct Running: Sendable {
        var ports: Ports
        var group: ServiceGroup
        var task: Task<Void, Never>
    }

    /// Errors from starting the emulator.
    public enum LifecycleError: Error, CustomStringConvertible {
        /// ``start()`` was called after ``shutdown()``.
        case alreadyShutDown
        /// A listener stopped before it was listening.
        case serverStopped
        /// ``demoServiceAccount()`` was called before ``start()``: the token URI is not known yet.
        case notRunning

        /// A sentence for humans.
        public var description: String {
            switch self {
            case .alreadyShutDown: "The FCM emulator was shut down; create a new one."
            case .serverStopped: "An FCM emulator listener stopped before it was listening."
            case .notRunning: "The FCM emulator is not running; start it first."
            }
        }
    }

    /// Creates the emulator: loads or creates the CA in the data directory (writing `<dataDirectory>/ca.pem`) and
    /// issues the server certificate for `127.0.0.1`, `::1` and `localhost`. Nothing listens until ``start()`` or
    /// ``run()``.
    public init(configuration: FCMEmulatorConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let registrar = LivelineRegistrar(logger: logger, clock: configuration.now)
        let changes = ChangeSignal()
        let persists = configuration.persistsPhones
        let changed: @Sendable () -> Void = { if persists { changes.mark() } }
        self.registrar = registrar
        let core = FCMEmulatorCore(
            messageHistoryLimit: configuration.messageHistoryLimit, accessTokenLifetime: configuration.accessTokenLifetime,
            assertionClockSkew: configuration.assertionClockSkew, registrar: registrar,
            changed: changed, clock: configuration.now
        )
        self.core = core
        self.phoneFile = try PhoneFile.open(
            fileName: Self.phoneFileName, in: configuration.dataDirectory, persists: configuration.persistsPhones, changes: changes,
            logger: logger, load: core.loadPhones, encode: { try core.encodePhones() }
        )
        self.identity = try EmulatorTLSIdentity.loadOrCreate(in: configuration.dataDirectory)
        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try NIOSSLCertificate(bytes: Array(identity.serverCertificatePEM.utf8), format: .pem))],
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(identity.serverPrivateKeyPEM.utf8), format: .pem))
        )
        tls.minimumTLSVersion = .tlsv12
        self.tlsConfiguration = tls
    }

    /// The PEM text of the CA certificate a client must trust to reach the FCM listener.
    public var caCertificatePEM: String { identity.caCertificatePEM }

    /// Where the CA certificate is written: `<dataDirectory>/ca.pem`.
    public var caCertificatePath: String {
        (configuration.dataDirectory as NSString).appendingPathComponent(EmulatorTLSIdentity.caFileName)
    }

    /// The bound ports while the emulator runs.
    public var boundPorts: (fcmPort: Int, controlPort: Int)? {
        lifecycle.running.map { ($0.ports.fcm, $0.ports.control) }
    }

    /// The host part of the emulator's URLs: the bound address, or loopback for a wildcard address.
    private var urlHost: String {
        switch configuration.host {
        case "0.0.0.0", "": "127.0.0.1"
        case "::": "[::1]"
        case let host where host.contains(":"): "[\(host)]"
        case let host: host
        }
    }

    /// The FCM base URL while the emulator runs, `https://<host>:<port>` (an ``FCMEmulator``'s stand-in for
    /// `https://fcm.googleapis.com`).
    public var baseURL: String? {
        boundPorts.map { "https://\(urlHost):\($0.fcmPort)" }
    }

    /// The token endpoint's URI while the emulator runs, `<baseURL>/token`: a service account's `token_uri`, and the
    /// audience its assertions must name.
    public var tokenURI: String? { baseURL.map { $0 + "/token" } }

    /// The control API's URL while the emulator runs.
    public var controlURL: String? {
        boundPorts.map { "http://\(urlHost):\($0.controlPort)" }
    }

    // MARK: Lifecycle

    /// Starts both listeners (idempotent) and returns the bound ports; for in-process use and tests.
    @discardableResult
    public func start() async throws -> (fcmPort: Int, controlPort: Int) {
        let (running, started): (Running, Bool)
        do {
            (running, started) = try await lifecycle.start {
                let running = try await listen()
                core.tokenURI = "https://\(urlHost):\(running.ports.fcm)/token"
                return running
            }
        } catch is ListenerLifecycle<Running>.Stopped {
            throw LifecycleError.alreadyShutDown
        }
        if started {
            logger.info(
                "FCM emulator listening",
                metadata: ["fcm": "https://\(urlHost):\(running.ports.fcm)", "control": "http://\(urlHost):\(running.ports.control)"]
            )
        }
        return (running.ports.fcm, running.ports.control)
    }

    /// Runs as a `Service`: starts, waits for graceful shutdown (or cancellation), then closes the listeners.
    public func run() async throws {
        try await start()
        try? await gracefulShutdown()
        try await shutdown()
    }

    /// Runs the emulator in its own `ServiceGroup` until SIGINT or SIGTERM, then shuts it down gracefully; for a
    /// process that runs nothing else (`liveline emulator fcm`).
    public func runService() async throws {
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(services: [self], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        )
        try await group.run()
    }

    /// Stops both listeners, letting requests in flight finish. Idempotent.
    public func shutdown() async throws {
        let registrar = self.registrar
        let stopped = try await lifecycle.stop { running in
            await registrar.shutdown()
            await running.group.triggerGracefulShutdown()
            await running.task.value
        }
        if stopped { logger.info("FCM emulator stopped") }
    }

    private func listen() async throws -> Running {
        let loop = MultiThreadedEventLoopGroup.singleton.any()
        let fcmPort = loop.makePromise(of: Int.self)
        let controlPort = loop.makePromise(of: Int.self)
        let fcm = Application(
            router: FCMRoutes(core: core).makeRouter(),
            server: try .http2Upgrade(tlsConfiguration: tlsConfiguration),
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.fcmPort), serverName: "Liveline FCM emulator"
            ),
            onServerRunning: { channel in fcmPort.succeed(channel.localAddress?.port ?? 0) },
            logger: logger
        )
        let control = Application(
            router: FCMControlAPI(emulator: self).makeRouter(),
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.controlPort),
                serverName: "Liveline FCM emulator control"
            ),
            onServerRunning: { channel in controlPort.succeed(channel.localAddress?.port ?? 0) },
            logger: logger
        )
        let services: [any Service] = [fcm, control] + (phoneFile.map { [$0] } ?? [])
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: logger))
        let logger = self.logger
        // Unstructured on purpose (a documented exception): the listeners run in their own task so that start() can
        // return while they serve — tests and `liveline serve` need the ports before they wire the rest; shutdown()
        // (or run() as a Service) ends them through the group's graceful shutdown and awaits the task.
        let task = Task {
            do {
                try await group.run()
            } catch {
                logger.error("FCM emulator listener failed", metadata: ["error": "\(error)"])
                fcmPort.fail(error)
                controlPort.fail(error)
            }
            fcmPort.fail(LifecycleError.serverStopped)
            controlPort.fail(LifecycleError.serverStopped)
        }
        do {
            let ports = Ports(fcm: try await fcmPort.futureResult.get(), control: try await controlPort.futureResult.get())
            return Running(ports: ports, group: group, task: task)
        } catch {
            await group.triggerGracefulShutdown()
            await task.value
            throw error
        }
    }

    // MARK: Registry

    /// Trusts assertions signed by `publicKey` whose `iss` is `clientEmail`, and lets the access tokens they earn send
    /// for `projectID`. When `privateKeyID` is given, an assertion's `kid` must be it.
    public func registerServiceAccount(
        clientEmail: String, projectID: String, publicKey: _RSA.Signing.PublicKey, privateKeyID: String? = nil
    ) {
        core.registerServiceAccount(
            RegisteredServiceAccount(clientEmail: clientEmail, projectID: projectID, publicKey: publicKey, privateKeyID: privateKeyID)
        )
    }

    /// The demo service account: generated once into the data directory (`fcm-service-account.json`, mode 0600) with
    /// its `token_uri` set to this emulator's ``tokenURI``, and registered. Call after ``start()``.
    ///
    /// - Throws: ``LifecycleError/notRunning`` before ``start()``; ``FCMDemoServiceAccount/Problem`` when the saved file
    ///   cannot be read.
    public func demoServiceAccount() throws -> FCMDemoServiceAccount {
        guard let tokenURI else { throw LifecycleError.notRunning }
        if let existing = demo.withLock({ $0 }), existing.tokenURI == tokenURI { return existing }
        let (account, registration) = try FCMDemoServiceAccount.loadOrCreate(
            in: configuration.dataDirectory, tokenURI: tokenURI, projectID: configuration.defaultProjectID
        )
        core.registerServiceAccount(registration)
        demo.withLock { $0 = account }
        return account
    }

    /// Registers a simulated Android phone for a project and returns its FCM registration token (a new random one
    /// unless given). Registering a token that exists replaces it with a fresh phone.
    ///
    /// `deviceID` (default: the token), `userID` and `tags` are what the app registers with Liveline; with
    /// `registerWith` (default: the configuration's) it does so at once (`PUT /v1/devices/{deviceId}`) and for each
    /// activity a `start` message posts (`PUT /v1/activities/{activityId}/instances/{deviceId}`).
    ///
    /// `platform` is the app instance's: an iOS or web one's token is refused with FCM's `401 THIRD_PARTY_AUTH_ERROR`
    /// ("a message targeted to an iOS device or a web push registration could not be sent"), since the emulated
    /// projects have no APNs certificate or web push key.
    @discardableResult
    public func addDevice(
        projectID: String? = nil, token: String? = nil, deviceID: String? = nil, userID: String? = nil, tags: JSONValue? = nil,
        registerWith: LivelineRegistrationTarget?? = .none, platform: FCMClientPlatform = .android
    ) -> String {
        let token = token ?? FCMEmulatorCore.newRegistrationToken()
        core.addDevice(
            projectID: projectID ?? configuration.defaultProjectID, token: token, deviceID: deviceID, userID: userID, tags: tags,
            registerWith: registerWith ?? configuration.registerWith, platform: platform
        )
        return token
    }

    /// The phone file's name in the data directory (with ``FCMEmulatorConfiguration/persistsPhones``).
    public static let phoneFileName = "fcm-phones.json"

    /// Waits until no registration call to Liveline is in flight.
    public func waitForRegistrations() async {
        await registrar.waitUntilIdle()
    }

    /// Writes the phone file now (with ``FCMEmulatorConfiguration/persistsPhones``; otherwise does nothing).
    public func savePhones() {
        phoneFile?.save()
    }

    /// The app is uninstalled: from now on messages to this token get 404 `UNREGISTERED`. `false` for an unknown token.
    @discardableResult
    public func unregisterDevice(token: String) -> Bool {
        core.unregisterDevice(token: token)
    }

    /// The user swipes the activity's notification away: nothing more shows for it. `false` for an unknown token.
    @discardableResult
    public func dismissNotification(token: String, activityID: String) -> Bool {
        core.dismissNotification(token: token, activityID: activityID)
    }

    /// Every access token issued so far stops working, as if revoked: the next send with one gets 401.
    public func revokeAccessTokens() {
        core.revokeAccessTokens()
    }

    /// Replaces the injected faults.
    public func setFaults(_ faults: FCMFaults) {
        core.faults = faults
    }

    /// The injected faults in force.
    public var faults: FCMFaults { core.faults }

    /// The newest `limit` received `messages:send` requests (to `token` when given), newest last.
    public func messages(token: String? = nil, limit: Int = 100) -> [ReceivedFCMMessage] {
        core.messages(token: token, limit: max(0, limit))
    }

    /// The phone with this token and its notifications, or `nil` for an unknown token.
    public func device(token: String) -> SimulatedAndroidDevice? {
        core.device(token: token)
    }

    /// Every phone, in the order they were registered.
    public func devices() -> [SimulatedAndroidDevice] {
        core.devices()
    }

    /// Counts over every request answered so far.
    public var statistics: FCMEmulatorStatistics { core.statistics }
}

/// The FCM listener's routes: Google's token endpoint and FCM's `messages:send`.
struct FCMRoutes: Sendable {
    let core: FCMEmulatorCore

    func makeRouter() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: FCMNotFoundMiddleware())
        router.post("token") { request, _ in
            let body = try await Self.collect(request, limit: 64 * 1024)
            guard let body else {
                return Self.response(OAuthRefusal("invalid_request", "The request body is too large.").body, status: 400)
            }
            let answer = core.handleTokenRequest(contentType: request.headers[.contentType], body: body)
            return Self.response(answer.body, status: answer.status)
        }
        router.post("v1/projects/:project/:method") { request, context in
            let method = try context.parameters.require("method")
            let projectText = try context.parameters.require("project")
            let project = projectText.removingPercentEncoding ?? projectText
            guard method == "messages:send" else {
                let refusal = FCMRefusal(status: 404, errorCode: nil, message: "Method not found.", errorInfoReason: nil, fieldViolation: nil)
                return Self.response(refusal.body, status: 404)
            }
            guard let body = try await Self.collect(request, limit: FCMEmulatorCore.maximumRequestBytes) else {
                let refusal = FCMRefusal.invalidArgument(
                    "Request payload size exceeds the limit: \(FCMEmulatorCore.maximumRequestBytes) bytes."
                )
                return Self.response(refusal.body, status: 400)
            }
            let answer = core.handleSend(
                projectID: project, authorization: request.headers[values: .authorization],
                contentType: request.headers[.contentType], body: body
            )
            if answer.delayMilliseconds > 0 { try await Task.sleep(for: .milliseconds(answer.delayMilliseconds)) }
            var response = Self.response(answer.body, status: answer.status)
            if let retryAfter = answer.retryAfter { response.headers[.retryAfter] = String(retryAfter) }
            return response
        }
        return router
    }

    /// The body, or `nil` when it is longer than `limit`.
    static func collect(_ request: Request, limit: Int) async throws -> [UInt8]? {
        do {
            return Array(try await request.body.collect(upTo: limit).readableBytesView)
        } catch is NIOTooManyBytesError {
            return nil
        }
    }

    static func response(_ body: [UInt8], status: Int) -> Response {
        var buffer = ByteBuffer()
        buffer.writeBytes(body)
        return Response(
            status: HTTPResponse.Status(code: status), headers: [.contentType: "application/json; charset=UTF-8"],
            body: ResponseBody(byteBuffer: buffer)
        )
    }
}

/// Unknown paths and methods on the FCM listener get Google's error JSON.
struct FCMNotFoundMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as any HTTPResponseError where error.status.code < 500 {
            let status = Int(error.status.code)
            let refusal = FCMRefusal(
                status: status, errorCode: nil, message: "\(request.method) \(request.uri.path) is not a FCM emulator route.",
                errorInfoReason: nil, fieldViolation: nil
            )
            return FCMRoutes.response(refusal.body, status: status)
        }
    }
}
