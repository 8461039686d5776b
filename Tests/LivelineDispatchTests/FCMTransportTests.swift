import FCM
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineStore
import LivelineTestSupport
import Logging
import NIOCore
import Testing
import _CryptoExtras

/// A service-account key file's JSON, as the Firebase console downloads it.
func fcmServiceAccountJSON(tokenURI: String, key: _RSA.Signing.PrivateKey = fcmTestKey) -> String {
    serviceAccountJSON(
        projectID: "android-project", clientEmail: "sender@android-project.iam.gserviceaccount.com", tokenURI: tokenURI,
        privateKeyPEM: key.pkcs8PEMRepresentation
    )
}

/// FCM credentials, and the FCM push transport turning the emulator's answers into push outcomes.
@Suite("FCM transport and credentials")
struct FCMTransportTests {
    struct Environment {
        let emulator: FCMEmulator
        let store: SQLStore
        let sealer: CredentialSealer
        let directory: FCMTransportDirectory
        let credentials: FCMCredentials
        let projectID: String
        let clock: SharedClock
        let appID = "app_android"
        /// Clients built by the directories of these tests: patient, because the suite runs beside tests that keep
        /// every core busy (under such load a 10 s connect to the emulator once timed out, in CI).
        static let clientConfiguration = FCMClient.Configuration(requestTimeout: .seconds(60), connectTimeout: .seconds(60))

        /// Stores the app's FCM credentials (the emulator's service account), as `PUT …/credentials/fcm` does.
        func saveCredentials() async throws {
            try await store.saveCredentials(try credentials.stored(appID: appID, sealer: sealer, at: clock.now))
        }

        /// The directory's Android transport for the app, which must have credentials.
        func androidTransport() async throws -> any PushTransport {
            try #require(try await directory.transport(appID: appID, platform: .android))
        }

        func push(to token: String, sequence: Int64, body: [UInt8]? = nil) -> OutgoingPush {
            let message = FCMLiveUpdateMessage(
                activityID: "order-1234", event: .update, sequence: sequence, timestamp: Int64(clock.now.timeIntervalSince1970),
                contentState: ["eta": .integer(10 - sequence)]
            )
            return OutgoingPush(
                appID: appID, activityID: "order-1234", deviceID: "device-1", platform: .android, token: token, topic: "",
                sequence: sequence, event: .update, priority: 10, expiration: nil,
                payload: ByteBuffer(bytes: body ?? message.encoded().body(token: token))
            )
        }
    }

    static func withEnvironment(_ body: (Environment) async throws -> Void) async throws {
        let root = uniqueTemporaryURL(prefix: "liveline-fcm-transport")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let clock = SharedClock()
        var configuration = FCMEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path)
        configuration.now = { [clock] in clock.now }
        var logger = Logger(label: "test.fcm")
        logger.logLevel = .warning
        let emulator = try FCMEmulator(configuration: configuration, logger: logger)
        try await emulator.start()
        let json = fcmServiceAccountJSON(tokenURI: try #require(emulator.tokenURI))
        emulator.registerServiceAccount(
            clientEmail: "sender@android-project.iam.gserviceaccount.com", projectID: "android-project",
            publicKey: fcmTestKey.publicKey, privateKeyID: "0123456789abcdef"
        )
        let store = try await SQLStore.open(path: root.appendingPathComponent("liveline.sqlite").path)
        let sealer = try CredentialSealer(masterKey: Array(repeating: 7, count: 32))
        let credentials = FCMCredentials(
            serviceAccountJSON: json, baseURL: emulator.baseURL, caCertificatePEM: emulator.caCertificatePEM
        )
        let directory = FCMTransportDirectory(
            store: store, sealer: sealer, clientConfiguration: Environment.clientConfiguration, now: { [clock] in clock.now }, logger: logger
        )
        let environment = Environment(
            emulator: emulator, store: store, sealer: sealer, directory: directory, credentials: credentials, projectID: "android-project",
            clock: clock
        )
        do {
            try await store.createApp(
                AppRecord(
                    id: environment.appID, name: "Android", bundleID: "com.example.android", androidPackage: "com.example.android",
                    createdAt: clock.now
                ),
                keys: []
            )
            try await body(environment)
        } catch {
            await directory.shutdown()
            try? await store.close()
            try await emulator.shutdown()
            throw error
        }
        await directory.shutdown()
        try await store.close()
        try await emulator.shutdown()
    }

