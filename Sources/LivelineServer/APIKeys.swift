import Crypto
import Foundation
import LivelineStore

/// Issues and verifies API keys.
///
/// A key reads `sk_<lookup><secret>` or `pk_<lookup><secret>`: 16 characters that find the
/// stored record, then 32 random characters. Only SHA-256 of the whole key is stored; a
/// presented key is hashed and compared to the stored hash in constant time.
public enum APIKeys {
    static let lookupLength = 16
    static let secretLength = 32
    static let alphabet = Array("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".utf8)

    /// A freshly issued key: the plain text (shown once) and the record to store.
    public struct Issued: Sendable {
        /// The key itself. Show it once; it is not stored.
        public var key: String
        /// What the Store keeps.
        public var record: APIKeyRecord
    }

    /// The prefix that marks a key's scope.
    public static func prefix(for scope: APIKeyScope) -> String {
        switch scope {
        case .secret: "sk_"
        case .publishable: "pk_"
        }
    }

    /// Issues a new key for `appID`.
    public static func issue(appID: String, scope: APIKeyScope, at now: Date) -> Issued {
        let lookup = randomString(length: lookupLength)
        let key = prefix(for: scope) + lookup + randomString(length: secretLength)
        let record = APIKeyRecord(id: lookup, appID: appID, scope: scope, hash: hash(key), createdAt: now)
        return Issued(key: key, record: record)
    }

    /// SHA-256 of the key.
    public static func hash(_ key: String) -> [UInt8] { Array(SHA256.hash(data: Data(key.utf8))) }

    /// Splits a presented key into its scope and lookup id, or `nil` if it cannot be a Liveline key.
    public static func parse(_ key: String) -> (scope: APIKeyScope, lookup: String)? {
        let bytes = Array(key.utf8)
        guard bytes.count == 3 + lookupLength + secretLength, bytes.allSatisfy(isAllowedByte(_:)) else { return nil }
        let scope: APIKeyScope
        switch String(decoding: bytes[0..<3], as: UTF8.self) {
        case "sk_": scope = .secret
        case "pk_": scope = .publishable
        default: return nil
        }
        guard bytes[3...].allSatisfy({ alphabet.contains($0) }) else { return nil }
        return (scope, String(decoding: bytes[3..<(3 + lookupLength)], as: UTF8.self))
    }

    /// Whether `key` is the key `record` was issued for. Constant time in the hash comparison.
    public static func verify(_ key: String, against record: APIKeyRecord) -> Bool {
        constantTimeEquals(hash(key), record.hash)
    }

    /// Compares two byte strings in time that depends only on their lengths.
    public static func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for index in a.indices { difference |= a[index] ^ b[index] }
        return difference == 0
    }

    /// A random string over the base-62 alphabet from the system's secure generator.
    public static func randomString(length: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(length)
        for _ in 0..<length { bytes.append(alphabet.randomElement(using: &generator)!) }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func isAllowedByte(_ byte: UInt8) -> Bool { byte > 0x20 && byte < 0x7F }
}
