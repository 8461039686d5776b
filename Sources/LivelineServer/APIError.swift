import HTTPTypes
import LivelineCore

/// An error the API answers with: `{"error": {"code", "message", "field"}}` and an HTTP status.
public struct APIError: Error, Sendable, Hashable {
    /// The HTTP status.
    public var status: HTTPResponse.Status
    /// A stable, machine-readable code such as `activity_ended`.
    public var code: String
    /// A sentence for humans.
    public var message: String
    /// The request field (body JSON path, path parameter or query parameter) at fault, if any.
    public var field: String?

    /// Creates an API error.
    public init(_ status: HTTPResponse.Status, code: String, message: String, field: String? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
    }

    /// The JSON body.
    public var json: JSONValue {
        var error: [String: JSONValue] = ["code": .string(code), "message": .string(message)]
        error["field"] = field.map(JSONValue.string) ?? .null
        return .object(["error": .object(error)])
    }

    /// A semantic (422) error from a rule in LivelineCore.
    public init(_ validation: ValidationError) {
        self.init(.unprocessableContent, code: validation.code, message: validation.message, field: validation.field)
    }

    static func badRequest(_ code: String, _ message: String, field: String? = nil) -> APIError {
        APIError(.badRequest, code: code, message: message, field: field)
    }

    static func invalidType(_ field: String, expected: String, got value: JSONValue) -> APIError {
        .badRequest("invalid_type", "\(field) must be \(expected), not \(value.kindName).", field: field)
    }

    static let unauthorized = APIError(
        .unauthorized, code: "unauthorized", message: "Send an API key as 'Authorization: Bearer <key>'."
    )
    static let invalidKey = APIError(.unauthorized, code: "invalid_api_key", message: "The API key is not valid.")
    static let secretKeyRequired = APIError(
        .forbidden, code: "secret_key_required",
        message: "This route needs the app's secret key (sk_…); publishable keys may only register devices and instances and report instance events."
    )
    static func activityNotFound(_ id: String) -> APIError {
        APIError(.notFound, code: "activity_not_found", message: "No activity '\(id)' in this app.", field: "activityId")
    }
    static func instanceNotFound(_ id: String) -> APIError {
        APIError(.notFound, code: "instance_not_found", message: "No instance for device '\(id)' on this activity.", field: "deviceId")
    }
    static func deviceNotFound(_ id: String) -> APIError {
        APIError(.notFound, code: "device_not_found", message: "No device '\(id)' in this app.", field: "deviceId")
    }
    static func activityEnded(_ id: String) -> APIError {
        APIError(.conflict, code: "activity_ended", message: "Activity '\(id)' has ended; it takes no further updates.", field: "activityId")
    }
    static let invalidIdempotencyKey = APIError(
        .badRequest, code: "invalid_idempotency_key",
        message: "Idempotency-Key must be sent once, as 1 to \(IdempotencyKey.maximumLength) printable ASCII characters, "
            + "neither the first nor the last a space.",
        field: IdempotencyKey.headerName
    )
    static let idempotencyKeyReused = APIError(
        .unprocessableContent, code: "idempotency_key_reused",
        message: "This Idempotency-Key was used in the last 24 hours with another request (method, path or body); "
            + "use a new key for a new request.",
        field: IdempotencyKey.headerName
    )
    static let bodyTooLarge = APIError(
        .contentTooLarge, code: "body_too_large", message: "The request body is over \(Limits.maximumRequestBodyBytes) bytes."
    )
}

// MARK: Broadcast channels

extension APIError {
    static func deliveryMismatch(existing: ActivityDelivery) -> APIError {
        APIError(
            .conflict, code: "delivery_mismatch",
            message: "This activity is delivered by \(existing.rawValue); delivery is chosen by the start or first update that creates it.",
            field: "delivery"
        )
    }
    static func storagePolicyMismatch(existing: ChannelStoragePolicy) -> APIError {
        APIError(
            .conflict, code: "storage_policy_mismatch",
            message: "The activity's channel stores '\(existing.rawValue)'; APNs fixes a channel's storage policy when it is created.",
            field: "messageStoragePolicy"
        )
    }
    static func channelLimitReached(maximum: Int) -> APIError {
        APIError(
            .conflict, code: "channel_limit_reached",
            message: "The app holds \(maximum) broadcast channels, as many as APNs allows; end broadcast activities (their channels are deleted once they leave the screens) or use token delivery.",
            field: "delivery"
        )
    }
    static let channelMismatch = APIError(
        .conflict, code: "channel_mismatch", message: "channelId is not this activity's broadcast channel (GET /v1/activities/{activityId}/channel).",
        field: "channelId"
    )
    static func notBroadcast(_ activityID: String) -> APIError {
        APIError(
            .notFound, code: "channel_not_found",
            message: "Activity '\(activityID)' has no broadcast channel: it is delivered to each phone's token.", field: "activityId"
        )
    }
}
