import Foundation

/// The stale date Liveline gives a state when the caller gives none, so that a backend that stops
/// updating leaves the phone showing the state as out of date rather than as current.
///
/// The default is the acceptance time plus twice the activity's observed update interval (the time
/// since its previous state), bounded by ``minimum`` and ``maximum``; a first state, with no interval to
/// observe, gets ``first``. An explicit `staleDate` from the caller is always respected.
public struct StalenessPolicy: Sendable, Hashable {
    /// Seconds of freshness for a state that follows no earlier one.
    public var first: Int64
    /// The least seconds of freshness a default stale date gives.
    public var minimum: Int64
    /// The most seconds of freshness a default stale date gives.
    public var maximum: Int64
    /// The observed interval is multiplied by this.
    public var factor: Double

    /// The defaults: 1 hour for a first state; otherwise twice the interval, between 2 minutes and 4 hours.
    public init(first: Int64 = 3600, minimum: Int64 = 120, maximum: Int64 = 4 * 3600, factor: Double = 2) {
        self.first = first
        self.minimum = minimum
        self.maximum = max(minimum, maximum)
        self.factor = factor
    }

    /// The stale date (seconds since 1970) for a state accepted at `now` whose activity's previous state was accepted
    /// at `previous` (nil for a first state).
    public func staleDate(now: Date, previous: Date?) -> Int64 {
        let nowSeconds = APIDate.epochSeconds(now)
        guard let previous, previous <= now else { return nowSeconds + min(max(first, minimum), maximum) }
        let interval = now.timeIntervalSince(previous) * factor
        let seconds = Int64(min(Double(maximum), max(Double(minimum), interval.rounded(.up))))
        return nowSeconds + seconds
    }
}
