/// An FCM HTTP v1 error code, as found in an error response's
/// `error.details[].errorCode` (`@type: type.googleapis.com/google.firebase.fcm.v1.FcmError`).
///
/// The set is open: Google may add codes at any time, so this is a `RawRepresentable` struct rather than an enum.
/// Every documented code has a static constant; anything else is still representable (see ``unknown(_:)``) and is
/// classified by its HTTP status (see ``FCMErrorDisposition/disposition(status:code:)``).
public struct FCMErrorCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The code exactly as FCM spelled it, for example `"UNREGISTERED"`.
    public var rawValue: String

    /// Wraps a code as FCM sent it.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// A code this library has no constant for. Equal to any constant with the same raw value.
    public static func unknown(_ raw: String) -> FCMErrorCode { FCMErrorCode(rawValue: raw) }

    /// The raw code.
    public var description: String { rawValue }

    /// No more information is available about this error.
    public static let unspecifiedError = FCMErrorCode(rawValue: "UNSPECIFIED_ERROR")
    /// 400: the request was invalid (a field, the payload size, the token's form …). Never retried; when the answer
    /// blames the token (``FCMResponse/blamesToken``), the token is dropped as for ``unregistered``.
    public static let invalidArgument = FCMErrorCode(rawValue: "INVALID_ARGUMENT")
    /// 404: the token is no longer valid (the app was uninstalled, the token expired or rotated). Drop it.
    public static let unregistered = FCMErrorCode(rawValue: "UNREGISTERED")
    /// 403: the token belongs to another sender (another Firebase project): "the authenticated sender ID is different
    /// from the sender ID for the registration token". A refusal of that one token, never retried, which says nothing
    /// of the other tokens.
    public static let senderIDMismatch = FCMErrorCode(rawValue: "SENDER_ID_MISMATCH")
    /// 429: the project's or the device's sending rate is exceeded. Retry after a delay.
    public static let quotaExceeded = FCMErrorCode(rawValue: "QUOTA_EXCEEDED")
    /// 503: FCM is overloaded. Retry with backoff, honouring `Retry-After`.
    public static let unavailable = FCMErrorCode(rawValue: "UNAVAILABLE")
    /// 500: an unknown internal error. Retry with backoff.
    public static let `internal` = FCMErrorCode(rawValue: "INTERNAL")
    /// 401: "A message targeted to an iOS device or a web push registration could not be sent": the project's APNs
    /// certificate or web push key, which only those targets need, is invalid or missing. For an Android sender it is a
    /// refusal of that one token (an iOS or web registration token registered as Android's), never retried, which says
    /// nothing of the Android tokens or of the service account: not the credentials' refusal, and not a 401 that a new
    /// access token could cure.
    public static let thirdPartyAuthError = FCMErrorCode(rawValue: "THIRD_PARTY_AUTH_ERROR")

    /// Every code Google documents, each with a static constant above.
    public static let allDocumented: [FCMErrorCode] = [
        .unspecifiedError, .invalidArgument, .unregistered, .senderIDMismatch, .quotaExceeded, .unavailable, .internal,
        .thirdPartyAuthError,
    ]

    /// How a sender must treat a response with this code, or `nil` when the code alone does not say
    /// (`UNSPECIFIED_ERROR` and codes Google does not document): classify those by HTTP status.
    public var knownDisposition: FCMErrorDisposition? {
        switch self {
        case .unregistered: .invalidToken
        case .invalidArgument, .senderIDMismatch, .thirdPartyAuthError: .terminal
        case .quotaExceeded, .unavailable, .internal: .retryable
        default: nil
        }
    }
}

/// What a sender must do with a message FCM refused.
public enum FCMErrorDisposition: Sendable, Hashable {
    /// The registration token is no longer valid (`UNREGISTERED`, 404 with Google's `NOT_FOUND`): invalidate it; never retry.
    case invalidToken
    /// The request can never succeed as sent (`INVALID_ARGUMENT`, `SENDER_ID_MISMATCH`, `THIRD_PARTY_AUTH_ERROR`, other
    /// 4xx): never retry.
    case terminal
    /// The credentials are refused: a 403 without a code (`PERMISSION_DENIED`: the service account may not send for the
    /// project), or a 401 that a fresh access token did not cure. The app's service account or project is
    /// misconfigured.
    case credentials
    /// A temporary condition (`QUOTA_EXCEEDED`, `UNAVAILABLE`, `INTERNAL`, 429, 5xx): retry later with backoff,
    /// honouring `Retry-After`.
    case retryable

    /// Classifies an FCM error response: a code with a ``FCMErrorCode/knownDisposition`` decides by itself;
    /// otherwise the HTTP status: 401, 403 and 404 → ``credentials``; 429 and 5xx → ``retryable``; anything else →
    /// ``terminal``, so that a misunderstanding never turns into a retry loop. A 404 invalidates a token only with
    /// Google's word for it (`UNREGISTERED`, or the status `NOT_FOUND`): a bare one comes from something that does not
    /// know the send method (a wrong base URL or project), and would otherwise invalidate every device of the app.
    public static func disposition(status: Int, code: FCMErrorCode?) -> FCMErrorDisposition {
        if let known = code?.knownDisposition { return known }
        switch status {
        case 401, 403, 404: return .credentials
        case 429, 500...599: return .retryable
        default: return .terminal
        }
    }
}
