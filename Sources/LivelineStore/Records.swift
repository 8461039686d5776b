import Foundation
import LivelineCore

/// What deleting an app removed (``AppStore/deleteApp(id:leavingChannels:)``).
public struct AppDeletion: Sendable, Hashable {
    /// The app as it was.
    public var app: AppRecord
    /// Its activities, whatever their state.
    public var activities: Int
    /// Its devices.
    public var devices: Int
    /// The broadcast channels it still held at APNs, left there (only when deleted while leaving channels).
    public var channelsLeft: [String]

    public init(app: AppRecord, activities: Int, devices: Int, channelsLeft: [String]) {
        self.app = app
        self.activities = activities
        self.devices = devices
        self.channelsLeft = channelsLeft
    }
}

/// An app: one iOS bundle id and optionally one Android package, with its own keys and data.
public struct AppRecord: Sendable, Hashable {
    /// Liveline's id for the app (`app_…`).
    public var id: String
    /// A human name.
    public var name: String
    /// The iOS bundle id; APNs topics derive from it.
    public var bundleID: String
    /// The Android application id, if the app ships on Android.
    public var androidPackage: String?
    /// When the app was created.
    public var createdAt: Date
    /// The app's own priority-10 budget, overriding the server's; `nil` parts use the server's.
    public var budget: BudgetOverride = BudgetOverride()
    /// The app's defaults for activities that do not choose their delivery; `nil` parts use the server's.
    public var broadcastDefaults = BroadcastDefaults()
    /// Who may set a device's audience fields (`userId`, `tags`): the app with its publishable key, or only the backend.
    public var audienceFrom: AudienceSource = .app

    /// Creates an app record.
    public init(
        id: String, name: String, bundleID: String, androidPackage: String?, createdAt: Date, budget: BudgetOverride = BudgetOverride(),
        broadcastDefaults: BroadcastDefaults = BroadcastDefaults(), audienceFrom: AudienceSource = .app
    ) {
        self.audienceFrom = audienceFrom
        self.broadcastDefaults = broadcastDefaults
        self.budget = budget
        self.id = id
        self.name = name
        self.bundleID = bundleID
        self.androidPackage = androidPackage
        self.createdAt = createdAt
    }
}

/// Who may set the fields of a device that remote starts choose their audience by (`userId` and `tags`).
///
/// The publishable key ships in every copy of the app, so whoever extracts it can register a device of their own under
/// any user id or tags, and then receive the Live Activities started for that user or those tags. An app whose user ids
/// can be guessed, or whose starts carry private content, sets those fields from its backend instead.
public enum AudienceSource: String, Sendable, Hashable, CaseIterable {
    /// The app sets them with its publishable key (or the backend with its secret key): the default.
    case app
    /// Only the backend sets them, with its secret key; a registration with the publishable key that names them is
    /// refused. The app still registers its tokens.
    case backend
}

/// An app's defaults for broadcast delivery; `nil` parts fall back to the server's configuration.
public struct BroadcastDefaults: Sendable, Hashable {
    /// How activities that do not say are delivered.
    public var delivery: ActivityDelivery?
    /// What the channels of its broadcast activities store, unless the activity says.
    public var storagePolicy: ChannelStoragePolicy?

    public init(delivery: ActivityDelivery? = nil, storagePolicy: ChannelStoragePolicy? = nil) {
        self.delivery = delivery
        self.storagePolicy = storagePolicy
    }
}

/// An app's own hourly priority-10 budget; `nil` parts fall back to the server's configuration.
public struct BudgetOverride: Sendable, Hashable {
    public var hourly: Int?
    public var hourlyWithFrequentPushes: Int?

    public init(hourly: Int? = nil, hourlyWithFrequentPushes: Int? = nil) {
        self.hourly = hourly
        self.hourlyWithFrequentPushes = hourlyWithFrequentPushes
    }

