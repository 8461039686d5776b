import Foundation
import LivelineCore
import NIOCore

/// One broadcast push (iOS 18 and later): a single request that APNs delivers to every device subscribed to a
/// channel.
///
/// As Apple's "Sending broadcast push notification requests to APNs" describes it: `POST /4/broadcasts/apps/<bundle
/// id>` on the APNs push host (the same host, and here the same connections, as device pushes), with the headers
/// `apns-channel-id`, `apns-push-type: liveactivity`, `apns-priority` (10, 5 or 1), `apns-expiration` (optional;
/// it must be 0 for a channel whose policy is ``APNsMessageStoragePolicy/noMessageStored``) and `apns-request-id`
/// (optional; APNs echoes it back), the provider token as `authorization: bearer <jwt>`, and the JSON payload of at
/// most 5,120 bytes. There is no device token in the path and no `apns-topic` header. APNs answers 200 with
/// `apns-request-id` (and `apns-unique-id` in the development environment) when it accepted the push.
public struct APNsBroadcast: Sendable {
    /// The largest payload APNs accepts for a broadcast, in bytes.
    public static let maximumPayloadBytes = 5120

    /// The app's bundle ID, the last path component.
    public var bundleID: String
    /// The `apns-channel-id` header: the channel ID APNs returned when the channel was created (base64 text).
    public var channelID: String
    /// The `apns-priority` header: 10 (immediate), 5 (opportunistic) or 1 (low).
    public var priority: Int
    /// The `apns-expiration` header in epoch seconds (0 = deliver now or never); `nil` omits the header.
    public var expiration: Int64?
    /// The `apns-request-id` header, sent as lowercase UUID text; APNs echoes it back.
    public var requestID: UUID
    /// The already-encoded JSON body, at most ``maximumPayloadBytes`` bytes.
    public var payload: ByteBuffer

    /// Creates a broadcast push.
    public init(
        bundleID: String,
        channelID: String,
        priority: Int,
        expiration: Int64?,
        requestID: UUID = UUID(),
        payload: ByteBuffer
    ) {
        self.bundleID = bundleID
        self.channelID = channelID
        self.priority = priority
        self.expiration = expiration
        self.requestID = requestID
        self.payload = payload
    }

    /// The request as the connection writes it, after checking every part can be sent.
    ///
    /// - Throws: ``APNsInvalidNotificationError``.
    func requestHead() throws -> APNsRequestHead {
        try APNsRequestHead.validateBundleID(bundleID)
        try APNsRequestHead.validateChannelID(channelID)
        guard priority == 10 || priority == 5 || priority == 1 else {
            throw APNsInvalidNotificationError("A broadcast's priority must be 10, 5 or 1, not \(priority).")
        }
        guard payload.readableBytes <= Self.maximumPayloadBytes else {
            throw APNsInvalidNotificationError(
                "A broadcast payload may have at most \(Self.maximumPayloadBytes) bytes; this one has \(payload.readableBytes)."
            )
        }
        var headers: [(name: String, value: String)] = [
            ("apns-channel-id", channelID),
            ("apns-push-type", "liveactivity"),
            ("apns-priority", String(priority)),
        ]
        if let expiration {
            headers.append(("apns-expiration", String(expiration)))
        }
        headers.append(("apns-request-id", requestID.lowercasedString))
        return APNsRequestHead(
            method: "POST",
            path: "/4/broadcasts/apps/" + bundleID,
            headers: headers,
            body: payload
        )
    }
}

/// A request other than a device push, as one connection writes it: `:method`, `:path`, the headers after
/// `authorization`, and the body (sent with `content-type: application/json`). `:scheme`, `:authority` and
/// `authorization` are added by the connection.
struct APNsRequestHead: Sendable {
    var method: String
    var path: String
    var headers: [(name: String, value: String)]
    var body: ByteBuffer?

    /// A bundle ID goes into the path: non-empty printable ASCII without `/`, `?`, `#` or `%`.
    static func validateBundleID(_ bundleID: String) throws {
        let bytes = bundleID.utf8
        let safe = !bytes.isEmpty && bytes.count <= 255
            && bytes.allSatisfy { byte in
                byte > 0x20 && byte < 0x7F && byte != UInt8(ascii: "/") && byte != UInt8(ascii: "?")
                    && byte != UInt8(ascii: "#") && byte != UInt8(ascii: "%")
            }
        guard safe else {
            throw APNsInvalidNotificationError(
                "The bundle ID \"\(bundleID)\" must be 1 to 255 printable ASCII characters without '/', '?', '#' or '%'."
            )
        }
    }

    /// A channel ID goes into the `apns-channel-id` header: non-empty printable ASCII without spaces.
    static func validateChannelID(_ channelID: String) throws {
        let bytes = channelID.utf8
        guard !bytes.isEmpty, bytes.count <= 1024, bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw APNsInvalidNotificationError(
                "The channel ID \"\(channelID)\" must be 1 to 1,024 printable ASCII characters without spaces."
            )
        }
    }
}

extension APNsClient {
    /// Sends one broadcast push and returns APNs' answer, whatever its HTTP status (200 on success), like
    /// ``send(_:)-(APNsNotification)``. The answer's ``APNsResponse/requestID`` is the `apns-request-id` APNs
    /// returned.
    ///
    /// It goes over the same connections as device pushes: create the client with the push host
    /// (``APNsEndpoint/production`` or ``APNsEndpoint/sandbox``), not a channel management host.
    ///
    /// - Throws: ``APNsInvalidNotificationError`` before anything is sent when the bundle ID or channel ID cannot
    ///   be sent, the priority is not 10, 5 or 1, or the payload has more than
    ///   ``APNsBroadcast/maximumPayloadBytes`` bytes; ``APNsTransportError`` when no answer arrived;
    ///   `CancellationError` when the calling task is cancelled.
    public func send(_ broadcast: APNsBroadcast) async throws -> APNsResponse {
        let head = try broadcast.requestHead()
        return try await send(head).response
    }
}
