import Foundation

/// FCM's answer to one `messages:send` request.
///
/// A success (2xx) carries the message's resource name `projects/<project>/messages/<id>`. An error carries
/// Google's error JSON:
///
/// ```json
/// {"error": {"code": 404, "message": "Requested entity was not found.", "status": "NOT_FOUND",
///            "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "UNREGISTERED"}]}}
/// ```
///
/// ``errorCode`` is the `FcmError` detail's `errorCode` when there is one; otherwise it is derived from `status`
/// (`NOT_FOUND` → `UNREGISTERED`, `RESOURCE_EXHAUSTED` → `QUOTA_EXCEEDED`, …) or from the HTTP status.
public struct FCMResponse: Sendable, Hashable {
    /// The `@type` of the detail that carries FCM's error code.
    public static let fcmErrorType = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
    /// The `@type` of the detail that names the fields of a request Google refused.
    public static let badRequestType = "type.googleapis.com/google.rpc.BadRequest"

    /// The HTTP status.
    public var status: Int
    /// The message's resource name, `projects/<project>/messages/<id>` (successes only).
    public var messageName: String?
    /// FCM's error code (errors only).
    public var errorCode: FCMErrorCode?
    /// Google's `error.status`, for example `NOT_FOUND` or `UNAUTHENTICATED` (errors only, when given).
    public var errorStatus: String?
    /// Google's `error.message` (errors only, when given).
    public var errorMessage: String?
    /// How long to wait before retrying, from the `Retry-After` header (seconds or an HTTP date).
    public var retryAfter: Duration?
    /// The fields a `google.rpc.BadRequest` detail names (`fieldViolations[].field`), or `nil` when the answer has
    /// no such detail (errors only).
    public var fieldViolations: [String]?
    /// Whether the answer carried FCM's own `FcmError` detail (errors only).
    public var hasFCMErrorDetail = false

    /// Whether FCM accepted the message.
    public var isSuccess: Bool { (200..<300).contains(status) }

    /// The message id: the last component of ``messageName``.
    public var messageID: String? {
        guard let messageName, let slash = messageName.lastIndex(of: "/") else { return messageName }
        return String(messageName[messageName.index(after: slash)...])
    }

    /// How to treat a refusal; `nil` for a success. An `INVALID_ARGUMENT` that is about the registration token
    /// (``blamesToken``) invalidates the token, as `UNREGISTERED` does; any other is ``FCMErrorDisposition/terminal``.
    public var disposition: FCMErrorDisposition? {
        if isSuccess { return nil }
        if blamesToken { return .invalidToken }
        return FCMErrorDisposition.disposition(status: status, code: errorCode)
    }

    /// Whether a 400 `INVALID_ARGUMENT` is about the registration token rather than the message. Google's error page
    /// shows the two apart: a token that is not a valid FCM registration token is answered with the `FcmError` detail
    /// alone, a message FCM cannot accept with a `google.rpc.BadRequest` detail naming the field at fault. A field
    /// violation on `message.token` blames the token too. (Liveline checks its messages' fields, data and size
    /// before sending, so its own `INVALID_ARGUMENT`s are the tokens'; Google's token guide asks senders to delete
    /// tokens answered `UNREGISTERED` or `INVALID_ARGUMENT`.)
    public var blamesToken: Bool {
        guard errorCode == .invalidArgument else { return false }
        guard let fieldViolations else { return hasFCMErrorDetail }
        return fieldViolations.contains("message.token")
    }

    /// A short text for logs and delivery records: the error code (or `HTTP <status>`), never a secret.
    public var reason: String {
        if isSuccess { return "OK" }
        return errorCode?.rawValue ?? "HTTP \(status)"
    }

    /// Creates a response from its parts.
    public init(
        status: Int, messageName: String? = nil, errorCode: FCMErrorCode? = nil, errorStatus: String? = nil,
        errorMessage: String? = nil, retryAfter: Duration? = nil
    ) {
        self.status = status
        self.messageName = messageName
        self.errorCode = errorCode
        self.errorStatus = errorStatus
        self.errorMessage = errorMessage
        self.retryAfter = retryAfter
    }

    /// Reads an answer from its status, body and `Retry-After` header; `now` resolves an HTTP-date `Retry-After`.
    /// A body that is not the documented JSON still gives a response, classified by its HTTP status.
    public init(status: Int, body: some Collection<UInt8>, retryAfterHeader: String? = nil, now: Date = Date()) {
        self.init(status: status)
        retryAfter = retryAfterHeader.flatMap { Self.retryAfter($0, now: now) }
        let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any]
        if isSuccess {
            messageName = object?["name"] as? String
            return
        }
        let error = object?["error"] as? [String: Any]
        errorStatus = error?["status"] as? String
        errorMessage = error?["message"] as? String
        let details = error?["details"] as? [[String: Any]] ?? []
        let detailCode = details.first { ($0["@type"] as? String) == Self.fcmErrorType }?["errorCode"] as? String
        hasFCMErrorDetail = detailCode != nil
        errorCode = detailCode.map(FCMErrorCode.init(rawValue:)) ?? Self.errorCode(googleStatus: errorStatus, httpStatus: status)
        let badRequests = details.filter { ($0["@type"] as? String) == Self.badRequestType }
        if !badRequests.isEmpty {
            fieldViolations = badRequests.flatMap { detail in
                (detail["fieldViolations"] as? [[String: Any]] ?? []).compactMap { $0["field"] as? String }
            }
        }
    }

    /// The FCM code a response without an `FcmError` detail stands for: from Google's canonical `status` when it
    /// matches one, else from the HTTP status, else the status text itself as an unknown code.
    static func errorCode(googleStatus: String?, httpStatus: Int) -> FCMErrorCode? {
        switch googleStatus {
        case "INVALID_ARGUMENT": return .invalidArgument
        case "NOT_FOUND": return .unregistered
        case "RESOURCE_EXHAUSTED": return .quotaExceeded
        case "UNAVAILABLE": return .unavailable
        case "INTERNAL": return .internal
        default: break
        }
        // A 404 without Google's status is not FCM's answer about a token (a wrong base URL, a proxy): no code.
        switch httpStatus {
        case 400: return .invalidArgument
        case 429: return .quotaExceeded
        case 500: return .internal
        case 503: return .unavailable
        default: return googleStatus.map(FCMErrorCode.unknown)
        }
    }

    /// Parses a `Retry-After` value: a non-negative number of seconds, or an HTTP date (IMF-fixdate, RFC 850 or
    /// asctime form) turned into the time left from `now` (zero when it has passed). Anything else is `nil`.
    public static func retryAfter(_ value: String, now: Date) -> Duration? {
        let text = value.trimmingCharacters(in: .whitespaces)
        if !text.isEmpty, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            guard let seconds = Int64(text) else { return nil }
            return .seconds(seconds)
        }
        // asctime pads a one-digit day with a second space.
        let collapsed = text.split(separator: " ").joined(separator: " ")
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: collapsed) {
                let seconds = max(0, date.timeIntervalSince(now))
                return .milliseconds(Int64((seconds * 1000).rounded(.up)))
            }
        }
        return nil
    }
}
