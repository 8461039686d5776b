import Foundation

/// Dates as the Liveline API accepts them: an ISO-8601 string (`2026-11-21T10:00:00Z`, optionally
/// with fractional seconds or an offset) or a number of seconds since 1970.
public enum APIDate {
    /// Seconds since 1970 for `value`, or a ``ValidationError`` naming `field`.
    public static func epochSeconds(from value: JSONValue, field: String) throws(ValidationError) -> Int64 {
        switch value {
        case .integer(let seconds):
            guard seconds >= 0, seconds < 100_000_000_000 else { throw outOfRange(field) }
            return seconds
        case .number(let seconds):
            guard seconds.isFinite, seconds >= 0, seconds < 100_000_000_000 else { throw outOfRange(field) }
            return Int64(seconds.rounded(.down))
        case .string(let text):
            guard let date = parseISO8601(text) else {
                throw ValidationError(
                    code: "invalid_date",
                    message: "\(field) must be an ISO-8601 date such as 2026-11-21T10:00:00Z, or seconds since 1970.",
                    field: field
                )
            }
            return epochSeconds(date)
        default:
            throw ValidationError(
                code: "invalid_type",
                message: "\(field) must be an ISO-8601 string or a number of seconds since 1970, not \(value.kindName).",
                field: field
            )
        }
    }

    /// Whole seconds since 1970 for `date`, rounded down: how Liveline writes times on the wire (`aps` dates,
    /// `apns-expiration`, stale dates).
    public static func epochSeconds(_ date: Date) -> Int64 {
        Int64(date.timeIntervalSince1970.rounded(.down))
    }

    /// Parses an ISO-8601 internet date-time, with or without fractional seconds.
    public static func parseISO8601(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text)
    }

    /// Formats seconds since 1970 as an ISO-8601 UTC string.
    public static func iso8601(epochSeconds: Int64) -> String {
        iso8601(Date(timeIntervalSince1970: TimeInterval(epochSeconds)))
    }

    /// Formats a date as an ISO-8601 UTC string with millisecond precision when it has any.
    public static func iso8601(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        let millis = Int64((date.timeIntervalSince1970 * 1000).rounded())
        formatter.formatOptions = millis % 1000 == 0 ? [.withInternetDateTime] : [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    private static func outOfRange(_ field: String) -> ValidationError {
        ValidationError(code: "invalid_date", message: "\(field) is out of range.", field: field)
    }
}
