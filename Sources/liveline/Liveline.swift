import ArgumentParser
import Configuration
import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineServer
import LivelineStore
import Logging
import Metrics

@main
struct Liveline: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "liveline",
        abstract: "Liveline: keeps iOS Live Activities and Android live updates current from your backend.",
        version: livelineVersion,
        subcommands: [Serve.self, Apps.self, Keys.self, Push.self, EmulatorCommand.self, WebhooksCommand.self, Bench.self, ConfigKeys.self, OpenAPI.self]
    )

    /// Parses and runs the command, as ArgumentParser's own `main` does, but an error the command throws while it runs
    /// (no such app, a database it cannot open) is reported as `Error: …` alone: the usage printed with a mistyped
    /// command line would be the top-level one, and says nothing of what went wrong. The exit status is
    /// ArgumentParser's (64 for a value refused, 1 for a failure).
    static func main() async {
        let command: any ParsableCommand
        do {
            command = try await asyncParseAsRoot()
        } catch {
            exit(withError: error)
        }
        do {
            if var asynchronous = command as? any AsyncParsableCommand {
                try await asynchronous.run()
            } else {
                var synchronous = command
                try synchronous.run()
            }
        } catch {
            // Help (`liveline apps`, `help apps`, `--help`) is "thrown" too, with success: ArgumentParser prints it.
            if exitCode(for: error) == .success { exit(withError: error) }
            let message = message(for: error)
            if !message.isEmpty { FileHandle.standardError.write(Data("Error: \(message)\n".utf8)) }
            Foundation.exit(exitCode(for: error).rawValue)
        }
    }
}

/// Options shared by every command that opens the database.
struct StorageOptions: ParsableArguments {
    @Option(name: .customLong("data-dir"), help: "Directory for Liveline's files (env LIVELINE_DATA_DIRECTORY; default ./.liveline).")
    var dataDirectory: String?

    @Option(
        name: [.customLong("database"), .customLong("database-url")],
        help: "Where the data is: a SQLite file (a path or sqlite:PATH), or a PostgreSQL URL postgres://user@host:5432/db that several nodes may share (env LIVELINE_DATABASE; default <data dir>/liveline.sqlite)."
    )
    var database: String?

    @Option(name: .customLong("config"), help: "A JSON configuration file with a top-level \"liveline\" object.")
    var configFile: String?

    var flagValues: [String: ConfigValue] {
        var values: [String: ConfigValue] = [:]
        if let dataDirectory { values["liveline.dataDirectory"] = ConfigValue(.string(dataDirectory), isSecret: false) }
        if let database { values["liveline.database"] = ConfigValue(.string(database), isSecret: true) }
        return values
    }

    func resolve(extra: [String: ConfigValue] = [:]) async throws -> LivelineConfiguration {
        let reader = try await LivelineConfiguration.reader(flags: flagValues.merging(extra) { _, new in new }, file: configFile)
        return try LivelineConfiguration(reader: reader)
    }
}

