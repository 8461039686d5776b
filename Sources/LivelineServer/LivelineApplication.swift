import Foundation
import Hummingbird
import HummingbirdCore
import LivelineCore
import LivelineStore
import Logging
import LivelineDispatch
import NIOCore
import NIOPosix
import ServiceLifecycle

/// Builds and runs the Liveline HTTP server.
public enum LivelineApplication {
    /// The router with every route: health, OpenAPI, `/v1` and `/admin/v1`.
    ///
    /// - Parameters:
    ///   - sealer: seals provider secrets at rest; a throwaway key when not given (tests).
    ///   - delivery: woken after an update, end or registration is committed (the delivery engine).
    ///   - metrics: what `GET /metrics` serves and where the HTTP API's metrics are made; `nil` turns `/metrics` off
    ///     (404). By default a registry of this router's own.
    ///   - appDeleted: told of each app the admin API deletes, once it is gone (to close its push connections).
    ///   - keys: the cache the API's keys are verified through; one of the router's own when `nil`. `serve` passes its
    ///     own, to forget the keys that other nodes revoke (``APIKeyCache/forget(appID:)``).
    public static func makeRouter(
        store: any Store, clock: WallClock = .system, adminToken: String?, sealer: CredentialSealer? = nil,
        staleness: StalenessPolicy = StalenessPolicy(), budget: PriorityBudget = PriorityBudget(),
        delivery: any DeliveryWaking = NoDeliveryEngine(), startConfirmationTimeout: TimeInterval = 120,
        channels: (any BroadcastChannelManagement)? = nil, broadcast: BroadcastSettings = BroadcastSettings(),
        webhookURLs: WebhookURLPolicy = WebhookURLPolicy(allowsPrivateNetworks: false), webhookDeliverer: (any DeliveryWaking)? = nil,
        metrics: LivelineMetrics? = LivelineMetrics(), appDeleted: @escaping @Sendable (String) async -> Void = { _ in },
        keys: APIKeyCache? = nil
    ) -> Router<BasicRequestContext> {
        let sealer = sealer ?? (try! CredentialSealer(masterKey: CredentialSealer.newMasterKey()))
        let keys = keys ?? APIKeyCache(store: store)
        let administration = AppAdministration(
            store: store, clock: clock, sealer: sealer, channels: channels, keysRevoked: { keys.forget(appID: $0) }, appDeleted: appDeleted
        )
        let router = Router(context: BasicRequestContext.self)
        // First, so that they wrap every route and the not-found responder (middleware wraps only what is added after it).
        router.add(middleware: RequestIDMiddleware())
        if let metrics { router.add(middleware: HTTPMetricsMiddleware(metrics: HTTPRequestMetrics(factory: metrics.factory))) }
        router.add(middleware: ErrorMiddleware())
        HealthRoutes(store: store).add(to: router)
        if let metrics { MetricsRoutes(metrics: metrics, store: store).add(to: router) }
        let lifecycle = ActivityLifecycle(
            store: store, clock: clock, staleness: staleness, delivery: delivery, channels: channels, broadcast: broadcast
        )
        LifecycleRoutes(
            store: store, authenticator: Authenticator(keys: keys), clock: clock, lifecycle: lifecycle, budget: budget,
            startConfirmationTimeout: startConfirmationTimeout
        ).add(to: router)
        StartRoutes(store: store, authenticator: Authenticator(keys: keys), clock: clock, lifecycle: lifecycle).add(to: router)
        SchemaRoutes(store: store, authenticator: Authenticator(keys: keys), clock: clock).add(to: router)
        DeviceRoutes(store: store, authenticator: Authenticator(keys: keys), clock: clock).add(to: router)
        EventRoutes(store: store, authenticator: Authenticator(keys: keys)).add(to: router)
        WebhookRoutes(
            store: store, authenticator: Authenticator(keys: keys), sealer: sealer, clock: clock, urls: webhookURLs, deliverer: webhookDeliverer
        ).add(to: router)
        AdminRoutes(administration: administration, adminToken: adminToken).add(to: router)
        // Last, so that it wraps only the not-found responder: a known path with another method is 405.
        router.add(middleware: MethodNotAllowedMiddleware(routes: router.routes))
        return router
    }

