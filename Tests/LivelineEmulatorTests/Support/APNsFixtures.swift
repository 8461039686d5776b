import Crypto
import Foundation
import LivelineCore
import LivelineTestSupport
import Logging
import Testing

@testable import LivelineEmulator

/// A team's signing key and the provider tokens it makes, written here from RFC 7515 and Apple's
/// "Establishing a token-based connection to APNs", independently of Liveline's sender.
struct TestSigningKey: Sendable {
    var teamID = "TEAM123456"
    var keyID = "KEY1234567"
    var privateKey = P256.Signing.PrivateKey()

    /// An ES256 JWT; every part can be bent to make a bad one.
    func token(
        iat: JSONValue, alg: String = "ES256", kid: String? = nil, iss: String? = nil,
        signingKey: P256.Signing.PrivateKey? = nil
    ) -> String {
        let header: JSONValue = ["alg": .string(alg), "kid": .string(kid ?? keyID)]
        let claims: JSONValue = ["iss": .string(iss ?? teamID), "iat": iat]
        let signingInput = Self.base64URL(header.encoded) + "." + Self.base64URL(claims.encoded)
        let signature = try! (signingKey ?? privateKey).signature(for: Array(signingInput.utf8))
        return signingInput + "." + Self.base64URL(Array(signature.rawRepresentation))
    }

    func token(issuedAt: Double) -> String { token(iat: .integer(Int64(issuedAt))) }

    static func base64URL(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}

/// A running emulator with one key, one bundle id and one device, and helpers to build requests.
struct EmulatorFixture: Sendable {
    let emulator: APNsEmulator
    let clock: TestClock
    let key: TestSigningKey
    let bundleID = "com.example.liveline.demo"
    let token: String
    let apnsPort: Int
    let controlPort: Int
    let directory: String

    var topic: String { bundleID + ".push-type.liveactivity" }

    /// The provider token the fixture's pushes carry by default, issued when the fixture started.
    /// A real sender reuses one token for up to an hour; so do these tests (each signing makes
    /// a different token, and a connection may switch tokens only every 20 minutes).
    let providerToken: String

    func connect() async throws -> HTTP2TestConnection {
        try await HTTP2TestConnection.connect(port: apnsPort, caPEM: emulator.caCertificatePEM)
    }

    /// Valid headers for a Live Activity push, after `changes`: a `nil` value removes the header.
    func headers(providerToken: String? = nil, _ changes: [String: String?] = [:], extra: [(String, String)] = []) -> [(String, String)] {
        var headers: [(String, String)] = [
            ("authorization", "bearer \(providerToken ?? self.providerToken)"),
            ("apns-push-type", "liveactivity"),
            ("apns-topic", topic),
            ("apns-priority", "10"),
        ]
        for (name, value) in changes {
            headers.removeAll { $0.0 == name }
            if let value { headers.append((name, value)) }
        }
        return headers + extra
    }

    /// A push request to `token` (the fixture's device unless given).
    func push(
        _ payload: [UInt8], token: String? = nil, providerToken: String? = nil, _ changes: [String: String?] = [:],
        extra: [(String, String)] = []
    ) -> TestRequest {
        TestRequest(
            path: "/3/device/\(token ?? self.token)",
            headers: headers(providerToken: providerToken, changes, extra: extra),
            body: payload
        )
    }

    func shutdown() async throws {
        try await emulator.shutdown()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// Runs `body` with a started emulator, and shuts it down afterwards.
func withEmulator(
    historyLimit: Int = 10_000, configure: (inout APNsEmulatorConfiguration) -> Void = { _ in },
    _ body: (EmulatorFixture) async throws -> Void
) async throws {
    let directory = uniqueTemporaryURL(prefix: "liveline-emulator").path
    let clock = TestClock()
    var configuration = APNsEmulatorConfiguration(dataDirectory: directory)
    configuration.now = { clock.now }
    configuration.pushHistoryLimit = historyLimit
    configure(&configuration)
    var logger = Logger(label: "emulator-tests")
    logger.logLevel = .warning
    let emulator = try APNsEmulator(configuration: configuration, logger: logger)
    let key = TestSigningKey()
    emulator.registerSigningKey(teamID: key.teamID, keyID: key.keyID, publicKey: key.privateKey.publicKey)
    let bundleID = "com.example.liveline.demo"
    emulator.registerBundleID(bundleID)
    let token = emulator.addDevice(bundleID: bundleID)
    let ports = try await emulator.start()
    let fixture = EmulatorFixture(
        emulator: emulator, clock: clock, key: key, token: token, apnsPort: ports.apnsPort, controlPort: ports.controlPort,
        directory: directory, providerToken: key.token(issuedAt: clock.seconds)
    )
    do {
        try await body(fixture)
    } catch {
        try await fixture.shutdown()
        throw error
    }
    try await fixture.shutdown()
}

/// An APNs Live Activity payload.
func payload(
    event: String = "update", timestamp: Double, contentState: JSONValue = ["eta": 5], _ extra: [String: JSONValue] = [:]
) -> [UInt8] {
    var aps: [String: JSONValue] = [
        "event": .string(event), "timestamp": .integer(Int64(timestamp)), "content-state": contentState,
    ]
    for (key, value) in extra { aps[key] = value }
    return JSONValue.object(["aps": .object(aps)]).encoded
}

/// A payload given as raw JSON text.
func rawPayload(_ text: String) -> [UInt8] { Array(text.utf8) }
