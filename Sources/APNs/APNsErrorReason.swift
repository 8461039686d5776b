/// A reason APNs gives for rejecting a request, as found in the JSON body `{"reason": "..."}` of an error
/// response (or in the debug data of a `GOAWAY` frame).
///
/// The set is open: Apple may add reasons at any time, so this is a `RawRepresentable` struct rather than an
/// enum. Every reason Apple documents has a static constant; anything else is still representable
/// (see ``unknown(_:)``) and is classified by its HTTP status (see ``APNsErrorDisposition/disposition(status:reason:)``).
public struct APNsErrorReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The reason exactly as APNs spelled it, for example `"BadDeviceToken"`.
    public var rawValue: String

    /// Wraps a reason string as APNs sent it.
    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    /// A reason this library has no constant for. Equal to any constant with the same raw value.
    public static func unknown(_ raw: String) -> APNsErrorReason {
        APNsErrorReason(rawValue: raw)
    }

    /// The raw reason string.
    public var description: String { rawValue }

    // MARK: 400 Bad Request

    /// 400: the collapse identifier exceeds the maximum allowed size.
    public static let badCollapseId = APNsErrorReason(rawValue: "BadCollapseId")
    /// 400: the device token is invalid (wrong format, or meant for the other environment).
    public static let badDeviceToken = APNsErrorReason(rawValue: "BadDeviceToken")
    /// 400: the `apns-expiration` value is invalid.
    public static let badExpirationDate = APNsErrorReason(rawValue: "BadExpirationDate")
    /// 400: the `apns-id` value is invalid.
    public static let badMessageId = APNsErrorReason(rawValue: "BadMessageId")
    /// 400: the `apns-priority` value is invalid.
    public static let badPriority = APNsErrorReason(rawValue: "BadPriority")
    /// 400: the `apns-topic` value is invalid.
    public static let badTopic = APNsErrorReason(rawValue: "BadTopic")
    /// 400: the device token does not match the specified topic.
    public static let deviceTokenNotForTopic = APNsErrorReason(rawValue: "DeviceTokenNotForTopic")
    /// 400: one or more headers are repeated.
    public static let duplicateHeaders = APNsErrorReason(rawValue: "DuplicateHeaders")
    /// 400: idle timeout.
    public static let idleTimeout = APNsErrorReason(rawValue: "IdleTimeout")
    /// 400: the `apns-push-type` value is invalid.
    public static let invalidPushType = APNsErrorReason(rawValue: "InvalidPushType")
    /// 400: the device token is not specified in the request path.
    public static let missingDeviceToken = APNsErrorReason(rawValue: "MissingDeviceToken")
    /// 400: the `apns-topic` header is missing but required.
    public static let missingTopic = APNsErrorReason(rawValue: "MissingTopic")
    /// 400: the message payload is empty.
    public static let payloadEmpty = APNsErrorReason(rawValue: "PayloadEmpty")
    /// 400: pushing to this topic is not allowed.
    public static let topicDisallowed = APNsErrorReason(rawValue: "TopicDisallowed")

    // MARK: 403 Forbidden

    /// 403: the certificate is invalid.
    public static let badCertificate = APNsErrorReason(rawValue: "BadCertificate")
    /// 403: the client certificate is for the wrong environment.
    public static let badCertificateEnvironment = APNsErrorReason(rawValue: "BadCertificateEnvironment")
    /// 403: the provider token is stale and a new token should be generated.
    public static let expiredProviderToken = APNsErrorReason(rawValue: "ExpiredProviderToken")
    /// 403: the specified action is not allowed.
    public static let forbidden = APNsErrorReason(rawValue: "Forbidden")
    /// 403: the provider token is not valid, or its signature can't be verified.
    public static let invalidProviderToken = APNsErrorReason(rawValue: "InvalidProviderToken")
    /// 403: no provider certificate was used and no provider token was in the `authorization` header.
    public static let missingProviderToken = APNsErrorReason(rawValue: "MissingProviderToken")
    /// 403: the key ID in the provider token is unrelated to the one used first on this connection;
    /// a new connection is needed.
    public static let unrelatedKeyIdInToken = APNsErrorReason(rawValue: "UnrelatedKeyIdInToken")
    /// 403: the key ID in the provider token is for the wrong environment.
    public static let badEnvironmentKeyIdInToken = APNsErrorReason(rawValue: "BadEnvironmentKeyIdInToken")

    // MARK: 404, 405, 410, 413, 429, 500, 503

    /// 404: the request contained an invalid `:path` value.
    public static let badPath = APNsErrorReason(rawValue: "BadPath")
    /// 405: the specified `:method` value isn't POST.
    public static let methodNotAllowed = APNsErrorReason(rawValue: "MethodNotAllowed")
    /// 410: the device token has expired.
    public static let expiredToken = APNsErrorReason(rawValue: "ExpiredToken")
    /// 410: the device token is inactive for the specified topic.
    public static let unregistered = APNsErrorReason(rawValue: "Unregistered")
    /// 413: the message payload is too large.
    public static let payloadTooLarge = APNsErrorReason(rawValue: "PayloadTooLarge")
    /// 429: the provider's authentication token is being updated too often.
    public static let tooManyProviderTokenUpdates = APNsErrorReason(rawValue: "TooManyProviderTokenUpdates")
    /// 429: too many requests were made consecutively to the same device token.
    public static let tooManyRequests = APNsErrorReason(rawValue: "TooManyRequests")
    /// 500: an internal server error occurred.
    public static let internalServerError = APNsErrorReason(rawValue: "InternalServerError")
    /// 503: the service is unavailable.
    public static let serviceUnavailable = APNsErrorReason(rawValue: "ServiceUnavailable")
    /// 503: the APNs server is shutting down.
    public static let shutdown = APNsErrorReason(rawValue: "Shutdown")

    // MARK: Broadcast and channel management (iOS 18)

    /// 400: broadcast push notifications are not enabled for the app (its key, or the app in the developer
    /// account, lacks the broadcast capability).
    public static let featureNotEnabled = APNsErrorReason(rawValue: "FeatureNotEnabled")
    /// 400: the `apns-channel-id` header is missing but required.
    public static let missingChannelId = APNsErrorReason(rawValue: "MissingChannelId")
    /// 400: the `apns-channel-id` value is not a valid channel ID.
    public static let badChannelId = APNsErrorReason(rawValue: "BadChannelId")
    /// 400: the channel does not exist (never created, deleted, or of the other environment).
    public static let channelNotRegistered = APNsErrorReason(rawValue: "ChannelNotRegistered")
    /// 400: the channel could not be created, for example because the app already has the most channels allowed
    /// (10,000 per environment).
    public static let cannotCreateChannelConfig = APNsErrorReason(rawValue: "CannotCreateChannelConfig")
    /// 400: the `apns-push-type` header is missing but required.
    public static let missingPushType = APNsErrorReason(rawValue: "MissingPushType")
    /// 403: the topic (bundle ID) does not match the one the provider token or certificate is for.
    public static let topicMismatch = APNsErrorReason(rawValue: "TopicMismatch")

    /// The reasons Apple documents for broadcast pushes and channel management that are not in
    /// ``allDocumented``; they also use `BadExpirationDate`, `BadPriority`, `InvalidPushType`, the provider token
    /// reasons and the 404, 405, 413, 429, 500 and 503 reasons.
    public static let allDocumentedForBroadcast: [APNsErrorReason] = [
        .featureNotEnabled, .missingChannelId, .badChannelId, .channelNotRegistered, .cannotCreateChannelConfig,
        .missingPushType, .topicMismatch,
    ]

    /// Every reason Apple documents for token-based pushes, each with a static constant above.
    public static let allDocumented: [APNsErrorReason] = [
        .badCollapseId, .badDeviceToken, .badExpirationDate, .badMessageId, .badPriority, .badTopic,
        .deviceTokenNotForTopic, .duplicateHeaders, .idleTimeout, .invalidPushType, .missingDeviceToken,
        .missingTopic, .payloadEmpty, .topicDisallowed, .badCertificate, .badCertificateEnvironment,
        .expiredProviderToken, .forbidden, .invalidProviderToken, .missingProviderToken,
        .unrelatedKeyIdInToken, .badEnvironmentKeyIdInToken, .badPath, .methodNotAllowed, .expiredToken,
        .unregistered, .payloadTooLarge, .tooManyProviderTokenUpdates, .tooManyRequests,
        .internalServerError, .serviceUnavailable, .shutdown,
    ]

    /// How a sender must treat a response carrying this reason, or `nil` for a reason Apple does not document
    /// (classify those by HTTP status with ``APNsErrorDisposition/disposition(status:reason:)``).
    public var knownDisposition: APNsErrorDisposition? {
        switch self {
        case .badDeviceToken, .deviceTokenNotForTopic, .unregistered, .expiredToken:
            return .invalidToken
        case .badCollapseId, .badExpirationDate, .badMessageId, .badPriority, .badTopic, .duplicateHeaders,
            .invalidPushType, .missingDeviceToken, .missingTopic, .payloadEmpty, .topicDisallowed, .forbidden,
            .badPath, .methodNotAllowed, .payloadTooLarge, .featureNotEnabled, .missingChannelId, .badChannelId,
            .channelNotRegistered, .cannotCreateChannelConfig, .missingPushType, .topicMismatch:
            return .terminal
        case .expiredProviderToken, .invalidProviderToken, .missingProviderToken, .unrelatedKeyIdInToken,
            .badCertificate, .badCertificateEnvironment, .badEnvironmentKeyIdInToken:
            return .credentials
        case .tooManyRequests, .tooManyProviderTokenUpdates, .internalServerError, .serviceUnavailable, .shutdown,
            .idleTimeout:
            return .retryable
        default:
            return nil
        }
    }

    /// How a sender must treat this reason. Documented reasons have a fixed disposition; a reason Apple does not
    /// document counts as ``APNsErrorDisposition/terminal`` here, because without the HTTP status nothing better
    /// is known. Prefer ``APNsResponse/disposition`` or ``disposition(status:reason:)``, which also use the status.
    public var disposition: APNsErrorDisposition {
        knownDisposition ?? .terminal
    }

    /// Classifies an error response; the same as ``APNsErrorDisposition/disposition(status:reason:)``.
    public static func disposition(status: Int, reason: APNsErrorReason?) -> APNsErrorDisposition {
        APNsErrorDisposition.disposition(status: status, reason: reason)
    }
}

