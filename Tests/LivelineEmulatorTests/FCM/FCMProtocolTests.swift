import Foundation
import LivelineCore
import LivelineTestSupport
import Testing

@testable import LivelineEmulator

/// The FCM emulator's token endpoint and `messages:send`, through a real HTTP/2 + TLS client.
@Suite("FCM emulator protocol")
struct FCMProtocolTests {
    @Test("a well-formed assertion earns a Bearer access token valid for an hour")
    func goodAssertion() async throws {
        try await withFCMEmulator { fixture in
            let assertion = fixture.account.assertion(audience: fixture.tokenURI, issuedAt: fixture.clock.seconds)
            let response = try await fixture.answer(fixture.tokenRequest(TestServiceAccount.grant(assertion)))
            #expect(response.status == 200)
            let body = try #require(response.json?.objectValue)
            #expect(body["token_type"] == "Bearer")
            #expect(body["expires_in"] == 3600)
            let token = try #require(body["access_token"]?.stringValue)
            #expect(token != fixture.accessToken)
            #expect(fixture.emulator.statistics.tokensIssued == 2)
            // The cloud-platform scope grants messaging too.
            let broad = fixture.account.assertion(
                audience: fixture.tokenURI, issuedAt: fixture.clock.seconds, scope: "https://www.googleapis.com/auth/cloud-platform"
            )
            #expect(try await fixture.answer(fixture.tokenRequest(TestServiceAccount.grant(broad))).status == 200)
        }
    }

    enum BadAssertion: String, CaseIterable, Sendable {
        case otherKeySigned, wrongAudience, longLifetime, issuedInFuture, expired, wrongScope, unknownIssuer, hs256, tampered
    }

    @Test("a bad assertion is refused with Google's OAuth error")
    func badAssertions() async throws {
        try await withFCMEmulator { fixture in
            let connection = try await fixture.connect()
            for kind in BadAssertion.allCases {
                let response = try await connection.send(fixture.tokenRequest(TestServiceAccount.grant(Self.assertion(kind, fixture))))
                #expect(response.status == 400, "\(kind)")
                #expect(response.oauthError == (kind == .wrongScope ? "invalid_scope" : "invalid_grant"), "\(kind)")
                #expect(response.json?.objectValue?["error_description"]?.stringValue?.isEmpty == false, "\(kind)")
                if kind == .wrongAudience {
                    #expect(response.json?.objectValue?["error_description"]?.stringValue?.contains(fixture.tokenURI) == true)
                }
            }
            await connection.close()
            #expect(fixture.emulator.statistics.tokensIssued == 1)
            #expect(fixture.emulator.statistics.tokenRefusals.values.reduce(0, +) == BadAssertion.allCases.count)
        }
    }

    /// An assertion that is wrong in one way.
    static func assertion(_ kind: BadAssertion, _ fixture: FCMFixture) -> String {
        let account = fixture.account
        let now = fixture.clock.seconds
        let uri = fixture.tokenURI
        switch kind {
        case .otherKeySigned: return account.assertion(audience: uri, issuedAt: now, signingKey: fcmStrangerKey)
        case .wrongAudience: return account.assertion(audience: "https://oauth2.googleapis.com/token", issuedAt: now)
        case .longLifetime: return account.assertion(audience: uri, issuedAt: now, lifetime: 7200)
        case .issuedInFuture: return account.assertion(audience: uri, issuedAt: now + 600)
        case .expired: return account.assertion(audience: uri, issuedAt: now - 3700)
        case .wrongScope: return account.assertion(audience: uri, issuedAt: now, scope: "https://www.googleapis.com/auth/userinfo.email")
        case .unknownIssuer: return account.assertion(audience: uri, issuedAt: now, issuer: "someone@else.iam.gserviceaccount.com")
        case .hs256: return account.assertion(audience: uri, issuedAt: now, alg: "HS256")
        case .tampered:
            let good = account.assertion(audience: uri, issuedAt: now).split(separator: ".")
            let claims: JSONValue = [
                "iss": .string(account.clientEmail), "scope": "https://www.googleapis.com/auth/firebase.messaging",
                "aud": .string(uri), "iat": .integer(Int64(now)), "exp": .integer(Int64(now) + 60),
            ]
            return "\(good[0]).\(TestSigningKey.base64URL(claims.encoded)).\(good[2])"
        }
    }