/// Bootstraps the process's logging (`format`: text lines or one JSON object per line) and returns the command's logger.
func makeLogger(level: Logger.Level, format: LogFormat = .text) -> Logger {
    LoggingSystem.bootstrap(format.handlerFactory(level: level))
    var logger = Logger(label: "liveline")
    logger.logLevel = level
    return logger
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the Liveline server (HTTP API on 127.0.0.1:8080 by default).")

    @OptionGroup var storage: StorageOptions

    @Option(help: "Address to listen on (env LIVELINE_HOST; default 127.0.0.1).")
    var host: String?

    @Option(help: "Port to listen on (env LIVELINE_PORT; default 8080).")
    var port: Int?

    @Option(name: .customLong("admin-token-file"), help: "File holding the admin API token (env LIVELINE_ADMIN_TOKEN).")
    var adminTokenFile: String?

    @Flag(help: "Development mode: create a demo app on first start and print its keys, and run the APNs and FCM emulators (env LIVELINE_DEV).")
    var dev = false

    @Flag(inversion: .prefixedNo, help: "Run the built-in APNs and FCM emulators for apps without credentials (env LIVELINE_EMULATOR; default: on with --dev).")
    var emulator: Bool?

    @Option(name: .customLong("emulator-port"), help: "The built-in APNs emulator's port (env LIVELINE_EMULATOR_PORT; default 8443).")
    var emulatorPort: Int?

    @Option(name: .customLong("emulator-control-port"), help: "The built-in APNs emulator's control API port (env LIVELINE_EMULATOR_CONTROL_PORT; default 8091).")
    var emulatorControlPort: Int?

    @Option(name: .customLong("emulator-channels-port"), help: "The built-in APNs emulator's channel management port, for iOS 18 broadcast channels (env LIVELINE_EMULATOR_CHANNELS_PORT; default 8445).")
    var emulatorChannelsPort: Int?

    @Option(name: .customLong("fcm-emulator-port"), help: "The built-in FCM emulator's port (env LIVELINE_FCM_EMULATOR_PORT; default 8444).")
    var fcmEmulatorPort: Int?

    @Option(name: .customLong("fcm-emulator-control-port"), help: "The built-in FCM emulator's control API port (env LIVELINE_FCM_EMULATOR_CONTROL_PORT; default 8092).")
    var fcmEmulatorControlPort: Int?

    @Option(name: .customLong("emulator-register-with"), help: "Liveline base URL the emulators' simulated phones register with, or 'none' (env LIVELINE_EMULATOR_REGISTER_WITH; default: this server with --dev).")
    var emulatorRegisterWith: String?

    @Option(name: .customLong("emulator-publishable-key"), help: "The publishable key the simulated phones register with (env LIVELINE_EMULATOR_PUBLISHABLE_KEY; default: the demo app's with --dev).")
    var emulatorPublishableKey: String?

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical (env LIVELINE_LOG_LEVEL).")
    var logLevel: String?

    @Option(name: .customLong("log-format"), help: "text, or json for one JSON object per line (env LIVELINE_LOG_FORMAT; default text).")
    var logFormat: String?

    func run() async throws {
        var extra: [String: ConfigValue] = [:]
        for (key, value) in [
            ("emulatorPort", emulatorPort), ("emulatorControlPort", emulatorControlPort), ("fcmEmulatorPort", fcmEmulatorPort),
            ("fcmEmulatorControlPort", fcmEmulatorControlPort), ("emulatorChannelsPort", emulatorChannelsPort),
        ] {
            if let value { extra["liveline.\(key)"] = ConfigValue(.int(value), isSecret: false) }
        }
        if let emulatorRegisterWith {
            extra["liveline.emulatorRegisterWith"] = ConfigValue(.string(emulatorRegisterWith), isSecret: false)
        }
        if let emulatorPublishableKey {
            extra["liveline.emulatorPublishableKey"] = ConfigValue(.string(emulatorPublishableKey), isSecret: false)
        }
        if let host { extra["liveline.host"] = ConfigValue(.string(host), isSecret: false) }
        if let port { extra["liveline.port"] = ConfigValue(.int(port), isSecret: false) }
        if dev { extra["liveline.dev"] = ConfigValue(.bool(true), isSecret: false) }
        if let emulator { extra["liveline.emulator"] = ConfigValue(.bool(emulator), isSecret: false) }
        if let logLevel { extra["liveline.logLevel"] = ConfigValue(.string(logLevel), isSecret: false) }
        if let logFormat { extra["liveline.logFormat"] = ConfigValue(.string(logFormat), isSecret: false) }
        if let adminTokenFile {
            let token = try readFile(adminTokenFile, option: "--admin-token-file").trimmingCharacters(in: .whitespacesAndNewlines)
            extra["liveline.adminToken"] = ConfigValue(.string(token), isSecret: true)
        }
        let configuration: LivelineConfiguration
        do {
            configuration = try await storage.resolve(extra: extra)
        } catch let error as ConfigurationError {
            throw ValidationError(error.description)
        }
        let logger = makeLogger(level: configuration.logLevel, format: configuration.logFormat)
        do {
            try ListeningPorts.checkFree(configuration)
            // Before anything records a metric: the engine's, the Store's and the API's are all made from this factory.
            var metrics = LivelineMetrics()
            metrics.storeCountInterval = configuration.metricsCountInterval
            if configuration.metricsEnabled {
                MetricsSystem.bootstrap(LivelineMetrics.prometheusFactory(registry: metrics.registry))
            }
            try await buildApplication(configuration, logger: logger, metrics: metrics).runService()
        } catch {
            // What ends the server is said as its log says everything else: one JSON object with --log-format json.
            guard configuration.logFormat == .json else { throw error }
            logger.critical("Liveline stopped on an error", metadata: ["error": "\(error)"])
            throw ExitCode.failure
        }
    }
}

/// Liveline's version, as `liveline --version` and the OpenAPI document give it.
let livelineVersion = "0.1.0"

