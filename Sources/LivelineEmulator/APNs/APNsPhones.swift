import Foundation
import LivelineCore

/// A simulated iPhone with the app installed: who it belongs to, its push-to-start token per attributes type, and
/// the Live Activities push-to-start pushes started on it (each with the update token the phone issued).
struct SimulatedIPhone: Sendable, Codable {
    var id: String
    /// The id the app registers with Liveline (defaults to ``id``).
    var deviceID: String
    var userID: String?
    /// Tags for targeting, a JSON object.
    var tags: JSONValue?
    var bundleID: String
    var order: Int
    /// The current push-to-start token per attributes type (`MatchAttributes` → 64 hex digits).
    var pushToStartTokens: [String: String]
    /// The update tokens of the activities started on this phone, in start order (each a device in the registry).
    var activityTokens: [String] = []
    /// Where the app registers, if it does.
    var registerWith: LivelineRegistrationTarget?
    /// The last device registration's outcome.
    var lastRegistration: RegistrationResult?
    /// Push-to-start pushes the phone ignored, and the last reason.
    var ignoredStartCount = 0
    var lastIgnoredStartReason: String?
    /// The iOS version, e.g. `"18.0"` (`nil` in phone files written before it was kept: `"18.0"`).
    var osVersion: String?

    /// The iOS version the phone runs.
    var version: String { osVersion ?? Self.defaultOSVersion }

    static let defaultOSVersion = "18.0"

    /// Whether the phone runs iOS 18 or later, and so subscribes Live Activities to broadcast channels.
    var supportsBroadcastChannels: Bool { Self.majorVersion(version) >= 18 }

    /// The major version of `"18.0"`, `"17.2.1"` or `"18"`; 0 when unreadable.
    static func majorVersion(_ version: String) -> Int {
        Int(version.split(separator: ".", maxSplits: 1).first ?? "") ?? 0
    }

    /// The `PUT /v1/devices/{deviceId}` the app makes with the phone as it is now.
    var deviceRegistration: RegistrationRequest {
        .iosDevice(deviceID: deviceID, userID: userID, tags: tags, pushToStartTokens: pushToStartTokens, osVersion: version)
    }
}

/// One push-to-start token: which phone and attributes type it belongs to, and when it was rotated away.
struct PushToStartToken: Sendable, Codable {
    var phoneID: String
    var attributesType: String
    /// Set once the phone rotated the token: pushes to it then get 410 `Unregistered`.
    var revokedAt: Date?
}

/// What a phone does with a push APNs accepted for one of its push-to-start tokens. Pure: the caller applies it.
///
/// Apple's own checks stop at headers, token and size (`PayloadEmpty`, `PayloadTooLarge`): APNs does not read the
/// `aps` of a Live Activity push. Everything below is the phone's business, so a start with a wrong
/// `attributes-type`, no `alert`, or a content state that does not decode is still answered 200 and then ignored.
enum PushToStartRule {
    enum Outcome: Sendable, Equatable {
        /// Start a Live Activity with this push.
        case start
        /// The phone ignores the push.
        case ignored(String)
    }

    /// - Parameters:
    ///   - decoded: the payload as ``LiveActivityState/decode(_:)`` read it.
    ///   - tokenAttributesType: the attributes type the push-to-start token was issued for.
    ///   - shownActivityIDs: the Liveline activity ids of the activities the phone still shows.
    static func evaluate(
        _ decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>, tokenAttributesType: String,
        shownActivityIDs: Set<String>
    ) -> Outcome {
        let push: LiveActivityState.DecodedPush
        switch decoded {
        case .failure(let why): return .ignored(why.message)
        case .success(let decoded): push = decoded
        }
        guard push.event == "start" else { return .ignored("\(push.event) sent to a push-to-start token") }
        guard push.attributesType == tokenAttributesType else {
            return .ignored("attributes-type \(push.attributesType ?? "") is not this token's \(tokenAttributesType)")
        }
        if let activityID = push.livelineActivityID, shownActivityIDs.contains(activityID) {
            return .ignored("activity \(activityID) is already shown on this phone")
        }
        return .start
    }
}

