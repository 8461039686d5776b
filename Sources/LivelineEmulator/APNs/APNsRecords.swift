import Foundation
import LivelineCore

/// What the simulated phone did with a push APNs accepted.
///
/// Real APNs answers 200 for a payload the phone cannot use and the phone drops it silently;
/// the emulator answers the same way and records why here.
public enum PhoneVerdict: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The phone applied the push: the display changed.
    case applied
    /// The phone ignored the push; the display is unchanged.
    case ignored(String)

    /// `applied`, or `ignored: <why>`.
    public var description: String {
        switch self {
        case .applied: "applied"
        case .ignored(let why): "ignored: \(why)"
        }
    }

    /// Whether the push changed the display.
    public var isApplied: Bool { self == .applied }

    /// Decodes the ``description`` form.
    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        if text == "applied" {
            self = .applied
        } else if text.hasPrefix("ignored: ") {
            self = .ignored(String(text.dropFirst("ignored: ".count)))
        } else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "Not a phone verdict: \(text)"))
        }
    }

    /// Encodes the ``description`` form.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

/// One request the APNs emulator received, and how it was answered.
public struct ReceivedPush: Sendable, Hashable, Codable {
    /// One request header as received (HTTP/2 names are lowercase; pseudo-headers included).
    public struct Header: Sendable, Hashable, Codable {
        /// The header name.
        public var name: String
        /// The header value.
        public var value: String

        /// Creates a header.
        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// When the request's last frame arrived, by the emulator's clock.
    public var receivedAt: Date
    /// The device token from `:path` (`""` when the path held none).
    public var token: String
    /// Every request header in arrival order, `authorization` included.
    public var headers: [Header]
    /// The request body as text (invalid UTF-8 replaced).
    public var payload: String
    /// The HTTP status answered, or `nil` when the connection was dropped instead.
    public var status: Int?
    /// The `reason` of an error answer.
    public var reason: String?
    /// The `apns-id` answered.
    public var apnsID: String
    /// For an accepted push (200), what the simulated phone did with it. For an accepted broadcast: `applied` when
    /// at least one subscriber applied it, else `ignored: <the last subscriber's reason>` (or `no subscribers`).
    public var verdict: PhoneVerdict?
    /// `"token"` for a push to a device token (`/3/device/…`), `"broadcast"` for a broadcast on a channel
    /// (`/4/broadcasts/apps/…`).
    public var kind: String
    /// A broadcast's `apns-channel-id`; `nil` for a token push.
    public var channelID: String?
    /// For an accepted broadcast: how many subscribers applied it, and how many ignored it.
    public var subscribersApplied: Int?
    /// For an accepted broadcast: how many subscribers ignored it.
    public var subscribersIgnored: Int?

    /// Creates a record of a token push (or, with `kind: "broadcast"` and `channelID`, of a broadcast).
    public init(
        receivedAt: Date, token: String, headers: [Header], payload: String, status: Int?, reason: String?,
        apnsID: String, verdict: PhoneVerdict?, kind: String = "token", channelID: String? = nil
    ) {
        self.kind = kind
        self.channelID = channelID
        self.receivedAt = receivedAt
        self.token = token
        self.headers = headers
        self.payload = payload
        self.status = status
        self.reason = reason
        self.apnsID = apnsID
        self.verdict = verdict
    }

    /// The first value of the header `name` (lowercase), if present.
    public func header(_ name: String) -> String? {
        headers.first { $0.name == name }?.value
    }

    enum CodingKeys: String, CodingKey {
        case receivedAt, token, headers, payload, status, reason, verdict, kind, subscribersApplied, subscribersIgnored
        case apnsID = "apnsId"
        case channelID = "channelId"
    }

    /// Decodes a record; `kind` defaults to `"token"`.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        receivedAt = try container.decode(Date.self, forKey: .receivedAt)
        token = try container.decode(String.self, forKey: .token)
        headers = try container.decode([Header].self, forKey: .headers)
        payload = try container.decode(String.self, forKey: .payload)
        status = try container.decodeIfPresent(Int.self, forKey: .status)
        reason = try container.decodeIfPresent(String.self, forKey: .reason)
        apnsID = try container.decode(String.self, forKey: .apnsID)
        verdict = try container.decodeIfPresent(PhoneVerdict.self, forKey: .verdict)
        kind = try container.decodeIfPresent(String.self, forKey: .kind) ?? "token"
        channelID = try container.decodeIfPresent(String.self, forKey: .channelID)
        subscribersApplied = try container.decodeIfPresent(Int.self, forKey: .subscribersApplied)
        subscribersIgnored = try container.decodeIfPresent(Int.self, forKey: .subscribersIgnored)
    }

    /// Encodes every member, absent ones as `null`, so the JSON shape never changes.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(receivedAt, forKey: .receivedAt)
        try container.encode(token, forKey: .token)
        try container.encode(headers, forKey: .headers)
        try container.encode(payload, forKey: .payload)
        try container.encode(status, forKey: .status)
        try container.encode(reason, forKey: .reason)
        try container.encode(apnsID, forKey: .apnsID)
        try container.encode(verdict, forKey: .verdict)
        try container.encode(kind, forKey: .kind)
        try container.encode(channelID, forKey: .channelID)
        try container.encode(subscribersApplied, forKey: .subscribersApplied)
        try container.encode(subscribersIgnored, forKey: .subscribersIgnored)
    }
}

