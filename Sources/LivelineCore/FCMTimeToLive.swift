import Foundation

extension FCMLiveUpdateMessage {
    /// How long FCM should keep a live update for an offline phone (`android.ttl`), in seconds: until the state's
    /// stale date (0 — now or never — once that has passed); without one, an hour for a start or update and eight hours
    /// for an end, so a phone that was offline still hears that the activity is over.
    public static func timeToLive(event: LiveActivityEvent, staleDate: Int64?, now: Date) -> Int64 {
        let nowSeconds = Int64(now.timeIntervalSince1970.rounded(.down))
        if let staleDate, event != .end {
            return min(max(0, staleDate - nowSeconds), 28 * 24 * 3600)
        }
        return event == .end ? 8 * 3600 : 3600
    }
}
