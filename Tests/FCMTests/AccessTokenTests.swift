import Crypto
import FCM
import Foundation
import LivelineTestSupport
import Testing
import _CryptoExtras

@Suite("FCM service account and access tokens")
struct AccessTokenTests {
    @Test("a service-account key file is read; its description never shows the key")
    func serviceAccount() throws {
        let account = try FCMServiceAccount(json: serviceAccountJSON())
        #expect(account.projectID == "demo-project")
        #expect(account.clientEmail == "sender@demo-project.iam.gserviceaccount.com")
        #expect(account.privateKeyID == "0123456789abcdef")
        #expect(account.tokenURI == "https://oauth2.googleapis.com/token")
        #expect(account.privateKey.publicKey.derRepresentation == fcmTestKey.publicKey.derRepresentation)
        let keyBody = fcmTestKey.pkcs8PEMRepresentation.split(separator: "\n")[1]
        for text in [account.description, account.debugDescription, "\(account)", String(reflecting: account)] {
            #expect(!text.contains(keyBody))
            #expect(text.contains("redacted"))
        }
        var dumped = ""
        dump(account, to: &dumped)
        #expect(!dumped.contains(keyBody))
    }

    @Test(
        "an invalid service account is refused, naming the member",
        arguments: [
            (serviceAccountJSON(omitting: ["client_email"]), "client_email"),
            (serviceAccountJSON(omitting: ["private_key"]), "private_key"),
            (serviceAccountJSON(omitting: ["project_id"]), "project_id"),
            (serviceAccountJSON(type: "authorized_user"), "type"),
            (serviceAccountJSON(tokenURI: "ftp://example.com/token"), "token_uri"),
            (serviceAccountJSON(privateKeyPEM: "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"), "private_key"),
            ("[1, 2]", "JSON object"),
            ("{", "JSON"),
        ]
    )
    func invalidServiceAccount(json: String, named: String) {
        let error = #expect(throws: FCMConfigurationError.self) { try FCMServiceAccount(json: json) }
        #expect(error?.description.contains(named) == true)
        #expect(error?.description.contains("BEGIN") == false)
    }

    @Test("the assertion is an RS256 JWT with Google's claims, verifiable with the public key")
    func assertion() throws {
        let account = try FCMServiceAccount(json: serviceAccountJSON())
        let tokens = FCMAccessTokens(serviceAccount: account, exchange: ScriptedExchange())
        let issuedAt = Date(timeIntervalSince1970: 1_800_000_000.7)
        let jwt = try tokens.makeAssertion(issuedAt: issuedAt)
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3)
        #expect(!jwt.contains("="))
        let header = try jsonObject(parts[0])
        #expect(header["alg"] as? String == "RS256")
        #expect(header["typ"] as? String == "JWT")
        #expect(header["kid"] as? String == "0123456789abcdef")
        let claims = try jsonObject(parts[1])
        #expect(claims["iss"] as? String == "sender@demo-project.iam.gserviceaccount.com")
        #expect(claims["scope"] as? String == "https://www.googleapis.com/auth/firebase.messaging")
        #expect(claims["aud"] as? String == "https://oauth2.googleapis.com/token")
        #expect((claims["iat"] as? NSNumber)?.int64Value == 1_800_000_000)
        #expect((claims["exp"] as? NSNumber)?.int64Value == 1_800_003_600)
        #expect(Set(claims.keys) == ["iss", "scope", "aud", "iat", "exp"])

        let signature = _RSA.Signing.RSASignature(rawRepresentation: try #require(base64URLDecode(parts[2])))
        let signingInput = Array("\(parts[0]).\(parts[1])".utf8)
        #expect(fcmTestKey.publicKey.isValidSignature(signature, for: SHA256.hash(data: signingInput), padding: .insecurePKCS1v1_5))
        let otherKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        #expect(!otherKey.publicKey.isValidSignature(signature, for: SHA256.hash(data: signingInput), padding: .insecurePKCS1v1_5))
        #expect(!fcmTestKey.publicKey.isValidSignature(signature, for: SHA256.hash(data: Array("x.y".utf8)), padding: .insecurePKCS1v1_5))
    }