    /// The budget in force: these values where set, `defaults` elsewhere.
    public func applied(to defaults: PriorityBudget) -> PriorityBudget {
        PriorityBudget(
            hourly: hourly ?? defaults.hourly,
            hourlyWithFrequentPushes: max(hourlyWithFrequentPushes ?? defaults.hourlyWithFrequentPushes, hourly ?? defaults.hourly),
            warningShare: defaults.warningShare
        )
    }
}

/// What an API key may do.
public enum APIKeyScope: String, Sendable, Hashable, CaseIterable {
    /// The backend's key (`sk_…`): everything within its app.
    case secret
    /// The app's key (`pk_…`): register instances and report instance events. Nothing else.
    case publishable
}

/// A stored API key: never the key itself, only its lookup id and a hash.
public struct APIKeyRecord: Sendable, Hashable {
    /// The public part of the key that finds its record (not secret on its own).
    public var id: String
    /// The app the key belongs to.
    public var appID: String
    /// What the key may do.
    public var scope: APIKeyScope
    /// SHA-256 of the whole key.
    public var hash: [UInt8]
    /// When the key was issued.
    public var createdAt: Date

    /// Creates a key record.
    public init(id: String, appID: String, scope: APIKeyScope, hash: [UInt8], createdAt: Date) {
        self.id = id
        self.appID = appID
        self.scope = scope
        self.hash = hash
        self.createdAt = createdAt
    }
}

/// One device registering (or refreshing) its push token for one activity.
public struct InstanceRegistration: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    public var deviceID: String
    public var platform: Platform
    /// The push token, already validated and normalized.
    public var pushToken: String
    /// The Swift type name of the activity's attributes; kept from the first registration.
    public var attributesType: String?
    /// The static attributes; kept from the first registration.
    public var attributes: JSONValue?
    /// The backend's user id for this device, if the app sends one.
    public var userID: String?
    /// The broadcast channel the phone subscribed the activity to (`pushType: .channel(id)`), instead of a token
    /// (``pushToken`` is then empty).
    public var channelID: String?

    /// Creates a registration.
    public init(
        appID: String, activityID: String, deviceID: String, platform: Platform, pushToken: String,
        attributesType: String?, attributes: JSONValue?, userID: String?, channelID: String? = nil
    ) {
        self.channelID = channelID
        self.appID = appID
        self.activityID = activityID
        self.deviceID = deviceID
        self.platform = platform
        self.pushToken = pushToken
        self.attributesType = attributesType
        self.attributes = attributes
        self.userID = userID
    }
}

/// What a registration changed.
public enum RegistrationChange: String, Sendable, Hashable {
    /// A new instance.
    case created
    /// An existing instance got a new token, platform or user id.
    case updated
    /// The same registration again: nothing changed.
    case unchanged
}

/// The result of a registration.
public struct RegistrationResult: Sendable, Hashable {
    public var change: RegistrationChange
    public var instance: InstanceRecord
    /// Whether the registration left the instance behind an accepted state (a newcomer to, or a new token on, an
    /// activity that has one): the delivery engine has work to do.
    public var needsDelivery: Bool

    public init(change: RegistrationChange, instance: InstanceRecord, needsDelivery: Bool = false) {
        self.change = change
        self.instance = instance
        self.needsDelivery = needsDelivery
    }
}

/// A new content state for an activity, validated.
public struct ActivityUpdate: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    public var contentState: JSONValue
    public var alert: LiveActivityAlert?
    /// Seconds since 1970.
    public var staleDate: Int64?
    public var relevanceScore: Double?
    /// 5 or 10; `nil` lets Liveline choose.
    public var priority: Int?
    /// The field kinds to remember for this activity (schema-less drift reports); `nil` keeps what is stored.
    public var contentShape: JSONShape?
    /// Seconds that must pass between two states sent to the phones (0 turns shaping off); `nil` keeps what is stored.
    public var minUpdateInterval: Double?

    public init(
        appID: String, activityID: String, contentState: JSONValue, alert: LiveActivityAlert? = nil,
        staleDate: Int64? = nil, relevanceScore: Double? = nil, priority: Int? = nil, contentShape: JSONShape? = nil,
        minUpdateInterval: Double? = nil
    ) {
        self.minUpdateInterval = minUpdateInterval
        self.appID = appID
        self.activityID = activityID
        self.contentState = contentState
        self.alert = alert
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.priority = priority
        self.contentShape = contentShape
    }
}

