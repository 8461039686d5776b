import Foundation
import LivelineCore
import Testing

@Suite("Idempotency keys: the header's shape and the replay / reuse / perform decision")
struct IdempotencyTests {
    let t0 = Date(timeIntervalSince1970: 1_795_255_200)
    let fingerprint: [UInt8] = Array(repeating: 1, count: 32)
    let other: [UInt8] = Array(repeating: 2, count: 32)

    @Test(
        "valid keys: 1 to 255 printable ASCII characters",
        arguments: ["k", "0b5d9a3e-3c7a-4f5e-9d4e-2f1c8b7a6e5d", "order 1234 / retry #2", "!~", String(repeating: "x", count: 255)]
    )
    func validKeys(_ key: String) {
        #expect(IdempotencyKey.isValid(key))
        #expect(key.wholeMatch(of: try! Regex(IdempotencyKey.pattern)) != nil, "the documented pattern agrees")
    }

    @Test(
        "invalid keys: empty, too long, non-ASCII, control characters, a space first or last",
        arguments: ["", String(repeating: "x", count: 256), "clé", "tab\there", "new\nline", " lead", "trail ", " ", "\u{7F}"]
    )
    func invalidKeys(_ key: String) {
        #expect(!IdempotencyKey.isValid(key))
        #expect(key.wholeMatch(of: try! Regex(IdempotencyKey.pattern)) == nil, "the documented pattern agrees")
    }

    @Test("nothing remembered: perform")
    func nothingRemembered() {
        #expect(IdempotencyDecision.decide(remembered: nil, fingerprint: fingerprint, now: t0) == .perform)
    }

    @Test("the same request within 24 hours: replay; another request: refuse")
    func sameAndOther() {
        let remembered = (fingerprint: fingerprint, acceptedAt: t0)
        #expect(IdempotencyDecision.decide(remembered: remembered, fingerprint: fingerprint, now: t0) == .replay)
        #expect(IdempotencyDecision.decide(remembered: remembered, fingerprint: fingerprint, now: t0.addingTimeInterval(86_399)) == .replay)
        #expect(IdempotencyDecision.decide(remembered: remembered, fingerprint: other, now: t0.addingTimeInterval(60)) == .refuseReuse)
    }

    @Test("after 24 hours the key is free again, whatever the request")
    func expired() {
        let remembered = (fingerprint: fingerprint, acceptedAt: t0)
        #expect(IdempotencyDecision.decide(remembered: remembered, fingerprint: fingerprint, now: t0.addingTimeInterval(86_400)) == .perform)
        #expect(IdempotencyDecision.decide(remembered: remembered, fingerprint: other, now: t0.addingTimeInterval(90_000)) == .perform)
    }
}
