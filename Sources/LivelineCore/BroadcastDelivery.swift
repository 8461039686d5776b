/// How an activity's updates reach the iPhones watching it.
public enum ActivityDelivery: String, Sendable, Hashable, CaseIterable, Codable {
    /// One APNs request per instance, to each instance's own update token (every iOS version, and Android always).
    case token
    /// iOS 18: one broadcast request per update to the activity's APNs channel, whatever the number of subscribers;
    /// instances with their own token (iOS 17, a phone that started the activity with a token, Android) still get
    /// theirs, from the same update.
    case broadcast
}

/// What APNs keeps of a channel's broadcasts for a phone it cannot reach at once (Apple's `message-storage-policy`,
/// fixed when the channel is created).
public enum ChannelStoragePolicy: String, Sendable, Hashable, CaseIterable, Codable {
    /// Nothing is stored (policy 0): a higher publishing budget, and every broadcast must say `apns-expiration: 0`.
    case none
    /// The most recent message is stored (policy 1), for up to 8 hours (Apple).
    case mostRecent

    /// Apple's number for the policy.
    public var apnsValue: Int {
        switch self {
        case .none: 0
        case .mostRecent: 1
        }
    }

    /// The `apns-expiration` a broadcast on such a channel carries: 0 on a channel that stores nothing (Apple refuses
    /// anything else with `BadExpirationDate`), otherwise the state's own.
    public func broadcastExpiration(stateExpiration: Int64?) -> Int64? {
        switch self {
        case .none: 0
        case .mostRecent: stateExpiration
        }
    }
}

/// Where a broadcast activity's channel stands.
public enum ChannelStatus: String, Sendable, Hashable, CaseIterable, Codable {
    /// Created at APNs; broadcasts go to it.
    case active
    /// APNs answered `ChannelNotRegistered`: broadcasts stop (the subscribers cannot be moved to a new channel), and the
    /// activity shows it.
    case unregistered
    /// Deleted at APNs after the activity ended and left the screens.
    case deleted
}

extension Limits {
    /// The largest broadcast payload APNs accepts, in bytes (Apple: 5 KB).
    public static let maximumBroadcastPayloadBytes = 5120
    /// The most channels APNs keeps per app and environment (Apple).
    public static let maximumChannelsPerApp = 10_000
}

/// Whether an iPhone can subscribe a Live Activity to a broadcast channel: iOS 18 or later. A version Liveline cannot
/// read (or none) counts as older, so such a phone keeps its own token.
public enum BroadcastSupport {
    /// The first iOS major version with broadcast channels.
    public static let firstMajorVersion = 18

    /// Whether `osVersion` (as the app reports it, e.g. `"18.2"`, `"17.5.1"`) is iOS 18 or later.
    public static func supportsChannels(osVersion: String?) -> Bool {
        guard let osVersion, let major = osVersion.split(separator: ".").first.flatMap({ Int($0) }) else { return false }
        return major >= firstMajorVersion
    }
}
