import Crypto
import Foundation
import Hummingbird
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
func buildApplication(_ configuration: LivelineConfiguration, logger: Logger) async throws -> some ApplicationProtocol {
    let store = try await LivelineApplication.openStore(configuration, logger: logger)
    logger.info("Database ready", metadata: ["path": "\(store.path)"])
    do {
        let sealer = try CredentialSealer(masterKey: try LivelineApplication.masterKey(configuration))
        if configuration.dev { try await LivelineApplication.prepareDevApp(store: store, sealer: sealer, logger: logger) }
        let emulators = configuration.emulator ? try await BuiltInEmulators.start(configuration, logger: logger) : nil
        let apns = APNsTransportDirectory(store: store, sealer: sealer, fallback: emulators?.apnsFallback, logger: logger)
        let fcm = FCMTransportDirectory(store: store, sealer: sealer, fallback: emulators?.fcmFallback, logger: logger)
        var dispatch = DispatcherConfiguration()
        dispatch.budget = configuration.budget
        dispatch.fcmRetryFloor = .seconds(configuration.fcmRetryFloor)
        let dispatcher = Dispatcher(
            store: store, transports: PlatformTransports(ios: apns, android: fcm), configuration: dispatch, logger: logger
        )
        let sweeper = LifetimeSweeper(store: store, policy: configuration.lifetime, logger: logger, delivery: dispatcher)
        let closing = ClosingService {
            await apns.shutdown()
            await fcm.shutdown()
            try await store.close()
        }
        return LivelineApplication.makeApplication(
            configuration: configuration, store: store, logger: logger, sealer: sealer, delivery: dispatcher,
            services: [closing] + (emulators?.services ?? []) + [dispatcher, sweeper]
        )
    } catch {
        try? await store.close()
        throw error
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

    static func start(_ configuration: LivelineConfiguration, logger: Logger) async throws -> BuiltInEmulators {
        var emulatorConfiguration = APNsEmulatorConfiguration(
            dataDirectory: (configuration.dataDirectory as NSString).appendingPathComponent("emulator")
        )
        emulatorConfiguration.host = "127.0.0.1"
        emulatorConfiguration.apnsPort = configuration.emulatorPort
        emulatorConfiguration.controlPort = configuration.emulatorControlPort
        let emulator = try APNsEmulator(configuration: emulatorConfiguration, logger: logger)
        let ports = try await emulator.start()
        let key = P256.Signing.PrivateKey()
        let teamID = "EMULATED01", keyID = "EMULATED01"
        emulator.registerSigningKey(teamID: teamID, keyID: keyID, publicKey: key.publicKey)
        let baseURL = "https://127.0.0.1:\(ports.apnsPort)"
        let caPEM = emulator.caCertificatePEM
        let keyPEM = key.pemRepresentation
        logger.notice(
            "Built-in APNs emulator running: apps without APNs credentials push to it, not to Apple",
            metadata: ["apns": "\(baseURL)", "phones": "http://127.0.0.1:\(ports.controlPort)/devices", "ca": "\(emulator.caCertificatePath)"]
        )
        var fcmConfiguration = FCMEmulatorConfiguration(dataDirectory: emulatorConfiguration.dataDirectory)
        fcmConfiguration.host = "127.0.0.1"
        fcmConfiguration.fcmPort = configuration.fcmEmulatorPort
        fcmConfiguration.controlPort = configuration.fcmEmulatorControlPort
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
                    teamID: teamID, keyID: keyID, privateKeyPEM: keyPEM, environment: .sandbox, baseURL: baseURL, caCertificatePEM: caPEM
                )
            },
            fcmFallback: { _ in fcmCredentials },
            services: [emulator, fcmEmulator]
        )
    }
}