    @Test("a token request that is not a JWT bearer grant is refused")
    func malformedGrant() async throws {
        try await withFCMEmulator { fixture in
            let assertion = fixture.account.assertion(audience: fixture.tokenURI, issuedAt: fixture.clock.seconds)
            let wrongType = try await fixture.answer(fixture.tokenRequest(TestServiceAccount.grant(assertion, grantType: "client_credentials")))
            #expect(wrongType.status == 400)
            #expect(wrongType.oauthError == "unsupported_grant_type")
            let noAssertion = try await fixture.answer(fixture.tokenRequest("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"))
            #expect(noAssertion.oauthError == "invalid_request")
            let json = try await fixture.answer(fixture.tokenRequest(TestServiceAccount.grant(assertion), contentType: "application/json"))
            #expect(json.oauthError == "invalid_request")
            // Unencoded colons are accepted too: form decoding leaves them as they are.
            let plain = "grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=\(assertion)"
            #expect(try await fixture.answer(fixture.tokenRequest(plain)).status == 200)
        }
    }

    @Test("a valid message is accepted with a message name")
    func accepted() async throws {
        try await withFCMEmulator { fixture in
            let response = try await fixture.answer(fixture.send(liveUpdateBody(token: fixture.token, sequence: 1)))
            #expect(response.status == 200)
            let name = try #require(response.json?.objectValue?["name"]?.stringValue)
            #expect(name.hasPrefix("projects/demo-project/messages/"))
            let record = try #require(fixture.emulator.messages(token: fixture.token).last)
            #expect(record.status == 200)
            #expect(record.messageName == name)
            #expect(record.verdict == .applied)
            // The enum's own spelling, a fractional TTL and a whole 4096-byte data map are accepted too.
            let upper = liveUpdateBody(
                token: fixture.token, sequence: 2, android: ["priority": "HIGH", "ttl": "3.5s", "collapse_key": "order-1234"]
            )
            #expect(try await fixture.answer(fixture.send(upper)).status == 200)
            #expect(try await fixture.answer(fixture.send(Self.body(token: fixture.token, dataBytes: 4096))).status == 200)
        }
    }

    @Test("validate_only checks a message without delivering it")
    func validateOnly() async throws {
        try await withFCMEmulator { fixture in
            let message = try #require(try JSONValue(parsing: liveUpdateBody(token: fixture.token, sequence: 1)).objectValue?["message"])
            let dryRun = JSONValue.object(["validate_only": true, "message": message]).encoded
            let response = try await fixture.answer(fixture.send(dryRun))
            #expect(response.status == 200)
            #expect(response.json?.objectValue?["name"] == "projects/demo-project/messages/fake_message_id")
            #expect(fixture.emulator.device(token: fixture.token)?.acceptedCount == 0)
            #expect(fixture.emulator.device(token: fixture.token)?.notifications.isEmpty == true)

            let notBool = JSONValue.object(["validate_only": "yes", "message": message]).encoded
            #expect(try await fixture.answer(fixture.send(notBool)).fcmErrorCode == "INVALID_ARGUMENT")
            let unknownToken = try #require(try JSONValue(parsing: liveUpdateBody(token: "nobody", sequence: 1)).objectValue?["message"])
            let dryUnknown = JSONValue.object(["validate_only": true, "message": unknownToken]).encoded
            #expect(try await fixture.answer(fixture.send(dryUnknown)).fcmErrorCode == "UNREGISTERED")
        }
    }

    /// A message whose data keys and values total exactly `dataBytes`.
    static func body(token: String, dataBytes: Int) -> [UInt8] {
        let key = "payload"
        return JSONValue.object(["message": ["token": .string(token), "data": [key: .string(String(repeating: "x", count: dataBytes - key.utf8.count))]]])
            .encoded
    }

