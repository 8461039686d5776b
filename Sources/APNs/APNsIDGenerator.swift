import Foundation
import Synchronization

/// Fresh `apns-id` values: version 4 (random) UUIDs, without a system call per push.
///
/// `UUID()` reads the system's random source for every value (on Linux it opens, reads and closes `/dev/urandom`),
/// which is a measurable share of a fan-out's CPU. An `apns-id` only has to be unique (APNs echoes it so an answer can
/// be matched to its push; it is not a secret), so the values come from a xoshiro256** generator seeded once from the
/// system's random source.
enum APNsIDGenerator {
    private static let generator = Mutex(Xoshiro256StarStar(seed: SystemRandomNumberGenerator()))

    /// The next identifier.
    static func next() -> UUID {
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
