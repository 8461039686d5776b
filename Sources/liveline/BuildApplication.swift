import Crypto
import Foundation
import Hummingbird
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineServer
import LivelineStore
import Logging
import ServiceLifecycle

/// The composition root of `liveline serve`: every long-lived part is built here, once, and run as a service of the
/// application's one `ServiceGroup` — the HTTP server, the delivery engine, the lifetime sweeper and (with the
/// emulator on) the built-in APNs and FCM emulators. On SIGINT or SIGTERM the group shuts them down in reverse order:
/// the server stops taking requests, the sweeper and the engine finish or hand back their work, the emulators close,
/// and last the push clients and the Store are closed.
///
/// `metrics` is what `GET /metrics` serves: the registry the process's `MetricsSystem` was bootstrapped with, so that
/// the engine's, the Store's and the API's metrics all show there.
func buildApplication(
    _ configuration: LivelineConfiguration, logger: Logger, metrics: LivelineMetrics = LivelineMetrics()
) async throws -> some ApplicationProtocol {
    // One server on a SQLite file (``ServeLock``), taken before the database is opened or migrated.
    var lock: ServeLock?
    if case .sqlite(let path) = try configuration.databaseLocation {
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        lock = try ServeLock.acquire(databasePath: path)
    }
    // On PostgreSQL the master key must be configured: said at once, not after waiting for the database.
    if case .postgres = try configuration.databaseLocation { _ = try LivelineApplication.masterKey(configuration) }
    let store: SQLStore
    do {
        store = try await LivelineApplication.openStore(configuration, waitingForDatabase: true, logger: logger)
    } catch {
        lock?.release()
        throw error
    }
    logger.info("Database ready", metadata: ["database": "\(store.location)"])
    do {
        let sealer = try await LivelineApplication.sealer(configuration, checkedAgainst: store)
        let demo = configuration.dev ? try await LivelineApplication.prepareDevApp(store: store, sealer: sealer, logger: logger) : nil
        let emulators =
            configuration.emulator
            ? try await BuiltInEmulators.start(configuration, createdDemoKey: demo?.publishableKey, logger: logger) : nil
        let apns = APNsTransportDirectory(store: store, sealer: sealer, fallback: emulators?.apnsFallback, logger: logger)
        let fcm = FCMTransportDirectory(store: store, sealer: sealer, fallback: emulators?.fcmFallback, logger: logger)
        var dispatch = DispatcherConfiguration()
        dispatch.budget = configuration.budget
        dispatch.fcmRetryFloor = .seconds(configuration.fcmRetryFloor)
        dispatch.fcmQuotaRetryFloor = .seconds(configuration.fcmQuotaRetryFloor)
        dispatch.claimLease = TimeInterval(configuration.claimLease)
        dispatch.workers = try configuration.deliveryWorkers()
        dispatch.pushesPerCall = configuration.enginePushesPerCall
        dispatch.pushesInFlight = configuration.enginePushesInFlight
        dispatch.progressBatchSize = configuration.engineProgressBatch
        // Fan-outs are shared between nodes only where nodes share the database.
        if store.nodeWakeChannel != nil, configuration.sliceSize > 0 { dispatch.sliceSize = configuration.sliceSize }
        let dispatcher = Dispatcher(
            store: store, transports: PlatformTransports(ios: apns, android: fcm), configuration: dispatch, logger: logger,
            peers: store.nodeWakeChannel.map(AnnouncingToNodes.init)
        )
        // Work committed here wakes this node's engine, and every other node's when they share a database.
        let delivery = WakingEveryNode(local: dispatcher, nodes: store.nodeWakeChannel)
        let sweeper = LifetimeSweeper(store: store, policy: configuration.lifetime, logger: logger, delivery: delivery, channels: apns)
        var webhookConfiguration = WebhookDeliverer.Configuration()
        webhookConfiguration.urls = WebhookURLPolicy(allowsPrivateNetworks: configuration.webhooks.allowsPrivateNetworks)
        webhookConfiguration.retry.retryFor = configuration.webhooks.retryFor
        let webhooks = WebhookDeliverer(store: store, sealer: sealer, configuration: webhookConfiguration, logger: logger)
        let closing = ClosingService { [lock] in
            await apns.shutdown()
            await fcm.shutdown()
            try await store.close()
            lock?.release()
        }
        let keys = APIKeyCache(store: store)
        // A deleted app's push connections close with it, in the background: closing waits for the pushes in flight,
        // and whoever deleted it need not.
        let closeConnections: @Sendable (String) -> Void = { appID in
            Task {
                await apns.forget(appID: appID)
                await fcm.forget(appID: appID)
            }
        }
        let listening: [any Service] = store.nodeWakeChannel.map { channel in
            [NodeWakeService(channel: channel, onWake: { announcer in
                // Work this node committed woke its engine there and then (``WakingEveryNode``; a shared fan-out's
                // slices, the engine that cut them): only another node's work wakes it here, rather than every worker
                // looking again, in vain, for each announcement of its own. The webhook deliverer is woken by every
                // announcement: this node's events too.
                if announcer == .anotherNode { dispatcher.wake() }
                webhooks.wake()
            }, onAppNotice: { notice in
                // Any node's (or one-shot command's) revocations and deletions, this node's own too (forgetting twice
                // is harmless): its cached keys stop working at once rather than after their lifetime, and a deleted
                // app's push connections close here as well.
                switch notice {
                case .keysRevoked(let appID):
                    keys.forget(appID: appID)
                case .appDeleted(let appID):
                    keys.forget(appID: appID)
                    closeConnections(appID)
                case .mayHaveMissed:
                    keys.forgetAll()
                    Task {
                        await apns.forgetDeletedApps()
                        await fcm.forgetDeletedApps()
                    }
                }
            })]
        } ?? []
        // On SQLite the engine's jobs run on event loops of their own; on PostgreSQL on the push clients' (see
        // ``LowPriorityEngine``).
        let engine = LowPriorityEngine(
            dispatcher: dispatcher, niceness: configuration.engineNiceness,
            placement: store.dialect == .sqlite ? .ownEventLoops : .pushClientsEventLoops
        )
        return LivelineApplication.makeApplication(
            configuration: configuration, store: store, logger: logger, sealer: sealer, delivery: delivery, channels: apns,
            webhookDeliverer: webhooks,
            // Shut down in the reverse order: the engine before the push clients it sends with (`closing`), and the
            // clients before the emulators they are connected to (an emulator closed first waited for their
            // connections, and the clients logged its GOAWAY).
            services: (emulators?.services ?? []) + [closing]
                + [engine, sweeper, webhooks] + listening,
            metrics: metrics,
            // Here at once; on the other nodes when they hear the Store's notice.
            appDeleted: { closeConnections($0) },
            keys: keys
        )
    } catch {
        try? await store.close()
        lock?.release()
        throw error
    }
}