/// What a simulated phone shows for one Live Activity push token.
public struct DisplayedActivity: Sendable, Hashable, Codable {
    /// The Live Activity push token.
    public var token: String
    /// The app's bundle id.
    public var bundleID: String
    /// When the token stopped being valid (``APNsEmulator/expireDevice(token:)``); pushes get 410.
    public var unregisteredAt: Date?
    /// The last applied content state; `nil` until a push was applied.
    public var contentState: JSONValue?
    /// The `aps.timestamp` (seconds since 1970) of the last applied push.
    public var timestamp: Double?
    /// The stale date of the last applied push, if it had one.
    public var staleDate: Date?
    /// Whether the stale date has passed.
    public var isStale: Bool
    /// The relevance score of the last applied push, if it had one.
    public var relevanceScore: Double?
    /// The `attributes-type` of the applied `start` push, if the activity was started by push.
    public var attributesType: String?
    /// The `attributes` of the applied `start` push.
    public var attributes: JSONValue?
    /// When the first push was applied (the activity's start on the phone).
    public var startedAt: Date?
    /// Whether the activity ended: by an `end` push, or by the system after 8 hours.
    public var ended: Bool
    /// When the activity ended.
    public var endedAt: Date?
    /// The dismissal date of the `end` push, or the system's (4 hours after ending) when none.
    public var dismissalDate: Date?
    /// Whether the activity is gone from the screen: its dismissal date passed, or the user
    /// dismissed it (``APNsEmulator/dismissActivity(token:)``).
    public var dismissed: Bool
    /// How many applied pushes carried an `alert`.
    public var alertCount: Int
    /// The `alert` of the last applied push that had one.
    public var lastAlert: JSONValue?
    /// How many accepted pushes the phone applied.
    public var appliedCount: Int
    /// How many accepted pushes the phone ignored.
    public var ignoredCount: Int
    /// The `aps.event` of the last applied push.
    public var lastEvent: String?
    /// Why the last ignored push was ignored.
    public var lastIgnoredReason: String?
    /// Accepted priority-10 pushes (an absent `apns-priority` counts as 10) to this token in the
    /// hour before now: what Apple's hourly Live Activity budget counts.
    public var priority10LastHour: Int

    enum CodingKeys: String, CodingKey {
        case token, unregisteredAt, contentState, timestamp, staleDate, isStale, relevanceScore, attributesType,
            attributes, startedAt, ended, endedAt, dismissalDate, dismissed, alertCount, lastAlert, appliedCount,
            ignoredCount, lastEvent, lastIgnoredReason, priority10LastHour
        case bundleID = "bundleId"
    }

    /// Encodes every member, absent ones as `null`, so the JSON shape never changes.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(token, forKey: .token)
        try container.encode(bundleID, forKey: .bundleID)
        try container.encode(unregisteredAt, forKey: .unregisteredAt)
        try container.encode(contentState, forKey: .contentState)
        try container.encode(timestamp, forKey: .timestamp)
        try container.encode(staleDate, forKey: .staleDate)
        try container.encode(isStale, forKey: .isStale)
        try container.encode(relevanceScore, forKey: .relevanceScore)
        try container.encode(attributesType, forKey: .attributesType)
        try container.encode(attributes, forKey: .attributes)
        try container.encode(startedAt, forKey: .startedAt)
        try container.encode(ended, forKey: .ended)
        try container.encode(endedAt, forKey: .endedAt)
        try container.encode(dismissalDate, forKey: .dismissalDate)
        try container.encode(dismissed, forKey: .dismissed)
        try container.encode(alertCount, forKey: .alertCount)
        try container.encode(lastAlert, forKey: .lastAlert)
        try container.encode(appliedCount, forKey: .appliedCount)
        try container.encode(ignoredCount, forKey: .ignoredCount)
        try container.encode(lastEvent, forKey: .lastEvent)
        try container.encode(lastIgnoredReason, forKey: .lastIgnoredReason)
        try container.encode(priority10LastHour, forKey: .priority10LastHour)
    }
}

/// Counts over every request the APNs emulator answered (or dropped).
public struct EmulatorStatistics: Sendable, Hashable, Codable {
    /// Every completed request.
    public var totalRequests: Int = 0
    /// Requests answered 200.
    public var accepted: Int = 0
    /// Requests whose connection was dropped instead of answered.
    public var dropped: Int = 0
    /// Accepted pushes the simulated phone applied.
    public var applied: Int = 0
    /// Accepted pushes the simulated phone ignored.
    public var ignored: Int = 0
    /// Answers by HTTP status.
    public var byStatus: [Int: Int] = [:]
    /// Error answers by `reason`.
    public var byReason: [String: Int] = [:]
    /// Accepted broadcasts (`POST /4/broadcasts/apps/…` answered 200); also counted in ``accepted``.
    public var broadcasts: Int = 0
    /// Subscribers that applied an accepted broadcast (one broadcast counts once per subscriber).
    public var broadcastApplied: Int = 0
    /// Subscribers that ignored an accepted broadcast.
    public var broadcastIgnored: Int = 0
    /// Requests on the channel management listener (not counted in ``totalRequests``).
    public var channelManagementRequests: Int = 0
    /// Channel management error answers by `reason`.
    public var channelManagementByReason: [String: Int] = [:]

    /// Empty counts.
    public init() {}
}
