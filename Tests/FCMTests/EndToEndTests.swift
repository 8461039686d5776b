import AsyncHTTPClient
import FCM
import Foundation
import LivelineCore
import LivelineEmulator
import LivelineTestSupport
import Logging
import NIOCore
import NIOSSL
import Testing

/// FCMClient and FCMAccessTokens against the real FCM emulator over TLS on 127.0.0.1.
@Suite("FCM client against the emulator")
struct EndToEndTests {
    struct Harness {
        let emulator: FCMEmulator
        let client: FCMClient
        let clock: TestClock
        let account: FCMServiceAccount
        let directory: String

        func message(sequence: Int64, event: LiveActivityEvent = .update, state: JSONValue = ["eta": 5]) -> FCMLiveUpdateMessage {
            FCMLiveUpdateMessage(
                activityID: "order-1234", event: event, sequence: sequence, timestamp: Int64(clock.now.timeIntervalSince1970),
                contentState: state
            )
        }

        func send(_ message: FCMLiveUpdateMessage, to token: String, project: String? = nil) async throws -> FCMResponse {
            try await client.send(projectID: project ?? account.projectID, body: ByteBuffer(bytes: message.requestBody(token: token)))
        }
    }

    /// A service account with the run's shared key, registered with the emulator (generating a demo account's key for
    /// every test would load the machine for nothing).
    static func registeredAccount(_ emulator: FCMEmulator) throws -> FCMServiceAccount {
        let account = try FCMServiceAccount(json: serviceAccountJSON(projectID: "liveline-demo", tokenURI: try #require(emulator.tokenURI)))
        emulator.registerServiceAccount(
            clientEmail: account.clientEmail, projectID: account.projectID, publicKey: fcmTestKey.publicKey,
            privateKeyID: account.privateKeyID
        )
        return account
    }

    static func withHarness(_ body: (Harness) async throws -> Void) async throws {
        let directory = uniqueTemporaryURL(prefix: "liveline-fcm").path
        let clock = TestClock()
        var configuration = FCMEmulatorConfiguration(dataDirectory: directory)
        configuration.now = { clock.now }
        var logger = Logger(label: "fcm-tests")
        logger.logLevel = .warning
        let emulator = try FCMEmulator(configuration: configuration, logger: logger)
        try await emulator.start()
        let account = try registeredAccount(emulator)
        let client = try FCMClient(
            serviceAccount: account,
            configuration: FCMClient.Configuration(baseURL: try #require(emulator.baseURL), trustedCAPEM: emulator.caCertificatePEM, connectTimeout: .seconds(60)),
            now: { clock.now }, logger: logger
        )
        let harness = Harness(emulator: emulator, client: client, clock: clock, account: account, directory: directory)
        do {
            try await body(harness)
        } catch {
            await client.shutdown()
            try await emulator.shutdown()
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        await client.shutdown()
        try await emulator.shutdown()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("messages are delivered with one access token, refreshed only near its expiry")
    func tokenReuseAndRefresh() async throws {
        try await Self.withHarness { harness in
            let token = harness.emulator.addDevice(projectID: harness.account.projectID)
            for sequence in 1...3 {
                let response = try await harness.send(harness.message(sequence: Int64(sequence), state: ["eta": .integer(Int64(10 - sequence))]), to: token)
                #expect(response.status == 200)
                #expect(response.messageName?.hasPrefix("projects/\(harness.account.projectID)/messages/") == true)
            }
            #expect(harness.emulator.statistics.tokensIssued == 1)
            #expect(await harness.client.tokens.exchangeCount == 1)
            let notification = try #require(harness.emulator.device(token: token)?.notification(activityID: "order-1234"))
            #expect(notification.sequence == 3)
            #expect(notification.contentState == ["eta": 7])
            #expect(notification.visible)

            harness.clock.advance(by: 3000)
            #expect(try await harness.send(harness.message(sequence: 4), to: token).status == 200)
            #expect(harness.emulator.statistics.tokensIssued == 1)

            // 55 minutes in, the token is replaced before the emulator would refuse it.
            harness.clock.advance(by: 300)
            #expect(try await harness.send(harness.message(sequence: 5), to: token).status == 200)
            #expect(harness.emulator.statistics.tokensIssued == 2)
            #expect(harness.emulator.messages(token: token).allSatisfy { $0.status == 200 })
        }
    }

    @Test("a refused access token (401) is replaced once and the message sent again")
    func unauthorizedRefreshesOnce() async throws {
        try await Self.withHarness { harness in
            let token = harness.emulator.addDevice(projectID: harness.account.projectID)
            #expect(try await harness.send(harness.message(sequence: 1), to: token).status == 200)
            harness.emulator.revokeAccessTokens()
            let response = try await harness.send(harness.message(sequence: 2), to: token)
            #expect(response.status == 200)
            #expect(harness.emulator.statistics.tokensIssued == 2)
            #expect(harness.emulator.messages(token: token).map(\.status) == [200, 401, 200])
            #expect(harness.emulator.messages(token: token)[1].errorCode == "UNAUTHENTICATED")
        }
    }

    @Test("an access token the emulator keeps refusing ends as a 401 with the credentials disposition")
    func persistentUnauthorized() async throws {
        let directory = uniqueTemporaryURL(prefix: "liveline-fcm").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let clock = TestClock()
        var configuration = FCMEmulatorConfiguration(dataDirectory: directory)
        configuration.now = { clock.now }
        // Tokens the emulator issues are already expired by its own clock.
        configuration.accessTokenLifetime = 0
        let emulator = try FCMEmulator(configuration: configuration, logger: Logger(label: "fcm-tests"))
        try await emulator.start()
        let account = try Self.registeredAccount(emulator)
        let client = try FCMClient(
            serviceAccount: account,
            configuration: .init(baseURL: try #require(emulator.baseURL), trustedCAPEM: emulator.caCertificatePEM, connectTimeout: .seconds(60)), now: { clock.now }
        )
        let token = emulator.addDevice(projectID: account.projectID)
        let body = FCMLiveUpdateMessage(activityID: "a", event: .update, sequence: 1, timestamp: 1, contentState: [:]).requestBody(token: token)
        let response = try await client.send(projectID: account.projectID, body: body)
        #expect(response.status == 401)
        #expect(response.disposition == .credentials)
        #expect(emulator.messages().map(\.status) == [401, 401])
        #expect(emulator.statistics.tokensIssued == 2)
        await client.shutdown()
        try await emulator.shutdown()
    }

    @Test("FCM's refusals arrive parsed and classified")
    func refusals() async throws {
        try await Self.withHarness { harness in
            let token = harness.emulator.addDevice(projectID: harness.account.projectID)

            harness.emulator.unregisterDevice(token: token)
            let unregistered = try await harness.send(harness.message(sequence: 1), to: token)
            #expect(unregistered.status == 404)
            #expect(unregistered.errorCode == .unregistered)
            #expect(unregistered.disposition == .invalidToken)

            let elsewhere = harness.emulator.addDevice(projectID: "another-project")
            let mismatch = try await harness.send(harness.message(sequence: 1), to: elsewhere)
            #expect(mismatch.errorCode == .senderIDMismatch)
            #expect(mismatch.disposition == .terminal, "another project's token is that token's refusal")

            let otherProject = try await harness.send(harness.message(sequence: 1), to: elsewhere, project: "another-project")
            #expect(otherProject.status == 403)
            #expect(otherProject.errorCode == .unknown("PERMISSION_DENIED"))
            #expect(otherProject.disposition == .credentials, "a project the service account may not send for is the credentials' fault")

            let fresh = harness.emulator.addDevice(projectID: harness.account.projectID)
            let invalid = try await harness.client.send(
                projectID: harness.account.projectID, body: Array(#"{"message":{"token":"\#(fresh)","data":{"n":5}}}"#.utf8)
            )
            #expect(invalid.status == 400)
            #expect(invalid.errorCode == .invalidArgument)
            #expect(invalid.disposition == .terminal)

            harness.emulator.setFaults(FCMFaults(unavailableRate: 1, retryAfterSeconds: 7))
            let unavailable = try await harness.send(harness.message(sequence: 1), to: fresh)
            #expect(unavailable.status == 503)
            #expect(unavailable.errorCode == .unavailable)
            #expect(unavailable.retryAfter == .seconds(7))
            #expect(unavailable.disposition == .retryable)
            harness.emulator.setFaults(.none)
            #expect(try await harness.send(harness.message(sequence: 1), to: fresh).isSuccess)
        }
    }

    @Test("a service account the token endpoint does not know is refused with invalid_grant")
    func unknownServiceAccount() async throws {
        try await Self.withHarness { harness in
            let stranger = try FCMServiceAccount(
                json: serviceAccountJSON(
                    projectID: harness.account.projectID, clientEmail: "stranger@elsewhere.iam.gserviceaccount.com",
                    tokenURI: harness.account.tokenURI
                )
            )
            let client = try FCMClient(
                serviceAccount: stranger,
                configuration: .init(baseURL: try #require(harness.emulator.baseURL), trustedCAPEM: harness.emulator.caCertificatePEM, connectTimeout: .seconds(60)),
                now: { harness.clock.now }
            )
            let token = harness.emulator.addDevice(projectID: harness.account.projectID)
            let error = await #expect(throws: FCMAuthenticationError.self) {
                try await client.send(projectID: stranger.projectID, body: harness.message(sequence: 1).requestBody(token: token))
            }
            #expect(error?.status == 400)
            #expect(error?.error == "invalid_grant")
            #expect(error?.isRetryable == false)
            await client.shutdown()
        }
    }

    @Test("the emulator answers HTTP/1.1 clients too")
    func http1() async throws {
        try await Self.withHarness { harness in
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMBytes(Array(harness.emulator.caCertificatePEM.utf8)))]
            var configuration = HTTPClient.Configuration(tlsConfiguration: tls, timeout: .init(connect: .seconds(60)))
            configuration.httpVersion = .http1Only
            let http1 = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
            var request = HTTPClientRequest(url: try #require(harness.emulator.baseURL) + "/v1/projects/\(harness.account.projectID)/messages:send")
            request.method = .POST
            request.body = .bytes(ByteBuffer(string: "{}"))
            do {
                let response = try await http1.execute(request, timeout: .seconds(60))
                #expect(response.version == .http1_1)
                #expect(response.status.code == 401)
                let body = try await response.body.collect(upTo: 64 * 1024)
                #expect(FCMResponse(status: 401, body: body.readableBytesView).errorStatus == "UNAUTHENTICATED")
            } catch {
                try await http1.shutdown()
                throw error
            }
            try await http1.shutdown()
        }
    }

    @Test("without trusting the emulator's CA, nothing is sent", .tags(.slow), .unlessSkippingSlowTests)
    func untrustedCertificate() async throws {
        try await Self.withHarness { harness in
            let client = try FCMClient(
                serviceAccount: harness.account, configuration: .init(baseURL: try #require(harness.emulator.baseURL)),
                now: { harness.clock.now }
            )
            await #expect(throws: FCMTransportError.self) {
                try await client.send(projectID: harness.account.projectID, body: harness.message(sequence: 1).requestBody(token: "t"))
            }
            await client.shutdown()
            await #expect(throws: FCMTransportError.self) {
                try await client.send(projectID: harness.account.projectID, body: [UInt8]())
            }
            #expect(harness.emulator.statistics.tokenRequests == 0)
        }
    }
}
