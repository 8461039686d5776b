import Foundation
import LivelineCore

/// One broadcast channel (iOS 18), as APNs keeps it: made by `POST /1/apps/{bundleID}/channels` on the channel
/// management listener, addressed by `apns-channel-id`, removed by `DELETE`. A deleted channel is kept (flagged) so a
/// broadcast to it is told `ChannelNotRegistered` and the control API can say what happened to it.
struct BroadcastChannel: Sendable, Codable, Hashable {
    var id: String
    var bundleID: String
    /// `message-storage-policy`: 0 no message stored, 1 the most recent message stored.
    var storagePolicy: Int
    var createdAt: Date
    var order: Int
    var deleted = false
    var deletedAt: Date?
    /// Accepted broadcasts on the channel.
    var broadcasts = 0
}

/// The channel management API, written from Apple's "Sending channel management requests to APNs" and
/// "Handling error responses from APNs": its routes and its answers' decisions, without I/O.
enum ChannelManagement {
    /// The channel management request a `:method` and `:path` name.
    enum Route: Sendable, Equatable {
        /// `POST /1/apps/{bundleID}/channels`: create a channel.
        case create(bundleID: String)
        /// `GET /1/apps/{bundleID}/channels` with `apns-channel-id`: read one channel's configuration.
        case read(bundleID: String)
        /// `DELETE /1/apps/{bundleID}/channels` with `apns-channel-id`.
        case delete(bundleID: String)
        /// `GET /1/apps/{bundleID}/all-channels`: every channel id of the app.
        case list(bundleID: String)

        var bundleID: String {
            switch self {
            case .create(let id), .read(let id), .delete(let id), .list(let id): id
            }
        }
    }

    /// The only `push-type` a channel takes.
    static let pushType = "LiveActivity"

    /// The route of a request: 404 `BadPath` for a path the management API does not have, 405 `MethodNotAllowed` for
    /// a method the path does not take (query strings are not part of Apple's paths and make the path unknown).
    static func route(method: String?, path: String?) throws(APNsEmulatorCore.Rejection) -> Route {
        guard let path else { throw .init(404, "BadPath") }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        // "", "1", "apps", bundle, "channels" | "all-channels"
        guard parts.count == 5, parts[0].isEmpty, parts[1] == "1", parts[2] == "apps", !parts[3].isEmpty,
            !parts[3].contains("?"), parts[4] == "channels" || parts[4] == "all-channels"
        else { throw .init(404, "BadPath") }
        let bundleID = String(parts[3])
        if parts[4] == "all-channels" {
            guard method == "GET" else { throw .init(405, "MethodNotAllowed") }
            return .list(bundleID: bundleID)
        }
        switch method {
        case "POST": return .create(bundleID: bundleID)
        case "GET": return .read(bundleID: bundleID)
        case "DELETE": return .delete(bundleID: bundleID)
        default: throw .init(405, "MethodNotAllowed")
        }
    }

    /// Reads a create request's body `{"message-storage-policy": 0|1, "push-type": "LiveActivity"}` and returns
    /// the policy. Apple documents `InvalidPushType` for a push type other than `LiveActivity`; it names no reason for
    /// an empty, unreadable or out-of-range body, so the emulator answers those 400 `PayloadEmpty`, `BadPayload` and
    /// `BadMessageStoragePolicy` (its own names).
    static func storagePolicy(fromCreateBody body: [UInt8], length: Int) throws(APNsEmulatorCore.Rejection) -> Int {
        if length == 0 { throw .init(400, "PayloadEmpty") }
        guard let object = (try? JSONValue(parsing: body))?.objectValue else { throw .init(400, "BadPayload") }
        guard object["push-type"]?.stringValue == pushType else { throw .init(400, "InvalidPushType") }
        guard case .integer(let policy) = object["message-storage-policy"] ?? .null, policy == 0 || policy == 1 else {
            throw .init(400, "BadMessageStoragePolicy")
        }
        return Int(policy)
    }

    /// Checks `apns-channel-id`: 400 `MissingChannelId` without one, 400 `BadChannelId` when it is not base64.
    static func checkChannelID(_ channelID: String?) throws(APNsEmulatorCore.Rejection) -> String {
        guard let channelID, !channelID.isEmpty else { throw .init(400, "MissingChannelId") }
        guard isBase64(channelID) else { throw .init(400, "BadChannelId") }
        return channelID
    }

    /// Whether `text` is standard base64 (padded) with at least one byte: what channel ids are.
    static func isBase64(_ text: String) -> Bool {
        guard text.utf8.count % 4 == 0, let data = Data(base64Encoded: text) else { return false }
        return !data.isEmpty
    }

    /// A new channel id: 16 random bytes in base64, the shape of Apple's examples.
    static func newChannelID() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return Data(bytes).base64EncodedString()
    }
}

/// The broadcast endpoint's checks, from Apple's "Sending broadcast push notification requests to APNs" and
/// "Handling error responses from APNs", without I/O.
enum BroadcastRules {
    static let pathPrefix = "/4/broadcasts/apps/"
    /// A broadcast payload may be up to 5 KB.
    static let maximumPayloadBytes = 5120

