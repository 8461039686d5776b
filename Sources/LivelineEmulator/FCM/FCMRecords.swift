import Foundation
import LivelineCore

/// One `messages:send` request the FCM emulator received, and how it was answered.
public struct ReceivedFCMMessage: Sendable, Hashable, Codable {
    /// When the request arrived, by the emulator's clock.
    public var receivedAt: Date
    /// The project from the request's path.
    public var projectID: String
    /// `message.token`, when the body had a string there.
    public var token: String?
    /// The request body as text (invalid UTF-8 replaced).
    public var body: String
    /// The HTTP status answered.
    public var status: Int
    /// The FCM error code of an error answer (`UNREGISTERED`, `INVALID_ARGUMENT` …), or `UNAUTHENTICATED` for a 401.
    public var errorCode: String?
    /// The `error.message` of an error answer.
    public var errorMessage: String?
    /// The message name answered with a 200, `projects/<project>/messages/<id>`.
    public var messageName: String?
    /// For an accepted message, what the simulated phone did with it.
    public var verdict: PhoneVerdict?

    enum CodingKeys: String, CodingKey {
        case receivedAt, token, body, status, errorCode, errorMessage, messageName, verdict
        case projectID = "projectId"
    }

    /// Encodes every member, absent ones as `null`, so the JSON shape never changes.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(receivedAt, forKey: .receivedAt)
        try container.encode(projectID, forKey: .projectID)
        try container.encode(token, forKey: .token)
        try container.encode(body, forKey: .body)
        try container.encode(status, forKey: .status)
        try container.encode(errorCode, forKey: .errorCode)
        try container.encode(errorMessage, forKey: .errorMessage)
        try container.encode(messageName, forKey: .messageName)
        try container.encode(verdict, forKey: .verdict)
    }
}

/// The ongoing notification a simulated Android phone shows for one activity, as an app following Liveline's data
/// contract keeps it.
public struct AndroidLiveNotification: Sendable, Hashable, Codable {
    /// The `liveline_activity_id` the notification is keyed by.
    public var activityID: String
    /// Whether the notification is on screen: posted, not dismissed by the user, and not removed at its dismissal date.
    public var visible: Bool
    /// The last applied content state.
    public var contentState: JSONValue?
    /// The `liveline_sequence` of the last applied message.
    public var sequence: Int64?
    /// The `liveline_timestamp` of the last applied message.
    public var timestamp: Int64?
    /// The stale date of the last applied message, if it had one.
    public var staleDate: Date?
    /// Whether the stale date has passed.
    public var isStale: Bool
    /// The attributes type of an applied `start`.
    public var attributesType: String?
    /// The attributes of an applied `start`.
    public var attributes: JSONValue?
    /// When the first message was applied.
    public var postedAt: Date?
    /// When the last message was applied.
    public var updatedAt: Date?
    /// Whether an `end` was applied.
    public var ended: Bool
    /// When the `end` was applied.
    public var endedAt: Date?
    /// When the ended notification is removed (`liveline_dismissal_date`); an ended notification without one stays
    /// until the user dismisses it.
    public var dismissalDate: Date?
    /// Whether the user swiped the notification away; nothing more shows for this activity.
    public var dismissedByUser: Bool
    /// How many applied messages carried an alert.
    public var alertCount: Int
    /// The alert title of the last applied message that had an alert (of a localized one, its string resource's key).
    public var lastAlertTitle: String?
    /// The alert body of the last applied message that had an alert (of a localized one, its string resource's key).
    public var lastAlertBody: String?
    /// How many accepted messages for this activity the phone applied.
    public var appliedCount: Int
    /// How many accepted messages for this activity the phone ignored.
    public var ignoredCount: Int
    /// The `liveline_event` of the last applied message.
    public var lastEvent: String?
    /// Why the last ignored message was ignored.
    public var lastIgnoredReason: String?
    /// The last `PUT /v1/activities/{activityId}/instances/{deviceId}` outcome, when the start registered.
    public var lastRegistration: RegistrationResult?

    enum CodingKeys: String, CodingKey {
        case lastRegistration
        case visible, contentState, sequence, timestamp, staleDate, isStale, attributesType, attributes, postedAt, updatedAt,
            ended, endedAt, dismissalDate, dismissedByUser, alertCount, lastAlertTitle, lastAlertBody, appliedCount,
            ignoredCount, lastEvent, lastIgnoredReason
        case activityID = "activityId"
    }

    /// Encodes every member, absent ones as `null`, so the JSON shape never changes.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(activityID, forKey: .activityID)
        try container.encode(visible, forKey: .visible)
        try container.encode(contentState, forKey: .contentState)
        try container.encode(sequence, forKey: .sequence)
        try container.encode(timestamp, forKey: .timestamp)
        try container.encode(staleDate, forKey: .staleDate)
        try container.encode(isStale, forKey: .isStale)
        try container.encode(attributesType, forKey: .attributesType)
        try container.encode(attributes, forKey: .attributes)
        try container.encode(postedAt, forKey: .postedAt)
        try container.encode(updatedAt, forKey: .updatedAt)
        try container.encode(ended, forKey: .ended)
        try container.encode(endedAt, forKey: .endedAt)
        try container.encode(dismissalDate, forKey: .dismissalDate)
        try container.encode(dismissedByUser, forKey: .dismissedByUser)
        try container.encode(alertCount, forKey: .alertCount)
        try container.encode(lastAlertTitle, forKey: .lastAlertTitle)
        try container.encode(lastAlertBody, forKey: .lastAlertBody)
        try container.encode(appliedCount, forKey: .appliedCount)
        try container.encode(ignoredCount, forKey: .ignoredCount)
        try container.encode(lastEvent, forKey: .lastEvent)
        try container.encode(lastIgnoredReason, forKey: .lastIgnoredReason)
        try container.encode(lastRegistration, forKey: .lastRegistration)
    }
}