/// Wakes this node's delivery engine, and announces the work to the other nodes sharing the database (if any).
struct WakingEveryNode: DeliveryWaking {
    let local: Dispatcher
    let nodes: NodeWakeChannel?

    func wake() {
        local.wake()
        nodes?.announce()
    }
}

/// Tells the other nodes sharing the database that work waits: a fan-out cut into slices for them (the engine that cut
/// them wakes its own workers).
struct AnnouncingToNodes: DeliveryWaking {
    let channel: NodeWakeChannel

    func wake() { channel.announce() }
}

/// Hears the other nodes' wake-ups (and sends this node's) and the Store's notices of apps until graceful shutdown.
struct NodeWakeService: Service {
    let channel: NodeWakeChannel
    let onWake: @Sendable (NodeWakeChannel.Announcer) -> Void
    let onAppNotice: @Sendable (AppNotice) -> Void

    func run() async throws {
        await cancelWhenGracefulShutdown { await channel.run(onWake: onWake, onAppNotice: onAppNotice) }
    }
}

/// Closes what the other services use once they have all stopped: it is the group's first service, so the last one
/// shut down.
struct ClosingService: Service {
    let close: @Sendable () async throws -> Void

    func run() async throws {
        // Returns when graceful shutdown begins (or throws if the group is cancelled instead): close either way.
        try? await gracefulShutdown()
        try await close()
    }
}

/// The built-in APNs and FCM emulators of `serve --dev`, started, with the credentials that send an app without its
/// own to them — never to Apple or Google.
struct BuiltInEmulators {
    var apnsFallback: APNsTransportDirectory.Fallback
    var fcmFallback: FCMTransportDirectory.Fallback
    var services: [any Service]

