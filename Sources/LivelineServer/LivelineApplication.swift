import Foundation
import Hummingbird
import LivelineCore
import LivelineStore
import Logging
import NIOCore

/// Builds and runs the Liveline HTTP server.
public enum LivelineApplication {
    /// The router with every route: health, OpenAPI, `/v1` and `/admin/v1`.
    public static func makeRouter(store: any Store, clock: WallClock = .system, adminToken: String?) -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: ErrorMiddleware())
        HealthRoutes(store: store).add(to: router)
        LifecycleRoutes(store: store, authenticator: Authenticator(store: store), clock: clock).add(to: router)
        AdminRoutes(administration: AppAdministration(store: store, clock: clock), adminToken: adminToken).add(to: router)
        return router
    }

    /// The application, ready to run as a Service.
    public static func makeApplication(
        configuration: LivelineConfiguration, store: any Store, clock: WallClock = .system, logger: Logger,
        onServerRunning: @escaping @Sendable (any Channel) async -> Void = { _ in }
    ) -> some ApplicationProtocol {
        Application(
            router: makeRouter(store: store, clock: clock, adminToken: configuration.adminToken),
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: "Liveline"
            ),
            onServerRunning: onServerRunning,
            logger: logger
        )
    }

    /// Opens the configured store, creating the data directory if needed.
    public static func openStore(_ configuration: LivelineConfiguration, logger: Logger) async throws -> SQLiteStore {
        let path = try configuration.databasePath
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }
        try FileManager.default.createDirectory(atPath: configuration.dataDirectory, withIntermediateDirectories: true)
        return try await SQLiteStore.open(path: path, logger: logger)
    }

    /// `liveline serve`: opens the store (running migrations), prepares the dev demo app if asked,
    /// and serves until SIGINT or SIGTERM, then shuts down gracefully.
    public static func serve(_ configuration: LivelineConfiguration, logger: Logger) async throws {
        let store = try await openStore(configuration, logger: logger)
        logger.info("Database ready", metadata: ["path": "\(store.path)"])
        do {
            if configuration.dev { try await prepareDevApp(store: store, logger: logger) }
            let app = makeApplication(configuration: configuration, store: store, logger: logger)
            try await app.runService()
        } catch {
            try? await store.close()
            throw error
        }
        try await store.close()
    }

    /// In dev mode, creates a demo app when the database has none and prints its keys (once: only
    /// their hashes are stored).
    static func prepareDevApp(store: any Store, logger: Logger) async throws {
        let existing = try await store.apps()
        if let app = existing.first {
            logger.notice("Dev mode: using existing app \(app.id) (\(app.name)); its keys were printed when it was created. Issue new ones with: liveline keys rotate --app \(app.id)")
            return
        }
        let created = try await AppAdministration(store: store).createApp(
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
    }
}

extension LivelineApplication {
    /// The OpenAPI 3.1 document of the HTTP API, as served at `/openapi.json`.
    public static var openAPIDocument: String { OpenAPIDocument.json }
}
