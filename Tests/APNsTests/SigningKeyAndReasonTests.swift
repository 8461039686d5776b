import Crypto
import Foundation
import Testing

@testable import APNs

@Suite("APNsSigningKey")
struct SigningKeyTests {
    @Test("reads a PKCS#8 .p8 PEM")
    func readsP8() throws {
        let key = P256.Signing.PrivateKey()
        let pem = key.pemRepresentation
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let signingKey = try APNsSigningKey(teamID: "TEAM123456", keyID: "ABCDEFGHIJ", p8PEM: pem)
        #expect(signingKey.teamID == "TEAM123456")
        #expect(signingKey.keyID == "ABCDEFGHIJ")
        #expect(signingKey.privateKey.rawRepresentation == key.rawRepresentation)
    }

    @Test("tolerates surrounding whitespace, CRLF and literal \\n escapes")
    func tolerantFormatting() throws {
        let key = P256.Signing.PrivateKey()
        let pem = key.pemRepresentation
        let variants = [
            "\n  " + pem + "\n\n",
            pem.replacingOccurrences(of: "\n", with: "\r\n"),
            pem.replacingOccurrences(of: "\n", with: "\\n"),
        ]
        for variant in variants {
            let signingKey = try APNsSigningKey(teamID: "TEAM123456", keyID: "ABCDEFGHIJ", p8PEM: variant)
            #expect(signingKey.privateKey.rawRepresentation == key.rawRepresentation)
        }
    }

    @Test("a key that signs tokens the public key verifies")
    func signsTokens() throws {
        let key = P256.Signing.PrivateKey()
        let signingKey = try APNsSigningKey(teamID: "TEAM123456", keyID: "ABCDEFGHIJ", p8PEM: key.pemRepresentation)
        let tokens = APNsProviderTokens(signingKey: signingKey)
        #expect(try DecodedJWT(tokens.current()).verifies(with: key.publicKey))
    }

    @Test(
        "clear errors for anything else",
        arguments: [
            ("garbage", "BEGIN PRIVATE KEY"),
            ("", "BEGIN PRIVATE KEY"),
            (P256.Signing.PrivateKey().derRepresentation.base64EncodedString(), "BEGIN PRIVATE KEY"),
            (
                "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----",
                "not a PKCS#8 P-256"
            ),
            (P384.Signing.PrivateKey().pemRepresentation, "not a PKCS#8 P-256"),
            (
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----",
                "got a \"EC PRIVATE KEY\" block"
            ),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----",
                "got a \"CERTIFICATE\" block"
            ),
        ]
    )
    func rejects(pem: String, message: String) {
        let error = #expect(throws: APNsConfigurationError.self) {
            try APNsSigningKey(teamID: "TEAM123456", keyID: "ABCDEFGHIJ", p8PEM: pem)
        }
        #expect(error?.description.contains(message) == true, "\(error?.description ?? "")")
    }

    @Test("team and key ids must be 10 letters or digits", arguments: [
        ("TEAM12345", "ABCDEFGHIJ", "team id"),
        ("TEAM123456", "ABCDEFGHIJK", "key id"),
        ("TEAM-12345", "ABCDEFGHIJ", "team id"),
        ("TEAM123456", "", "key id"),
    ])
    func rejectsIDs(teamID: String, keyID: String, name: String) {
        let error = #expect(throws: APNsConfigurationError.self) {
            try APNsSigningKey(teamID: teamID, keyID: keyID, p8PEM: P256.Signing.PrivateKey().pemRepresentation)
        }
        #expect(error?.description.contains(name) == true)
    }
}

@Suite("Error reasons and dispositions")
struct ReasonTests {
    static let table: [(String, APNsErrorDisposition)] = [
        ("BadCollapseId", .terminal),
        ("BadDeviceToken", .invalidToken),
        ("BadExpirationDate", .terminal),
        ("BadMessageId", .terminal),
        ("BadPriority", .terminal),
        ("BadTopic", .terminal),
        ("DeviceTokenNotForTopic", .invalidToken),
        ("DuplicateHeaders", .terminal),
        ("IdleTimeout", .retryable),
        ("InvalidPushType", .terminal),
        ("MissingDeviceToken", .terminal),
        ("MissingTopic", .terminal),
        ("PayloadEmpty", .terminal),
        ("TopicDisallowed", .terminal),
        ("BadCertificate", .credentials),
        ("BadCertificateEnvironment", .credentials),
        ("ExpiredProviderToken", .credentials),
        ("Forbidden", .terminal),
        ("InvalidProviderToken", .credentials),
        ("MissingProviderToken", .credentials),
        ("UnrelatedKeyIdInToken", .credentials),
        ("BadEnvironmentKeyIdInToken", .credentials),
        ("BadPath", .terminal),
        ("MethodNotAllowed", .terminal),
        ("ExpiredToken", .invalidToken),
        ("Unregistered", .invalidToken),
        ("PayloadTooLarge", .terminal),
        ("TooManyProviderTokenUpdates", .retryable),
        ("TooManyRequests", .retryable),
        ("InternalServerError", .retryable),
        ("ServiceUnavailable", .retryable),
        ("Shutdown", .retryable),
    ]

    @Test("every documented reason has a constant and a disposition")
    func documented() {
        #expect(APNsErrorReason.allDocumented.count == Self.table.count)
        #expect(Set(APNsErrorReason.allDocumented.map(\.rawValue)) == Set(Self.table.map(\.0)))
        for (raw, disposition) in Self.table {
            let reason = APNsErrorReason(rawValue: raw)
            #expect(reason.disposition == disposition, "\(raw)")
            #expect(reason.knownDisposition == disposition, "\(raw)")
            // A documented reason decides regardless of the status it came with.
            for status in [400, 403, 410, 429, 500] {
                #expect(APNsErrorDisposition.disposition(status: status, reason: reason) == disposition)
                #expect(APNsErrorReason.disposition(status: status, reason: reason) == disposition)
            }
        }
    }

    @Test("constants are the documented strings")
    func constants() {
        #expect(APNsErrorReason.badDeviceToken.rawValue == "BadDeviceToken")
        #expect(APNsErrorReason.unrelatedKeyIdInToken.rawValue == "UnrelatedKeyIdInToken")
        #expect(APNsErrorReason.tooManyProviderTokenUpdates.description == "TooManyProviderTokenUpdates")
        #expect(APNsErrorReason.unknown("Unregistered") == .unregistered)
        #expect(APNsErrorReason.unknown("SomethingNew").rawValue == "SomethingNew")
    }

    @Test(
        "unknown or missing reasons are classified by status",
        arguments: [
            (410, APNsErrorDisposition.invalidToken),
            (429, .retryable),
            (500, .retryable),
            (502, .retryable),
            (503, .retryable),
            (599, .retryable),
            (403, .credentials),
            (400, .terminal),
            (404, .terminal),
            (405, .terminal),
            (413, .terminal),
            (418, .terminal),
        ]
    )
    func byStatus(status: Int, disposition: APNsErrorDisposition) {
        #expect(APNsErrorDisposition.disposition(status: status, reason: .unknown("SomethingNew")) == disposition)
        #expect(APNsErrorDisposition.disposition(status: status, reason: nil) == disposition)
        #expect(APNsResponse(status: status, reason: .unknown("SomethingNew")).disposition == disposition)
    }

    @Test("a success has no disposition")
    func success() {
        let response = APNsResponse(status: 200, apnsID: "x")
        #expect(response.isSuccess)
        #expect(response.disposition == nil)
        #expect(!APNsResponse(status: 410).isSuccess)
    }
}