    /// The application, ready to run as a Service.
    ///
    /// `metrics` is what `GET /metrics` serves (off when ``LivelineConfiguration/metricsEnabled`` is false);
    /// `appDeleted` and `keys` are passed to ``makeRouter(store:clock:adminToken:sealer:staleness:budget:delivery:startConfirmationTimeout:channels:broadcast:webhookURLs:webhookDeliverer:metrics:appDeleted:keys:)``.
    ///
    /// Its HTTP/1.1 server keeps each connection to ``LivelineConfiguration/connections``: deadlines for a request's
    /// header block and body and for keep-alive idleness, and a cap on open connections.
    public static func makeApplication(
        configuration: LivelineConfiguration, store: any Store, clock: WallClock = .system, logger: Logger,
        sealer: CredentialSealer? = nil, delivery: any DeliveryWaking = NoDeliveryEngine(),
        channels: (any BroadcastChannelManagement)? = nil, webhookDeliverer: (any DeliveryWaking)? = nil, services: [any Service] = [],
        metrics: LivelineMetrics = LivelineMetrics(), appDeleted: @escaping @Sendable (String) async -> Void = { _ in },
        keys: APIKeyCache? = nil, onServerRunning: @escaping @Sendable (any Channel) async -> Void = { _ in }
    ) -> some ApplicationProtocol {
        Application(
            router: HeadServingRouter(makeRouter(
                store: store, clock: clock, adminToken: configuration.adminToken, sealer: sealer, staleness: configuration.staleness,
                budget: configuration.budget, delivery: delivery, startConfirmationTimeout: configuration.startConfirmationTimeout,
                channels: channels, broadcast: configuration.broadcast,
                webhookURLs: WebhookURLPolicy(allowsPrivateNetworks: configuration.webhooks.allowsPrivateNetworks),
                webhookDeliverer: webhookDeliverer, metrics: configuration.metricsEnabled ? metrics : nil, appDeleted: appDeleted,
                keys: keys
            )),
            server: .guardedHTTP1(limits: configuration.connections, logger: logger),
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: "Liveline",
                // Beyond the cap the server stops accepting; waiting connections stay in the kernel's backlog.
                availableConnectionsDelegate: MaximumAvailableConnections(configuration.connections.maximumConnections, logger: logger)
            ),
            services: services,
            onServerRunning: onServerRunning,
            eventLoopGroupProvider: .shared(apiEventLoops),
            logger: logger
        )
    }

    /// The HTTP API's own event loops, apart from the push clients' (the shared singleton group): during a fan-out
    /// those loops are busy with TLS and HTTP/2 for the pushes, and a request to the API would wait in line behind
    /// that work; on threads of its own the system shares the cores between the two. Their threads are named
    /// ``httpThreadNamePrefix``.
    static let apiEventLoops = MultiThreadedEventLoopGroup._makePerpetualGroup(
        threadNamePrefix: httpThreadNamePrefix, numberOfThreads: System.coreCount
    )

    /// The prefix of the names of the HTTP API's event loops' threads (`ll-http-2-#0`: NIO adds the group's number and
    /// the thread's), as Linux shows them (`top -H`, `/proc/PID/task/*/comm`).
    public static let httpThreadNamePrefix = "ll-http-"

    /// The master key that seals provider secrets: from configuration, or generated once into the data directory.
    public static func masterKey(_ configuration: LivelineConfiguration) throws -> [UInt8] {
        if let configured = configuration.masterKey { return try CredentialSealer.masterKey(base64: configured) }
        // Nodes that share a database must share the key that seals its credentials: one node's own file would leave
        // the others unable to read what it sealed.
        if case .postgres = try configuration.databaseLocation {
            throw ConfigurationError(
                "With a PostgreSQL database every node needs the same master key: set LIVELINE_MASTER_KEY (or liveline.masterKey) to Base64 of 32 random bytes, e.g. $(openssl rand -base64 32)."
            )
        }
        try FileManager.default.createDirectory(atPath: configuration.dataDirectory, withIntermediateDirectories: true)
        return try CredentialSealer.loadOrCreateMasterKey(at: (configuration.dataDirectory as NSString).appendingPathComponent("master.key"))
    }

    /// The sealer of the configured master key (``masterKey(_:)``), once ``checkMasterKey(store:sealer:)`` has found it
    /// to be the key of `store`'s secrets: what `serve` and every one-shot command seal and open with.
    public static func sealer(_ configuration: LivelineConfiguration, checkedAgainst store: any Store) async throws -> CredentialSealer {
        let sealer = try CredentialSealer(masterKey: try masterKey(configuration))
        try await checkMasterKey(store: store, sealer: sealer)
        return sealer
    }

    /// Makes sure `sealer`'s master key is the one the database's secrets were sealed with, before anything is sealed
    /// or opened with it: a server (or a one-shot command) given another key (a `LIVELINE_MASTER_KEY` the command's
    /// shell lacked, a new `master.key`) sealed credentials the others could not open, and the server then failed each
    /// push with an error a second. The database keeps a check value (``CredentialSealer/sealCheck()``), made by the
    /// first key to come; a database from before it first has its apps' stored credentials opened with the key.
    public static func checkMasterKey(store: any Store, sealer: CredentialSealer) async throws {
        let mismatch = ConfigurationError(
            "The master key is not the one this database's secrets were sealed with. Give the same key as before: LIVELINE_MASTER_KEY (or liveline.masterKey) as the server has it, or the data directory's master.key."
        )
        if let existing = try await store.storedMasterKeyCheck() {
            guard sealer.opensCheck(existing) else { throw mismatch }
            return
        }
        // No check value yet: what the database already sealed must open with this key before the key's check is kept.
        for app in try await store.apps() {
            for provider in CredentialProvider.allCases {
                guard let stored = try await store.credentials(appID: app.id, provider: provider) else { continue }
                guard (try? sealer.open(stored.sealedSecret, appID: app.id, provider: provider)) != nil else { throw mismatch }
            }
        }
        // Another node may have stored its check first: then that one decides.
        guard sealer.opensCheck(try await store.masterKeyCheck(proposing: try sealer.sealCheck())) else { throw mismatch }
    }

    /// Opens the configured store, creating the data directory if needed. On PostgreSQL, with `waitingForDatabase`,
    /// a database that cannot be reached yet is tried again for up to ``LivelineConfiguration/databaseStartupWait``
    /// (``waitingForDatabase(_:logger:clock:open:)``); the one-shot commands do not wait.
    public static func openStore(
        _ configuration: LivelineConfiguration, waitingForDatabase: Bool = false, logger: Logger
    ) async throws -> SQLStore {
        // A setting that cannot be used fails before anything is made on disk.
        let location = try configuration.databaseLocation
        try FileManager.default.createDirectory(atPath: configuration.dataDirectory, withIntermediateDirectories: true)
        switch location {
        case .sqlite(let path):
            let directory = (path as NSString).deletingLastPathComponent
            if !directory.isEmpty {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            }
            return try await SQLStore.open(path: path, readers: configuration.databaseReaders, logger: logger)
        case .postgres(let url):
            let wait = DatabaseStartupWait(limit: waitingForDatabase ? configuration.databaseStartupWait : .zero)
            return try await Self.waitingForDatabase(wait, logger: logger, clock: ContinuousClock()) {
                try await SQLStore.open(
                    postgres: url, writers: configuration.databaseWriters, readers: configuration.databaseReaders, logger: logger
                )
            }
        }
    }

    /// Runs `open` until it succeeds, or fails in a way waiting cannot mend, or `wait`'s limit has passed: each failure
    /// that may pass by itself (``PostgresFailure/isConnectionLost``: nothing listening, a server starting up) is
    /// logged and followed by the pause ``DatabaseStartupWait`` decides. Any other error ends it at once.
    static func waitingForDatabase<Opened, WaitingClock: Clock<Duration>>(
        _ wait: DatabaseStartupWait, logger: Logger, clock: WaitingClock, open: () async throws -> Opened
    ) async throws -> Opened {
        let start = clock.now
        var attempt = 0
        while true {
            attempt += 1
            do {
                let opened = try await open()
                if attempt > 1 { logger.notice("The database answered", metadata: ["attempts": "\(attempt)"]) }
                return opened
            } catch let failure as PostgresFailure {
                let elapsed = start.duration(to: clock.now)
                switch wait.decision(afterAttempt: attempt, elapsed: elapsed, mayPass: failure.isConnectionLost) {
                case .giveUp:
                    throw failure
                case .tryAgain(let pause):
                    logger.warning(
                        "The database cannot be reached yet; trying again",
                        metadata: [
                            "error": "\(failure)", "attempt": "\(attempt)", "retryIn": "\(pause)",
                            "waitingUpTo": "\(wait.limit)",
                        ]
                    )
                    try await clock.sleep(for: pause, tolerance: nil)
                }
            }
        }
    }

    /// In dev mode, creates a demo app when the database has none and prints its keys (once: only
    /// their hashes are stored).
    ///
    /// - Returns: the demo app with its keys when this call created it (the keys exist only now), else `nil`.
    @discardableResult
    public static func prepareDevApp(store: any Store, sealer: CredentialSealer, logger: Logger) async throws -> AppAdministration.AppWithKeys? {
        let existing = try await store.apps()
        if let app = existing.first {
            logger.notice("Dev mode: using existing app \(app.id) (\(app.name)); its keys were printed when it was created. Issue new ones with: liveline keys rotate --app \(app.id)")
            return nil
        }
        let created = try await AppAdministration(store: store, sealer: sealer).createApp(
            name: "Demo", bundleID: "com.example.liveline.demo", androidPackage: "com.example.liveline.demo"
        )
        let banner = """

            Liveline dev mode: created the demo app \(created.app.id) (bundle id \(created.app.bundleID)).
            Its keys are shown this once:
              export LIVELINE_APP_ID=\(created.app.id)
              export LIVELINE_SECRET_KEY=\(created.secretKey)
              export LIVELINE_PUBLISHABLE_KEY=\(created.publishableKey)

            """
        // Unbuffered, so the keys show at once even when stdout is a pipe.
        FileHandle.standardOutput.write(Data(banner.utf8))
        return created
    }
}

extension LivelineApplication {
    /// The OpenAPI 3.1 document of the HTTP API, as served at `/openapi.json`.
    public static var openAPIDocument: String { OpenAPIDocument.json }
}