/// The text of the file an option names, or an error that names the option, the path and why it cannot be read
/// (rather than Foundation's own description of the failure).
func readFile(_ path: String, option: String) throws -> String {
    do {
        return try String(contentsOfFile: path, encoding: .utf8)
    } catch let error as CocoaError {
        let reason: String
        switch error.code {
        case .fileReadNoSuchFile: reason = "no such file"
        case .fileReadNoPermission: reason = "permission denied"
        case .fileReadInapplicableStringEncoding: reason = "not UTF-8 text"
        default: reason = (error.userInfo[NSUnderlyingErrorKey] as? NSError)?.localizedDescription ?? "cannot be read"
        }
        throw ArgumentParser.ValidationError("\(option) \(path): \(reason).")
    }
}

/// Opens the store for a one-shot command and closes it afterwards; with `channels`, the administration reaches APNs'
/// channel management with the apps' stored credentials (to delete an app's broadcast channels).
///
/// Only `creatingDatabase` (creating an app) makes a SQLite database that is not there yet: any other command given a
/// mistyped `--data-dir` says so, instead of leaving a new directory with an empty database and a master key behind.
func withAdministration<T: Sendable>(
    _ storage: StorageOptions, channels: Bool = false, creatingDatabase: Bool = false, _ body: (AppAdministration) async throws -> T
) async throws -> T {
    let configuration = try await storage.resolve()
    if !creatingDatabase, case .sqlite(let path) = try configuration.databaseLocation, !FileManager.default.fileExists(atPath: path) {
        throw ArgumentParser.ValidationError(
            "No Liveline database at \(path): check --data-dir (or --database), or create the first app with liveline apps create."
        )
    }
    var logger = Logger(label: "liveline")
    logger.logLevel = .warning
    let store = try await LivelineApplication.openStore(configuration, logger: logger)
    var directory: APNsTransportDirectory?
    do {
        let sealer = try await LivelineApplication.sealer(configuration, checkedAgainst: store)
        directory = channels ? APNsTransportDirectory(store: store, sealer: sealer, logger: logger) : nil
        let result = try await body(AppAdministration(store: store, sealer: sealer, channels: directory))
        await directory?.shutdown()
        try await store.close()
        return result
    } catch {
        await directory?.shutdown()
        try? await store.close()
        throw error
    }
}

enum OutputFormat: String, ExpressibleByArgument, CaseIterable {
    case text
    case json
    case env
}

func printKeys(_ created: AppAdministration.AppWithKeys, format: OutputFormat, heading: String) {
    switch format {
    case .text:
        print("""
            \(heading)
              app id:          \(created.app.id)
              name:            \(created.app.name)
              bundle id:       \(created.app.bundleID)
              android package: \(created.app.androidPackage ?? "-")
              secret key:      \(created.secretKey)
              publishable key: \(created.publishableKey)

            The keys are shown this once; Liveline keeps only their hashes.
            """)
    case .json:
        let value: JSONValue = [
            "appId": .string(created.app.id), "name": .string(created.app.name), "bundleId": .string(created.app.bundleID),
            "androidPackage": created.app.androidPackage.map(JSONValue.string) ?? .null,
            "secretKey": .string(created.secretKey), "publishableKey": .string(created.publishableKey),
        ]
        print(value.encodedString)
    case .env:
        print("""
            export LIVELINE_APP_ID=\(created.app.id)
            export LIVELINE_SECRET_KEY=\(created.secretKey)
            export LIVELINE_PUBLISHABLE_KEY=\(created.publishableKey)
            """)
    }
}

func describe(_ error: any Error) -> any Error {
    switch error {
    case let error as LivelineCore.ValidationError: return ArgumentParser.ValidationError(error.message)
    case StoreError.appNotFound: return ArgumentParser.ValidationError("No such app.")
    default: return error
    }
}

struct Apps: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create, list and delete apps, and set their push credentials and device rules.",
        subcommands: [Create.self, List.self, Delete.self, SetAPNs.self, SetFCM.self, SetDevices.self]
    )

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create an app and print its secret and publishable keys once.")

        @OptionGroup var storage: StorageOptions
        @Option(help: "A name for the app.") var name: String
        @Option(name: .customLong("bundle-id"), help: "The iOS bundle id, e.g. com.example.app.") var bundleID: String
        @Option(name: .customLong("android-package"), help: "The Android application id, if the app ships on Android.")
        var androidPackage: String?
        @Option(help: "text, json, or env (shell exports).") var format: OutputFormat = .text

        func run() async throws {
            do {
                let created = try await withAdministration(storage, creatingDatabase: true) {
                    try await $0.createApp(name: name, bundleID: bundleID, androidPackage: androidPackage)
                }
                printKeys(created, format: format, heading: "Created app \(created.app.id).")
            } catch {
                throw describe(error)
            }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List apps (never their keys).")

        @OptionGroup var storage: StorageOptions
        @Option(help: "text or json.") var format: OutputFormat = .text

        func validate() throws {
            guard format != .env else { throw ArgumentParser.ValidationError("apps list prints text or json; env is for the keys of apps create and keys rotate.") }
        }

        func run() async throws {
            let apps = try await withAdministration(storage) { try await $0.listApps() }
            if format == .json {
                let values: [JSONValue] = apps.map {
                    ["id": .string($0.id), "name": .string($0.name), "bundleId": .string($0.bundleID),
                     "androidPackage": $0.androidPackage.map(JSONValue.string) ?? .null,
                     "createdAt": .string(APIDate.iso8601($0.createdAt))]
                }
                print(JSONValue.array(values).encodedString)
                return
            }
            if apps.isEmpty {
                print("No apps yet. Create one with: liveline apps create --name NAME --bundle-id com.example.app")
                return
            }
            for app in apps {
                print("\(app.id)  \(app.name)  \(app.bundleID)  \(app.androidPackage ?? "-")  \(APIDate.iso8601(app.createdAt))")
            }
        }
    }
}

