import Foundation
import NIOCore

/// One push to one device token.
///
/// `payload` is the already-encoded JSON body. It is built once per update and shared by every notification of
/// that update: `ByteBuffer` is copy-on-write, so sharing it costs no copy and the client writes it to the wire as
/// it is.
public struct APNsNotification: Sendable {
    /// The device (or push-to-start / activity update) token as hexadecimal; lowercase is what APNs documents.
    public var deviceToken: String
    /// The `apns-topic` header, for Live Activities `"<bundle id>.push-type.liveactivity"`.
    public var topic: String
    /// The `apns-push-type` header; `"liveactivity"` by default.
    public var pushType: String
    /// The `apns-priority` header: 10 (immediate, counts against the budget) or 5 (opportunistic).
    public var priority: Int
    /// The `apns-expiration` header in epoch seconds (0 = deliver now or never); `nil` omits the header.
    public var expiration: Int64?
    /// The `apns-id` header, sent in lowercase, which APNs echoes back; `nil` (the default) omits the header, and APNs
    /// makes an id up and returns it in its response (``APNsResponse/apnsID``) all the same (Apple, "Sending
    /// notification requests to APNs"). Left out, a push costs a header less to encode (a 36-character literal) on every
    /// request, and a random UUID less to make.
    public var apnsID: UUID?
    /// The JSON body.
    public var payload: ByteBuffer

    /// Creates a notification.
    public init(
        deviceToken: String,
        topic: String,
        pushType: String = "liveactivity",
        priority: Int,
        expiration: Int64? = nil,
        apnsID: UUID? = nil,
        payload: ByteBuffer
    ) {
        self.deviceToken = deviceToken
        self.topic = topic
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.apnsID = apnsID
        self.payload = payload
    }
}

/// APNs' answer to one request, successful or not.
public struct APNsResponse: Sendable, Hashable {
    /// The HTTP status: 200 on success.
    public var status: Int
    /// The `apns-id` header APNs answered with: the request's own, or the one APNs made up for a request without.
    public var apnsID: String?
    /// The `apns-unique-id` header, if present (development environment only).
    public var apnsUniqueID: String?
    /// The reason from the JSON body `{"reason": "..."}` of an error response.
    public var reason: APNsErrorReason?
    /// For 410: when the token stopped being valid for the topic (the body's `timestamp`, milliseconds since 1970).
    public var tokenInvalidSince: Date?
    /// The `retry-after` header (seconds), if present.
    public var retryAfter: Duration?
    /// The `apns-request-id` header, if present: APNs answers broadcast and channel management requests with the
    /// `apns-request-id` the request carried (or one it made up when the request had none).
    public var requestID: String?
    /// For a 403 `ExpiredProviderToken` or `InvalidProviderToken`: whether the client has since replaced the refused
    /// provider token, so that sending again may succeed. A token younger than 20 minutes is kept (see
    /// ``APNsProviderTokens/refresh(replacing:)``), and then this is false: the request would be refused again.
    public var providerTokenReplaced = false

    /// Creates a response value (the client builds these; fakes in tests may too).
    public init(
        status: Int,
        apnsID: String? = nil,
        apnsUniqueID: String? = nil,
        reason: APNsErrorReason? = nil,
        tokenInvalidSince: Date? = nil,
        retryAfter: Duration? = nil,
        requestID: String? = nil
    ) {
        self.status = status
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.reason = reason
        self.tokenInvalidSince = tokenInvalidSince
        self.retryAfter = retryAfter
        self.requestID = requestID
    }

    /// Whether APNs accepted the notification (status 200).
    public var isSuccess: Bool { status == 200 }

    /// How a sender must treat this response; `nil` on success.
    public var disposition: APNsErrorDisposition? {
        isSuccess ? nil : APNsErrorDisposition.disposition(status: status, reason: reason)
    }
}

/// The request never got an answer from APNs: the connection or TLS handshake failed, the connection closed (or
/// was told to go away) before the response, the request timed out, or the client was shut down.
///
/// The notification may or may not have reached APNs, so it is always safe to retry (a Live Activity push carries
/// its own timestamp, so a duplicate is harmless).
public struct APNsTransportError: Error, Sendable, CustomStringConvertible {
    /// What happened, for logs.
    public var description: String

    /// Creates a transport error with the given explanation.
    public init(_ description: String) {
        self.description = description
    }

    /// Creates a transport error with the given explanation.
    public init(description: String) {
        self.description = description
    }
}

/// A notification that cannot be put on the wire as given (a device token that is not hexadecimal, a topic or
/// push type with characters HTTP/2 headers cannot carry). Sending it again can never succeed.
public struct APNsInvalidNotificationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What is wrong with the notification.
    public var description: String

    /// Creates an error with the given explanation.
    public init(_ description: String) {
        self.description = description
    }
}