/// A simulated Android phone: an app installation's FCM registration token and its live-update notifications.
public struct SimulatedAndroidDevice: Sendable, Hashable, Codable {
    /// The FCM registration token.
    public var token: String
    /// The Firebase project the token belongs to.
    public var projectID: String
    /// When the device was registered.
    public var registeredAt: Date
    /// When the token was unregistered (the app uninstalled); later messages get 404 `UNREGISTERED`.
    public var unregisteredAt: Date?
    /// Accepted messages to this token.
    public var acceptedCount: Int
    /// Accepted messages that did not follow the live-update contract (no activity id, unreadable values).
    public var unusableCount: Int
    /// Why the last unusable message could not be used.
    public var lastUnusableReason: String?
    /// Accepted high-priority messages that posted or updated no notification (unusable, stale, ended or dismissed).
    /// FCM expects high priority to lead to a visible notification and demotes apps that often do otherwise, so a
    /// sender should keep this at zero.
    public var highPriorityWithoutNotificationCount: Int
    /// The notifications, one per activity, in the order they were first seen.
    public var notifications: [AndroidLiveNotification]
    /// The device id the app registers with Liveline (defaults to the token).
    public var deviceID: String?
    /// The user id the app registers, if any.
    public var userID: String?
    /// The tags the app registers, if any (a JSON object).
    public var tags: JSONValue?
    /// Where the app registers with Liveline, if it does.
    public var registerWith: LivelineRegistrationTarget?
    /// The last `PUT /v1/devices/{deviceId}` outcome.
    public var lastRegistration: RegistrationResult?

    enum CodingKeys: String, CodingKey {
        case deviceID = "deviceId", userID = "userId", tags, registerWith, lastRegistration
        case token, registeredAt, unregisteredAt, acceptedCount, unusableCount, lastUnusableReason,
            highPriorityWithoutNotificationCount, notifications
        case projectID = "projectId"
    }

    /// Encodes every member, absent ones as `null`, so the JSON shape never changes.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(token, forKey: .token)
        try container.encode(projectID, forKey: .projectID)
        try container.encode(registeredAt, forKey: .registeredAt)
        try container.encode(unregisteredAt, forKey: .unregisteredAt)
        try container.encode(acceptedCount, forKey: .acceptedCount)
        try container.encode(unusableCount, forKey: .unusableCount)
        try container.encode(lastUnusableReason, forKey: .lastUnusableReason)
        try container.encode(highPriorityWithoutNotificationCount, forKey: .highPriorityWithoutNotificationCount)
        try container.encode(notifications, forKey: .notifications)
        try container.encode(deviceID, forKey: .deviceID)
        try container.encode(userID, forKey: .userID)
        try container.encode(tags, forKey: .tags)
        try container.encode(registerWith, forKey: .registerWith)
        try container.encode(lastRegistration, forKey: .lastRegistration)
    }

    /// The notification for `activityID`, if the phone has seen that activity.
    public func notification(activityID: String) -> AndroidLiveNotification? {
        notifications.first { $0.activityID == activityID }
    }
}

/// Counts over everything the FCM emulator answered.
public struct FCMEmulatorStatistics: Sendable, Hashable, Codable {
    /// Every `messages:send` request.
    public var sendRequests: Int = 0
    /// Requests answered 200.
    public var accepted: Int = 0
    /// Accepted messages a simulated phone applied.
    public var applied: Int = 0
    /// Accepted messages a simulated phone ignored.
    public var ignored: Int = 0
    /// `messages:send` answers by HTTP status.
    public var byStatus: [Int: Int] = [:]
    /// `messages:send` error answers by error code.
    public var byErrorCode: [String: Int] = [:]
    /// Every `POST /token` request.
    public var tokenRequests: Int = 0
    /// Access tokens issued.
    public var tokensIssued: Int = 0
    /// Token requests refused, by OAuth error.
    public var tokenRefusals: [String: Int] = [:]

    /// Empty counts.
    public init() {}
}

/// The last `capacity` received messages, oldest overwritten first.
struct FCMMessageHistory: Sendable {
    let capacity: Int
    private var storage: [ReceivedFCMMessage] = []
    private var oldest = 0

    init(capacity: Int) {
        self.capacity = max(0, capacity)
        storage.reserveCapacity(min(self.capacity, 1024))
    }

    mutating func append(_ message: ReceivedFCMMessage) {
        guard capacity > 0 else { return }
        if storage.count < capacity {
            storage.append(message)
        } else {
            storage[oldest] = message
            oldest = (oldest + 1) % capacity
        }
    }

    /// Up to `limit` of the newest records that match, oldest of them first.
    func newest(limit: Int, where matches: (ReceivedFCMMessage) -> Bool) -> [ReceivedFCMMessage] {
        var found: [ReceivedFCMMessage] = []
        var offset = storage.count - 1
        while offset >= 0, found.count < limit {
            let message = storage[(oldest + offset) % storage.count]
            if matches(message) { found.append(message) }
            offset -= 1
        }
        return found.reversed()
    }
}

/// The platform of an app instance whose registration token the FCM emulator knows (``FCMEmulator/addDevice(projectID:token:deviceID:userID:tags:registerWith:platform:)``).
public enum FCMClientPlatform: String, Sendable, Hashable, Codable, CaseIterable {
    /// An Android app: its messages are delivered by FCM itself.
    case android
    /// An iOS app using FCM: its messages go through APNs, with the project's APNs certificate or key.
    case ios
    /// A web push registration: its messages go through the browser's push service, with the project's web push key.
    case web
}