/// A simulated iPhone as the control API shows it.
public struct SimulatedPhoneDisplay: Sendable, Hashable, Codable {
    /// The phone's id in the emulator.
    public var id: String
    /// The device id the app registers with Liveline.
    public var deviceID: String
    /// The user id the app registers, if any.
    public var userID: String?
    /// The tags the app registers, if any.
    public var tags: JSONValue?
    /// The app's bundle id.
    public var bundleID: String
    /// The current push-to-start token per attributes type.
    public var pushToStartTokens: [String: String]
    /// The Live Activities started on the phone by push, in start order.
    public var activities: [PhoneLiveActivity]
    /// Where the app registers with Liveline, if it does (the publishable key included: it ships in every app).
    public var registerWith: LivelineRegistrationTarget?
    /// The last `PUT /v1/devices/{deviceId}` outcome.
    public var lastRegistration: RegistrationResult?
    /// Push-to-start pushes the phone ignored.
    public var ignoredStartCount: Int
    /// Why the last one was ignored.
    public var lastIgnoredStartReason: String?
    /// The iOS version the phone runs, e.g. `"18.0"`.
    public var osVersion: String

    enum CodingKeys: String, CodingKey {
        case id, userID = "userId", deviceID = "deviceId", tags, bundleID = "bundleId", pushToStartTokens, activities,
            registerWith, lastRegistration, ignoredStartCount, lastIgnoredStartReason, osVersion
    }

    /// Encodes every member, absent ones as `null`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(deviceID, forKey: .deviceID)
        try container.encode(userID, forKey: .userID)
        try container.encode(tags, forKey: .tags)
        try container.encode(bundleID, forKey: .bundleID)
        try container.encode(pushToStartTokens, forKey: .pushToStartTokens)
        try container.encode(activities, forKey: .activities)
        try container.encode(registerWith, forKey: .registerWith)
        try container.encode(lastRegistration, forKey: .lastRegistration)
        try container.encode(ignoredStartCount, forKey: .ignoredStartCount)
        try container.encode(lastIgnoredStartReason, forKey: .lastIgnoredStartReason)
        try container.encode(osVersion, forKey: .osVersion)
    }
}

/// A Live Activity a push-to-start push started on a simulated iPhone.
public struct PhoneLiveActivity: Sendable, Hashable, Codable {
    /// The update token the phone issued for the activity (also a device under `GET /devices/{token}`). A channel
    /// activity started without `"input-push-token": 1` has no update token: this is then a local key
    /// (`channel-…`, not hex, so no token push can reach it).
    public var updateToken: String
    /// The Liveline activity id from `attributes.liveline.activityId`, if the attributes carried one.
    public var activityID: String?
    /// The attributes type it was started with.
    public var attributesType: String
    /// Whether the start push asked for the token with `"input-push-token": 1` (iOS 18); the phone issues one either
    /// way, as iOS 17.2 did.
    public var inputPushTokenRequested: Bool
    /// The last `PUT /v1/activities/{activityId}/instances/{deviceId}` outcome.
    public var lastRegistration: RegistrationResult?
    /// What the phone shows for it.
    public var state: DisplayedActivity
    /// The broadcast channel the activity is subscribed to (`"input-push-channel"`, iOS 18), if any.
    public var channelID: String?

    enum CodingKeys: String, CodingKey {
        case updateToken, activityID = "activityId", attributesType, inputPushTokenRequested, lastRegistration, state
        case channelID = "channelId"
    }

    /// Encodes every member, absent ones as `null`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(updateToken, forKey: .updateToken)
        try container.encode(activityID, forKey: .activityID)
        try container.encode(attributesType, forKey: .attributesType)
        try container.encode(inputPushTokenRequested, forKey: .inputPushTokenRequested)
        try container.encode(lastRegistration, forKey: .lastRegistration)
        try container.encode(state, forKey: .state)
        try container.encode(channelID, forKey: .channelID)
    }
}