    @Test("credentials validate, keep the key out of settings and text, and survive sealing")
    func credentials() async throws {
        try await Self.withEnvironment { environment in
            let credentials = environment.credentials
            try credentials.validate()
            let settings = try #require(credentials.settings.objectValue)
            #expect(settings["projectId"] == .string(environment.projectID))
            #expect(settings["clientEmail"]?.stringValue?.hasSuffix(".iam.gserviceaccount.com") == true)
            #expect(settings["baseUrl"] == .string(try #require(environment.emulator.baseURL)))
            #expect(!credentials.settings.encodedString.contains("PRIVATE KEY"))
            #expect(!credentials.description.contains("PRIVATE KEY"))

            let stored = try credentials.stored(appID: environment.appID, sealer: environment.sealer, at: environment.clock.now)
            #expect(stored.provider == .fcm)
            #expect(!String(decoding: stored.sealedSecret, as: UTF8.self).contains("PRIVATE KEY"))
            let opened = try FCMCredentials(stored, sealer: environment.sealer)
            #expect(opened.serviceAccountJSON == credentials.serviceAccountJSON)
            #expect(opened.baseURL == credentials.baseURL)
            #expect(opened.caCertificatePEM == credentials.caCertificatePEM)
            var moved = stored
            moved.appID = "app_other"
            #expect(throws: CredentialError.self) { try FCMCredentials(moved, sealer: environment.sealer) }

            let broken = FCMCredentials(serviceAccountJSON: #"{"type":"service_account"}"#)
            let error = #expect(throws: ValidationError.self) { try broken.validate() }
            #expect(error?.code == "invalid_service_account")
            #expect(error?.message.contains("project_id") == true)
            let http = FCMCredentials(serviceAccountJSON: credentials.serviceAccountJSON, baseURL: "http://example.com")
            #expect(throws: ValidationError.self) { try http.validate() }
        }
    }

    @Test("the directory builds a transport from stored credentials; outcomes follow FCM's answers")
    func outcomes() async throws {
        try await Self.withEnvironment { environment in
            #expect(try await environment.directory.transport(appID: environment.appID, platform: .android) == nil)
            try await environment.saveCredentials()
            #expect(try await environment.directory.transport(appID: environment.appID, platform: .ios) == nil)
            let transport = try await environment.androidTransport()

            let token = environment.emulator.addDevice(projectID: environment.projectID)
            let delivered = await transport.send(environment.push(to: token, sequence: 1))
            guard case .delivered(let name) = delivered else {
                Issue.record("expected delivered, got \(delivered)")
                return
            }
            #expect(name?.hasPrefix("projects/\(environment.projectID)/messages/") == true)
            #expect(environment.emulator.device(token: token)?.notification(activityID: "order-1234")?.contentState == ["eta": 9])

            let rejected = await transport.send(
                environment.push(to: token, sequence: 2, body: Array(#"{"message":{"token":"\#(token)","data":{"n":1}}}"#.utf8))
            )
            #expect(rejected == .rejected(reason: "INVALID_ARGUMENT", providerID: nil))

            environment.emulator.setFaults(FCMFaults(quotaExceededRate: 1, retryAfterSeconds: 12))
            let throttled = await transport.send(environment.push(to: token, sequence: 2))
            #expect(throttled == .retryable(reason: "QUOTA_EXCEEDED", retryAfter: .seconds(12), providerID: nil))
            environment.emulator.setFaults(.none)

            let foreign = environment.emulator.addDevice(projectID: "another-project")
            let mismatch = await transport.send(environment.push(to: foreign, sequence: 1))
            // Another project's token is that token's refusal, not the credentials'.
            #expect(mismatch == .rejected(reason: "SENDER_ID_MISMATCH", providerID: nil))

            environment.emulator.unregisterDevice(token: token)
            let gone = await transport.send(environment.push(to: token, sequence: 3))
            #expect(gone == .invalidToken(reason: "UNREGISTERED", providerID: nil))

            // The same transport keeps its client (one access token) while the credentials are unchanged.
            _ = try await environment.directory.transport(appID: environment.appID, platform: .android)
            #expect(environment.emulator.statistics.tokensIssued == 1)
        }
    }

    @Test("an iOS or web registration token is that push's refusal (THIRD_PARTY_AUTH_ERROR), with no new access token; the other phones are sent to")
    func thirdPartyAuthError() async throws {
        try await Self.withEnvironment { environment in
            try await environment.saveCredentials()
            let transport = try await environment.androidTransport()
            let iPhone = environment.emulator.addDevice(projectID: environment.projectID, platform: .ios)
            let pixel = environment.emulator.addDevice(projectID: environment.projectID)
            #expect(await transport.send(environment.push(to: iPhone, sequence: 1)) == .rejected(reason: "THIRD_PARTY_AUTH_ERROR", providerID: nil))
            guard case .delivered = await transport.send(environment.push(to: pixel, sequence: 1)) else {
                Issue.record("the Android phone's push was not delivered")
                return
            }
            // The 401 was not taken for an access token FCM no longer accepts.
            #expect(environment.emulator.statistics.tokensIssued == 1)
        }
    }

    @Test("a TLS failure is a retryable outcome whose reason names the failure, not the server's build directory")
    func tlsFailureReason() async throws {
        try await Self.withEnvironment { environment in
            // A client that does not trust the emulator's CA: every handshake fails on the certificate (and the connection
            // pool tries again until its connect timeout).
            let account = try FCMServiceAccount(json: environment.credentials.serviceAccountJSON)
            let client = try FCMClient(
                serviceAccount: account,
                configuration: .init(baseURL: try #require(environment.emulator.baseURL), requestTimeout: .seconds(60), connectTimeout: .seconds(3)),
                now: { [clock = environment.clock] in clock.now }
            )
            // On a loaded machine a handshake may outlast the 3 s connect timeout, and that send's reason is the timeout
            // (CI saw it once); a send is tried again until one handshake fails on the certificate in time.
            let transport = FCMPushTransport(client: client)
            var reasons: [String] = []
            for sequence: Int64 in 1...8 {
                let outcome = await transport.send(environment.push(to: "t", sequence: sequence))
                guard case .retryable(let reason, _, _) = outcome else {
                    Issue.record("expected a retryable outcome, got \(outcome)")
                    break
                }
                reasons.append(reason)
                if reason.contains("CERTIFICATE_VERIFY_FAILED") { break }
            }
            await client.shutdown()
            #expect(reasons.last?.contains("CERTIFICATE_VERIFY_FAILED") == true, "\(reasons)")
            for reason in reasons {
                #expect(!reason.contains(".build"), "\(reason)")
                #expect(!reason.contains(" at /"), "\(reason)")
            }
        }
    }

    @Test("forgetting a deleted app closes its client; a later ask builds a new one, with an access token of its own")
    func forgetClosesTheClient() async throws {
        try await Self.withEnvironment { environment in
            try await environment.saveCredentials()
            let token = environment.emulator.addDevice(projectID: environment.projectID)
            let first = try await environment.androidTransport()
            guard case .delivered = await first.send(environment.push(to: token, sequence: 1)) else {
                Issue.record("the first push was not delivered")
                return
            }
            await environment.directory.forget(appID: environment.appID)
            let closed = await first.send(environment.push(to: token, sequence: 2))
            guard case .retryable(let reason, _, _) = closed else {
                Issue.record("a push through the closed client was \(closed)")
                return
            }
            #expect(reason.contains("shut down"))
            let next = try await environment.androidTransport()
            guard case .delivered = await next.send(environment.push(to: token, sequence: 2)) else {
                Issue.record("the new client's push was not delivered")
                return
            }
            #expect(environment.emulator.statistics.tokensIssued == 2)
        }
    }

    @Test("after notices may have been missed, the client of an app gone from the Store is closed, and not before")
    func forgetDeletedApps() async throws {
        try await Self.withEnvironment { environment in
            try await environment.saveCredentials()
            let token = environment.emulator.addDevice(projectID: environment.projectID)
            let transport = try await environment.androidTransport()
            await environment.directory.forgetDeletedApps()
            guard case .delivered = await transport.send(environment.push(to: token, sequence: 1)) else {
                Issue.record("the client of an app still in the Store was closed")
                return
            }
            // Deleted by another node (whose notice this one missed).
            #expect(try await environment.store.deleteApp(id: environment.appID, leavingChannels: false) != nil)
            await environment.directory.forgetDeletedApps()
            let closed = await transport.send(environment.push(to: token, sequence: 2))
            guard case .retryable(let reason, _, _) = closed else {
                Issue.record("a push through the deleted app's client was \(closed)")
                return
            }
            #expect(reason.contains("shut down"))
        }
    }

    @Test(
        "a service account the token endpoint refuses is credentialsRejected; an unreachable FCM retryable",
        .tags(.slow), .unlessSkippingSlowTests
    )
    func refusedAccount() async throws {
        try await Self.withEnvironment { environment in
            let json = fcmServiceAccountJSON(tokenURI: try #require(environment.emulator.tokenURI), key: fcmStrangerKey)
            let client = try FCMClient(
                serviceAccount: try FCMServiceAccount(json: json),
                // A generous connect timeout: on a loaded machine (the whole suite at once) the emulator may take
                // seconds to accept, and this test is about the refusal, not the timeout.
                configuration: .init(
                    baseURL: try #require(environment.emulator.baseURL), trustedCAPEM: environment.emulator.caCertificatePEM,
                    connectTimeout: .seconds(60)
                ),
                now: { [clock = environment.clock] in clock.now }
            )
            let token = environment.emulator.addDevice(projectID: environment.projectID)
            let refused = await FCMPushTransport(client: client).send(environment.push(to: token, sequence: 1))
            guard case .credentialsRejected(let reason, _) = refused else {
                Issue.record("expected credentialsRejected, got \(refused)")
                await client.shutdown()
                return
            }
            #expect(reason.contains("invalid_grant"))
            #expect(!reason.contains("PRIVATE KEY"))
            await client.shutdown()

            let unreachable = try FCMClient(
                serviceAccount: try FCMServiceAccount(json: environment.credentials.serviceAccountJSON),
                configuration: .init(baseURL: "https://127.0.0.1:1", trustedCAPEM: environment.emulator.caCertificatePEM),
                now: { [clock = environment.clock] in clock.now }
            )
            // The token endpoint answers, FCM's host does not.
            let outcome = await FCMPushTransport(client: unreachable).send(environment.push(to: token, sequence: 1))
            guard case .retryable(_, nil, nil) = outcome else {
                Issue.record("expected retryable, got \(outcome)")
                await unreachable.shutdown()
                return
            }
            await unreachable.shutdown()
        }
    }

    @Test("an app without FCM credentials uses the fallback: the emulator's demo service account")
    func fallback() async throws {
        try await Self.withEnvironment { environment in
            let demo = try environment.emulator.demoServiceAccount()
            let credentials = FCMCredentials(
                serviceAccountJSON: demo.json, baseURL: environment.emulator.baseURL, caCertificatePEM: environment.emulator.caCertificatePEM
            )
            try credentials.validate()
            let directory = FCMTransportDirectory(
                store: environment.store, sealer: environment.sealer, fallback: { _ in credentials },
                clientConfiguration: Environment.clientConfiguration, now: { [clock = environment.clock] in clock.now }
            )
            let transport = try #require(try await directory.transport(appID: environment.appID, platform: .android))
            let token = environment.emulator.addDevice(projectID: demo.projectID)
            let outcome = await transport.send(environment.push(to: token, sequence: 1))
            guard case .delivered = outcome else {
                Issue.record("expected delivered, got \(outcome)")
                await directory.shutdown()
                return
            }
            await directory.shutdown()
        }
    }
}