    /// Bodies FCM refuses, each with what the error message must name; `"T"` stands for the device's token.
    static let invalidBodies: [(body: String, naming: String)] = [
        (#"not json"#, "JSON"),
        (#"[1]"#, "object"),
        (#"{"message":{"token":"T","data":{"n":5}}}"#, "message.data[\"n\"].value"),
        (#"{"message":{"token":"T","data":{"from":"me"}}}"#, "from"),
        (#"{"message":{"token":"T","data":{"google.sent_time":"1"}}}"#, "google.sent_time"),
        (#"{"message":{"token":"T","data":{"gcm.notification":"1"}}}"#, "gcm.notification"),
        (#"{"message":{"token":"T","data":{"message_type":"x"}}}"#, "message_type"),
        (#"{"message":{"token":"T","data":"text"}}"#, "message.data"),
        (#"{"message":{"token":"T","android":{"priority":"urgent"}}}"#, "message.android.priority"),
        (#"{"message":{"token":"T","android":{"priority":1}}}"#, "message.android.priority"),
        (#"{"message":{"token":"T","android":{"ttl":"3600"}}}"#, "message.android.ttl"),
        (#"{"message":{"token":"T","android":{"ttl":3600}}}"#, "message.android.ttl"),
        (#"{"message":{"token":"T","android":{"ttl":"-1s"}}}"#, "message.android.ttl"),
        (#"{"message":{"token":"T","android":{"ttl":"1.1234567890s"}}}"#, "message.android.ttl"),
        (#"{"message":{"token":"T","android":{"collapse_key":7}}}"#, "collapse_key"),
        (#"{"message":{"token":"T","android":{"colapse_key":"x"}}}"#, "colapse_key"),
        (#"{"message":{"token":"T","android":{"data":{"n":1}}}}"#, "message.android.data"),
        (#"{"message":{"token":"T","topic":"news"}}"#, "topic"),
        (#"{"message":{"data":{"a":"b"}}}"#, "Recipient"),
        (#"{"message":{"token":7}}"#, "message.token"),
        (#"{"message":{"token":"T","tokens":["a"]}}"#, "tokens"),
        (#"{"msg":{"token":"T"}}"#, "msg"),
        (#"{}"#, "message"),
    ]

    @Test("what FCM refuses gets 400 INVALID_ARGUMENT naming the problem")
    func invalidArgument() async throws {
        try await withFCMEmulator { fixture in
            let connection = try await fixture.connect()
            for (body, naming) in Self.invalidBodies {
                let text = body.replacingOccurrences(of: #""T""#, with: "\"\(fixture.token)\"")
                let response = try await connection.send(fixture.send(Array(text.utf8)))
                #expect(response.status == 400, "\(body)")
                #expect(response.googleStatus == "INVALID_ARGUMENT", "\(body)")
                #expect(response.fcmErrorCode == "INVALID_ARGUMENT", "\(body)")
                #expect(response.googleMessage?.contains(naming) == true, "\(body): \(response.googleMessage ?? "no message")")
                #expect(response.json?.objectValue?["error"]?.objectValue?["code"] == 400, "\(body)")
                // Every refusal of a message names a field (Google's BadRequest detail): only a token that is not a
                // registration token is answered with FCM's detail alone, which senders take for the token's fault.
                let details = response.json?.objectValue?["error"]?.objectValue?["details"]?.arrayValue ?? []
                #expect(details.contains { $0.objectValue?["@type"] == "type.googleapis.com/google.rpc.BadRequest" }, "\(body)")
            }
            await connection.close()
            #expect(fixture.emulator.device(token: fixture.token)?.acceptedCount == 0)
            #expect(fixture.emulator.statistics.byErrorCode == ["INVALID_ARGUMENT": Self.invalidBodies.count])
        }
    }

    @Test("data keys Google does not reserve are accepted, notification among them")
    func unreservedKeys() async throws {
        try await withFCMEmulator { fixture in
            let body = #"{"message":{"token":"\#(fixture.token)","data":{"notification":"1","fromage":"brie","my_google":"x"}}}"#
            let response = try await fixture.answer(fixture.send(Array(body.utf8)))
            #expect(response.status == 200, "\(response.googleMessage ?? "")")
        }
    }

    @Test("data over 4096 bytes is refused, naming the size")
    func tooBig() async throws {
        try await withFCMEmulator { fixture in
            let response = try await fixture.answer(fixture.send(Self.body(token: fixture.token, dataBytes: 4097)))
            #expect(response.status == 400)
            #expect(response.fcmErrorCode == "INVALID_ARGUMENT")
            #expect(response.googleMessage?.contains("4097") == true)
        }
    }

    @Test("without a valid, unexpired access token the answer is 401 UNAUTHENTICATED")
    func unauthenticated() async throws {
        try await withFCMEmulator { fixture in
            let body = liveUpdateBody(token: fixture.token, sequence: 1)
            for authorization: String? in [nil, "Bearer not-issued", "Basic abc", fixture.accessToken] {
                let response = try await fixture.answer(fixture.send(body, authorization: .some(authorization)))
                #expect(response.status == 401)
                #expect(response.googleStatus == "UNAUTHENTICATED")
            }
            fixture.clock.advance(by: 3599)
            #expect(try await fixture.answer(fixture.send(body)).status == 200)
            fixture.clock.advance(by: 1)
            let expired = try await fixture.answer(fixture.send(liveUpdateBody(token: fixture.token, sequence: 2)))
            #expect(expired.status == 401)
            #expect(expired.body.count > 0)
            #expect(String(decoding: expired.body, as: UTF8.self).contains("ACCESS_TOKEN_EXPIRED"))
            #expect(fixture.emulator.messages().last?.errorCode == "UNAUTHENTICATED")
        }
    }

    @Test("a project other than the service account's gets 403 PERMISSION_DENIED, without FCM's detail")
    func wrongProject() async throws {
        try await withFCMEmulator { fixture in
            let response = try await fixture.answer(fixture.send(liveUpdateBody(token: fixture.token, sequence: 1), project: "someone-else"))
            #expect(response.status == 403)
            #expect(response.fcmErrorCode == nil)
            #expect(response.googleStatus == "PERMISSION_DENIED")
            #expect(String(decoding: response.body, as: UTF8.self).contains("IAM_PERMISSION_DENIED"))
        }
    }

    @Test("unknown and unregistered tokens get 404 UNREGISTERED; another project's token 403 SENDER_ID_MISMATCH; a malformed one 400")
    func tokens() async throws {
        try await withFCMEmulator { fixture in
            let unknown = try await fixture.answer(fixture.send(liveUpdateBody(token: "never-registered", sequence: 1)))
            #expect(unknown.status == 404)
            #expect(unknown.fcmErrorCode == "UNREGISTERED")
            #expect(unknown.googleStatus == "NOT_FOUND")

            #expect(try await fixture.answer(fixture.send(liveUpdateBody(token: fixture.token, sequence: 1))).status == 200)
            fixture.emulator.unregisterDevice(token: fixture.token)
            let gone = try await fixture.answer(fixture.send(liveUpdateBody(token: fixture.token, sequence: 2)))
            #expect(gone.status == 404)
            #expect(gone.fcmErrorCode == "UNREGISTERED")
            #expect(fixture.emulator.device(token: fixture.token)?.unregisteredAt != nil)

            let foreign = fixture.emulator.addDevice(projectID: "other-project")
            let mismatch = try await fixture.answer(fixture.send(liveUpdateBody(token: foreign, sequence: 1)))
            #expect(mismatch.status == 403)
            #expect(mismatch.fcmErrorCode == "SENDER_ID_MISMATCH")
            // Not the form of a registration token at all: 400 INVALID_ARGUMENT with FCM's detail alone, as Google's
            // error page shows, no field violation.
            let malformed = try await fixture.answer(fixture.send(liveUpdateBody(token: "not/a.token!", sequence: 1)))
            #expect(malformed.status == 400)
            #expect(malformed.fcmErrorCode == "INVALID_ARGUMENT")
            #expect(malformed.googleMessage == "The registration token is not a valid FCM registration token")
            let details = malformed.json?.objectValue?["error"]?.objectValue?["details"]?.arrayValue ?? []
            #expect(details.count == 1)
            #expect(fixture.emulator.statistics.byErrorCode == ["UNREGISTERED": 2, "SENDER_ID_MISMATCH": 1, "INVALID_ARGUMENT": 1])
        }
    }

    @Test("the listener speaks HTTP/2 and unknown routes get Google's error JSON")
    func unknownRoute() async throws {
        try await withFCMEmulator { fixture in
            let response = try await fixture.answer(TestRequest(path: "/v1/projects/demo-project/messages:broadcast", body: Array("{}".utf8)))
            #expect(response.status == 404)
            #expect(response.googleStatus == "NOT_FOUND")
            let other = try await fixture.answer(TestRequest(method: "GET", path: "/nothing-here"))
            #expect(other.status == 404)
            #expect(other.json?.objectValue?["error"] != nil)
        }
    }
}
