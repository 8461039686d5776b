import Foundation

/// One accepted state of an activity as every phone watching it will receive it: the one input of the render step.
///
/// The same value is rendered when the state is accepted (to refuse, with a clear error, a state that could not be
/// sent) and when the delivery engine sends it: ``apnsPayload`` for iPhones, ``fcmMessage(priority:now:)`` for
/// Android phones. There is no other builder of either.
public struct LiveActivityState: Sendable, Hashable {
    /// The activity.
    public var activityID: String
    /// `start`, `update` or `end`.
    public var event: LiveActivityEvent
    /// The activity's sequence number of this state.
    public var sequence: Int64
    /// The `aps.timestamp`: seconds since 1970, strictly increasing per activity (``nextTimestamp(after:now:)``).
    public var timestamp: Int64
    /// The content state the app decodes.
    public var contentState: JSONValue
    /// When the state shows as stale, in seconds since 1970.
    public var staleDate: Int64?
    /// The relative relevance among the app's activities.
    public var relevanceScore: Double?
    /// An alert that lights the screen.
    public var alert: LiveActivityAlert?
    /// When an ended activity leaves the screen, in seconds since 1970 (`end` only).
    public var dismissalDate: Int64?

    /// Creates a state.
    public init(
        activityID: String, event: LiveActivityEvent, sequence: Int64, timestamp: Int64, contentState: JSONValue,
        staleDate: Int64? = nil, relevanceScore: Double? = nil, alert: LiveActivityAlert? = nil, dismissalDate: Int64? = nil
    ) {
        self.activityID = activityID
        self.event = event
        self.sequence = sequence
        self.timestamp = timestamp
        self.contentState = contentState
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.alert = alert
        self.dismissalDate = dismissalDate
    }

    // MARK: Rules of a sequence

    /// The `aps.timestamp` of the next sequence: the current second, but always after the previous one, so the phone
    /// (which ignores a timestamp that is not newer) never drops the newest state.
    public static func nextTimestamp(after previous: Int64?, now: Date) -> Int64 {
        let seconds = APIDate.epochSeconds(now)
        guard let previous else { return seconds }
        return max(seconds, previous + 1)
    }

    /// How long the push services keep this state for a phone they cannot reach at once (``LiveUpdateLifetime``).
    public func lifetime(now: Date) -> Int64 {
        LiveUpdateLifetime.seconds(event: event, staleDate: staleDate, now: now)
    }

    /// The `apns-expiration` header for a push of this state sent at `now`: `now` plus its ``lifetime(now:)``, or 0
    /// (APNs tries once and stores nothing) when that is nothing.
    public func apnsExpiration(now: Date) -> Int64 {
        APNsLiveActivityPayload.expiration(event: event, staleDate: staleDate, now: now)
    }

    // MARK: Rendering

    /// The `{"aps": {...}}` payload every iPhone watching the activity receives.
    public var apnsPayload: APNsLiveActivityPayload {
        APNsLiveActivityPayload(
            event: event, timestamp: timestamp, contentState: contentState, staleDate: staleDate, relevanceScore: relevanceScore,
            alert: alert, dismissalDate: event == .end ? dismissalDate : nil
        )
    }

    /// The FCM data message every Android phone watching the activity receives, sent at `now` (which sets its
    /// `android.ttl`).
    public func fcmMessage(priority: FCMAndroidPriority = .high, now: Date) -> FCMLiveUpdateMessage {
        FCMLiveUpdateMessage(
            activityID: activityID, event: event, sequence: sequence, timestamp: timestamp, contentState: contentState,
            staleDate: staleDate, dismissalDate: event == .end ? dismissalDate : nil, alert: alert, priority: priority,
            timeToLive: lifetime(now: now)
        )
    }

    // MARK: Starting remotely

    /// The key Liveline adds to a start's attributes, `{"liveline": {"activityId": "…"}}`: how the app (its attributes
    /// type declares the field; a default decoder ignores it otherwise) learns which activity the system started, to
    /// register the activity's own push token under it.
    public static let startAttributesKey = "liveline"

