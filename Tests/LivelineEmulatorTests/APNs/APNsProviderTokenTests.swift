import Crypto
import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// Provider tokens: signature, age, refresh rate, and verification cost.
@Suite("Provider tokens")
struct ProviderTokenTests {
    @Test("A token 61 minutes old by the injected clock is refused as expired, even after it was accepted")
    func expiresWithTime() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            #expect(try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 200)
            fixture.clock.advance(by: 59 * 60)
            #expect(try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 200)
            fixture.clock.advance(by: 2 * 60)
            let response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 403)
            #expect(response.reason == "ExpiredProviderToken")
            await connection.close()
        }
    }

    @Test("Switching to a token issued within 20 minutes of the last one on a connection is 429 TooManyProviderTokenUpdates")
    func tooManyUpdates() async throws {
        try await withEmulator { fixture in
            let first = try await fixture.connect()
            let start = fixture.clock.seconds
            #expect(try await first.send(fixture.push(payload(timestamp: start))).status == 200)

            fixture.clock.advance(by: 5 * 60)
            let early = fixture.key.token(issuedAt: fixture.clock.seconds)
            let refused = try await first.send(fixture.push(payload(timestamp: start + 1), providerToken: early))
            #expect(refused.status == 429)
            #expect(refused.reason == "TooManyProviderTokenUpdates")
            #expect(refused.header("retry-after") == nil)
            // The connection keeps its token: the old one still works there…
            #expect(try await first.send(fixture.push(payload(timestamp: start + 2))).status == 200)
            // …and the new one is fine on a connection of its own.
            let second = try await fixture.connect()
            #expect(try await second.send(fixture.push(payload(timestamp: start + 3), providerToken: early)).status == 200)

            fixture.clock.advance(by: 16 * 60)
            let later = fixture.key.token(issuedAt: fixture.clock.seconds)
            #expect(try await first.send(fixture.push(payload(timestamp: start + 4), providerToken: later)).status == 200)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 4)
            await first.close()
            await second.close()
        }
    }

    @Test("One stream until a request carries a valid provider token, then many (Apple: Establishing a connection to APNs)")
    func oneStreamBeforeToken() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let refused = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds), providerToken: "not.a.token"))
            #expect(refused.reason == "InvalidProviderToken")
            #expect(try await connection.streamLimits == [1], "a refused token opens nothing")
            #expect(try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 200)
            #expect(try await connection.streamLimits == [1, 1000])
            let results = try await connection.sendAll((1...20).map { fixture.push(payload(timestamp: fixture.clock.seconds + Double($0))) })
            #expect(results.allSatisfy { (try? $0.get().status) == 200 })
            #expect(try await connection.streamLimits == [1, 1000], "raised once")
            await connection.close()
        }
    }

    @Test("A token's signature is verified once, then served from the cache; registering a key clears it")
    func verificationIsCached() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let requests = (1...20).map { fixture.push(payload(timestamp: fixture.clock.seconds + Double($0))) }
            let results = try await connection.sendAll(requests)
            #expect(results.allSatisfy { (try? $0.get().status) == 200 })
            #expect(fixture.emulator.core.state.withLock { $0.tokenChecks.count } == 1)

            let other = P256.Signing.PrivateKey()
            fixture.emulator.registerSigningKey(teamID: "TEAMOTHER1", keyID: "KEYOTHER01", publicKey: other.publicKey)
            #expect(fixture.emulator.core.state.withLock { $0.tokenChecks.isEmpty })
            // A token refused for its unknown kid becomes valid once its key is registered.
            let key = TestSigningKey(teamID: "TEAMLATE01", keyID: "KEYLATE001")
            let token = key.token(issuedAt: fixture.clock.seconds)
            let second = try await fixture.connect()
            #expect(try await second.send(fixture.push(payload(timestamp: fixture.clock.seconds + 100), providerToken: token)).reason == "InvalidProviderToken")
            fixture.emulator.registerSigningKey(teamID: key.teamID, keyID: key.keyID, publicKey: key.privateKey.publicKey)
            #expect(try await second.send(fixture.push(payload(timestamp: fixture.clock.seconds + 101), providerToken: token)).status == 200)
            await connection.close()
            await second.close()
        }
    }

    @Test("The verifier reads RFC 7515 tokens and refuses every malformed part")
    func verifierUnit() {
        let key = TestSigningKey()
        let keys = [key.keyID: RegisteredSigningKey(teamID: key.teamID, keyID: key.keyID, publicKey: key.privateKey.publicKey)]
        guard case .valid(let verified) = ProviderTokenVerifier.check(key.token(iat: 1_800_000_000.5), keys: keys) else {
            Issue.record("a valid token was refused")
            return
        }
        #expect(verified.issuedAt == 1_800_000_000.5)
        #expect(verified.teamID == key.teamID)
        let valid = key.token(issuedAt: 1_800_000_000)
        let parts = valid.split(separator: ".").map(String.init)
        let broken = [
            "", "a.b", parts[0] + "." + parts[1], valid + ".x", parts[0] + "." + parts[1] + ".",
            parts[0] + "." + parts[1] + "." + TestSigningKey.base64URL(Array(repeating: 1, count: 64)),
            parts[0] + "." + parts[1] + "." + TestSigningKey.base64URL(Array(repeating: 1, count: 63)),
            TestSigningKey.base64URL(Array("[]".utf8)) + "." + parts[1] + "." + parts[2],
            parts[0] + "." + TestSigningKey.base64URL(Array("{\"iss\":\"TEAM123456\"}".utf8)) + "." + parts[2],
            parts[0] + "+" + "." + parts[1] + "." + parts[2],
        ]
        for token in broken {
            if case .valid = ProviderTokenVerifier.check(token, keys: keys) { Issue.record("accepted \(token)") }
        }
    }
}