/// A registered content-state contract of one attributes type of one app.
public struct StoredSchema: Sendable, Hashable {
    public var appID: String
    public var attributesType: String
    /// The schema in its JSON form (``AttributesTypeSchema/json``).
    public var schema: JSONValue
    public var createdAt: Date
    public var updatedAt: Date

    public init(appID: String, attributesType: String, schema: JSONValue, createdAt: Date, updatedAt: Date) {
        self.appID = appID
        self.attributesType = attributesType
        self.schema = schema
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

/// One instance's priority-10 pushes and its frequent-updates setting.
public struct Priority10Usage: Sendable, Hashable {
    public var tally: Priority10Tally
    public var frequentPushes: Bool?

    public init(tally: Priority10Tally, frequentPushes: Bool?) {
        self.tally = tally
        self.frequentPushes = frequentPushes
    }
}

/// An activity's identity.
public struct ActivityKey: Sendable, Hashable {
    public var appID: String
    public var activityID: String

    public init(appID: String, activityID: String) {
        self.appID = appID
        self.activityID = activityID
    }
}

/// Why an activity ended.
public enum EndReason: String, Sendable, Hashable, CaseIterable {
    /// The backend ended it (`POST …/end` or `DELETE`).
    case caller
    /// Liveline ended it before the platform's limit (about 8 hours active).
    case lifetime
    /// Every instance was dismissed, ended on the device or invalidated.
    case allInstancesGone = "all-instances-gone"
}

/// The end of an activity, validated.
public struct ActivityEnd: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    /// The final content state; `nil` keeps the current one.
    public var contentState: JSONValue?
    public var alert: LiveActivityAlert?
    /// Seconds since 1970; `nil` lets the system decide (up to four hours).
    public var dismissalDate: Int64?
    public var staleDate: Int64?
    public var relevanceScore: Double?
    public var priority: Int?
    /// Why the activity ends.
    public var reason: EndReason

    public init(
        appID: String, activityID: String, contentState: JSONValue? = nil, alert: LiveActivityAlert? = nil,
        dismissalDate: Int64? = nil, staleDate: Int64? = nil, relevanceScore: Double? = nil, priority: Int? = nil,
        reason: EndReason = .caller
    ) {
        self.reason = reason
        self.appID = appID
        self.activityID = activityID
        self.contentState = contentState
        self.alert = alert
        self.dismissalDate = dismissalDate
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.priority = priority
    }
}

/// Who a remote start goes to: devices of the app, chosen by id, by user, by tags (all must match) or all of them.
public enum StartAudience: Sendable, Hashable {
    case deviceIDs([String])
    case userIDs([String])
    /// Devices carrying every one of these tags.
    case tags([String: String])
    case all

    /// The audience as stored and shown: `{"deviceIds": […]}`, `{"userIds": […]}`, `{"tags": {…}}` or `{"all": true}`.
    public var json: JSONValue {
        switch self {
        case .deviceIDs(let ids): .object(["deviceIds": .array(ids.map(JSONValue.string))])
        case .userIDs(let ids): .object(["userIds": .array(ids.map(JSONValue.string))])
        case .tags(let tags): .object(["tags": .object(tags.mapValues(JSONValue.string))])
        case .all: .object(["all": .bool(true)])
        }
    }

