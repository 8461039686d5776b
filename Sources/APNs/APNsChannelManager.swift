import Foundation
import LivelineCore
import Logging
import NIOCore
import NIOPosix

/// The `message-storage-policy` of a broadcast channel, fixed when the channel is created.
///
/// From Apple's "Sending channel management requests to APNs": with `0` APNs stores no message for devices that are
/// offline (and allows a higher publishing budget); with `1` it keeps the most recent message for them.
public enum APNsMessageStoragePolicy: Int, Sendable, Hashable, Codable {
    /// `0`: no message is stored. Broadcasts on such a channel must carry `apns-expiration: 0`.
    case noMessageStored = 0
    /// `1`: the most recent message is stored for devices that are not reachable.
    case mostRecentMessageStored = 1
}

/// A broadcast channel as APNs describes it.
public struct APNsChannel: Sendable, Hashable {
    /// The channel ID (base64 text) that APNs assigned at creation; devices subscribe with it.
    public var channelID: String
    /// The message storage policy chosen at creation.
    public var storagePolicy: APNsMessageStoragePolicy
    /// The channel's push type, `"LiveActivity"`.
    public var pushType: String

    /// Creates a channel description.
    public init(channelID: String, storagePolicy: APNsMessageStoragePolicy, pushType: String = "LiveActivity") {
        self.channelID = channelID
        self.storagePolicy = storagePolicy
        self.pushType = pushType
    }
}

/// An error answer of the channel management API: any status other than 2xx, with the reason from APNs' JSON body
/// `{"reason": "..."}` ("Handling error responses from APNs"). Also thrown, with `reason == nil` and
/// ``APNsErrorDisposition/terminal``, for a 2xx answer that lacks what Apple's document promises (a 201 without
/// `apns-channel-id`, a channel or channel list body that cannot be read).
public struct APNsChannelManagementError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The HTTP status.
    public var status: Int
    /// APNs' reason, when the body had one.
    public var reason: APNsErrorReason?
    /// The `apns-request-id` header of the answer, when present.
    public var requestID: String?
    /// How to treat the error, from ``APNsErrorDisposition/disposition(status:reason:)``.
    public var disposition: APNsErrorDisposition
    /// What went wrong when the status alone does not say it (a malformed success answer); `nil` otherwise.
    public var detail: String?

    /// Creates an error; the disposition is derived from `status` and `reason`.
    public init(status: Int, reason: APNsErrorReason?, requestID: String? = nil, detail: String? = nil) {
        self.status = status
        self.reason = reason
        self.requestID = requestID
        self.detail = detail
        self.disposition = detail == nil ? APNsErrorDisposition.disposition(status: status, reason: reason) : .terminal
    }

    /// A one-line summary for logs.
    public var description: String {
        var text = "APNs channel management answered \(status)"
        if let reason {
            text += " \(reason.rawValue)"
        }
        if let detail {
            text += ": \(detail)"
        }
        if let requestID {
            text += " (apns-request-id \(requestID))"
        }
        return text + " [\(disposition)]"
    }
}

/// Creates, reads, lists and deletes broadcast channels over HTTP/2 with the channel management hosts
/// (``APNsEndpoint/channelManagementProduction``, ``APNsEndpoint/channelManagementSandbox``), as Apple's "Sending
/// channel management requests to APNs" describes.
///
/// It keeps its own connection(s) (an ``APNsClient`` pointed at the management host) and authorizes every request
/// with the same provider tokens as pushes. Each request carries `apns-request-id` (lowercase UUID text), which
/// APNs echoes back. An app may have up to 10,000 channels per environment; delete channels that are done.
///
/// A 2xx answer returns its result; any other status throws ``APNsChannelManagementError``; no answer throws
/// ``APNsTransportError``; an empty or unsendable bundle ID or channel ID throws ``APNsInvalidNotificationError``
/// before anything is sent. Call ``shutdown()`` when done.
public final class APNsChannelManager: Sendable {
    /// The provider token source whose current token authorizes every request.
    public var tokens: APNsProviderTokens { client.tokens }
    /// Where requests go.
    public var endpoint: APNsEndpoint { client.endpoint }

    private let client: APNsClient

    /// Creates a channel manager. No connection is opened until the first request.
    ///
    /// - Parameters:
    ///   - tokens: Provider tokens for the app's team and key (the same as for pushes).
    ///   - endpoint: ``APNsEndpoint/channelManagementProduction``, ``APNsEndpoint/channelManagementSandbox``, or a
    ///     custom endpoint.
    ///   - configuration: Connection tuning; one connection by default, which is plenty for management requests.
    ///   - eventLoopGroup: Where the connection lives.
    ///   - logger: Where connection events are logged.
    /// - Throws: ``APNsConfigurationError`` when `endpoint.trustedCAPEM` holds no valid certificate or TLS cannot
    ///   be configured (as ``APNsClient``'s initialiser).
    public init(
        tokens: APNsProviderTokens,
        endpoint: APNsEndpoint,
        configuration: APNsClient.Configuration = .init(connections: 1),
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger = Logger(label: "liveline.apns.channels")
    ) throws {
        client = try APNsClient(
            endpoint: endpoint,
            tokens: tokens,
            configuration: configuration,
            eventLoopGroup: eventLoopGroup,
            logger: logger
        )
    }

