import Crypto
import Foundation
import LivelineTestSupport
import Testing

@testable import APNs

@Suite("Provider tokens")
struct ProviderTokenTests {
    @Test("an ES256 JWT with kid, iss and a numeric iat, signed r||s")
    func tokenShape() throws {
        let key = makeSigningKey()
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: key, now: clock.closure)
        let jwt = try DecodedJWT(tokens.current())

        #expect(try jwt.header() == .init(alg: "ES256", kid: "KEY1234567"))
        #expect(try jwt.claims() == .init(iss: "TEAM123456", iat: 1_700_000_000))
        // iat is a JSON number, not a string.
        #expect(jwt.claimsJSON.contains(#""iat":1700000000"#))
        #expect(jwt.signature.count == 64)
        #expect(try jwt.verifies(with: key.privateKey.publicKey))
        #expect(try !jwt.verifies(with: P256.Signing.PrivateKey().publicKey))
        #expect(tokens.issuedAt == Date(timeIntervalSince1970: 1_700_000_000))
    }

    @Test("iat is whole seconds of the injected clock")
    func wholeSeconds() throws {
        let clock = TestClock(Date(timeIntervalSince1970: 1_700_000_123.9))
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        #expect(try DecodedJWT(tokens.current()).claims().iat == 1_700_000_123)
    }

    @Test("ids are JSON-escaped")
    func escaping() throws {
        let key = APNsSigningKey(teamID: #"TE"AM\1"#, keyID: "K", privateKey: P256.Signing.PrivateKey())
        let tokens = APNsProviderTokens(signingKey: key, now: TestClock(testStart).closure)
        let jwt = try DecodedJWT(tokens.current())
        #expect(try jwt.claims().iss == #"TE"AM\1"#)
    }

    @Test("reused until 50 minutes old, then replaced")
    func reuseAndRefresh() throws {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        #expect(tokens.issuedAt == nil)
        let first = tokens.current()
        let issued = try #require(tokens.issuedAt)

        for _ in 0..<49 {
            clock.advance(by: .seconds(60))
            #expect(tokens.current() == first)
        }
        clock.advance(by: .seconds(59))
        #expect(tokens.current() == first, "49:59 old is still fresh")
        #expect(tokens.issuedAt == issued)

        clock.advance(by: .seconds(1))
        let second = tokens.current()
        #expect(second != first, "50:00 old is replaced")
        #expect(try DecodedJWT(second).claims().iat == 1_700_000_000 + 50 * 60)
        #expect(tokens.issuedAt == issued.addingTimeInterval(50 * 60))

        // And the new one lives another 50 minutes: an hour and a half covered without sleeping.
        clock.advance(by: .seconds(49 * 60))
        #expect(tokens.current() == second)
        clock.advance(by: .seconds(60))
        #expect(tokens.current() != second)
    }

    @Test("refreshAfter is clamped to 20...60 minutes", arguments: [
        (Duration.seconds(60), Duration.seconds(20 * 60)),
        (Duration.seconds(0), Duration.seconds(20 * 60)),
        (Duration.seconds(30 * 60), Duration.seconds(30 * 60)),
        (Duration.seconds(2 * 60 * 60), Duration.seconds(60 * 60)),
    ])
    func clamping(asked: Duration, effective: Duration) {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), refreshAfter: asked, now: clock.closure)
        #expect(tokens.refreshAfter == effective)
        let first = tokens.current()
        clock.advance(by: effective - .seconds(1))
        #expect(tokens.current() == first)
        clock.advance(by: .seconds(1))
        #expect(tokens.current() != first)
    }

    @Test("refresh(replacing:) forces a new token only for the current one")
    func forcedRefresh() throws {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()

        clock.advance(by: .seconds(60))
        let second = tokens.refresh(replacing: first)
        #expect(second != first, "a 403 for the current token forces a new one at once")
        #expect(tokens.current() == second)
        #expect(tokens.issuedAt == Date(timeIntervalSince1970: 1_700_000_060))

        // More refusals of the old token (requests that were in flight with it) change nothing,
        // at any time before the normal refresh age: not even after 20 minutes, let alone before.
        #expect(tokens.refresh(replacing: first) == second)
        for _ in 0..<49 {
            clock.advance(by: .seconds(60))
            #expect(tokens.refresh(replacing: first) == second)
        }
        #expect(tokens.current() == second)
    }

    @Test("refresh(replacing:) of a replaced token still refreshes a due token")
    func replacedButDue() {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()
        let second = tokens.refresh(replacing: first)
        clock.advance(by: .seconds(50 * 60))
        let third = tokens.refresh(replacing: first)
        #expect(third != second)
        #expect(third != first)
        #expect(tokens.current() == third)
    }

    @Test("refresh(replacing:) is not rate limited for the current token, and never before 20 minutes otherwise")
    func noEarlyRefresh() {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()
        let second = tokens.refresh(replacing: first)
        // 19 minutes, asked with a replaced token: kept.
        clock.advance(by: .seconds(19 * 60))
        #expect(tokens.refresh(replacing: first) == second)
        #expect(tokens.refresh(replacing: "not a token we made") == second)
        #expect(tokens.current() == second)
    }

    @Test("N concurrent refusals of one token refresh it once")
    func concurrentRefusals() async {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let stale = tokens.current()
        let results = await withTaskGroup(of: String.self) { group in
            for _ in 0..<64 {
                group.addTask { tokens.refresh(replacing: stale) }
            }
            var all: Set<String> = []
            for await token in group {
                all.insert(token)
            }
            return all
        }
        #expect(results.count == 1)
        #expect(results.first != stale)
        #expect(results.first == tokens.current())
    }
}
