/// A request that breaks one of Liveline's rules, found before anything reaches a phone.
///
/// `code` is a stable machine-readable string, `field` names the offending input (a JSON path
/// such as `contentState` or `alert.title`, or a path parameter such as `activityId`).
public struct ValidationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A stable, machine-readable error code such as `invalid_id`.
    public var code: String
    /// A sentence for humans.
    public var message: String
    /// The input that broke the rule, if one did.
    public var field: String?

    /// Creates a validation error.
    public init(code: String, message: String, field: String? = nil) {
        self.code = code
        self.message = message
        self.field = field
    }

    public var description: String { "\(code): \(message)" + (field.map { " (\($0))" } ?? "") }
}

/// Limits Liveline enforces when a call arrives, so nothing fails silently later.
public enum Limits {
    /// The largest request body the API accepts, in bytes.
    public static let maximumRequestBodyBytes = 64 * 1024
    /// The largest APNs payload for a push to one token, in bytes.
    public static let maximumAPNsPayloadBytes = 4096
    /// The most a Live Activity's data may take on the phone, in bytes. Apple: "Static and dynamic data for a Live
    /// Activity, including data for ActivityKit updates and ActivityKit push notifications, can't exceed a combined size
    /// of 4 KB." A token push's payload holds its content state within APNs' 4,096 bytes anyway; a broadcast's may be
    /// larger (``maximumBroadcastPayloadBytes``), its content state not.
    public static let maximumActivityDataBytes = 4096
    /// The longest an identifier (activity id, device id, user id) may be.
    public static let maximumIdentifierLength = 128
    /// The longest push token accepted, in characters.
    public static let maximumPushTokenLength = 4096
    /// How far after the end Apple keeps an ended Live Activity on the Lock Screen at most.
    public static let maximumDismissalDelaySeconds: Int64 = 4 * 3600
}

/// Checks identifiers chosen by apps and backends: `[A-Za-z0-9._:-]{1,128}`, but not `.` or `..`.
///
/// An id is a path segment of the API (`/v1/activities/{activityId}`), and `.` and `..` are the dot segments URL
/// libraries, browsers and curl remove before they send a request (RFC 3986, 5.2.4): an activity called `..` could be
/// made, by a client that sends the path as it is, and never reached again by one that does not; worse, that one's
/// `/v1/activities/./deliveries` reads the activity called `deliveries`.
public enum Identifier {
    /// Whether `value` is a valid identifier: ``isWellFormed(_:)``, and not `.` or `..`.
    public static func isValid(_ value: String) -> Bool {
        isWellFormed(value) && value != "." && value != ".."
    }

    /// Whether `value` is 1 to 128 characters of `A-Z a-z 0-9 . _ : -`, dot segments included: the form of a position
    /// among ids (a page cursor's key), which may be one made before the dot segments were refused.
    public static func isWellFormed(_ value: String) -> Bool {
        let bytes = value.utf8
        guard !bytes.isEmpty, bytes.count <= Limits.maximumIdentifierLength else { return false }
        return bytes.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: ":"), UInt8(ascii: "-"):
                true
            default:
                false
            }
        }
    }

    /// Returns `value` if it is a valid identifier, or throws a ``ValidationError`` naming `field`.
    public static func validate(_ value: String, field: String) throws(ValidationError) -> String {
        guard isValid(value) else {
            throw ValidationError(
                code: "invalid_id",
                message: "\(field) must be 1 to \(Limits.maximumIdentifierLength) characters of A-Z, a-z, 0-9, '.', '_', ':' or '-', and not '.' or '..'.",
                field: field
            )
        }
        return value
    }
}

/// The platform an instance runs on.
public enum Platform: String, Sendable, Hashable, CaseIterable, Codable {
    case ios
    case android
}

/// Push token rules per platform.
public enum PushToken {
    /// Normalizes and checks a push token: APNs tokens are hexadecimal (returned lowercased);
    /// FCM registration tokens are printable ASCII without spaces. Errors name `field`.
    public static func validate(_ token: String, platform: Platform, field: String = "pushToken") throws(ValidationError) -> String {
        let bytes = token.utf8
        guard !bytes.isEmpty, bytes.count <= Limits.maximumPushTokenLength else {
            throw ValidationError(
                code: "invalid_push_token",
                message: "\(field) must be 1 to \(Limits.maximumPushTokenLength) characters.",
                field: field
            )
        }
        switch platform {
        case .ios:
            let isHex = bytes.allSatisfy { byte in
                (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                    || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(byte)
                    || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(byte)
            }
            guard isHex, bytes.count % 2 == 0 else {
                throw ValidationError(
                    code: "invalid_push_token",
                    message: "An iOS \(field) must be the hexadecimal form of the ActivityKit token (an even number of 0-9, a-f).",
                    field: field
                )
            }
            return token.lowercased()
        case .android:
            let isPrintable = bytes.allSatisfy { $0 > 0x20 && $0 < 0x7F }
            guard isPrintable else {
                throw ValidationError(
                    code: "invalid_push_token",
                    message: "An Android \(field) must be the FCM registration token: printable ASCII without spaces.",
                    field: field
                )
            }
            return token
        }
    }
}