    /// The audience from its stored form (``json``), or `nil` when it is not one.
    public init?(json: JSONValue) {
        guard let members = json.objectValue, members.count == 1, let (key, value) = members.first else { return nil }
        switch key {
        case "deviceIds": self = .deviceIDs(value.arrayValue?.compactMap(\.stringValue) ?? [])
        case "userIds": self = .userIDs(value.arrayValue?.compactMap(\.stringValue) ?? [])
        case "tags": self = .tags(value.objectValue?.compactMapValues(\.stringValue) ?? [:])
        case "all": self = .all
        default: return nil
        }
    }
}

/// A remote start of an activity (push-to-start on iOS 17.2+, a start message on Android), validated.
public struct ActivityStart: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    /// The Swift type name of the activity's attributes: which push-to-start token of each device is used.
    public var attributesType: String
    /// The static attributes.
    public var attributes: JSONValue
    public var contentState: JSONValue
    /// The alert a start must carry (Apple requires one).
    public var alert: LiveActivityAlert
    /// Seconds since 1970.
    public var staleDate: Int64?
    public var relevanceScore: Double?
    public var audience: StartAudience
    /// The field kinds to remember for this activity (schema-less drift reports); `nil` keeps what is stored.
    public var contentShape: JSONShape?

    public init(
        appID: String, activityID: String, attributesType: String, attributes: JSONValue, contentState: JSONValue,
        alert: LiveActivityAlert, staleDate: Int64? = nil, relevanceScore: Double? = nil, audience: StartAudience,
        contentShape: JSONShape? = nil
    ) {
        self.appID = appID
        self.activityID = activityID
        self.attributesType = attributesType
        self.attributes = attributes
        self.contentState = contentState
        self.alert = alert
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.audience = audience
        self.contentShape = contentShape
    }
}

/// How many of a start's audience it reaches, counted when it is accepted.
public struct AudienceCounts: Sendable, Hashable {
    /// iPhones with a push-to-start token for the attributes type (or already watching the activity).
    public var ios: Int
    /// Android phones with an FCM token (or already watching the activity).
    public var android: Int
    /// Devices of the audience it does not reach: no usable token for the type, dismissed it, or (by id) unknown.
    public var skipped: Int

    public init(ios: Int, android: Int, skipped: Int) {
        self.ios = ios
        self.android = android
        self.skipped = skipped
    }
}

/// An accepted start: its sequence and who it reaches.
public struct AcceptedStart: Sendable, Hashable {
    public var sequence: AcceptedSequence
    public var counts: AudienceCounts

    public init(sequence: AcceptedSequence, counts: AudienceCounts) {
        self.sequence = sequence
        self.counts = counts
    }
}

/// Instances started remotely whose phones have not confirmed them within the allowed time.
public struct UnconfirmedStarts: Sendable, Hashable {
    /// How many there are in all.
    public var count: Int
    /// The first of them, by device id.
    public var instances: [InstanceRecord]

    public init(count: Int, instances: [InstanceRecord]) {
        self.count = count
        self.instances = instances
    }
}

/// An accepted sequence: what the API answers with its 202.
public struct AcceptedSequence: Sendable, Hashable {
    public var activityID: String
    public var sequence: Int64
    public var event: LiveActivityEvent
    public var acceptedAt: Date
    /// Whether the delivery engine has work from it: false for an update that created its activity, which nobody can
    /// watch yet (the Store writes it as delivered), so that waking the engines would only have them look and find
    /// nothing.
    public var needsDelivery: Bool

    public init(activityID: String, sequence: Int64, event: LiveActivityEvent, acceptedAt: Date, needsDelivery: Bool = true) {
        self.activityID = activityID
        self.sequence = sequence
        self.event = event
        self.acceptedAt = acceptedAt
        self.needsDelivery = needsDelivery
    }
}

