import ArgumentParser
import Foundation
import LivelineEmulator
import Logging

/// `liveline emulator …`: local stand-ins for the push services.
struct EmulatorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "emulator",
        abstract: "Run local stand-ins for the push services Liveline talks to.",
        subcommands: [APNsCommand.self, FCMCommand.self]
    )

    /// `liveline emulator apns`: the APNs emulator with its control API.
    struct APNsCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "apns",
            abstract: "Run a local APNs (HTTP/2 + TLS) with simulated phones and a JSON control API.",
            discussion: """
                Pushes are checked as Apple documents them and applied to simulated phones; see what a phone \
                shows with GET /devices on the control API. Without --key-file a signing key is generated once \
                into the data directory and reused on later starts.
                """
        )

        @Option(help: "Address both listeners bind to.")
        var host = "127.0.0.1"

        @Option(help: "Port of the APNs listener (HTTP/2 over TLS).")
        var port = 8443

        @Option(name: .customLong("control-port"), help: "Port of the JSON control API (HTTP/1.1).")
        var controlPort = 8091

        @Option(name: .customLong("channels-port"), help: "Port of the broadcast channel management listener (HTTP/2 over TLS, like api-manage-broadcast.push.apple.com).")
        var channelsPort = 8445

        @Option(name: .customLong("data-dir"), help: "Directory for the CA certificate, the generated key and the simulated phones (apns-phones.json).")
        var dataDirectory = "./.liveline/emulator"

        @Option(name: .customLong("bundle-id"), help: "A bundle id whose Live Activity topic to allow (repeatable; default com.example.liveline.demo).")
        var bundleIDs: [String] = []

        @Option(name: .customLong("team-id"), help: "The team id provider tokens carry as iss (default: the saved or a generated one).")
        var teamID: String?

        @Option(name: .customLong("key-id"), help: "The key id provider tokens carry as kid (default: from the key file's name, the saved or a generated one).")
        var keyID: String?

        @Option(name: .customLong("key-file"), help: "A .p8 file whose public key to trust (default: generate one into the data directory once).")
        var keyFile: String?

        @OptionGroup var phones: PhoneOptions

        @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.")
        var logLevel = "info"

        func validate() throws {
            guard Logger.Level(rawValue: logLevel) != nil else {
                throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical.")
            }
            for (name, value) in [("--port", port), ("--control-port", controlPort), ("--channels-port", channelsPort)]
            where !(0...65535).contains(value) {
                throw ValidationError("\(name) must be a port number from 0 to 65535.")
            }
        }

        func run() async throws {
            let logger = makeLogger(level: Logger.Level(rawValue: logLevel) ?? .info)
            let directory = URL(fileURLWithPath: dataDirectory).standardizedFileURL.path
            let credentials: EmulatorSigningCredentials
            do {
                credentials = try EmulatorSigningCredentials.loadOrCreate(
                    dataDirectory: directory, teamID: teamID, keyID: keyID,
                    keyFile: keyFile.map { URL(fileURLWithPath: $0).standardizedFileURL.path }
                )
            } catch let problem as EmulatorSigningCredentials.Problem {
                throw ValidationError(problem.description)
            }

            var configuration = APNsEmulatorConfiguration(dataDirectory: directory)
            configuration.host = host
            configuration.apnsPort = port
            configuration.controlPort = controlPort
            configuration.channelsPort = channelsPort
            configuration.persistsPhones = phones.persistPhones
            configuration.registerWith = phones.target
            let emulator = try APNsEmulator(configuration: configuration, logger: logger)
            emulator.registerSigningKey(teamID: credentials.teamID, keyID: credentials.keyID, publicKey: credentials.publicKey)
            let bundles = bundleIDs.isEmpty ? ["com.example.liveline.demo"] : bundleIDs
            for bundleID in bundles { emulator.registerBundleID(bundleID) }

            let ports = try await emulator.start()
            let urlHost = host.contains(":") ? "[\(host)]" : host
            let apnsURL = "https://\(urlHost):\(ports.apnsPort)"
            let banner = """
                Liveline APNs emulator
                  APNs:         \(apnsURL)
                  channels:     https://\(urlHost):\(emulator.boundChannelsPort ?? channelsPort)  (broadcast channel management)
                  CA file:      \(emulator.caCertificatePath)
                  control API:  http://\(urlHost):\(ports.controlPort)
                  team id:      \(credentials.teamID)
                  key id:       \(credentials.keyID)
                  key file:     \(credentials.keyFilePath)\(credentials.generated ? " (generated)" : "")
                  bundle ids:   \(bundles.joined(separator: ", "))

                Point an app at it:
                  liveline apps set-apns --app APP_ID --team-id \(credentials.teamID) --key-id \(credentials.keyID) --key-file \(shellQuoted(credentials.keyFilePath)) --environment sandbox --base-url \(apnsURL)\(emulator.boundChannelsPort.map { " --channel-management-base-url https://\(urlHost):\($0)" } ?? "") --ca-file \(shellQuoted(emulator.caCertificatePath))

                Add a simulated phone: curl -X POST http://\(urlHost):\(ports.controlPort)/devices -d '{"bundleId":"\(bundles[0])"}'
                Add an iPhone with push-to-start: curl -X POST http://\(urlHost):\(ports.controlPort)/phones -d '{"bundleId":"\(bundles[0])","attributesTypes":["MatchAttributes"]}'
                Its app registers with Liveline: \(configuration.registerWith?.url ?? "no (use --register-with URL --publishable-key pk_…)")

                """
            FileHandle.standardOutput.write(Data(banner.utf8))
            try await emulator.runService()
        }

        private func shellQuoted(_ path: String) -> String {
            path.allSatisfy({ $0.isLetter || $0.isNumber || "/._-+".contains($0) }) ? path : "'\(path.replacingOccurrences(of: "'", with: "'\\''"))'"
        }
    }

    /// `liveline emulator fcm`: the FCM emulator (with Google's OAuth token endpoint) and its control API.
    struct FCMCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "fcm",
            abstract: "Run a local FCM HTTP v1 (HTTPS, HTTP/2) with an OAuth token endpoint, simulated Android phones and a JSON control API.",
            discussion: """
                Messages are checked as Google documents them and applied to simulated Android phones; see what a phone \
                shows with GET /devices on the control API. A demo service account is generated once into the data \
                directory (fcm-service-account.json, mode 0600), its token_uri pointing at this emulator, and reused on \
                later starts.
                """
        )

        @Option(help: "Address both listeners bind to.")
        var host = "127.0.0.1"

        @Option(help: "Port of the FCM listener (HTTPS: OAuth /token and /v1/projects/…/messages:send).")
        var port = 8444

        @Option(name: .customLong("control-port"), help: "Port of the JSON control API (HTTP/1.1).")
        var controlPort = 8092

        @Option(name: .customLong("data-dir"), help: "Directory for the CA certificate and the demo service account.")
        var dataDirectory = "./.liveline/emulator"

        @Option(name: .customLong("project-id"), help: "The demo service account's project, for a newly generated account.")
        var projectID = "liveline-demo"

        @OptionGroup var phones: PhoneOptions

        @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.")
        var logLevel = "info"

        func validate() throws {
            guard Logger.Level(rawValue: logLevel) != nil else {
                throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical.")
            }
            for (name, value) in [("--port", port), ("--control-port", controlPort)] where !(0...65535).contains(value) {
                throw ValidationError("\(name) must be a port number from 0 to 65535.")
            }
            guard !projectID.isEmpty, projectID.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
                throw ValidationError("--project-id must be letters, digits and '-', as Firebase project ids are.")
            }
        }

        func run() async throws {
            let logger = makeLogger(level: Logger.Level(rawValue: logLevel) ?? .info)
            let directory = URL(fileURLWithPath: dataDirectory).standardizedFileURL.path
            var configuration = FCMEmulatorConfiguration(dataDirectory: directory)
            configuration.host = host
            configuration.fcmPort = port
            configuration.controlPort = controlPort
            configuration.defaultProjectID = projectID
            configuration.persistsPhones = phones.persistPhones
            configuration.registerWith = phones.target
            let emulator = try FCMEmulator(configuration: configuration, logger: logger)
            try await emulator.start()
            let account: FCMDemoServiceAccount
            do {
                account = try emulator.demoServiceAccount()
            } catch let problem as FCMDemoServiceAccount.Problem {
                try await emulator.shutdown()
                throw ValidationError(problem.description)
            }
            let baseURL = emulator.baseURL ?? ""
            let controlURL = emulator.controlURL ?? ""
            let banner = """
                Liveline FCM emulator
                  FCM:              \(baseURL)
                  token endpoint:   \(account.tokenURI)
                  CA file:          \(emulator.caCertificatePath)
                  control API:      \(controlURL)
                  service account:  \(account.path)\(account.generated ? " (generated)" : "")
                  project id:       \(account.projectID)
                  client email:     \(account.clientEmail)

                Point an app at it: its FCM credentials are the service-account file, with base URL \(baseURL) and the CA file above.

                Add a simulated Android phone: curl -X POST \(controlURL)/devices -d '{"projectId":"\(account.projectID)"}'
                Its app registers with Liveline: \(configuration.registerWith?.url ?? "no (use --register-with URL --publishable-key pk_…)")

                """
            FileHandle.standardOutput.write(Data(banner.utf8))
            try await emulator.runService()
        }
    }
}

