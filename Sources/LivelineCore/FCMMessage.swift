import Foundation

/// The `android.priority` of an FCM message.
///
/// High priority wakes the device at once; FCM expects it to lead to a visible notification and demotes
/// apps whose high-priority messages do not. Every Liveline live update posts or updates the ongoing
/// notification, so high is the default.
public enum FCMAndroidPriority: String, Sendable, Hashable, CaseIterable {
    /// Delivered at once, waking the device.
    case high
    /// May be delayed until the device leaves Doze.
    case normal
}

/// One Android live update as an FCM HTTP v1 data message, with Liveline's data contract: every value is
/// a string, as FCM requires, under the keys in ``Key``.
///
/// An app following the contract keys its ongoing notification by ``Key/activityID``, keeps only the
/// newest ``Key/sequence``, ends it on an `end` event and never shows it again after the user dismissed it.
///
/// Build it once per accepted sequence; ``validate(maximumBytes:)`` checks it at accept time, before any token
/// is known; ``encoded()`` encodes everything but the token once, so the request body for each of many tokens
/// costs one copy (``FCMEncodedMessage/body(token:)``).
public struct FCMLiveUpdateMessage: Sendable, Hashable {
    /// The largest `data` FCM accepts, counted as the UTF-8 bytes of every key and value.
    public static let maximumDataBytes = 4096

    /// The data keys of Liveline's Android contract.
    public enum Key {
        /// The activity id, which the app keys its notification by.
        public static let activityID = "liveline_activity_id"
        /// `start`, `update` or `end`.
        public static let event = "liveline_event"
        /// The activity's sequence number (decimal text): the app keeps only the newest.
        public static let sequence = "liveline_sequence"
        /// When the sequence was accepted, in whole seconds since 1970 (decimal text).
        public static let timestamp = "liveline_timestamp"
        /// The content state as compact JSON text with sorted keys.
        public static let contentState = "liveline_content_state"
        /// When the notification shows as stale, in seconds since 1970 (decimal text).
        public static let staleDate = "liveline_stale_date"
        /// When an ended notification is removed, in seconds since 1970 (decimal text; `end` only).
        public static let dismissalDate = "liveline_dismissal_date"
        /// The attributes type name (`start` only).
        public static let attributesType = "liveline_attributes_type"
        /// The static attributes as compact JSON text with sorted keys (`start` only).
        public static let attributes = "liveline_attributes"
        /// The alert title, when the update should alert with text shown as it is.
        public static let alertTitle = "liveline_alert_title"
        /// The alert body, when the update should alert with text shown as it is.
        public static let alertBody = "liveline_alert_body"
        /// The key of the app's string resource for the alert title, when the title is localized on the phone.
        public static let alertTitleLocKey = "liveline_alert_title_loc_key"
        /// The arguments for that string's placeholders, in order, as a JSON array of strings (with the key only).
        public static let alertTitleLocArgs = "liveline_alert_title_loc_args"
        /// The key of the app's string resource for the alert body, when the body is localized on the phone.
        public static let alertBodyLocKey = "liveline_alert_body_loc_key"
        /// The arguments for that string's placeholders, in order, as a JSON array of strings (with the key only).
        public static let alertBodyLocArgs = "liveline_alert_body_loc_args"
    }

    /// The activity the notification shows.
    public var activityID: String
    /// `start`, `update` or `end`.
    public var event: LiveActivityEvent
    /// The activity's sequence number.
    public var sequence: Int64
    /// When the sequence was accepted, in seconds since 1970.
    public var timestamp: Int64
    /// The content state, which the app decodes.
    public var contentState: JSONValue
    /// When the notification shows as stale, in seconds since 1970.
    public var staleDate: Int64?
    /// When an ended notification is removed, in seconds since 1970 (`end` only).
    public var dismissalDate: Int64?
    /// The attributes type name (`start` only).
    public var attributesType: String?
    /// The static attributes (`start` only).
    public var attributes: JSONValue?
    /// An alert: its title and body are sent; a sound has no place in the Android contract.
    public var alert: LiveActivityAlert?
    /// The `android.priority`.
    public var priority: FCMAndroidPriority
    /// The `android.ttl` in whole seconds: how long FCM keeps the message for an offline device.
    /// Defaults to 8 hours, the longest a live activity stays active.
    public var timeToLive: Int64

    /// Creates a message.
    public init(
        activityID: String,
        event: LiveActivityEvent,
        sequence: Int64,
        timestamp: Int64,
        contentState: JSONValue,
        staleDate: Int64? = nil,
        dismissalDate: Int64? = nil,
        attributesType: String? = nil,
        attributes: JSONValue? = nil,
        alert: LiveActivityAlert? = nil,
        priority: FCMAndroidPriority = .high,
        timeToLive: Int64 = 8 * 3600
    ) {
        self.activityID = activityID
        self.event = event
        self.sequence = sequence
        self.timestamp = timestamp
        self.contentState = contentState
        self.staleDate = staleDate
        self.dismissalDate = dismissalDate
        self.attributesType = attributesType
        self.attributes = attributes
        self.alert = alert
        self.priority = priority
        self.timeToLive = timeToLive
    }

