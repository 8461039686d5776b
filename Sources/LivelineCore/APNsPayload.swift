import Foundation

/// The `aps.event` of a Live Activity push. An open set: values Liveline does not know
/// survive as ``unknown(_:)``.
public struct LiveActivityEvent: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// Starts a Live Activity (push-to-start, iOS 17.2+).
    public static let start = LiveActivityEvent(rawValue: "start")
    /// Updates the content state.
    public static let update = LiveActivityEvent(rawValue: "update")
    /// Ends the Live Activity.
    public static let end = LiveActivityEvent(rawValue: "end")
    /// Any other value.
    public static func unknown(_ value: String) -> LiveActivityEvent { LiveActivityEvent(rawValue: value) }

    public var description: String { rawValue }
}

/// The alert of a Live Activity push: lights the screen and, on devices without a Dynamic Island,
/// shows as a banner.
public struct LiveActivityAlert: Sendable, Hashable {
    /// The alert title.
    public var title: AlertText
    /// The alert body.
    public var body: AlertText
    /// A sound file name in the app bundle, or `"default"`.
    public var sound: String?

    /// Creates an alert.
    public init(title: AlertText, body: AlertText, sound: String? = nil) {
        self.title = title
        self.body = body
        self.sound = sound
    }

    /// Creates an alert of text shown as it is.
    public init(title: String, body: String, sound: String? = nil) {
        self.init(title: .text(title), body: .text(body), sound: sound)
    }

    /// The alert as APNs takes it in `aps.alert` (`title`, `body`, `sound`; a localized text as `loc-key` and
    /// `loc-args`), and as the Store keeps it.
    public var json: JSONValue {
        var members: [String: JSONValue] = ["title": title.apnsJSON, "body": body.apnsJSON]
        if let sound { members["sound"] = .string(sound) }
        return .object(members)
    }

    /// The alert as the API takes and shows it (a localized text as `locKey` and `locArgs`).
    public var apiJSON: JSONValue {
        var members: [String: JSONValue] = ["title": title.apiJSON, "body": body.apiJSON]
        if let sound { members["sound"] = .string(sound) }
        return .object(members)
    }

    /// Reads an alert as ``json`` writes it; nil for anything else.
    public init?(json: JSONValue) {
        guard let members = json.objectValue, let title = members["title"].flatMap(AlertText.init(apnsJSON:)),
            let body = members["body"].flatMap(AlertText.init(apnsJSON:))
        else { return nil }
        self.init(title: title, body: body, sound: members["sound"]?.stringValue)
    }
}

/// The title or body of an alert: text shown as it is, or the key of a string the app localizes on the phone with the
/// arguments for its format's placeholders.
///
/// Apple's Live Activity alerts take either: "title": "…", or "title": {"loc-key": "%@ is on an adventure!",
/// "loc-args": ["Power Panda"]} ("Starting and updating Live Activities with ActivityKit push notifications": "consider
/// localizing both strings"). The phone looks the key up in the app's `Localizable.strings` and fills in the arguments.
public enum AlertText: Sendable, Hashable, ExpressibleByStringLiteral {
    /// Text shown as it is.
    case text(String)
    /// A key of the app's localized strings, and the arguments for its placeholders, in order.
    case localized(key: String, arguments: [String])

    /// Text shown as it is.
    public init(stringLiteral value: String) {
        self = .text(value)
    }

    /// As APNs takes it: the text, or `{"loc-key": …, "loc-args": […]}` (`loc-args` only with arguments).
    public var apnsJSON: JSONValue {
        switch self {
        case .text(let text): .string(text)
        case .localized(let key, let arguments):
            arguments.isEmpty
                ? .object(["loc-key": .string(key)]) : .object(["loc-key": .string(key), "loc-args": .array(arguments.map(JSONValue.string))])
        }
    }

    /// As the API takes and shows it: the text, or `{"locKey": …, "locArgs": […]}` (`locArgs` always, perhaps empty).
    public var apiJSON: JSONValue {
        switch self {
        case .text(let text): .string(text)
        case .localized(let key, let arguments): .object(["locKey": .string(key), "locArgs": .array(arguments.map(JSONValue.string))])
        }
    }

    /// Reads APNs' form (``apnsJSON``); nil for anything else.
    public init?(apnsJSON: JSONValue) {
        switch apnsJSON {
        case .string(let text):
            self = .text(text)
        case .object(let members):
            guard let key = members["loc-key"]?.stringValue else { return nil }
            var arguments: [String] = []
            if let list = members["loc-args"] {
                guard let values = list.arrayValue else { return nil }
                for value in values {
                    guard let argument = value.stringValue else { return nil }
                    arguments.append(argument)
                }
            }
            self = .localized(key: key, arguments: arguments)
        default:
            return nil
        }
    }
}

