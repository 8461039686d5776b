import Foundation

/// How long a push service should keep a Live Activity push for a phone it cannot reach at once: until the state's
/// stale date (nothing — now or never — once that has passed); without one, an hour for a start or an update and
/// eight hours for an end, so a phone that was offline still hears that the activity is over.
///
/// Both push services are told the same: FCM as `android.ttl`, APNs as `apns-expiration`.
public enum LiveUpdateLifetime {
    /// The longest FCM keeps a message: 28 days.
    static let maximumSeconds: Int64 = 28 * 24 * 3600

    /// The lifetime in seconds from `now`; 0 means deliver now or never.
    public static func seconds(event: LiveActivityEvent, staleDate: Int64?, now: Date) -> Int64 {
        if let staleDate, event != .end {
            return min(max(0, staleDate - APIDate.epochSeconds(now)), maximumSeconds)
        }
        return event == .end ? 8 * 3600 : 3600
    }
}

extension FCMLiveUpdateMessage {
    /// `android.ttl` in seconds: the push's ``LiveUpdateLifetime``.
    public static func timeToLive(event: LiveActivityEvent, staleDate: Int64?, now: Date) -> Int64 {
        LiveUpdateLifetime.seconds(event: event, staleDate: staleDate, now: now)
    }
}

extension APNsLiveActivityPayload {
    /// The `apns-expiration` header's value, in seconds since 1970: `now` plus the push's ``LiveUpdateLifetime``, or 0
    /// (APNs tries once and does not store the push) when that is nothing.
    public static func expiration(event: LiveActivityEvent, staleDate: Int64?, now: Date) -> Int64 {
        let lifetime = LiveUpdateLifetime.seconds(event: event, staleDate: staleDate, now: now)
        return lifetime == 0 ? 0 : APIDate.epochSeconds(now) + lifetime
    }
}
