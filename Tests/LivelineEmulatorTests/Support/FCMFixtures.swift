import Crypto
import Foundation
import LivelineCore
import LivelineTestSupport
import Logging
import Testing
import _CryptoExtras

@testable import LivelineEmulator

/// A service account and the assertions it signs, written here from RFC 7523 and Google's "Using OAuth 2.0 for
/// Server to Server Applications", independently of Liveline's sender.
struct TestServiceAccount: Sendable {
    var clientEmail = "sender@demo-project.iam.gserviceaccount.com"
    var projectID = "demo-project"
    var keyID = "key-1"

    /// An RS256 JWT; every part can be bent to make a bad one.
    func assertion(
        audience: String, issuedAt: Double, lifetime: Double = 3600, scope: String = "https://www.googleapis.com/auth/firebase.messaging",
        alg: String = "RS256", issuer: String? = nil, signingKey: _RSA.Signing.PrivateKey? = nil
    ) -> String {
        let header: JSONValue = ["alg": .string(alg), "typ": "JWT", "kid": .string(keyID)]
        let claims: JSONValue = [
            "iss": .string(issuer ?? clientEmail), "scope": .string(scope), "aud": .string(audience),
            "iat": .integer(Int64(issuedAt)), "exp": .integer(Int64(issuedAt + lifetime)),
        ]
        let signingInput = TestSigningKey.base64URL(header.encoded) + "." + TestSigningKey.base64URL(claims.encoded)
        let signature = try! (signingKey ?? fcmTestKey).signature(for: SHA256.hash(data: Array(signingInput.utf8)), padding: .insecurePKCS1v1_5)
        return signingInput + "." + TestSigningKey.base64URL(Array(signature.rawRepresentation))
    }

    /// The form body of a JWT bearer grant.
    static func grant(_ assertion: String, grantType: String = "urn:ietf:params:oauth:grant-type:jwt-bearer") -> String {
        let allowed = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-._~"))
        return "grant_type=" + grantType.addingPercentEncoding(withAllowedCharacters: allowed)! + "&assertion="
            + assertion.addingPercentEncoding(withAllowedCharacters: allowed)!
    }
}

/// A running FCM emulator with one service account and one device, and helpers to build requests.
struct FCMFixture: Sendable {
    let emulator: FCMEmulator
    let clock: TestClock
    let account: TestServiceAccount
    let token: String
    let fcmPort: Int
    let controlPort: Int
    let directory: String
    let tokenURI: String
    /// An access token the emulator issued when the fixture started.
    let accessToken: String

    func connect() async throws -> HTTP2TestConnection {
        try await HTTP2TestConnection.connect(port: fcmPort, caPEM: emulator.caCertificatePEM)
    }

    /// `POST /token` with a form body.
    func tokenRequest(_ form: String, contentType: String = "application/x-www-form-urlencoded") -> TestRequest {
        TestRequest(path: "/token", headers: [("content-type", contentType)], body: Array(form.utf8))
    }

    /// `POST /v1/projects/<project>/messages:send`.
    func send(_ body: [UInt8], project: String? = nil, authorization: String?? = .none) -> TestRequest {
        var headers: [(String, String)] = [("content-type", "application/json")]
        switch authorization {
        case .none: headers.append(("authorization", "Bearer \(accessToken)"))
        case .some(.some(let value)): headers.append(("authorization", value))
        case .some(.none): break
        }
        return TestRequest(path: "/v1/projects/\(project ?? account.projectID)/messages:send", headers: headers, body: body)
    }

    /// Sends on a new connection and returns the answer.
    func answer(_ request: TestRequest) async throws -> TestResponse {
        let connection = try await connect()
        do {
            let response = try await connection.send(request)
            await connection.close()
            return response
        } catch {
            await connection.close()
            throw error
        }
    }

    func shutdown() async throws {
        try await emulator.shutdown()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

extension TestResponse {
    /// `error.details[FcmError].errorCode` of Google's error JSON.
    var fcmErrorCode: String? {
        let details = json?.objectValue?["error"]?.objectValue?["details"].flatMap { value -> [JSONValue]? in
            if case .array(let items) = value { return items }
            return nil
        }
        return details?.first { $0.objectValue?["@type"] == "type.googleapis.com/google.firebase.fcm.v1.FcmError" }?
            .objectValue?["errorCode"]?.stringValue
    }
    var googleStatus: String? { json?.objectValue?["error"]?.objectValue?["status"]?.stringValue }
    var googleMessage: String? { json?.objectValue?["error"]?.objectValue?["message"]?.stringValue }
    var oauthError: String? { json?.objectValue?["error"]?.stringValue }
}

/// Runs `body` with a started FCM emulator, and shuts it down afterwards.
func withFCMEmulator(accessTokenLifetime: TimeInterval = 3600, _ body: (FCMFixture) async throws -> Void) async throws {
    let directory = uniqueTemporaryURL(prefix: "liveline-fcm-emulator").path
    let clock = TestClock()
    var configuration = FCMEmulatorConfiguration(dataDirectory: directory)
    configuration.now = { clock.now }
    configuration.accessTokenLifetime = accessTokenLifetime
    var logger = Logger(label: "fcm-emulator-tests")
    logger.logLevel = .warning
    let emulator = try FCMEmulator(configuration: configuration, logger: logger)
    let account = TestServiceAccount()
    emulator.registerServiceAccount(
        clientEmail: account.clientEmail, projectID: account.projectID, publicKey: fcmTestKey.publicKey, privateKeyID: account.keyID
    )
    let token = emulator.addDevice(projectID: account.projectID)
    let ports = try await emulator.start()
    let tokenURI = try #require(emulator.tokenURI)
    let connection = try await HTTP2TestConnection.connect(port: ports.fcmPort, caPEM: emulator.caCertificatePEM)
    let granted = try await connection.send(
        TestRequest(
            path: "/token", headers: [("content-type", "application/x-www-form-urlencoded")],
            body: Array(TestServiceAccount.grant(account.assertion(audience: tokenURI, issuedAt: clock.seconds)).utf8)
        )
    )
    await connection.close()
    let accessToken = try #require(granted.json?.objectValue?["access_token"]?.stringValue)
    let fixture = FCMFixture(
        emulator: emulator, clock: clock, account: account, token: token, fcmPort: ports.fcmPort, controlPort: ports.controlPort,
        directory: directory, tokenURI: tokenURI, accessToken: accessToken
    )
    do {
        try await body(fixture)
    } catch {
        try await fixture.shutdown()
        throw error
    }
    try await fixture.shutdown()
}

/// A `messages:send` body carrying a live update as Liveline's Android data contract describes it, written out by
/// hand; `extraData` adds or replaces data entries and `android` replaces the android settings.
func liveUpdateBody(
    token: String, activity: String = "order-1234", event: String = "update", sequence: Int, state: String = #"{"eta":5}"#,
    timestamp: Int = 1_800_000_000, extraData: [String: JSONValue] = [:],
    android: JSONValue = ["priority": "high", "ttl": "3600s", "collapse_key": "order-1234"]
) -> [UInt8] {
    var data: [String: JSONValue] = [
        "liveline_activity_id": .string(activity), "liveline_event": .string(event), "liveline_sequence": .string(String(sequence)),
        "liveline_timestamp": .string(String(timestamp)), "liveline_content_state": .string(state),
    ]
    for (key, value) in extraData { data[key] = value }
    return JSONValue.object(["message": ["token": .string(token), "data": .object(data), "android": android]]).encoded
}