/// An activity as stored: the latest accepted sequence and what it carries.
public struct ActivityRecord: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    public var attributesType: String?
    public var attributes: JSONValue?
    public var state: ActivityState
    /// The number of the latest accepted update or end; 0 before the first.
    public var sequence: Int64
    /// The event the latest sequence carries (`update` or `end`), `nil` before the first.
    public var event: LiveActivityEvent?
    /// When the latest sequence was accepted.
    public var sequenceAt: Date?
    /// The `aps.timestamp` of the latest sequence: seconds since 1970, strictly increasing per activity.
    public var timestampSeconds: Int64?
    /// Every active instance has been sent at least this sequence.
    public var dispatchedSequence: Int64
    public var contentState: JSONValue?
    public var alert: LiveActivityAlert?
    public var staleDate: Int64?
    public var relevanceScore: Double?
    public var priority: Int?
    public var dismissalDate: Int64?
    public var createdAt: Date
    public var updatedAt: Date
    public var endedAt: Date?
    /// Why it ended, once it has.
    public var endReason: EndReason?
    /// Rate shaping: seconds between two states sent to the phones; `nil` or 0 when off.
    public var minUpdateInterval: Double?
    /// The sequence the delivery engine last started sending, and when.
    public var lastSentSequence: Int64?
    public var lastSentAt: Date?
    /// The last time one of its instances reached the warning share of its priority-10 budget.
    public var budgetWarnedAt: Date?
    /// The field kinds remembered from its content states (activities without a schema).
    public var contentShape: JSONShape?
    /// How many instances are in each state.
    public var instanceCounts: [InstanceState: Int]
    /// The alert of the latest remote start: what a start push carries (a start needs one; the updates sent to
    /// instances already watching carry their own).
    public var startAlert: LiveActivityAlert?
    /// How its iPhones are reached: a token each, or (iOS 18) its broadcast channel plus the tokens of the rest.
    public var delivery: ActivityDelivery = .token
    /// Its APNs broadcast channel, once created (broadcast activities only).
    public var channel: BroadcastChannel?
    /// The sequence its last broadcast carried, or gave up on (0 before the first).
    public var broadcastSequence: Int64 = 0
    /// Its broadcasts at priority 10 over the last hour: each one drew down the budget of every iPhone subscribed to its
    /// channel, as a token push does its own phone's.
    public var broadcastPriority10 = Priority10Tally(packed: 0)

    public init(
        appID: String, activityID: String, attributesType: String?, attributes: JSONValue?, state: ActivityState,
        sequence: Int64, event: LiveActivityEvent?, sequenceAt: Date?, timestampSeconds: Int64? = nil, dispatchedSequence: Int64 = 0,
        contentState: JSONValue?,
        alert: LiveActivityAlert?, staleDate: Int64?, relevanceScore: Double?, priority: Int?,
        dismissalDate: Int64?, createdAt: Date, updatedAt: Date, endedAt: Date?, instanceCounts: [InstanceState: Int],
        endReason: EndReason? = nil, minUpdateInterval: Double? = nil, lastSentSequence: Int64? = nil, lastSentAt: Date? = nil,
        budgetWarnedAt: Date? = nil, contentShape: JSONShape? = nil, startAlert: LiveActivityAlert? = nil,
        delivery: ActivityDelivery = .token, channel: BroadcastChannel? = nil, broadcastSequence: Int64 = 0,
        broadcastPriority10: Priority10Tally = Priority10Tally(packed: 0)
    ) {
        self.delivery = delivery
        self.channel = channel
        self.broadcastSequence = broadcastSequence
        self.broadcastPriority10 = broadcastPriority10
        self.startAlert = startAlert
        self.budgetWarnedAt = budgetWarnedAt
        self.contentShape = contentShape
        self.endReason = endReason
        self.minUpdateInterval = minUpdateInterval
        self.lastSentSequence = lastSentSequence
        self.lastSentAt = lastSentAt
        self.appID = appID
        self.activityID = activityID
        self.attributesType = attributesType
        self.attributes = attributes
        self.state = state
        self.sequence = sequence
        self.event = event
        self.sequenceAt = sequenceAt
        self.timestampSeconds = timestampSeconds
        self.dispatchedSequence = dispatchedSequence
        self.contentState = contentState
        self.alert = alert
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.priority = priority
        self.dismissalDate = dismissalDate
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.endedAt = endedAt
        self.instanceCounts = instanceCounts
    }
}