/// The `aps` dictionary of one Live Activity push, with Apple's key names.
///
/// Build it once per accepted sequence; ``encoded()`` gives the exact bytes to send and
/// ``byteCount`` their size, which must not exceed ``Limits/maximumAPNsPayloadBytes``.
public struct APNsLiveActivityPayload: Sendable, Hashable {
    /// `start`, `update` or `end`.
    public var event: LiveActivityEvent
    /// When the sequence was accepted, in seconds since 1970: the phone keeps only the newest.
    public var timestamp: Int64
    /// The content state, which the app decodes into its `ContentState`.
    public var contentState: JSONValue
    /// When the system shows the activity as stale, in seconds since 1970.
    public var staleDate: Int64?
    /// The relative relevance among the app's activities.
    public var relevanceScore: Double?
    /// An alert that lights the screen.
    public var alert: LiveActivityAlert?
    /// When an ended activity leaves the Lock Screen, in seconds since 1970 (`end` only).
    public var dismissalDate: Int64?
    /// The Swift type name of the activity's attributes (`start` only).
    public var attributesType: String?
    /// The static attributes (`start` only).
    public var attributes: JSONValue?
    /// Asks the phone to return an update token for the started activity (`start`, iOS 18).
    public var inputPushToken: Bool
    /// Subscribes the started activity to a broadcast channel (`start`, iOS 18).
    public var inputPushChannel: String?

    /// Creates a payload.
    public init(
        event: LiveActivityEvent,
        timestamp: Int64,
        contentState: JSONValue,
        staleDate: Int64? = nil,
        relevanceScore: Double? = nil,
        alert: LiveActivityAlert? = nil,
        dismissalDate: Int64? = nil,
        attributesType: String? = nil,
        attributes: JSONValue? = nil,
        inputPushToken: Bool = false,
        inputPushChannel: String? = nil
    ) {
        self.event = event
        self.timestamp = timestamp
        self.contentState = contentState
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.alert = alert
        self.dismissalDate = dismissalDate
        self.attributesType = attributesType
        self.attributes = attributes
        self.inputPushToken = inputPushToken
        self.inputPushChannel = inputPushChannel
    }

    /// The whole payload, `{"aps": {...}}`, as a JSON value.
    public var json: JSONValue {
        var aps: [String: JSONValue] = [
            "timestamp": .integer(timestamp),
            "event": .string(event.rawValue),
            "content-state": contentState,
        ]
        if let staleDate { aps["stale-date"] = .integer(staleDate) }
        if let relevanceScore { aps["relevance-score"] = .number(relevanceScore) }
        if let alert { aps["alert"] = alert.json }
        if let dismissalDate { aps["dismissal-date"] = .integer(dismissalDate) }
        if let attributesType { aps["attributes-type"] = .string(attributesType) }
        if let attributes { aps["attributes"] = attributes }
        if inputPushToken { aps["input-push-token"] = .integer(1) }
        if let inputPushChannel { aps["input-push-channel"] = .string(inputPushChannel) }
        return .object(["aps": .object(aps)])
    }

    /// The exact bytes sent to APNs.
    public func encoded() -> [UInt8] { json.encoded }

    /// The size of ``encoded()`` in bytes.
    public var byteCount: Int { encoded().count }

    /// Checks the rules Apple's documents give for the `aps` dictionary of this event, so a caller
    /// hears about a problem before APNs (or worse, the phone) silently drops the push.
    public func validate(maximumBytes: Int = Limits.maximumAPNsPayloadBytes) throws(ValidationError) {
        guard contentState.objectValue != nil else {
            throw ValidationError(code: "invalid_content_state", message: "contentState must be a JSON object.", field: "contentState")
        }
        if dismissalDate != nil, event != .end {
            throw ValidationError(
                code: "dismissal_date_not_allowed",
                message: "dismissalDate is only allowed when ending an activity.",
                field: "dismissalDate"
            )
        }
        if event == .start {
            guard attributesType != nil, attributes?.objectValue != nil else {
                throw ValidationError(
                    code: "invalid_start",
                    message: "A start needs attributesType and an attributes object.",
                    field: "attributes"
                )
            }
            guard alert != nil else {
                throw ValidationError(code: "invalid_start", message: "A start needs an alert.", field: "alert")
            }
        }
        let size = byteCount
        guard size <= maximumBytes else {
            let field = largestPayloadField(contentState: contentState, alert: alert, attributes: attributes)
            throw ValidationError(
                code: "payload_too_large",
                message: "The APNs payload would be \(size) bytes; APNs accepts at most \(maximumBytes). Send a smaller \(field).",
                field: field
            )
        }
    }
}

/// The request field that makes up most of a payload found too large (`contentState`, `alert` or `attributes`), for the
/// refusal to name the part to shrink.
func largestPayloadField(contentState: JSONValue, alert: LiveActivityAlert?, attributes: JSONValue?) -> String {
    var largest = (field: "contentState", bytes: contentState.encoded.count)
    if let alert, case let bytes = alert.json.encoded.count, bytes > largest.bytes { largest = ("alert", bytes) }
    if let attributes, case let bytes = attributes.encoded.count, bytes > largest.bytes { largest = ("attributes", bytes) }
    return largest.field
}