/// What both emulators' simulated phones take: where their app registers, and whether they are kept across restarts.
struct PhoneOptions: ParsableArguments {
    @Option(name: .customLong("register-with"), help: "A Liveline base URL (e.g. http://127.0.0.1:8080) the simulated phones' app registers with, as the real app would; needs --publishable-key.")
    var registerWith: String?

    @Option(name: .customLong("publishable-key"), help: "The app's publishable key (pk_…) for --register-with.")
    var publishableKey: String?

    @Flag(name: .customLong("persist-phones"), inversion: .prefixedNo, help: "Keep the simulated phones in the data directory across restarts.")
    var persistPhones = true

    func validate() throws {
        try validateRegistration(registerWith: registerWith, publishableKey: publishableKey)
    }

    /// The target of `--register-with` and `--publishable-key`, when both are given.
    var target: LivelineRegistrationTarget? {
        registrationTarget(registerWith: registerWith, publishableKey: publishableKey)
    }
}

/// Checks `--register-with` and `--publishable-key`: both or neither, and an http(s) URL.
func validateRegistration(registerWith: String?, publishableKey: String?) throws {
    switch (registerWith, publishableKey) {
    case (nil, nil): return
    case (nil, _): throw ValidationError("--publishable-key needs --register-with.")
    case (_, nil): throw ValidationError("--register-with needs --publishable-key (the app's pk_… key).")
    case (let url?, _):
        guard url.hasPrefix("http://") || url.hasPrefix("https://") else {
            throw ValidationError("--register-with must be an http:// or https:// URL, e.g. http://127.0.0.1:8080.")
        }
    }
}

/// The registration target of `--register-with` and `--publishable-key`, when both are given.
func registrationTarget(registerWith: String?, publishableKey: String?) -> LivelineRegistrationTarget? {
    guard let registerWith, let publishableKey else { return nil }
    return LivelineRegistrationTarget(url: registerWith, publishableKey: publishableKey)
}