    /// The attributes a start push carries: the backend's, with ``startAttributesKey`` naming the activity.
    public func startAttributes(_ attributes: JSONValue) -> JSONValue {
        var members = attributes.objectValue ?? [:]
        members[Self.startAttributesKey] = .object(["activityId": .string(activityID)])
        return .object(members)
    }

    /// The `{"aps": {...}}` payload that starts this state's Live Activity on an iPhone (push-to-start, iOS 17.2+): the
    /// `start` event with the attributes type and attributes, the start's alert (Apple requires one), and
    /// `input-push-token: 1` so the phone hands the app an update token for the new activity.
    ///
    /// With `channelID` (a broadcast activity, to an iPhone on iOS 18 or later) the start carries
    /// `input-push-channel` instead: the new activity subscribes to the channel and takes its broadcasts, with no token
    /// of its own.
    public func apnsStartPayload(
        attributesType: String, attributes: JSONValue, alert: LiveActivityAlert, channelID: String? = nil
    ) -> APNsLiveActivityPayload {
        APNsLiveActivityPayload(
            event: .start, timestamp: timestamp, contentState: contentState, staleDate: staleDate, relevanceScore: relevanceScore,
            alert: alert, attributesType: attributesType, attributes: startAttributes(attributes), inputPushToken: channelID == nil,
            inputPushChannel: channelID
        )
    }

    /// The start that subscribes an iPhone on iOS 18 or later to the broadcast channel `channelID`
    /// (``apnsStartPayload(attributesType:attributes:alert:channelID:)``), or nil when APNs would refuse it for its size
    /// (413 `PayloadTooLarge`). It is longer than the start the API checks when it accepts a state (the one with
    /// `input-push-token`) by about the channel id's length, which Apple does not bound ("don't make assumptions on the
    /// channel ID size"): without it, the phone is sent that checked start, and its activity takes a token of its own.
    public func apnsChannelStartPayload(
        attributesType: String, attributes: JSONValue, alert: LiveActivityAlert, channelID: String
    ) -> APNsLiveActivityPayload? {
        let payload = apnsStartPayload(attributesType: attributesType, attributes: attributes, alert: alert, channelID: channelID)
        return payload.byteCount <= Limits.maximumAPNsPayloadBytes ? payload : nil
    }

    /// The FCM data message that starts this state's live update on an Android phone: the `start` event with the
    /// attributes type and attributes and the start's alert, so the app posts the ongoing notification.
    public func fcmStartMessage(
        attributesType: String, attributes: JSONValue, alert: LiveActivityAlert, priority: FCMAndroidPriority = .high, now: Date
    ) -> FCMLiveUpdateMessage {
        FCMLiveUpdateMessage(
            activityID: activityID, event: .start, sequence: sequence, timestamp: timestamp, contentState: contentState,
            staleDate: staleDate, attributesType: attributesType, attributes: startAttributes(attributes), alert: alert,
            priority: priority, timeToLive: lifetime(now: now)
        )
    }

    /// Checks that both start renderings are ones the push services and the phones accept.
    public func validateStartRenderings(attributesType: String, attributes: JSONValue, alert: LiveActivityAlert, now: Date) throws(ValidationError) {
        try apnsStartPayload(attributesType: attributesType, attributes: attributes, alert: alert).validate()
        try fcmStartMessage(attributesType: attributesType, attributes: attributes, alert: alert, now: now).validate()
    }

    /// Checks that both renderings are ones the push services and the phones accept (sizes, dates, shapes), so the
    /// caller hears of a problem when the state is accepted rather than never.
    ///
    /// A broadcast activity's APNs payload may be as large as a broadcast (5,120 bytes), but its content state no
    /// larger than ActivityKit keeps for a Live Activity (``Limits/maximumActivityDataBytes``); an iPhone of it that
    /// keeps its own token is refused a payload above 4,096 by APNs, and the timeline shows it. The FCM rendering is
    /// checked when the app has Android phones to reach (`android`): for an iOS-only app it would hold a broadcast to
    /// FCM's 4,096 bytes.
    public func validateRenderings(now: Date, delivery: ActivityDelivery = .token, android: Bool = true) throws(ValidationError) {
        if delivery == .broadcast, case let bytes = contentState.encoded.count, bytes > Limits.maximumActivityDataBytes {
            throw ValidationError(
                code: "payload_too_large",
                message: "contentState would be \(bytes) bytes; a Live Activity's data (its attributes and content state) "
                    + "may take at most \(Limits.maximumActivityDataBytes) bytes on the phone, even in a broadcast. Send a smaller contentState.",
                field: "contentState"
            )
        }
        try apnsPayload.validate(
            maximumBytes: delivery == .broadcast ? Limits.maximumBroadcastPayloadBytes : Limits.maximumAPNsPayloadBytes
        )
        if android { try fcmMessage(now: now).validate() }
    }
}

