import Foundation

/// Whether APNs' answers look like an app whose APNs environment does not match its builds, for a warning in the log.
///
/// Apple answers `BadDeviceToken` when "the token matches the environment" fails as well as for a token that is no
/// good: an app whose credentials say `production` while its phones run builds from Xcode (sandbox tokens), or the
/// other way round, has every push refused so, and every instance invalidated in one pass. The engine cannot tell the
/// two apart from one answer; a batch whose pushes were all refused with `BadDeviceToken`, none delivered, is the sign
/// worth a warning. Pure: the engine feeds it each batch's counts and logs when it says so.
struct EnvironmentMismatchWatch: Sendable {
    /// The least time between two warnings for one app.
    static let quietInterval: TimeInterval = 600

    private var lastWarned: [String: Date] = [:]

    /// Whether to warn now for `appID`, given one batch's iOS answers: `badDeviceTokens` refused with `BadDeviceToken`,
    /// `delivered` taken. At most once per app in ``quietInterval``.
    mutating func shouldWarn(appID: String, badDeviceTokens: Int, delivered: Int, at now: Date) -> Bool {
        guard badDeviceTokens > 0, delivered == 0 else { return false }
        if let last = lastWarned[appID], now.timeIntervalSince(last) < Self.quietInterval { return false }
        lastWarned[appID] = now
        return true
    }
}