    @Test("the token is cached and reused, and replaced five minutes before it expires")
    func cachingAndRefresh() async throws {
        let clock = TestClock()
        let exchange = ScriptedExchange(expiresIn: 3600)
        let tokens = FCMAccessTokens(serviceAccount: try FCMServiceAccount(json: serviceAccountJSON()), exchange: exchange, now: { clock.now })
        #expect(try await tokens.current() == "access-token-1")
        clock.advance(by: 1800)
        #expect(try await tokens.current() == "access-token-1")
        clock.advance(by: 3600 - 300 - 1800 - 1)
        #expect(try await tokens.current() == "access-token-1")
        #expect(exchange.calls.count == 1)
        clock.advance(by: 1)
        #expect(try await tokens.current() == "access-token-2")
        #expect(exchange.calls.count == 2)
        #expect(await tokens.exchangeCount == 2)
        #expect(await tokens.expiresAt == clock.now + 3600)

        // Each exchange signs a fresh assertion with the clock's time.
        let second = exchange.calls[1].assertion.split(separator: ".")[1]
        let claims = try jsonObject(second)
        #expect((claims["iat"] as? NSNumber)?.doubleValue == clock.now.timeIntervalSince1970)
        #expect(exchange.calls[1].tokenURI == "https://oauth2.googleapis.com/token")
    }

    @Test("a short-lived token is kept for at least half its lifetime")
    func shortLifetime() async throws {
        let clock = TestClock()
        let exchange = ScriptedExchange(expiresIn: 120)
        let tokens = FCMAccessTokens(serviceAccount: try FCMServiceAccount(json: serviceAccountJSON()), exchange: exchange, now: { clock.now })
        _ = try await tokens.current()
        clock.advance(by: 59)
        _ = try await tokens.current()
        #expect(exchange.calls.count == 1)
        clock.advance(by: 1)
        _ = try await tokens.current()
        #expect(exchange.calls.count == 2)
    }

    @Test("concurrent callers share one exchange")
    func singleFlight() async throws {
        let exchange = ScriptedExchange()
        exchange.hold()
        let tokens = FCMAccessTokens(serviceAccount: try FCMServiceAccount(json: serviceAccountJSON()), exchange: exchange)
        try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<20 { group.addTask { try await tokens.current() } }
            while exchange.calls.isEmpty { await Task.yield() }
            // Give every caller time to reach the actor while the exchange is held.
            for _ in 0..<2000 { await Task.yield() }
            try await Task.sleep(for: .milliseconds(50))
            exchange.release()
            var received: [String] = []
            for try await token in group { received.append(token) }
            #expect(received == Array(repeating: "access-token-1", count: 20))
        }
        #expect(exchange.calls.count == 1)
    }

    @Test("invalidate forces one new exchange; invalidating a replaced token changes nothing")
    func invalidate() async throws {
        let exchange = ScriptedExchange()
        let tokens = FCMAccessTokens(serviceAccount: try FCMServiceAccount(json: serviceAccountJSON()), exchange: exchange)
        let first = try await tokens.current()
        await tokens.invalidate(first)
        let second = try await tokens.current()
        #expect(second == "access-token-2")
        await tokens.invalidate(first)
        #expect(try await tokens.current() == second)
        await tokens.invalidate()
        #expect(try await tokens.current() == "access-token-3")
        #expect(exchange.calls.count == 3)
    }

    @Test("a failed exchange is not cached: the next call tries again")
    func failureNotCached() async throws {
        let exchange = ScriptedExchange()
        exchange.fail(with: FCMAuthenticationError(status: 400, error: "invalid_grant", errorDescription: "Invalid JWT Signature."))
        let tokens = FCMAccessTokens(serviceAccount: try FCMServiceAccount(json: serviceAccountJSON()), exchange: exchange)
        let error = await #expect(throws: FCMAuthenticationError.self) { try await tokens.current() }
        #expect(error?.error == "invalid_grant")
        #expect(error?.isRetryable == false)
        exchange.fail(with: nil)
        #expect(try await tokens.current() == "access-token-2")
        #expect(FCMAuthenticationError(status: 503, error: "x").isRetryable)
    }

    @Test("a refresh that fails while the token is still valid keeps it in use, and is tried again 30 s later")
    func failedRefreshKeepsTheToken() async throws {
        let clock = TestClock()
        let exchange = ScriptedExchange(expiresIn: 3600)
        let tokens = FCMAccessTokens(serviceAccount: try FCMServiceAccount(json: serviceAccountJSON()), exchange: exchange, now: { clock.now })
        #expect(try await tokens.current() == "access-token-1")
        clock.advance(by: 3600 - 300)
        exchange.fail(with: FCMAuthenticationError(status: 503, error: "backendError"))
        #expect(try await tokens.current() == "access-token-1", "FCM still takes it for five minutes")
        #expect(try await tokens.current() == "access-token-1")
        #expect(exchange.calls.count == 2, "not one exchange per send")
        clock.advance(by: 30)
        exchange.fail(with: nil)
        #expect(try await tokens.current() == "access-token-3")
        // Within a minute of its expiry a token is not used: the failure is the caller's.
        clock.advance(by: 3600 - 60)
        exchange.fail(with: FCMAuthenticationError(status: 503, error: "backendError"))
        await #expect(throws: FCMAuthenticationError.self) { try await tokens.current() }
    }
}