    /// The bundle id of `/4/broadcasts/apps/{bundleID}`, or `nil` for another path.
    static func bundleID(path: String?) -> String? {
        guard let path, path.hasPrefix(pathPrefix) else { return nil }
        let rest = path.dropFirst(pathPrefix.count)
        guard !rest.isEmpty, !rest.contains("/"), !rest.contains("?") else { return nil }
        return String(rest)
    }

    /// The header checks in order, after authentication; `channel` is the channel the id names (if any, deleted
    /// ones included) and `bundleID` the path's. Returns the channel id.
    static func check(
        _ headers: RequestHeaders, bundleID: String, bundleRegistered: Bool, channel: BroadcastChannel?, bodyLength: Int
    ) throws(APNsEmulatorCore.Rejection) -> String {
        guard bundleRegistered else { throw .init(400, "FeatureNotEnabled") }
        if headers.hasDuplicateAPNsHeader { throw .init(400, "DuplicateHeaders") }
        guard let pushType = headers.pushType else { throw .init(400, "MissingPushType") }
        guard pushType == "liveactivity" else { throw .init(400, "InvalidPushType") }
        let channelID = try ChannelManagement.checkChannelID(headers.channelID)
        guard let channel, !channel.deleted else { throw .init(400, "ChannelNotRegistered") }
        guard channel.bundleID == bundleID else { throw .init(403, "TopicMismatch") }
        if let priority = headers.priority, !["10", "5", "1"].contains(priority) { throw .init(400, "BadPriority") }
        if let expiration = headers.expiration {
            guard !expiration.isEmpty, expiration.utf8.allSatisfy({ (0x30...0x39).contains($0) }), let value = Int64(expiration)
            else { throw .init(400, "BadExpirationDate") }
            // A channel that stores no message takes only an expiration of 0.
            if channel.storagePolicy == 0, value != 0 { throw .init(400, "BadExpirationDate") }
        }
        if let requestID = headers.requestID, !RequestHeaders.isUUID(requestID) { throw .init(400, "BadMessageId") }
        if bodyLength == 0 { throw .init(400, "PayloadEmpty") }
        if bodyLength > maximumPayloadBytes { throw .init(413, "PayloadTooLarge") }
        return channelID
    }
}

/// A broadcast channel as the control API shows it.
public struct BroadcastChannelSummary: Sendable, Hashable, Codable {
    /// The channel id (base64).
    public var channelID: String
    /// The app's bundle id.
    public var bundleID: String
    /// `message-storage-policy`: 0 no message stored, 1 the most recent one.
    public var storagePolicy: Int
    /// When the channel was created.
    public var createdAt: Date
    /// Live Activities subscribed to the channel (control-API subscribers and iPhones' channel activities).
    public var subscribers: Int
    /// Accepted broadcasts on the channel.
    public var broadcasts: Int

    enum CodingKeys: String, CodingKey {
        case channelID = "channelId", bundleID = "bundleId", storagePolicy, createdAt, subscribers, broadcasts
    }
}

/// A channel with what its subscribers show: `GET /channels/{channelId}`.
public struct BroadcastChannelDetail: Sendable, Hashable, Codable {
    /// The channel and its counts.
    public var summary: BroadcastChannelSummary
    /// Subscribers by the `timestamp` of the state they show (`"none"` before any push applied), e.g.
    /// `{"1760000000": 99999, "none": 1}`. Whole-second timestamps are written without a fraction.
    public var subscribersByTimestamp: [String: Int]
    /// Subscribers whose activity ended.
    public var ended: Int
    /// Subscribers whose content is stale.
    public var stale: Int

    /// Encodes the summary's members flat, beside the counts.
    public func encode(to encoder: any Encoder) throws {
        try summary.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(subscribersByTimestamp, forKey: .subscribersByTimestamp)
        try container.encode(ended, forKey: .ended)
        try container.encode(stale, forKey: .stale)
    }

    /// Decodes the flat form.
    public init(from decoder: any Decoder) throws {
        summary = try BroadcastChannelSummary(from: decoder)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        subscribersByTimestamp = try container.decode([String: Int].self, forKey: .subscribersByTimestamp)
        ended = try container.decode(Int.self, forKey: .ended)
        stale = try container.decode(Int.self, forKey: .stale)
    }

    init(summary: BroadcastChannelSummary, subscribersByTimestamp: [String: Int], ended: Int, stale: Int) {
        self.summary = summary
        self.subscribersByTimestamp = subscribersByTimestamp
        self.ended = ended
        self.stale = stale
    }

    enum CodingKeys: String, CodingKey {
        case subscribersByTimestamp, ended, stale
    }

    /// The key a timestamp groups under.
    static func key(_ timestamp: Double?) -> String {
        guard let timestamp else { return "none" }
        if timestamp == timestamp.rounded(), abs(timestamp) < 1e15 { return String(Int64(timestamp)) }
        return String(timestamp)
    }
}
