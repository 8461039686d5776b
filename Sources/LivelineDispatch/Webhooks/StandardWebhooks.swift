import Crypto
import Foundation

/// Signing as the Standard Webhooks specification (standardwebhooks.com) says: a secret `whsec_<base64>`, and for each
/// message the headers `webhook-id`, `webhook-timestamp` (seconds since 1970) and
/// `webhook-signature: v1,<base64 of HMAC-SHA256 over "id.timestamp.body" with the secret's bytes>`.
public enum StandardWebhooks {
    /// The prefix of a signing secret.
    public static let secretPrefix = "whsec_"

    /// A new signing secret: 24 random bytes.
    public static func newSecret() -> String {
        secretPrefix + Data(SymmetricKey(size: .bits192).withUnsafeBytes { Array($0) }).base64EncodedString()
    }

    /// The key bytes of a `whsec_…` secret, or nil when it is not one.
    public static func key(of secret: String) -> [UInt8]? {
        guard secret.hasPrefix(secretPrefix), let data = Data(base64Encoded: String(secret.dropFirst(secretPrefix.count))), !data.isEmpty
        else { return nil }
        return Array(data)
    }

    /// The `webhook-signature` value for one message.
    public static func signature(key: [UInt8], id: String, timestamp: Int64, body: [UInt8]) -> String {
        var message = Array("\(id).\(timestamp).".utf8)
        message += body
        let mac = HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: key))
        return "v1," + Data(mac).base64EncodedString()
    }

    /// Whether `header` (space-separated `v1,<signature>` entries) holds a valid signature of the message, and its
    /// timestamp is within `tolerance` of `now` (replays are refused).
    public static func verify(
        key: [UInt8], id: String, timestamp: Int64, body: [UInt8], header: String, now: Date, tolerance: TimeInterval = 300
    ) -> Bool {
        guard abs(now.timeIntervalSince1970 - TimeInterval(timestamp)) <= tolerance else { return false }
        let expected = Array(signature(key: key, id: id, timestamp: timestamp, body: body).utf8)
        return header.split(separator: " ").contains { candidate in
            let given = Array(candidate.utf8)
            // Constant time over equal lengths.
            guard given.count == expected.count else { return false }
            return zip(given, expected).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
        }
    }
}
