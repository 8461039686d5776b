import Crypto
import Foundation
import Hummingbird
import LivelineCore
import Logging
import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL
import ServiceLifecycle
import Synchronization

/// A local stand-in for Apple Push Notification service, for Live Activity pushes.
///
/// It speaks APNs' protocol (HTTP/2 over TLS, `POST /3/device/<token>`, ES256 provider tokens, iOS 18 broadcasts
/// `POST /4/broadcasts/apps/<bundle id>`, and on a second listener channel management `/1/apps/<bundle id>/channels`)
/// and answers as Apple documents, with Apple's statuses and reasons. Behind it sit simulated
/// phones — one per registered push token — that apply accepted pushes the way iOS does and
/// silently ignore those it cannot use. A JSON control API (HTTP/1.1) registers keys, bundle ids
/// and devices, injects faults, and shows what each phone displays.
///
/// It is written from Apple's documents, independently of Liveline's sender, so a misreading in
/// the sender is caught rather than repeated.
///
/// Run it as a `Service` in a `ServiceGroup`, or call ``start()`` and ``shutdown()`` directly.
public final class APNsEmulator: Service, Sendable {
    /// The configuration it was created with.
    public let configuration: APNsEmulatorConfiguration
    let core: APNsEmulatorCore
    private let logger: Logger
    private let identity: EmulatorTLSIdentity
    private let sslContext: NIOSSLContext
    private let connections = OpenConnections()
    private let lifecycle = ListenerLifecycle<Running>()
    private let registrar: LivelineRegistrar
    private let phoneFile: PhoneFile?

    struct Ports: Sendable, Hashable {
        var apns: Int
        var control: Int
        var channels: Int
    }

    private struct Running: Sendable {
        var ports: Ports
        var apnsChannel: any Channel
        var channelsChannel: any Channel
        var controlGroup: ServiceGroup
        var controlTask: Task<Void, Never>
    }

