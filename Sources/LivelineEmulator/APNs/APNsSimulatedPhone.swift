import Foundation
import LivelineCore

/// One Live Activity as a phone holds it, and the rules by which a phone applies an accepted
/// push to it. Written from ActivityKit's documentation and field reports, not from Liveline's
/// payload builder: a push APNs accepts (200) but the phone cannot use is ignored silently.
struct LiveActivityState: Sendable, Codable {
    /// ActivityKit keeps an activity active for at most 8 hours…
    static let maximumActiveDuration: TimeInterval = 8 * 3600
    /// …and an ended one on the Lock Screen for at most 4 more.
    static let maximumEndedDuration: TimeInterval = 4 * 3600

    var contentState: JSONValue?
    var timestamp: Double?
    var staleDate: Date?
    var relevanceScore: Double?
    var attributesType: String?
    var attributes: JSONValue?
    var startedAt: Date?
    var ended = false
    var endedAt: Date?
    /// The dismissal date the `end` push asked for.
    var requestedDismissalDate: Date?
    var dismissedByUser = false
    var alertCount = 0
    var lastAlert: JSONValue?
    var appliedCount = 0
    var ignoredCount = 0
    var lastEvent: String?
    var lastIgnoredReason: String?

    /// The activity as the system sees it at `now`: one active for 8 hours has ended.
    func atTime(_ now: Date) -> LiveActivityState {
        var state = self
        if !state.ended, let startedAt, now >= startedAt + Self.maximumActiveDuration {
            state.ended = true
            state.endedAt = startedAt + Self.maximumActiveDuration
        }
        return state
    }

    /// When the ended activity leaves the screen: the requested date, at most 4 hours after it ended.
    var dismissalDate: Date? {
        guard ended, let endedAt else { return nil }
        let systemLimit = endedAt + Self.maximumEndedDuration
        guard let requestedDismissalDate else { return systemLimit }
        return min(requestedDismissalDate, systemLimit)
    }

    func isDismissed(at now: Date) -> Bool {
        if dismissedByUser { return true }
        guard let dismissalDate else { return false }
        return now >= dismissalDate
    }

    func isStale(at now: Date) -> Bool {
        guard let staleDate else { return false }
        return now > staleDate
    }

    /// Applies an accepted push's payload as the phone would, and says what happened.
    mutating func apply(payload: [UInt8], now: Date) -> PhoneVerdict {
        apply(Self.decode(payload), now: now)
    }

    /// Applies an already decoded payload (decoding happens outside the registry lock).
    mutating func apply(_ decoded: Result<DecodedPush, Unusable>, now: Date) -> PhoneVerdict {
        self = atTime(now)
        let verdict: PhoneVerdict
        switch decoded {
        case .failure(let why):
            verdict = .ignored(why.message)
        case .success(let push):
            verdict = apply(push, now: now)
        }
        if case .ignored(let why) = verdict {
            ignoredCount += 1
            lastIgnoredReason = why
        } else {
            appliedCount += 1
        }
        return verdict
    }

    private mutating func apply(_ push: DecodedPush, now: Date) -> PhoneVerdict {
        if isDismissed(at: now) { return .ignored("dismissed") }
        if ended { return .ignored("ended") }
        if let timestamp, push.timestamp <= timestamp { return .ignored("stale timestamp") }

        contentState = push.contentState
        timestamp = push.timestamp
        staleDate = push.staleDate
        relevanceScore = push.relevanceScore
        lastEvent = push.event
        if startedAt == nil { startedAt = now }
        if let alert = push.alert {
            alertCount += 1
            lastAlert = alert
        }
        switch push.event {
        case "start":
            attributesType = push.attributesType
            attributes = push.attributes
        case "end":
            ended = true
            endedAt = now
            requestedDismissalDate = push.dismissalDate
        default:
            break
        }
        return .applied
    }

    /// The parts of an `aps` dictionary a phone reads.
    struct DecodedPush {
        var timestamp: Double
        var event: String
        var contentState: JSONValue
        var staleDate: Date?
        var relevanceScore: Double?
        var dismissalDate: Date?
        var alert: JSONValue?
        var attributesType: String?
        var attributes: JSONValue?
        /// A start's `"input-push-token": 1`: the sender asks for an update token (iOS 18).
        var inputPushTokenRequested = false
        /// A start's `attributes.liveline.activityId`: the Liveline activity id the app's attributes type carries.
        var livelineActivityID: String?
        /// A start's `"input-push-channel": "<channel id>"` (iOS 18): the activity subscribes to that broadcast channel.
        var inputPushChannel: String?
    }

    struct Unusable: Error {
        var message: String
        init(_ message: String) { self.message = message }
    }

    /// Reads a payload the way ActivityKit decodes it; any failure means the phone drops the push.
    static func decode(_ payload: [UInt8]) -> Result<DecodedPush, Unusable> {
        let root: JSONValue
        do {
            root = try JSONValue(parsing: payload)
        } catch {
            return .failure(Unusable("payload is not valid JSON (\(error))"))
        }
        guard let aps = root.objectValue?["aps"]?.objectValue else {
            return .failure(Unusable("payload is not a JSON object with an aps object"))
        }
        guard let timestamp = aps["timestamp"].flatMap(number) else {
            return .failure(Unusable("aps.timestamp is missing or not a number"))
        }
        guard let event = aps["event"]?.stringValue, ["start", "update", "end"].contains(event) else {
            return .failure(Unusable("aps.event is not start, update or end"))
        }
        guard let contentState = aps["content-state"], contentState.objectValue != nil else {
            return .failure(Unusable("aps.content-state is missing or not an object"))
        }
        var push = DecodedPush(timestamp: timestamp, event: event, contentState: contentState)
        if let value = aps["dismissal-date"] {
            guard event == "end" else { return .failure(Unusable("aps.dismissal-date on a \(event) event")) }
            guard let seconds = number(value) else { return .failure(Unusable("aps.dismissal-date is not a number")) }
            push.dismissalDate = Date(timeIntervalSince1970: seconds)
        }
        if let value = aps["stale-date"] {
            guard let seconds = number(value) else { return .failure(Unusable("aps.stale-date is not a number")) }
            push.staleDate = Date(timeIntervalSince1970: seconds)
        }
        if let value = aps["relevance-score"] {
            guard let score = number(value) else { return .failure(Unusable("aps.relevance-score is not a number")) }
            push.relevanceScore = score
        }
        if let alert = aps["alert"] {
            switch alert {
            case .object, .string: push.alert = alert
            default: return .failure(Unusable("aps.alert is not an object"))
            }
        }
        if event == "start" {
            guard let attributesType = aps["attributes-type"]?.stringValue, !attributesType.isEmpty else {
                return .failure(Unusable("start without a string aps.attributes-type"))
            }
            guard let attributes = aps["attributes"], attributes.objectValue != nil else {
                return .failure(Unusable("start without an aps.attributes object"))
            }
            guard push.alert != nil else { return .failure(Unusable("start without an aps.alert")) }
            push.attributesType = attributesType
            push.attributes = attributes
            push.inputPushTokenRequested = aps["input-push-token"].flatMap(number) == 1
            push.livelineActivityID = attributes.objectValue?["liveline"]?.objectValue?["activityId"]?.stringValue
            if let channel = aps["input-push-channel"]?.stringValue, !channel.isEmpty { push.inputPushChannel = channel }
        }
        return .success(push)
    }

    private static func number(_ value: JSONValue) -> Double? {
        switch value {
        case .integer(let value): Double(value)
        case .number(let value): value
        default: nil
        }
    }
}