extension Apps {
    struct SetAPNs: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "set-apns",
            abstract: "Set an app's APNs token-auth credentials. The .p8 key is sealed at rest and never shown again."
        )

        @OptionGroup var storage: StorageOptions
        @Option(help: "The app id (app_…).") var app: String
        @Option(name: .customLong("team-id"), help: "Apple team id (10 characters).") var teamID: String
        @Option(name: .customLong("key-id"), help: "The key id of the .p8 (10 characters).") var keyID: String
        @Option(name: .customLong("key-file"), help: "Path to AuthKey_<KEYID>.p8.") var keyFile: String
        @Option(help: "sandbox or production.") var environment: String
        @Option(name: .customLong("base-url"), help: "Send to this https URL instead of Apple's host (e.g. the local emulator).")
        var baseURL: String?
        @Option(
            name: .customLong("channel-management-base-url"),
            help: "Manage iOS 18 broadcast channels at this https URL instead of Apple's api-manage-broadcast host."
        )
        var channelManagementBaseURL: String?
        @Option(
            name: .customLong("broadcast-base-url"),
            help: "Publish iOS 18 broadcasts to this https URL instead of the push host (--base-url, or Apple's)."
        )
        var broadcastBaseURL: String?
        @Option(name: .customLong("ca-file"), help: "A PEM CA certificate to trust for the URLs above.") var caFile: String?

        func run() async throws {
            guard let environment = APNsEnvironmentName(rawValue: environment) else {
                throw ArgumentParser.ValidationError("--environment must be sandbox or production.")
            }
            let key = try readFile(keyFile, option: "--key-file")
            let ca = try caFile.map { try readFile($0, option: "--ca-file") }
            do {
                let stored = try await withAdministration(storage) {
                    try await $0.setAPNsCredentials(
                        appID: app,
                        APNsCredentials(
                            teamID: teamID, keyID: keyID, privateKeyPEM: key, environment: environment, baseURL: baseURL, caCertificatePEM: ca,
                            channelManagementBaseURL: channelManagementBaseURL, broadcastBaseURL: broadcastBaseURL
                        )
                    )
                }
                print("Stored APNs credentials for \(stored.appID): team \(teamID), key \(keyID), \(environment.rawValue)\(baseURL.map { " via \($0)" } ?? "").")
            } catch {
                throw describe(error)
            }
        }
    }
}

extension Apps {
    struct SetFCM: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "set-fcm",
            abstract: "Set an app's FCM service account. Its private key is sealed at rest and never shown again."
        )

        @OptionGroup var storage: StorageOptions
        @Option(help: "The app id (app_…).") var app: String
        @Option(name: .customLong("service-account"), help: "Path to the Firebase service-account JSON.") var serviceAccount: String
        @Option(name: .customLong("base-url"), help: "Send to this https URL instead of fcm.googleapis.com (e.g. the local emulator).")
        var baseURL: String?
        @Option(name: .customLong("ca-file"), help: "A PEM CA certificate to trust for --base-url and the token URI.") var caFile: String?

        func run() async throws {
            let json = try readFile(serviceAccount, option: "--service-account")
            let ca = try caFile.map { try readFile($0, option: "--ca-file") }
            do {
                let stored = try await withAdministration(storage) {
                    try await $0.setFCMCredentials(appID: app, FCMCredentials(serviceAccountJSON: json, baseURL: baseURL, caCertificatePEM: ca))
                }
                let settings = stored.settings.objectValue ?? [:]
                print(
                    "Stored FCM credentials for \(stored.appID): project \(settings["projectId"]?.stringValue ?? "?"), \(settings["clientEmail"]?.stringValue ?? "?")\(baseURL.map { " via \($0)" } ?? "")."
                )
            } catch {
                throw describe(error)
            }
        }
    }
}

