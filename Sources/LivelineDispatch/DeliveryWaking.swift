/// Told when committed work waits for delivery — an accepted update or end, a new or rotated push token, an activity
/// the lifetime sweeper ended — so the engine looks for it at once rather than at its next poll.
public protocol DeliveryWaking: Sendable {
    /// Work for the engine was committed.
    func wake()
}

extension Dispatcher: DeliveryWaking {}

/// No engine to wake: the API alone (tests, or a node that only serves the API; the engines poll).
public struct NoDeliveryEngine: DeliveryWaking {
    /// Creates it.
    public init() {}
    /// Does nothing.
    public func wake() {}
}
