import Foundation
import Synchronization

/// Fresh version 4 (random) UUIDs for identifiers that only have to be unique, without a system call each: the
/// `apns-id` of every push, the id of every HTTP request that came without one.
///
/// `UUID()` reads the system's random source for every value (on Linux it opens, reads and closes `/dev/urandom`),
/// which is a measurable share of a fan-out's CPU, and of every API request's. These identifiers are not secrets (APNs
/// echoes an `apns-id` so an answer can be matched to its push; a request id marks log lines), so the values come from
/// a xoshiro256** generator seeded once from the system's random source. Never use them for keys, tokens or secrets.
public enum RandomUUID {
    private static let generator = Mutex(Xoshiro256StarStar(seed: SystemRandomNumberGenerator()))

    /// The next identifier.
    public static func next() -> UUID {
        let (high, low) = generator.withLock { generator in (generator.next(), generator.next()) }
        return uuid(high: high, low: low)
    }

    /// The version 4, RFC 4122 variant UUID with these 128 bits (6 of them overwritten by the version and variant).
    static func uuid(high: UInt64, low: UInt64) -> UUID {
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &bytes) { raw in
            raw.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
            raw.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
            raw[6] = (raw[6] & 0x0F) | 0x40
            raw[8] = (raw[8] & 0x3F) | 0x80
        }
        return UUID(uuid: bytes)
    }
}

/// xoshiro256** (Blackman and Vigna): a small, fast generator with 256 bits of state. Not for secrets.
struct Xoshiro256StarStar: RandomNumberGenerator {
    private var s0, s1, s2, s3: UInt64

    /// A generator whose state comes from `source`.
    init(seed source: some RandomNumberGenerator) {
        var source = source
        repeat {
            (s0, s1, s2, s3) = (source.next(), source.next(), source.next(), source.next())
        } while s0 | s1 | s2 | s3 == 0
    }

    mutating func next() -> UInt64 {
        let result = (s1 &* 5).rotatedLeft(by: 7) &* 9
        let t = s1 << 17
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = s3.rotatedLeft(by: 45)
        return result
    }
}

extension UInt64 {
    fileprivate func rotatedLeft(by count: UInt64) -> UInt64 {
        (self << count) | (self >> (64 - count))
    }
}

extension UUID {
    /// The canonical 8-4-4-4-12 form in lowercase, built without intermediate strings.
    public var lowercasedString: String {
        let digits: StaticString = "0123456789abcdef"
        return withUnsafeBytes(of: uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { buffer in
                digits.withUTF8Buffer { hex in
                    var out = 0
                    for (index, byte) in bytes.enumerated() {
                        if index == 4 || index == 6 || index == 8 || index == 10 {
                            buffer[out] = UInt8(ascii: "-")
                            out += 1
                        }
                        buffer[out] = hex[Int(byte >> 4)]
                        buffer[out + 1] = hex[Int(byte & 0x0F)]
                        out += 2
                    }
                    return out
                }
            }
        }
    }
}
