import Foundation

/// Where the server reads the current time. Injected so time rules are tested without sleeping.
public struct WallClock: Sendable {
    private let read: @Sendable () -> Date

    /// A clock that reads `read`.
    public init(_ read: @escaping @Sendable () -> Date) { self.read = read }

    /// The system clock.
    public static let system = WallClock { Date() }

    /// The current time.
    public func now() -> Date { read() }
}

extension Duration {
    /// The duration in seconds, as a `TimeInterval`.
    public var seconds: TimeInterval {
        TimeInterval(components.seconds) + TimeInterval(components.attoseconds) / 1e18
    }
}