    /// Creates the emulator: loads or creates the CA in the data directory (writing
    /// `<dataDirectory>/ca.pem`) and issues the server certificate for `127.0.0.1`, `::1` and
    /// `localhost`. Nothing listens until ``start()`` or ``run()``.
    public init(configuration: APNsEmulatorConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let registrar = LivelineRegistrar(logger: logger, clock: configuration.now)
        let changes = ChangeSignal()
        let persists = configuration.persistsPhones
        let changed: @Sendable () -> Void = { if persists { changes.mark() } }
        self.registrar = registrar
        let core = APNsEmulatorCore(
            pushHistoryLimit: configuration.pushHistoryLimit, clockSkew: configuration.providerTokenClockSkew,
            registrar: registrar, changed: changed, maximumChannelsPerApp: configuration.maximumChannelsPerApp,
            clock: configuration.now
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
        tls.applicationProtocols = ["h2"]
        tls.minimumTLSVersion = .tlsv12
        self.sslContext = try NIOSSLContext(configuration: tls)
    }

    /// The phone file's name in the data directory (with ``APNsEmulatorConfiguration/persistsPhones``).
    public static let phoneFileName = "apns-phones.json"

    /// The PEM text of the CA certificate a client must trust to reach the APNs listener.
    public var caCertificatePEM: String { identity.caCertificatePEM }

    /// Where the CA certificate is written: `<dataDirectory>/ca.pem`.
    public var caCertificatePath: String {
        (configuration.dataDirectory as NSString).appendingPathComponent(EmulatorTLSIdentity.caFileName)
    }

    /// The bound ports while the emulator runs.
    public var boundPorts: (apnsPort: Int, controlPort: Int)? {
        lifecycle.running.map { ($0.ports.apns, $0.ports.control) }
    }

    /// The channel management listener's bound port while the emulator runs (set once started).
    public var boundChannelsPort: Int? {
        lifecycle.running.map(\.ports.channels)
    }

    // MARK: Lifecycle

    /// Errors from starting the emulator.
    public enum LifecycleError: Error, CustomStringConvertible {
        /// ``start()`` was called after ``shutdown()``.
        case alreadyShutDown
        /// The control API stopped before it was listening.
        case controlServerStopped

        /// A sentence for humans.
        public var description: String {
            switch self {
            case .alreadyShutDown: "The APNs emulator was shut down; create a new one."
            case .controlServerStopped: "The emulator's control API stopped before it was listening."
            }
        }
    }

    /// Starts the listeners (APNs, channel management, control API; idempotent) and returns the bound ports; for in-process use and tests.
    @discardableResult
    public func start() async throws -> (apnsPort: Int, controlPort: Int) {
        let (running, started): (Running, Bool)
        do {
            (running, started) = try await lifecycle.start(listen)
        } catch is ListenerLifecycle<Running>.Stopped {
            throw LifecycleError.alreadyShutDown
        }
        if started {
            logger.info(
                "APNs emulator listening",
                metadata: [
                    "apns": "https://\(configuration.host):\(running.ports.apns)",
                    "channels": "https://\(configuration.host):\(running.ports.channels)",
                    "control": "http://\(configuration.host):\(running.ports.control)",
                ]
            )
        }
        return (running.ports.apns, running.ports.control)
    }

    /// Runs as a `Service`: starts, waits for graceful shutdown (or cancellation), then closes
    /// the listeners, sending each open APNs connection `GOAWAY` with `{"reason":"Shutdown"}`.
    public func run() async throws {
        try await start()
        try? await gracefulShutdown()
        try await shutdown()
    }

    /// Runs the emulator in its own `ServiceGroup` until SIGINT or SIGTERM, then shuts it down
    /// gracefully; for a process that runs nothing else (`liveline emulator apns`).
    public func runService() async throws {
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(services: [self], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        )
        try await group.run()
    }

    /// Stops both listeners; open APNs connections get `GOAWAY` and are closed once their
    /// in-flight requests are answered (at most ten seconds later). Idempotent.
    public func shutdown() async throws {
        if try await lifecycle.stop(stop) {
            logger.info("APNs emulator stopped")
        }
    }

    private func listen() async throws -> Running {
        let apnsChannel = try await bindHTTP2(port: configuration.apnsPort, listener: .push)
        let apnsPort = apnsChannel.localAddress?.port ?? 0
        let channelsChannel: any Channel
        do {
            channelsChannel = try await bindHTTP2(port: configuration.channelsPort, listener: .channelManagement)
        } catch {
            try? await apnsChannel.close()
            throw error
        }
        let channelsPort = channelsChannel.localAddress?.port ?? 0
        let controlPort = MultiThreadedEventLoopGroup.singleton.any().makePromise(of: Int.self)
        let application = Application(
            router: APNsControlAPI(emulator: self).makeRouter(),
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.controlPort),
                serverName: "Liveline APNs emulator"
            ),
            onServerRunning: { channel in controlPort.succeed(channel.localAddress?.port ?? 0) },
            logger: logger
        )
        let services: [any Service] = [application] + (phoneFile.map { [$0] } ?? [])
        let controlGroup = ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: logger))
        let logger = self.logger
        // Unstructured on purpose (a documented exception): the control API runs in its own task so that start() can
        // return while it serves — tests and `liveline serve` need the ports before they wire the rest; shutdown() (or
        // run() as a Service) ends it through the group's graceful shutdown and awaits the task, so it never outlives
        // the emulator.
        let controlTask = Task {
            do {
                try await controlGroup.run()
            } catch {
                logger.error("APNs emulator control API failed", metadata: ["error": "\(error)"])
                controlPort.fail(error)
            }
            controlPort.fail(LifecycleError.controlServerStopped)
        }
        do {
            let port = try await controlPort.futureResult.get()
            return Running(
                ports: Ports(apns: apnsPort, control: port, channels: channelsPort), apnsChannel: apnsChannel,
                channelsChannel: channelsChannel, controlGroup: controlGroup, controlTask: controlTask
            )
        } catch {
            try? await apnsChannel.close()
            try? await channelsChannel.close()
            await controlTask.value
            throw error
        }
    }

    /// Binds one HTTP/2-over-TLS listener (same CA and identity for both): Apple's push endpoint or its channel
    /// management endpoint.
    private func bindHTTP2(port: Int, listener: APNsConnectionHandler.Listener) async throws -> any Channel {
        let core = self.core
        let sslContext = self.sslContext
        let logger = self.logger
        let connections = self.connections
        let settings = [
            HTTP2Setting(
                parameter: .maxConcurrentStreams,
                value: listener == .push ? APNsConnectionHandler.streamLimitBeforeToken : APNsConnectionHandler.openedStreamLimit
            ),
            HTTP2Setting(parameter: .maxHeaderListSize, value: 16 * 1024),
        ]
        return try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(NIOSSLServerHandler(context: sslContext))
                    try pipeline.addHandler(NIOHTTP2Handler(mode: .server, initialSettings: settings))
                    try pipeline.addHandler(APNsConnectionHandler(core: core, listener: listener, logger: logger))
                    connections.add(channel)
                }
            }
            .bind(host: configuration.host, port: port)
            .get()
    }

    private func stop(_ running: Running) async {
        try? await running.apnsChannel.close()
        try? await running.channelsChannel.close()
        let open = connections.closeAll()
        for channel in open {
            channel.eventLoop.execute {
                if let handler = try? channel.pipeline.syncOperations.handler(type: APNsConnectionHandler.self) {
                    handler.shutDownGracefully()
                } else {
                    channel.close(promise: nil)
                }
            }
        }
        if !open.isEmpty {
            let loop = MultiThreadedEventLoopGroup.singleton.any()
            // A grace period for answers still in flight (a delay fault, a slow or loaded machine); past it, close.
            let deadline = loop.scheduleTask(in: .seconds(10)) { for channel in open { channel.close(promise: nil) } }
            _ = try? await EventLoopFuture.whenAllComplete(open.map(\.closeFuture), on: loop).get()
            deadline.cancel()
        }
        await registrar.shutdown()
        await running.controlGroup.triggerGracefulShutdown()
        await running.controlTask.value
    }

    // MARK: Registry

    /// Trusts provider tokens signed by `publicKey` with header `kid: keyID` and claim `iss: teamID`.
    public func registerSigningKey(teamID: String, keyID: String, publicKey: P256.Signing.PublicKey) {
        core.registerSigningKey(teamID: teamID, keyID: keyID, publicKey: publicKey)
    }

    /// Allows the topic `<bundleID>.push-type.liveactivity`.
    public func registerBundleID(_ bundleID: String) {
        core.registerBundleID(bundleID)
    }

    /// Creates a simulated phone's Live Activity push token for a bundle id (random 32-byte hex
    /// unless given; hex is stored lowercase) and returns it. The bundle id is registered too.
    /// Adding a token that exists replaces it with a fresh phone.
    ///
    /// - Precondition: `token`, when given, is a non-empty even-length hex string.
    @discardableResult
    public func addDevice(bundleID: String, token: String? = nil) -> String {
        let token = token?.lowercased() ?? Self.randomToken()
        precondition(APNsEmulatorCore.isHexToken(token), "A device token is a non-empty, even-length hex string.")
        core.addDevice(bundleID: bundleID, token: token)
        return token
    }

    /// From now on pushes to this token get 410 Unregistered with `timestamp` = now (ms).
    public func expireDevice(token: String) {
        _ = core.expireDevice(token: token.lowercased())
    }

    /// The user swipes the token's Live Activity away: later pushes are ignored (`dismissed`).
    /// Returns `false` when no such device exists.
    @discardableResult
    public func dismissActivity(token: String) -> Bool {
        core.dismissActivity(token: token.lowercased())
    }

    // MARK: Simulated iPhones

    /// Why ``createPhone(id:deviceID:userID:tags:bundleID:attributesTypes:registerWith:osVersion:)`` refused.
    public enum PhoneCreationError: Error, CustomStringConvertible {
        /// A phone with this id exists.
        case phoneExists(String)
        /// A phone needs at least one attributes type.
        case noAttributesTypes

        /// A sentence for humans.
        public var description: String {
            switch self {
            case .phoneExists(let id): "A phone with id \(id) exists."
            case .noAttributesTypes: "A phone needs at least one attributes type."
            }
        }
    }

    /// Creates a simulated iPhone with a push-to-start token (64 hex digits) per attributes type. `deviceID`
    /// defaults to the phone's id (a random one unless given), `bundleID` to the configuration's default and
    /// `registerWith` to the configuration's: with one, the app registers the phone with Liveline at once
    /// (`PUT /v1/devices/{deviceId}`, with `osVersion`) and each activity a start push begins. `osVersion` is the
    /// iOS version (default `"18.0"`): from 18 on, a start push's `input-push-channel` subscribes the new activity
    /// to that broadcast channel; an older phone ignores the key.
    @discardableResult
    public func createPhone(
        id: String? = nil, deviceID: String? = nil, userID: String? = nil, tags: JSONValue? = nil, bundleID: String? = nil,
        attributesTypes: [String], registerWith: LivelineRegistrationTarget?? = .none, osVersion: String = "18.0"
    ) throws(PhoneCreationError) -> SimulatedPhoneDisplay {
        do throws(APNsEmulatorCore.PhoneError) {
            return try core.createPhone(
                id: id, deviceID: deviceID, userID: userID, tags: tags, bundleID: bundleID ?? configuration.defaultBundleID,
                attributesTypes: attributesTypes, registerWith: registerWith ?? configuration.registerWith, osVersion: osVersion
            )
        } catch {
            switch error {
            case .phoneExists(let id): throw .phoneExists(id)
            case .noAttributesTypes: throw .noAttributesTypes
            }
        }
    }

    /// The phone issues a new push-to-start token for `attributesType` (and registers it, with register-with); the
    /// old token answers 410 `Unregistered` from now on. `nil` for an unknown phone or type.
    @discardableResult
    public func rotatePushToStartToken(phoneID: String, attributesType: String) -> SimulatedPhoneDisplay? {
        core.rotatePushToStartToken(phoneID: phoneID, attributesType: attributesType)
    }

    /// Why ``rotateActivityToken(phoneID:activityID:)`` cannot rotate.
    public enum ActivityTokenRotationError: Error, Equatable, CustomStringConvertible {
        /// No phone with this id.
        case noPhone(String)
        /// The phone shows no Live Activity with this Liveline activity id.
        case noActivity(String)
        /// The activity is subscribed to a broadcast channel and has no update token.
        case noUpdateToken(String)

        /// A sentence for humans.
        public var description: String {
            switch self {
            case .noPhone(let id): "No phone with id \(id)."
            case .noActivity(let id): "The phone shows no Live Activity for activity \(id)."
            case .noUpdateToken(let id): "The Live Activity for activity \(id) is subscribed to a broadcast channel without an update token."
            }
        }
    }

    /// The phone's Live Activity for Liveline activity `activityID` gets a new update token (and registers it, with
    /// register-with); the old token answers 410 `Unregistered` from now on. Returns the phone as it now is.
    @discardableResult
    public func rotateActivityToken(phoneID: String, activityID: String) throws(ActivityTokenRotationError) -> SimulatedPhoneDisplay {
        try core.rotateActivityToken(phoneID: phoneID, activityID: activityID)
    }

    /// One simulated iPhone with its push-to-start tokens and Live Activities, or `nil`.
    public func phone(id: String) -> SimulatedPhoneDisplay? {
        core.phone(id: id)
    }

    /// Every simulated iPhone, in the order they were created.
    public func phones() -> [SimulatedPhoneDisplay] {
        core.phones()
    }

    /// Waits until no registration call to Liveline is in flight.
    public func waitForRegistrations() async {
        await registrar.waitUntilIdle()
    }

    /// Writes the phone file now (with ``APNsEmulatorConfiguration/persistsPhones``; otherwise does nothing).
    public func savePhones() {
        phoneFile?.save()
    }

    /// Replaces the injected faults.
    public func setFaults(_ faults: APNsFaults) {
        core.faults = faults
    }

    /// The injected faults in force.
    public var faults: APNsFaults { core.faults }

    /// The newest `limit` received requests (to `token` when given), newest last.
    public func pushes(token: String? = nil, limit: Int = 100) -> [ReceivedPush] {
        core.pushes(token: token?.lowercased(), limit: max(0, limit))
    }

    /// What the phone with this token displays, or `nil` for an unknown token.
    public func display(token: String) -> DisplayedActivity? {
        core.display(token: token.lowercased())
    }

    /// Every device's display, in the order the devices were added.
    public func devices() -> [DisplayedActivity] {
        core.displays()
    }

    /// Counts over every request answered so far.
    public var statistics: EmulatorStatistics { core.statistics }

    /// How many pushes to this Live Activity update token APNs accepted (answered 200), per `aps.timestamp` of their
    /// payload, whether the phone applied them or ignored them. Liveline gives each sequence of an activity its own,
    /// strictly increasing timestamp, so a count above 1 is one state delivered more than once. Pushes whose payload
    /// the phone could not decode, and pushes to push-to-start tokens, are not counted. Unlike the push history this
    /// has no limit; it is kept in memory only (not in the phone file). `[:]` for a token never pushed to.
    public func acceptedPushCounts(token: String) -> [Double: Int] {
        core.acceptedPushCounts(token: token.lowercased())
    }

    /// ``acceptedPushCounts(token:)`` for every token pushed to, read at once: token → `aps.timestamp` → pushes.
    public func acceptedPushCounts() -> [String: [Double: Int]] {
        core.acceptedPushCounts()
    }

    // MARK: Broadcast channels

    /// Creates a broadcast channel for `bundleID` (registering the bundle id), as `POST /1/apps/{bundleID}/channels`
    /// would but without a request; returns its base64 id. `storagePolicy` is 0 (no message stored) or 1.
    @discardableResult
    public func createChannel(bundleID: String, storagePolicy: Int = 0) -> String {
        core.createChannel(bundleID: bundleID, storagePolicy: storagePolicy == 1 ? 1 : 0)
    }

    /// Subscribes `count` anonymous iOS 18 Live Activities, started locally with `pushType: .channel(channelID)`, to
    /// the channel. They live in memory only (never in the phone file). Returns `(created, total subscribers)`, or
    /// `nil` when no live channel has this id.
    @discardableResult
    public func addSubscribers(channelID: String, count: Int, attributesType: String? = nil) -> (created: Int, total: Int)? {
        core.addSubscribers(channelID: channelID, count: max(0, count), attributesType: attributesType)
    }

    /// Every live (not deleted) broadcast channel, in creation order.
    public func channels() -> [BroadcastChannelSummary] {
        core.channelSummaries()
    }

    /// One live channel with its subscribers grouped by the `timestamp` they show, or `nil`.
    public func channel(id: String) -> BroadcastChannelDetail? {
        core.channelDetail(id: id)
    }

    /// The first `limit` subscribers' displays (iPhones' channel activities first), or `nil` for no live channel.
    public func channelSubscribers(id: String, limit: Int = 100) -> [DisplayedActivity]? {
        core.channelSubscribers(id: id, limit: max(0, limit))
    }

    static func randomToken() -> String {
        var generator = SystemRandomNumberGenerator()
        let hex = Array("0123456789abcdef".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(64)
        for _ in 0..<32 {
            let byte = UInt8.random(in: 0...255, using: &generator)
            bytes.append(hex[Int(byte >> 4)])
            bytes.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// The open APNs connections, so shutdown can say goodbye to each.
final class OpenConnections: Sendable {
    private struct State {
        var channels: [ObjectIdentifier: any Channel] = [:]
        var closed = false
    }
    private let state = Mutex(State())

    func add(_ channel: any Channel) {
        let accepted = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.channels[ObjectIdentifier(channel)] = channel
            return true
        }
        guard accepted else {
            channel.close(promise: nil)
            return
        }
        channel.closeFuture.whenComplete { _ in
            _ = self.state.withLock { $0.channels.removeValue(forKey: ObjectIdentifier(channel)) }
        }
    }

    /// Refuses further connections and returns the open ones.
    func closeAll() -> [any Channel] {
        state.withLock { state in
            state.closed = true
            return Array(state.channels.values)
        }
    }
}
