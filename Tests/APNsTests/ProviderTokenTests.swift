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

    @Test("refresh(replacing:) signs a new token for the current one once it is 20 minutes old, and only for the current one")
    func forcedRefresh() throws {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()

        clock.advance(by: .seconds(20 * 60))
        let renewal = tokens.refresh(replacing: first)
        #expect(renewal == .renewed(token: tokens.current()))
        let second = renewal.token
        #expect(second != first, "a 403 for the current token 20 minutes old forces a new one at once")
        #expect(renewal.replacedRefusedToken)
        #expect(tokens.issuedAt == Date(timeIntervalSince1970: 1_700_001_200))

        // More refusals of the old token (requests that were in flight with it) change nothing,
        // at any time before the normal refresh age.
        #expect(tokens.refresh(replacing: first) == .alreadyReplaced(token: second))
        for _ in 0..<49 {
            clock.advance(by: .seconds(60))
            #expect(tokens.refresh(replacing: first) == .alreadyReplaced(token: second))
        }
        #expect(tokens.current() == second)
    }

    @Test("a refused token younger than 20 minutes is kept (Apple: one renewal in 20 minutes), and its first refusal says so")
    func youngRefusedTokenKept() throws {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()
        clock.advance(by: .seconds(60))
        #expect(tokens.refresh(replacing: first) == .kept(token: first, age: .seconds(60), firstRefusal: true))
        #expect(!tokens.refresh(replacing: first).replacedRefusedToken)
        clock.advance(by: .seconds(18 * 60))
        #expect(tokens.refresh(replacing: first) == .kept(token: first, age: .seconds(19 * 60), firstRefusal: false))
        #expect(tokens.current() == first)
        // At 20 minutes a refusal renews it; the new token's own first refusal is reported again.
        clock.advance(by: .seconds(60))
        let second = tokens.refresh(replacing: first).token
        #expect(second != first)
        clock.advance(by: .seconds(1))
        #expect(tokens.refresh(replacing: second) == .kept(token: second, age: .seconds(1), firstRefusal: true))
    }

    @Test("refresh(replacing:) of a replaced token still refreshes a due token")
    func replacedButDue() {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()
        clock.advance(by: .seconds(20 * 60))
        let second = tokens.refresh(replacing: first).token
        clock.advance(by: .seconds(50 * 60))
        let third = tokens.refresh(replacing: first)
        #expect(third == .renewed(token: tokens.current()))
        #expect(third.token != second)
        #expect(third.token != first)
    }

    @Test("refresh(replacing:) never renews before 20 minutes, whichever token is named")
    func noEarlyRefresh() {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let first = tokens.current()
        clock.advance(by: .seconds(20 * 60))
        let second = tokens.refresh(replacing: first).token
        // 19 minutes, asked with a replaced token, an unknown one, or the current one: kept.
        clock.advance(by: .seconds(19 * 60))
        #expect(tokens.refresh(replacing: first).token == second)
        #expect(tokens.refresh(replacing: "not a token we made").token == second)
        #expect(tokens.refresh(replacing: second).token == second)
        #expect(tokens.current() == second)
    }

    @Test("N concurrent refusals of one token refresh it once")
    func concurrentRefusals() async {
        let clock = TestClock(testStart)
        let tokens = APNsProviderTokens(signingKey: makeSigningKey(), now: clock.closure)
        let stale = tokens.current()
        clock.advance(by: .seconds(25 * 60))
        let results = await withTaskGroup(of: String.self) { group in
            for _ in 0..<64 {
                group.addTask { tokens.refresh(replacing: stale).token }
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
