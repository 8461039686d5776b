import Foundation

/// The rules of the `Idempotency-Key` header that a POST of the `/v1` API may carry.
///
/// A backend that retries a POST (after a timeout, a dropped connection, a crash of its own) sends the same key with
/// the same request; Liveline answers the retry with the first response and does nothing again. Keys are the caller's
/// to choose (a UUID is the usual choice) and belong to one app.
public enum IdempotencyKey {
    /// The request header's name.
    public static let headerName = "Idempotency-Key"
    /// The response header set, to `true`, on a replayed response.
    public static let replayedHeaderName = "Idempotent-Replayed"
    /// The longest key, in characters.
    public static let maximumLength = 255
    /// How long an accepted request is remembered under its key; after that the key may be used afresh.
    public static let retention: TimeInterval = 24 * 3600
    /// The key's shape as the OpenAPI document states it: 1 to 255 printable ASCII characters, the first and the last
    /// not a space (HTTP trims spaces around a header's value, so they could not arrive).
    public static let pattern = "^[!-~]([ -~]{0,253}[!-~])?$"

    /// The key under which a request is remembered. The backend's keys (`sk_…`) and the phones' (`pk_…`) are kept apart:
    /// the publishable key is public, and a phone that could take a key the backend uses (a predictable one such as
    /// `start-match-42`) would make the backend's request fail with `idempotency_key_reused` for a day. A phone's key
    /// is remembered behind a prefix that starts with DEL (`0x7F`), which no valid key holds, so the two never meet.
    public static func remembered(_ key: String, fromPublishableKey: Bool) -> String {
        fromPublishableKey ? "\u{7F}publishable:" + key : key
    }

    /// Whether `key` is a valid key: 1 to ``maximumLength`` printable ASCII characters (`0x20`–`0x7E`), neither the
    /// first nor the last a space.
    public static func isValid(_ key: String) -> Bool {
        let bytes = key.utf8
        guard let first = bytes.first, let last = bytes.last, bytes.count <= maximumLength else { return false }
        return first != 0x20 && last != 0x20 && bytes.allSatisfy { (0x20...0x7E).contains($0) }
    }
}

/// What to do with a request that carries an idempotency key, given what is remembered under that key.
///
/// The decision is pure; the Store takes it inside the transaction that would accept the request, so two requests
/// with one new key cannot both be accepted, and once more before validation, so a retry is answered even when the
/// request would now be refused (an `end` retried after the activity ended).
public enum IdempotencyDecision: Sendable, Hashable {
    /// Nothing (or nothing younger than ``IdempotencyKey/retention``) is remembered under the key: handle the request,
    /// and remember it with its response if it is accepted.
    case perform
    /// The same request was accepted under this key: answer with its response, do nothing else.
    case replay
    /// Another request was accepted under this key: refuse (`idempotency_key_reused`).
    case refuseReuse

    /// Decides for a request whose fingerprint (SHA-256 of its method, path and body) is `fingerprint`, at `now`, when
    /// `remembered` is what the key holds (its request's fingerprint and when it was accepted), if anything.
    public static func decide(
        remembered: (fingerprint: [UInt8], acceptedAt: Date)?, fingerprint: [UInt8], now: Date,
        retention: TimeInterval = IdempotencyKey.retention
    ) -> IdempotencyDecision {
        guard let remembered, now.timeIntervalSince(remembered.acceptedAt) < retention else { return .perform }
        return remembered.fingerprint == fingerprint ? .replay : .refuseReuse
    }
}