/// What a sender must do with a push APNs refused.
public enum APNsErrorDisposition: Sendable, Hashable {
    /// The device token is no longer (or never was) valid for this topic: `BadDeviceToken`,
    /// `DeviceTokenNotForTopic`, `Unregistered`, `ExpiredToken`. Drop or invalidate the token; never retry.
    case invalidToken
    /// The request can never succeed as sent (`PayloadTooLarge`, `BadTopic`, `BadPriority`, `Forbidden`,
    /// `TopicDisallowed`, ...), including every broadcast and channel error (`FeatureNotEnabled`, `BadChannelId`,
    /// `ChannelNotRegistered`, `CannotCreateChannelConfig`, `TopicMismatch`, ...). Never retry.
    case terminal
    /// The provider credentials are wrong, expired or for the other environment (`ExpiredProviderToken`,
    /// `InvalidProviderToken`, `MissingProviderToken`, `UnrelatedKeyIdInToken`, `BadCertificate`,
    /// `BadCertificateEnvironment`, `BadEnvironmentKeyIdInToken`).
    ///
    /// ``APNsClient`` has already forced a new provider token after `ExpiredProviderToken` and
    /// `InvalidProviderToken`, and retires the connection after `UnrelatedKeyIdInToken`, so one later retry
    /// is reasonable; if it fails the same way, the app's key, team or environment is misconfigured.
    case credentials
    /// A temporary condition (`TooManyRequests`, `TooManyProviderTokenUpdates`, `InternalServerError`,
    /// `ServiceUnavailable`, `Shutdown`, `IdleTimeout`): retry later with backoff, honouring `retry-after`.
    case retryable

    /// Classifies an APNs error response.
    ///
    /// A documented reason decides by itself. A missing or undocumented reason is classified by the HTTP status:
    /// 410 → ``invalidToken``; 429 and 5xx → ``retryable``; 403 → ``credentials``; any other status (other
    /// 4xx, or anything unexpected) → ``terminal``, so that a misunderstanding never turns into a retry loop.
    public static func disposition(status: Int, reason: APNsErrorReason?) -> APNsErrorDisposition {
        if let known = reason?.knownDisposition {
            return known
        }
        switch status {
        case 410:
            return .invalidToken
        case 429, 500...599:
            return .retryable
        case 403:
            return .credentials
        default:
            return .terminal
        }
    }
}
