import Foundation
import Synchronization

/// A wall clock the tests move by hand, safe to read from any thread.
///
/// Hand ``now`` to the code under test (as a `() -> Date` closure) wherever it takes a clock, then move time with
/// ``advance(by:)`` instead of sleeping.
public final class TestClock: Sendable {
    private let current: Mutex<Date>

    /// A clock that starts at `start` (by default 2027-01-15T08:00:00Z, 1,800,000,000 s after 1970).
    public init(_ start: Date = Date(timeIntervalSince1970: 1_800_000_000)) {
        current = Mutex(start)
    }

    /// The clock's current time.
    public var now: Date { current.withLock { $0 } }

    /// The clock's current time in seconds since 1970.
    public var seconds: Double { now.timeIntervalSince1970 }

    /// Moves the clock `seconds` forward (or back, when negative).
    public func advance(by seconds: TimeInterval) {
        current.withLock { $0 += seconds }
    }
}
