import Crypto

/// The numbers an app sees in place of the database's counters, which every app shares: the feed's positions (in event
/// ids and the feed's cursors), the ids of webhook deliveries and of timeline attempts. Shown as they are, two events
/// an hour apart would tell an app how many events every other app recorded in that hour.
///
/// Each app has its own keyed permutation (a four-round Feistel network, HMAC-SHA256 as its round function) of the
/// counters `1 ... 2⁵²` onto `2⁵² ..< 2⁵³`: one number for one counter, and back, and nothing learnt about the counters
/// between two numbers. Public numbers stay exact in a JSON double (below 2⁵³), and sit above every counter a database
/// gave before they existed, so a cursor issued earlier (a bare position) is still told apart and still read.
public struct PublicNumbers: Sendable {
    /// The counters that have a public number: `1 ... 2⁵²`.
    public static let counters: ClosedRange<Int64> = 1...(1 << 52)
    /// The public numbers: `2⁵² ..< 2⁵³`.
    public static let numbers: Range<Int64> = (1 << 52)..<(1 << 53)

    private static let halfBits: UInt64 = 26
    private static let halfMask: UInt64 = (1 << 26) - 1
    private static let rounds: UInt8 = 4

    private let key: SymmetricKey

    /// The numbers of the app `appID` under the store's `secret` (32 random bytes kept in the database).
    public init(secret: [UInt8], appID: String) {
        let derived = HMAC<SHA256>.authenticationCode(for: Array("liveline public numbers v1/\(appID)".utf8), using: SymmetricKey(data: secret))
        key = SymmetricKey(data: Array(derived))
    }

    /// The public number of `counter` (`1 ... 2⁵²`).
    public func number(for counter: Int64) -> Int64 {
        precondition(Self.counters.contains(counter), "a counter beyond 2^52")
        var left = UInt64(counter - 1) >> Self.halfBits
        var right = UInt64(counter - 1) & Self.halfMask
        for round in 0..<Self.rounds {
            (left, right) = (right, left ^ mix(round, right))
        }
        return Self.numbers.lowerBound + Int64((left << Self.halfBits) | right)
    }

    /// The counter whose public number is `number`, or nil for a number no counter has.
    public func counter(for number: Int64) -> Int64? {
        guard Self.numbers.contains(number) else { return nil }
        let value = UInt64(number - Self.numbers.lowerBound)
        var left = value >> Self.halfBits
        var right = value & Self.halfMask
        for round in (0..<Self.rounds).reversed() {
            (left, right) = (right ^ mix(round, left), left)
        }
        return Int64((left << Self.halfBits) | right) + 1
    }

    /// The round function: 26 bits of HMAC-SHA256 of the round and one half.
    private func mix(_ round: UInt8, _ half: UInt64) -> UInt64 {
        let input: [UInt8] = [round, UInt8(truncatingIfNeeded: half >> 24), UInt8(truncatingIfNeeded: half >> 16), UInt8(truncatingIfNeeded: half >> 8), UInt8(truncatingIfNeeded: half)]
        let code = HMAC<SHA256>.authenticationCode(for: input, using: key)
        return code.withUnsafeBytes { bytes in
            (UInt64(bytes[0]) << 24 | UInt64(bytes[1]) << 16 | UInt64(bytes[2]) << 8 | UInt64(bytes[3])) & Self.halfMask
        }
    }
}