    /// Creates a channel: `POST /1/apps/<bundle id>/channels` with the body
    /// `{"message-storage-policy": <0|1>, "push-type": "LiveActivity"}`. APNs answers 201 Created with the new
    /// channel's ID in the `apns-channel-id` response header ("Sending channel management requests to APNs").
    ///
    /// - Throws: ``APNsChannelManagementError`` (for example `CannotCreateChannelConfig` when the app already has
    ///   the most channels allowed), ``APNsTransportError``, ``APNsInvalidNotificationError``.
    public func createChannel(
        bundleID: String,
        storagePolicy: APNsMessageStoragePolicy,
        requestID: UUID = UUID()
    ) async throws -> APNsChannel {
        try APNsRequestHead.validateBundleID(bundleID)
        let body = ByteBuffer(
            string: #"{"message-storage-policy":\#(storagePolicy.rawValue),"push-type":"LiveActivity"}"#
        )
        let answer = try await perform("POST", path: "/1/apps/\(bundleID)/channels", requestID: requestID, body: body)
        guard let channelID = answer.request.channelID, !channelID.isEmpty else {
            throw APNsChannelManagementError(
                status: answer.response.status,
                reason: nil,
                requestID: answer.response.requestID,
                detail: "the answer has no apns-channel-id header"
            )
        }
        return APNsChannel(channelID: channelID, storagePolicy: storagePolicy, pushType: "LiveActivity")
    }

    /// Reads a channel's configuration: `GET /1/apps/<bundle id>/channels` with the `apns-channel-id` header. APNs
    /// answers 200 with a JSON body holding `message-storage-policy` and `push-type` ("Sending channel management
    /// requests to APNs"). The returned channel's ID is the body's `channel-id` if it has one, else the
    /// `apns-channel-id` response header, else the ID asked for.
    ///
    /// - Throws: ``APNsChannelManagementError`` (for example `ChannelNotRegistered`), ``APNsTransportError``,
    ///   ``APNsInvalidNotificationError``.
    public func channel(bundleID: String, channelID: String, requestID: UUID = UUID()) async throws -> APNsChannel {
        try APNsRequestHead.validateBundleID(bundleID)
        try APNsRequestHead.validateChannelID(channelID)
        let answer = try await perform(
            "GET",
            path: "/1/apps/\(bundleID)/channels",
            requestID: requestID,
            channelID: channelID
        )
        guard let body = answer.request.body,
            let decoded = try? JSONDecoder().decode(ChannelBody.self, from: Data(body.readableBytesView)),
            let policy = APNsMessageStoragePolicy(rawValue: decoded.messageStoragePolicy)
        else {
            throw APNsChannelManagementError(
                status: answer.response.status,
                reason: nil,
                requestID: answer.response.requestID,
                detail: "the channel's configuration could not be read from the answer's body"
            )
        }
        return APNsChannel(
            channelID: decoded.channelID ?? answer.request.channelID ?? channelID,
            storagePolicy: policy,
            pushType: decoded.pushType ?? "LiveActivity"
        )
    }

    /// Deletes a channel: `DELETE /1/apps/<bundle id>/channels` with the `apns-channel-id` header. APNs answers
    /// 204 No Content ("Sending channel management requests to APNs").
    ///
    /// - Throws: ``APNsChannelManagementError`` (for example `ChannelNotRegistered`), ``APNsTransportError``,
    ///   ``APNsInvalidNotificationError``.
    public func deleteChannel(bundleID: String, channelID: String, requestID: UUID = UUID()) async throws {
        try APNsRequestHead.validateBundleID(bundleID)
        try APNsRequestHead.validateChannelID(channelID)
        _ = try await perform(
            "DELETE",
            path: "/1/apps/\(bundleID)/channels",
            requestID: requestID,
            channelID: channelID
        )
    }

    /// Lists the app's channel IDs: `GET /1/apps/<bundle id>/all-channels`. APNs answers 200 with the JSON body
    /// `{"channels": ["<channel id>", ...]}` ("Sending channel management requests to APNs").
    ///
    /// - Throws: ``APNsChannelManagementError``, ``APNsTransportError``, ``APNsInvalidNotificationError``.
    public func allChannels(bundleID: String, requestID: UUID = UUID()) async throws -> [String] {
        try APNsRequestHead.validateBundleID(bundleID)
        let answer = try await perform("GET", path: "/1/apps/\(bundleID)/all-channels", requestID: requestID)
        guard let body = answer.request.body,
            let decoded = try? JSONDecoder().decode(ChannelListBody.self, from: Data(body.readableBytesView))
        else {
            throw APNsChannelManagementError(
                status: answer.response.status,
                reason: nil,
                requestID: answer.response.requestID,
                detail: "the channel list could not be read from the answer's body"
            )
        }
        return decoded.channels
    }

    /// Closes the connection(s); requests in flight fail with ``APNsTransportError``, and so does every later one.
    public func shutdown() async {
        await client.shutdown()
    }

    /// Sends one request; a 2xx answer is returned, any other throws ``APNsChannelManagementError``.
    private func perform(
        _ method: String,
        path: String,
        requestID: UUID,
        channelID: String? = nil,
        body: ByteBuffer? = nil
    ) async throws -> (response: APNsResponse, request: PendingRequest) {
        var headers: [(name: String, value: String)] = []
        if let channelID {
            headers.append(("apns-channel-id", channelID))
        }
        headers.append(("apns-request-id", requestID.lowercasedString))
        let answer = try await client.send(APNsRequestHead(method: method, path: path, headers: headers, body: body))
        guard (200..<300).contains(answer.response.status) else {
            throw APNsChannelManagementError(
                status: answer.response.status,
                reason: answer.response.reason,
                requestID: answer.response.requestID
            )
        }
        return answer
    }
}

/// The body of a read channel answer.
private struct ChannelBody: Decodable {
    var channelID: String?
    var messageStoragePolicy: Int
    var pushType: String?

    private enum CodingKeys: String, CodingKey {
        case channelID = "channel-id"
        case messageStoragePolicy = "message-storage-policy"
        case pushType = "push-type"
    }
}

/// The body of an all-channels answer.
private struct ChannelListBody: Decodable {
    var channels: [String]
}
