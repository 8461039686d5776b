import Foundation

/// What the phone reports about one Live Activity it shows.
public enum LivelineActivityEvent: Sendable, Hashable, Codable {
    /// The person (or the system) removed the activity: Liveline sends it nothing more.
    case dismissed
    /// The activity ended on the phone.
    case ended
    /// The person switched the app's "more frequent updates" setting (`frequentPushesEnabled`).
    case frequentPushes(enabled: Bool)

    /// The event's `type` on the wire: `dismissed`, `ended` or `frequentPushes`. The outbox keeps one event per
    /// activity and type.
    public var type: String {
        switch self {
        case .dismissed: "dismissed"
        case .ended: "ended"
        case .frequentPushes: "frequentPushes"
        }
    }
}

/// The device fields a `PUT /v1/devices/{deviceId}` sends. `nil` fields are left out, so the server keeps what it
/// stores; push-to-start tokens merge per attributes type.
public struct LivelineDeviceRegistration: Sendable, Hashable, Codable {
    /// The user the device belongs to.
    public var userID: String?
    /// Targeting tags (replace every stored tag when sent).
    public var tags: [String: String]?
    /// The OS version, e.g. `17.2.1`.
    public var osVersion: String?
    /// The locale, e.g. `en-US`.
    public var locale: String?
    /// The newest push-to-start token per attributes type, hexadecimal.
    public var pushToStartTokens: [String: String]

    /// Creates a registration.
    public init(
        userID: String? = nil, tags: [String: String]? = nil, osVersion: String? = nil, locale: String? = nil,
        pushToStartTokens: [String: String] = [:]
    ) {
        self.userID = userID
        self.tags = tags
        self.osVersion = osVersion
        self.locale = locale
        self.pushToStartTokens = pushToStartTokens
    }

    /// This registration with `newer` laid over it: each field `newer` gives wins, tokens merge per type.
    public func merging(_ newer: LivelineDeviceRegistration) -> LivelineDeviceRegistration {
        var merged = self
        if let userID = newer.userID { merged.userID = userID }
        if let tags = newer.tags { merged.tags = tags }
        if let osVersion = newer.osVersion { merged.osVersion = osVersion }
        if let locale = newer.locale { merged.locale = locale }
        merged.pushToStartTokens.merge(newer.pushToStartTokens) { _, new in new }
        return merged
    }
}

/// One call waiting in the outbox, as ``LivelineClient/pendingOperations()`` shows it.
public struct LivelineOperation: Sendable, Hashable, Codable {
    /// What the call does.
    public enum Kind: Sendable, Hashable, Codable {
        /// `PUT /v1/devices/{deviceId}`: the device's fields and push-to-start tokens (one such call at most waits).
        case registerDevice(LivelineDeviceRegistration)
        /// `PUT /v1/activities/{activityId}/instances/{deviceId}` with the activity's newest update token.
        case registerActivity(activityID: String, attributesType: String?, pushToken: String)
        /// `PUT /v1/activities/{activityId}/instances/{deviceId}` with the broadcast channel the Live Activity
        /// subscribed to (iOS 18, `pushType: .channel(channelID)`), instead of an update token.
        case subscribeActivity(activityID: String, attributesType: String?, channelID: String)
        /// `POST /v1/activities/{activityId}/instances/{deviceId}/events`, sent with `Idempotency-Key: idempotencyKey`.
        case report(activityID: String, event: LivelineActivityEvent, idempotencyKey: String)
    }

    /// What coalesces: the device call, one registration per activity, one event per activity and type.
    public enum Key: Sendable, Hashable, Codable {
        /// The device registration.
        case device
        /// The registration of one activity's instance.
        case activity(String)
        /// One event type for one activity.
        case event(activityID: String, type: String)
    }

    /// The call.
    public internal(set) var kind: Kind
    /// The order it was first recorded in (smaller is older).
    public internal(set) var sequence: Int
    /// Grows whenever a newer call is merged into this one; a send of an older revision does not complete it.
    public internal(set) var revision: Int
    /// Failed attempts so far.
    public internal(set) var attempts: Int
    /// Not sent again before this time (after a failed attempt).
    public internal(set) var notBefore: Date?
    /// Why the last attempt failed.
    public internal(set) var lastError: String?

    /// What the operation coalesces with.
    public var key: Key {
        switch kind {
        case .registerDevice: .device
        case .registerActivity(let activityID, _, _), .subscribeActivity(let activityID, _, _): .activity(activityID)
        case .report(let activityID, let event, _): .event(activityID: activityID, type: event.type)
        }
    }

    /// The Liveline activity the operation concerns (`nil` for the device registration).
    public var activityID: String? {
        switch kind {
        case .registerDevice: nil
        case .registerActivity(let activityID, _, _), .subscribeActivity(let activityID, _, _), .report(let activityID, _, _): activityID
        }
    }

    /// The order the outbox sends in: device, then instance registrations, then events.
    var rank: Int {
        switch kind {
        case .registerDevice: 0
        case .registerActivity, .subscribeActivity: 1
        case .report: 2
        }
    }
}

/// What happened to a call, for ``LivelineClient/events()``.
public enum LivelineEvent: Sendable, Hashable {
    /// The server accepted the call with `status`.
    case sent(LivelineOperation, status: Int)
    /// The call failed (transport error, 408, 429 or 5xx) and is sent again at `at`.
    case willRetry(LivelineOperation, at: Date, reason: String)
    /// The server refused the call for good (another 4xx): it is dropped. `code` is the server's `error.code`.
    case rejected(LivelineOperation, status: Int, code: String, message: String?)
    /// The outbox could not be written; the call is kept in memory only.
    case storageFailed(String)
}