/// The part of an activity's stored row its next state depends on.
public struct ActivityHead: Sendable, Hashable {
    /// Whether it still takes updates.
    public var state: ActivityState
    /// Its current sequence (0 before any state).
    public var sequence: Int64
    /// The `aps.timestamp` of its current sequence.
    public var timestamp: Int64?
    /// Its current content state.
    public var contentState: JSONValue?
    /// Its current stale date.
    public var staleDate: Int64?
    /// Its current relevance score.
    public var relevanceScore: Double?

    /// The sequence number and `aps.timestamp` of whatever comes next, at `now`: the next number, and a timestamp
    /// after the current one (``LiveActivityState/nextTimestamp(after:now:)``).
    public func next(now: Date) -> (sequence: Int64, timestamp: Int64) {
        (sequence + 1, LiveActivityState.nextTimestamp(after: timestamp, now: now))
    }

    /// Creates a head.
    public init(
        state: ActivityState, sequence: Int64, timestamp: Int64?, contentState: JSONValue?, staleDate: Int64?, relevanceScore: Double?
    ) {
        self.state = state
        self.sequence = sequence
        self.timestamp = timestamp
        self.contentState = contentState
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
    }
}

/// Why a state cannot follow an activity's head.
public enum NextStateRefusal: Error, Sendable, Hashable {
    /// The activity has ended: it takes no update and no second end.
    case activityEnded
}

extension LiveActivityState {
    /// The state an update accepted at `now` makes, after `head` (nil: the activity's first state): the next sequence,
    /// the next ``nextTimestamp(after:now:)``, and exactly the given fields.
    public static func update(
        activityID: String, after head: ActivityHead?, contentState: JSONValue, staleDate: Int64?, relevanceScore: Double?,
        alert: LiveActivityAlert?, now: Date
    ) throws(NextStateRefusal) -> LiveActivityState {
        if let head {
            do { _ = try head.state.applying(.update) } catch { throw .activityEnded }
        }
        let next = head?.next(now: now) ?? (sequence: 1, timestamp: nextTimestamp(after: nil, now: now))
        return LiveActivityState(
            activityID: activityID, event: .update, sequence: next.sequence, timestamp: next.timestamp, contentState: contentState,
            staleDate: staleDate, relevanceScore: relevanceScore, alert: alert
        )
    }

    /// The final state an end accepted at `now` makes, after `head`: what is given, and for the content state and
    /// relevance score that are not, the activity's current ones (an end repeats the last state unless told
    /// otherwise). The alert, dismissal date and stale date are the end's own: the last update's stale date, inherited,
    /// showed the final card as out of date on the Lock Screen for the hours an ended activity stays there.
    ///
    /// `nil` when there is no final state at all — no content state given, and none ever accepted: the activity ends
    /// as the next sequence (``ActivityHead/next(now:)``) with nothing to show or send. The API refuses such an end
    /// from a caller; Liveline's own lifetime sweeper makes it.
    public static func end(
        activityID: String, after head: ActivityHead, contentState: JSONValue?, staleDate: Int64?, relevanceScore: Double?,
        alert: LiveActivityAlert?, dismissalDate: Int64?, now: Date
    ) throws(NextStateRefusal) -> LiveActivityState? {
        do { _ = try head.state.applying(.end) } catch { throw .activityEnded }
        guard let finalState = contentState ?? head.contentState else { return nil }
        let next = head.next(now: now)
        return LiveActivityState(
            activityID: activityID, event: .end, sequence: next.sequence, timestamp: next.timestamp, contentState: finalState, staleDate: staleDate,
            relevanceScore: relevanceScore ?? head.relevanceScore,
            alert: alert, dismissalDate: dismissalDate
        )
    }
}