extension Apps {
    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete an app with all its data: keys, credentials, activities, devices, events and webhooks.",
            discussion: """
                The app's broadcast channels are deleted at APNs first, with its stored credentials; if one cannot be, the app is \
                kept, unless --leave-channels (an app without APNs credentials made its channels at the built-in emulator: they are \
                left). Then its keys are revoked and the rest is deleted. Live Activities on phones are not ended: end them first to \
                have them leave the screens. The same as DELETE /admin/v1/apps/{appId}.
                """
        )

        @OptionGroup var storage: StorageOptions
        @Option(help: "The app id (app_…).") var app: String
        @Flag(name: .customLong("leave-channels"), help: "Delete the app even if some of its broadcast channels cannot be deleted at APNs.")
        var leaveChannels = false
        @Flag(help: "Confirm: the app and its data cannot be brought back.") var yes = false

        func validate() throws {
            guard yes else {
                throw ArgumentParser.ValidationError("Deleting \(app) erases it and all its data for good; add --yes to confirm.")
            }
        }

        func run() async throws {
            do {
                let deleted = try await withAdministration(storage, channels: true) {
                    try await $0.deleteApp(appID: app, leavingChannels: leaveChannels)
                }
                let deletion = deleted.deletion
                print(
                    "Deleted app \(deletion.app.id) (\(deletion.app.name)): \(deletion.activities) activities, \(deletion.devices) devices, "
                        + "\(deleted.channelsDeleted) broadcast channels deleted at APNs."
                )
                if !deletion.channelsLeft.isEmpty {
                    print("Left at APNs: \(deletion.channelsLeft.count) channels: \(deletion.channelsLeft.joined(separator: " "))")
                }
            } catch {
                throw describe(error)
            }
        }
    }
}

extension Apps {
    struct SetDevices: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "set-devices",
            abstract: "Set who may set an app's devices' userId and tags: the app with its publishable key, or only the backend.",
            discussion: """
                The publishable key ships in every copy of the app: with 'app' (the default), whoever extracts it can register a \
                device of their own under any user id or tags, and receive the Live Activities started for them. With 'backend', a \
                publishable-key registration that names userId or tags is refused (403 secret_key_required); the backend sets them \
                with the secret key.
                """
        )

        @OptionGroup var storage: StorageOptions
        @Option(help: "The app id (app_…).") var app: String
        @Option(name: .customLong("audience-from"), help: "app or backend.") var audienceFrom: String

        func validate() throws {
            guard AudienceSource(rawValue: audienceFrom) != nil else {
                throw ArgumentParser.ValidationError("--audience-from must be 'app' or 'backend'; got '\(audienceFrom)'.")
            }
        }

        func run() async throws {
            let source = AudienceSource(rawValue: audienceFrom) ?? .backend
            do {
                let updated = try await withAdministration(storage) { try await $0.setAudienceFrom(appID: app, source) }
                switch updated.audienceFrom {
                case .app: print("\(updated.id): the app's publishable key may set its devices' userId and tags.")
                case .backend: print("\(updated.id): only the backend's secret key sets its devices' userId and tags.")
                }
            } catch {
                throw describe(error)
            }
        }
    }
}

struct Keys: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Manage API keys.", subcommands: [Rotate.self])

    struct Rotate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke an app's keys and print a new pair once.")

        @OptionGroup var storage: StorageOptions
        @Option(help: "The app id (app_…).") var app: String
        @Option(help: "text, json, or env (shell exports).") var format: OutputFormat = .text

        func run() async throws {
            do {
                let rotated = try await withAdministration(storage) { try await $0.rotateKeys(appID: app) }
                printKeys(rotated, format: format, heading: "Rotated the keys of \(rotated.app.id); the old ones are refused from now on (nodes on PostgreSQL are told at once; a server running on a SQLite file may still take them for up to 5 seconds).")
            } catch {
                throw describe(error)
            }
        }
    }
}

struct ConfigKeys: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "config", abstract: "List every configuration key.")

    func run() async throws {
        for key in LivelineConfiguration.keys {
            print("\(key.environment)\t\(key.flag ?? "-")\t\(key.name)\tdefault \(key.defaultValue)\t\(key.summary)")
        }
    }
}

struct OpenAPI: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "openapi", abstract: "Print the OpenAPI document of the HTTP API.")

    func run() async throws {
        print(LivelineApplication.openAPIDocument)
    }
}