/// One device watching one activity.
public struct InstanceRecord: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    public var deviceID: String
    public var platform: Platform
    public var pushToken: String
    public var userID: String?
    public var state: InstanceState
    /// What the app last reported for "frequent updates"; `nil` if never reported.
    public var frequentPushesEnabled: Bool?
    /// The last sequence delivered to this instance; 0 before the first.
    public var deliveredSequence: Int64
    public var createdAt: Date
    public var updatedAt: Date
    /// The instance's priority-10 pushes of the last hour or so.
    public var priority10: Priority10Tally
    /// The broadcast channel the instance subscribed to (an iPhone on iOS 18 or later): it takes the activity's
    /// broadcasts, not pushes to a token of its own (``pushToken`` is empty, or its push-to-start token until its start
    /// went out).
    public var channelID: String?
    /// The activity's pass counter when the instance joined it, took its token or became deliverable again: the marks
    /// of later passes speak for it (``DeliveryMark``).
    public var joinedPass: Int64

    public init(
        appID: String, activityID: String, deviceID: String, platform: Platform, pushToken: String, userID: String?,
        state: InstanceState, frequentPushesEnabled: Bool?, deliveredSequence: Int64, createdAt: Date, updatedAt: Date,
        priority10: Priority10Tally = Priority10Tally(packed: 0), channelID: String? = nil, joinedPass: Int64 = 0
    ) {
        self.joinedPass = joinedPass
        self.channelID = channelID
        self.priority10 = priority10
        self.appID = appID
        self.activityID = activityID
        self.deviceID = deviceID
        self.platform = platform
        self.pushToken = pushToken
        self.userID = userID
        self.state = state
        self.frequentPushesEnabled = frequentPushesEnabled
        self.deliveredSequence = deliveredSequence
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

/// Which activities a listing returns.
public struct ActivityFilter: Sendable, Hashable {
    public var state: ActivityState?
    public var attributesType: String?

    public init(state: ActivityState? = nil, attributesType: String? = nil) {
        self.state = state
        self.attributesType = attributesType
    }
}

/// One page of a keyset-paginated listing.
public struct Page<Item: Sendable>: Sendable {
    public var items: [Item]
    /// Pass this back to get the next page; `nil` on the last page.
    public var nextCursor: String?

    public init(items: [Item], nextCursor: String?) {
        self.items = items
        self.nextCursor = nextCursor
    }
}

extension Page: Equatable where Item: Equatable {}
extension Page: Hashable where Item: Hashable {}

/// What the Store refuses.
public enum StoreError: Error, Sendable, Hashable {
    case appNotFound
    case activityNotFound
    case instanceNotFound
    case activityEnded
    /// A start names another attributes type than the activity has.
    case attributesTypeMismatch(existing: String)
    case duplicateApp
    case invalidCursor
    /// An `Idempotency-Key` already holds another request of the app, accepted within the last 24 hours.
    case idempotencyKeyReused
    /// A device registered again with another platform than it was first registered with.
    case platformMismatch(registered: Platform)
    /// The activity is reached another way (`delivery` is set by the start or first update that created it).
    case deliveryMismatch(existing: ActivityDelivery)
    /// The app holds as many broadcast channels as it may.
    case channelLimitReached(maximum: Int)
    /// The instance names a channel the activity does not have.
    case channelMismatch
    /// The database holds data written by a newer Liveline.
    case schemaTooNew(found: Int, supported: Int)
    /// The app still holds `count` broadcast channels at APNs: deleting it would leave them there.
    case channelsHeld(count: Int)
}

extension StoreError: CustomStringConvertible {
    /// A sentence for an operator (the API answers its own JSON errors).
    public var description: String {
        switch self {
        case .schemaTooNew(let found, let supported):
            "The database was written by a newer Liveline (its schema is at version \(found); this one knows up to \(supported)). Run that release or a newer one; this one would not know what the newer steps changed."
        case .appNotFound: "No such app."
        case .activityNotFound: "No such activity."
        case .instanceNotFound: "No such instance."
        case .activityEnded: "The activity has ended."
        case .attributesTypeMismatch(let existing): "The activity has attributes type '\(existing)'."
        case .duplicateApp: "An app with this id exists."
        case .invalidCursor: "The cursor is not one this server issued."
        case .idempotencyKeyReused: "The Idempotency-Key holds another request."
        case .platformMismatch(let registered): "The device is registered as '\(registered.rawValue)'."
        case .deliveryMismatch(let existing): "The activity is delivered by '\(existing.rawValue)'."
        case .channelLimitReached(let maximum): "The app holds its \(maximum) broadcast channels."
        case .channelMismatch: "The channel is not the activity's."
        case .channelsHeld(let count): "The app still holds \(count) broadcast channel\(count == 1 ? "" : "s") at APNs."
        }
    }
}

extension ActivityRecord {
    /// What the activity's next state depends on (``LiveActivityState/update(activityID:after:contentState:staleDate:relevanceScore:alert:now:)``
    /// and ``LiveActivityState/end(activityID:after:contentState:staleDate:relevanceScore:alert:dismissalDate:now:)``).
    public var head: ActivityHead {
        ActivityHead(
            state: state, sequence: sequence, timestamp: timestampSeconds, contentState: contentState, staleDate: staleDate,
            relevanceScore: relevanceScore
        )
    }

    /// The activity's current state as the phones receive it, or `nil` before its first state.
    public var currentState: LiveActivityState? {
        guard let contentState, let event else { return nil }
        return LiveActivityState(
            activityID: activityID, event: event, sequence: sequence,
            timestamp: timestampSeconds ?? APIDate.epochSeconds(sequenceAt ?? createdAt), contentState: contentState,
            staleDate: staleDate, relevanceScore: relevanceScore, alert: alert, dismissalDate: dismissalDate
        )
    }
}

/// How one optional field of a registration changes the stored value: kept when the request leaves the field out,
/// set when it gives a value, cleared when it gives JSON `null`.
public enum FieldUpdate<Value: Sendable & Hashable>: Sendable, Hashable {
    /// The field was absent: the stored value stays.
    case keep
    /// The field was given: it replaces the stored value.
    case set(Value)
    /// The field was `null`: the stored value is removed.
    case clear

    /// The value after applying this change to `current`.
    public func applied(to current: Value?) -> Value? {
        switch self {
        case .keep: current
        case .set(let value): value
        case .clear: nil
        }
    }
}

/// An installation of the app registering (or refreshing) itself: the audience of remote starts.
///
/// Already validated and normalized (iOS tokens lowercased). A device's platform never changes: registering an existing
/// device id with another platform is refused (``StoreError/platformMismatch``).
public struct DeviceRegistration: Sendable, Hashable {
    public var appID: String
    /// The installation's id, chosen by the SDK.
    public var deviceID: String
    public var platform: Platform
    /// The backend's user id for this installation.
    public var userID: FieldUpdate<String>
    /// String tags for targeting; `nil` keeps the stored tags, a dictionary (even empty) replaces them all.
    public var tags: [String: String]?
    /// iOS push-to-start tokens by attributes type, merged per type: a token replaces the type's token (and clears a
    /// drop), `nil` removes the type, types not mentioned are kept.
    public var pushToStartTokens: [String: String?]
    /// Android: the FCM registration token; a new value clears a drop.
    public var fcmToken: FieldUpdate<String>
    public var osVersion: FieldUpdate<String>
    public var locale: FieldUpdate<String>

    /// Creates a registration; every field left out keeps what is stored.
    public init(
        appID: String, deviceID: String, platform: Platform, userID: FieldUpdate<String> = .keep, tags: [String: String]? = nil,
        pushToStartTokens: [String: String?] = [:], fcmToken: FieldUpdate<String> = .keep, osVersion: FieldUpdate<String> = .keep,
        locale: FieldUpdate<String> = .keep
    ) {
        self.appID = appID
        self.deviceID = deviceID
        self.platform = platform
        self.userID = userID
        self.tags = tags
        self.pushToStartTokens = pushToStartTokens
        self.fcmToken = fcmToken
        self.osVersion = osVersion
        self.locale = locale
    }
}

/// An iOS device's push-to-start token for one attributes type (iOS 17.2+): what starts a Live Activity remotely.
public struct PushToStartToken: Sendable, Hashable {
    /// The Swift type name of the ActivityAttributes this token starts.
    public var attributesType: String
    /// The token, hexadecimal, lowercased.
    public var token: String
    /// When the device last registered this token.
    public var updatedAt: Date
    /// When APNs rejected the token (410, `BadDeviceToken`); `nil` while it is usable.
    public var droppedAt: Date?
    /// APNs's reason for the rejection.
    public var dropReason: String?

    /// Whether a start may be sent with this token.
    public var isUsable: Bool { droppedAt == nil }

    public init(attributesType: String, token: String, updatedAt: Date, droppedAt: Date? = nil, dropReason: String? = nil) {
        self.attributesType = attributesType
        self.token = token
        self.updatedAt = updatedAt
        self.droppedAt = droppedAt
        self.dropReason = dropReason
    }
}

/// An installation of the app as stored.
public struct DeviceRecord: Sendable, Hashable {
    public var appID: String
    public var deviceID: String
    public var platform: Platform
    public var userID: String?
    /// String tags for targeting.
    public var tags: [String: String]
    /// iOS: push-to-start tokens, usable and dropped, ordered by attributes type.
    public var pushToStartTokens: [PushToStartToken]
    /// Android: the FCM registration token.
    public var fcmToken: String?
    /// When FCM answered `UNREGISTERED` for ``fcmToken``; `nil` while it is usable.
    public var fcmTokenDroppedAt: Date?
    public var fcmTokenDropReason: String?
    public var osVersion: String?
    public var locale: String?
    public var createdAt: Date
    public var updatedAt: Date

    public init(
        appID: String, deviceID: String, platform: Platform, userID: String?, tags: [String: String],
        pushToStartTokens: [PushToStartToken], fcmToken: String?, fcmTokenDroppedAt: Date? = nil, fcmTokenDropReason: String? = nil,
        osVersion: String?, locale: String?, createdAt: Date, updatedAt: Date
    ) {
        self.appID = appID
        self.deviceID = deviceID
        self.platform = platform
        self.userID = userID
        self.tags = tags
        self.pushToStartTokens = pushToStartTokens
        self.fcmToken = fcmToken
        self.fcmTokenDroppedAt = fcmTokenDroppedAt
        self.fcmTokenDropReason = fcmTokenDropReason
        self.osVersion = osVersion
        self.locale = locale
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }

    /// The push-to-start token for `attributesType`, usable or dropped, if the device registered one.
    public func pushToStartToken(for attributesType: String) -> PushToStartToken? {
        pushToStartTokens.first { $0.attributesType == attributesType }
    }
}

/// Which devices a listing returns: every condition given must hold.
public struct DeviceFilter: Sendable, Hashable {
    /// Only this user's devices.
    public var userID: String?
    /// Only devices carrying every one of these tags (key and value).
    public var tags: [DeviceTag]

    public init(userID: String? = nil, tags: [DeviceTag] = []) {
        self.userID = userID
        self.tags = tags
    }
}

/// One targeting tag: a key and its value.
public struct DeviceTag: Sendable, Hashable {
    public var key: String
    public var value: String

    public init(key: String, value: String) {
        self.key = key
        self.value = value
    }
}

/// An activity's APNs broadcast channel.
public struct BroadcastChannel: Sendable, Hashable {
    /// Apple's channel id (base64).
    public var id: String
    public var storagePolicy: ChannelStoragePolicy
    public var status: ChannelStatus
    public var createdAt: Date
    /// When it was deleted at APNs.
    public var deletedAt: Date?

    /// Creates a channel record.
    public init(id: String, storagePolicy: ChannelStoragePolicy, status: ChannelStatus = .active, createdAt: Date, deletedAt: Date? = nil) {
        self.id = id
        self.storagePolicy = storagePolicy
        self.status = status
        self.createdAt = createdAt
        self.deletedAt = deletedAt
    }
}