    /// The FCM `data` map: every value a string; absent optionals are left out.
    public var data: [String: String] {
        var data: [String: String] = [
            Key.activityID: activityID,
            Key.event: event.rawValue,
            Key.sequence: String(sequence),
            Key.timestamp: String(timestamp),
            Key.contentState: contentState.encodedString,
        ]
        if let staleDate { data[Key.staleDate] = String(staleDate) }
        if let dismissalDate { data[Key.dismissalDate] = String(dismissalDate) }
        if let attributesType { data[Key.attributesType] = attributesType }
        if let attributes { data[Key.attributes] = attributes.encodedString }
        if let alert {
            Self.put(alert.title, text: Key.alertTitle, locKey: Key.alertTitleLocKey, locArgs: Key.alertTitleLocArgs, in: &data)
            Self.put(alert.body, text: Key.alertBody, locKey: Key.alertBodyLocKey, locArgs: Key.alertBodyLocArgs, in: &data)
        }
        return data
    }

    /// Puts an alert's title or body in `data`: a text under `text`, a localized one as its key and arguments.
    private static func put(_ alertText: AlertText, text: String, locKey: String, locArgs: String, in data: inout [String: String]) {
        switch alertText {
        case .text(let value):
            data[text] = value
        case .localized(let key, let arguments):
            data[locKey] = key
            data[locArgs] = JSONValue.array(arguments.map(JSONValue.string)).encodedString
        }
    }

    /// The size of ``data`` as FCM counts it: the UTF-8 bytes of every key and value.
    public var dataByteCount: Int { Self.dataByteCount(data) }

    /// The size of a `data` map as FCM counts it: the UTF-8 bytes of every key and value.
    public static func dataByteCount(_ data: [String: String]) -> Int {
        data.reduce(0) { $0 + $1.key.utf8.count + $1.value.utf8.count }
    }

    /// Checks the message when the API call arrives, before any token is known, so the caller hears about
    /// a problem as a clear 4xx instead of a refusal from FCM later: the content state must be an object,
    /// a dismissal date belongs to `end` only, a start needs its attributes type and an attributes object,
    /// the time to live must not be negative, and ``data`` must fit in `maximumBytes`.
    public func validate(maximumBytes: Int = FCMLiveUpdateMessage.maximumDataBytes) throws(ValidationError) {
        guard contentState.objectValue != nil else {
            throw ValidationError(code: "invalid_content_state", message: "contentState must be a JSON object.", field: "contentState")
        }
        if dismissalDate != nil, event != .end {
            throw ValidationError(
                code: "dismissal_date_not_allowed", message: "dismissalDate is only allowed when ending an activity.",
                field: "dismissalDate"
            )
        }
        if event == .start {
            guard let attributesType, !attributesType.isEmpty, attributes?.objectValue != nil else {
                throw ValidationError(
                    code: "invalid_start", message: "A start needs attributesType and an attributes object.", field: "attributes"
                )
            }
        }
        guard timeToLive >= 0 else {
            throw ValidationError(code: "invalid_ttl", message: "The FCM time to live must not be negative.", field: "ttl")
        }
        let size = dataByteCount
        guard size <= maximumBytes else {
            let field = largestPayloadField(contentState: contentState, alert: alert, attributes: attributes)
            throw ValidationError(
                code: "payload_too_large",
                message: "The FCM data would be \(size) bytes; FCM accepts at most \(maximumBytes). Send a smaller \(field).",
                field: field
            )
        }
    }

    /// The `messages:send` body for every token, encoded once.
    public func encoded() -> FCMEncodedMessage {
        var suffix: [UInt8] = []
        suffix.reserveCapacity(dataByteCount + 256)
        suffix.append(contentsOf: #","data":"#.utf8)
        JSONValue.object(data.mapValues(JSONValue.string)).append(to: &suffix)
        suffix.append(contentsOf: #","android":{"priority":"#.utf8)
        JSONValue.appendString(priority.rawValue, to: &suffix)
        suffix.append(contentsOf: #","ttl":"#.utf8)
        JSONValue.appendString(String(timeToLive) + "s", to: &suffix)
        // No `collapse_key`: Google throttles collapsible messages to "a burst of 20 messages per app per device, with
        // a refill of 1 message every 3 minutes" ("FCM Throttling and Quotas"), which would hold a live update's 21st
        // message for minutes; for "high burst send patterns" it points to non-collapsible messages that carry their
        // content, as these do. A phone that was offline gets the stored ones (within their `ttl`) and keeps the
        // highest `liveline_sequence`.
        suffix.append(contentsOf: "}}}".utf8)
        return FCMEncodedMessage(suffix: suffix)
    }

    /// The whole `messages:send` body for one token:
    /// `{"message": {"token": T, "data": {...}, "android": {"priority", "ttl"}}}`: non-collapsible (see ``encoded()``).
    public func requestBody(token: String) -> [UInt8] { encoded().body(token: token) }
}

/// A `messages:send` body with everything but the token encoded: ``prefix`` + the token as a JSON string +
/// ``suffix`` is the body for that token.
public struct FCMEncodedMessage: Sendable, Hashable {
    /// `{"message":{"token":`.
    public static let prefix: [UInt8] = Array(#"{"message":{"token":"#.utf8)
    /// The bytes after the token: `,"data":{...},"android":{...}}}`.
    public let suffix: [UInt8]

    /// Wraps the bytes that follow the token.
    public init(suffix: [UInt8]) { self.suffix = suffix }

    /// The body for `token`.
    public func body(token: String) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Self.prefix.count + token.utf8.count + 2 + suffix.count)
        append(token: token, to: &out)
        return out
    }

    /// Appends the body for `token` to `out`.
    public func append(token: String, to out: inout [UInt8]) {
        out.append(contentsOf: Self.prefix)
        JSONValue.appendString(token, to: &out)
        out.append(contentsOf: suffix)
    }
}