    /// Starts both emulators. Their simulated phones are kept in `<data dir>/emulator` across restarts, and register
    /// with Liveline (see ``registrationTarget(_:createdDemoKey:directory:)``).
    static func start(_ configuration: LivelineConfiguration, createdDemoKey: String?, logger: Logger) async throws -> BuiltInEmulators {
        let directory = (configuration.dataDirectory as NSString).appendingPathComponent("emulator")
        let registration = registrationTarget(configuration, createdDemoKey: createdDemoKey, directory: directory)
        switch registration {
        case .target(let target):
            logger.notice("Simulated phones register with Liveline", metadata: ["url": "\(target.url)"])
        case .off(let why):
            logger.notice("Simulated phones do not register with Liveline: \(why)")
        }
        var emulatorConfiguration = APNsEmulatorConfiguration(dataDirectory: directory)
        emulatorConfiguration.host = "127.0.0.1"
        emulatorConfiguration.apnsPort = configuration.emulatorPort
        emulatorConfiguration.controlPort = configuration.emulatorControlPort
        emulatorConfiguration.channelsPort = configuration.emulatorChannelsPort
        emulatorConfiguration.persistsPhones = true
        emulatorConfiguration.registerWith = registration.resolved
        let emulator = try APNsEmulator(configuration: emulatorConfiguration, logger: logger)
        let ports = try await emulator.start()
        let key = P256.Signing.PrivateKey()
        let teamID = "EMULATED01", keyID = "EMULATED01"
        emulator.registerSigningKey(teamID: teamID, keyID: keyID, publicKey: key.publicKey)
        let baseURL = "https://127.0.0.1:\(ports.apnsPort)"
        let channelsURL = emulator.boundChannelsPort.map { "https://127.0.0.1:\($0)" }
        let caPEM = emulator.caCertificatePEM
        let keyPEM = key.pemRepresentation
        logger.notice(
            "Built-in APNs emulator running: apps without APNs credentials push to it, not to Apple",
            metadata: [
                "apns": "\(baseURL)", "channels": "\(channelsURL ?? "none")", "phones": "http://127.0.0.1:\(ports.controlPort)/devices",
                "ca": "\(emulator.caCertificatePath)",
            ]
        )
        var fcmConfiguration = FCMEmulatorConfiguration(dataDirectory: emulatorConfiguration.dataDirectory)
        fcmConfiguration.host = "127.0.0.1"
        fcmConfiguration.fcmPort = configuration.fcmEmulatorPort
        fcmConfiguration.controlPort = configuration.fcmEmulatorControlPort
        fcmConfiguration.persistsPhones = true
        fcmConfiguration.registerWith = registration.resolved
        let fcmEmulator = try FCMEmulator(configuration: fcmConfiguration, logger: logger)
        let fcmPorts: (fcmPort: Int, controlPort: Int)
        let demoAccount: FCMDemoServiceAccount
        do {
            fcmPorts = try await fcmEmulator.start()
            demoAccount = try fcmEmulator.demoServiceAccount()
        } catch {
            try? await emulator.shutdown()
            try? await fcmEmulator.shutdown()
            throw error
        }
        let fcmCredentials = FCMCredentials(
            serviceAccountJSON: demoAccount.json, baseURL: fcmEmulator.baseURL, caCertificatePEM: fcmEmulator.caCertificatePEM
        )
        logger.notice(
            "Built-in FCM emulator running: apps without FCM credentials push to it, not to Google",
            metadata: [
                "fcm": "\(fcmEmulator.baseURL ?? "")", "phones": "http://127.0.0.1:\(fcmPorts.controlPort)/devices",
                "project": "\(demoAccount.projectID)",
            ]
        )
        return BuiltInEmulators(
            apnsFallback: { _, bundleID in
                emulator.registerBundleID(bundleID)
                return APNsCredentials(
                    teamID: teamID, keyID: keyID, privateKeyPEM: keyPEM, environment: .sandbox, baseURL: baseURL, caCertificatePEM: caPEM,
                    channelManagementBaseURL: channelsURL
                )
            },
            fcmFallback: { _ in fcmCredentials },
            services: [emulator, fcmEmulator]
        )
    }
}

extension BuiltInEmulators {
    /// Whether and where the simulated phones register, and why not when they do not.
    enum Registration: Equatable {
        case target(LivelineRegistrationTarget)
        case off(String)

        var resolved: LivelineRegistrationTarget? {
            if case .target(let target) = self { return target }
            return nil
        }
    }

    /// The demo app's publishable key, kept once `serve --dev` created it: a publishable key ships in every app, so
    /// keeping it in the data directory gives nothing away, and a restarted server's phones still register.
    static let savedKeyFileName = "register-with.json"

    /// Where the simulated phones register: `emulatorRegisterWith` (`none` turns it off), by default this server's
    /// own URL in dev mode; with `emulatorPublishableKey`, else the demo app's key (just created, or kept from the
    /// start that created it).
    static func registrationTarget(_ configuration: LivelineConfiguration, createdDemoKey: String?, directory: String) -> Registration {
        let keyFile = (directory as NSString).appendingPathComponent(savedKeyFileName)
        if let createdDemoKey {
            let saved: JSONValue = ["publishableKey": .string(createdDemoKey)]
            try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try? Data(saved.encoded).write(to: URL(fileURLWithPath: keyFile), options: .atomic)
        }
        let url: String
        switch configuration.emulatorRegisterWith {
        case "none": return .off("--emulator-register-with none")
        case .some(let given): url = given
        case .none:
            guard configuration.dev else { return .off("not in dev mode and no --emulator-register-with") }
            let host = ["0.0.0.0", "::", ""].contains(configuration.host) ? "127.0.0.1" : configuration.host
            url = "http://\(host.contains(":") ? "[\(host)]" : host):\(configuration.port)"
        }
        let savedKey = (try? Data(contentsOf: URL(fileURLWithPath: keyFile)))
            .flatMap { try? JSONValue(parsing: Array($0)) }?.objectValue?["publishableKey"]?.stringValue
        guard let key = configuration.emulatorPublishableKey ?? createdDemoKey ?? savedKey else {
            return .off("no publishable key (pass --emulator-publishable-key pk_…)")
        }
        return .target(LivelineRegistrationTarget(url: url, publishableKey: key))
    }
}
