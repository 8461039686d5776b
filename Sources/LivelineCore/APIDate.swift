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
                    message: "\(field) must be an RFC 3339 date such as 2026-11-21T10:00:00Z, or seconds since 1970.",
                    field: field
                )
            }
            // The same range as a number's: a date before 1970 is no time an activity can have.
            let seconds = epochSeconds(date)
            guard seconds >= 0, seconds < 100_000_000_000 else { throw outOfRange(field) }
            return seconds
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

    /// Parses an internet date-time (RFC 3339 §5.6, the OpenAPI `date-time` format): `2026-11-21T10:00:00Z`, with or
    /// without fractional seconds, `Z` or an offset such as `+02:00`, `T` and `Z` in either case. Anything else is nil:
    /// a day the month does not have, an hour past 23, an offset past 23:59, text after the date. (Foundation's
    /// `ISO8601DateFormatter` on Linux rolled `2026-11-31` over to December 1st and ignored what followed a date.)
    public static func parseISO8601(_ text: String) -> Date? {
        let bytes = Array(text.utf8)
        var index = 0
        func number(_ digits: Int) -> Int? {
            guard index + digits <= bytes.count else { return nil }
            var value = 0
            for byte in bytes[index..<index + digits] {
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
            }
            index += digits
            return value
        }
        func expect(_ characters: String) -> Bool {
            guard index < bytes.count, characters.utf8.contains(bytes[index]) else { return false }
            index += 1
            return true
        }
        guard let year = number(4), expect("-"), let month = number(2), expect("-"), let day = number(2), expect("Tt"),
            let hour = number(2), expect(":"), let minute = number(2), expect(":"), let second = number(2)
        else { return nil }
        guard (1...12).contains(month), day >= 1, day <= daysIn(month: month, year: year), hour <= 23, minute <= 59, second <= 60 else {
            return nil
        }
        var fraction = 0.0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            var scale = 0.1
            let start = index
            while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
                fraction += Double(bytes[index] - UInt8(ascii: "0")) * scale
                scale /= 10
                index += 1
            }
            guard index > start else { return nil }
        }
        var offsetSeconds = 0
        if expect("Zz") {
            offsetSeconds = 0
        } else if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
            let sign = bytes[index] == UInt8(ascii: "-") ? -1 : 1
            index += 1
            guard let offsetHours = number(2), expect(":"), let offsetMinutes = number(2), offsetHours <= 23, offsetMinutes <= 59 else {
                return nil
            }
            offsetSeconds = sign * (offsetHours * 3600 + offsetMinutes * 60)
        } else {
            return nil
        }
        guard index == bytes.count else { return nil }
        let days = daysSince1970(year: year, month: month, day: day)
        let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offsetSeconds
        return Date(timeIntervalSince1970: Double(seconds) + fraction)
    }

    private static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
    private static func daysSince1970(year: Int, month: Int, day: Int) -> Int {
        let shiftedYear = month <= 2 ? year - 1 : year
        let era = (shiftedYear >= 0 ? shiftedYear : shiftedYear - 399) / 400
        let yearOfEra = shiftedYear - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// Formats seconds since 1970 as an ISO-8601 UTC string.
    public static func iso8601(epochSeconds: Int64) -> String {
        iso8601(Date(timeIntervalSince1970: TimeInterval(epochSeconds)))
    }

    /// Formats a date as an ISO-8601 UTC string with millisecond precision when it has any.
    ///
    /// Written out by hand rather than with a date formatter: every response carries dates, and on Linux a formatter
    /// loads locale data each time it is made, which cost a registration more than its database work.
    public static func iso8601(_ date: Date) -> String {
        let millis = Int64((date.timeIntervalSince1970 * 1000).rounded())
        let (seconds, fraction) = floorDivision(millis, 1000)
        let (days, secondOfDay) = floorDivision(seconds, 86_400)
        // Days since 1970 to a proleptic Gregorian date (Howard Hinnant's `civil_from_days`).
        let shifted = days + 719_468
        let era = floorDivision(shifted, 146_097).quotient
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthFromMarch = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthFromMarch + 2) / 5 + 1
        let month = monthFromMarch < 10 ? monthFromMarch + 3 : monthFromMarch - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        var text: [UInt8] = []
        text.reserveCapacity(24)
        func append(_ value: Int64, digits: Int) {
            var remaining = value
            var scratch = [UInt8](repeating: UInt8(ascii: "0"), count: digits)
            for index in stride(from: digits - 1, through: 0, by: -1) {
                scratch[index] = UInt8(ascii: "0") + UInt8(remaining % 10)
                remaining /= 10
            }
            text.append(contentsOf: scratch)
        }
        if year < 0 { text.append(UInt8(ascii: "-")) }
        append(abs(year), digits: abs(year) > 9999 ? String(abs(year)).count : 4)
        text.append(UInt8(ascii: "-"))
        append(month, digits: 2)
        text.append(UInt8(ascii: "-"))
        append(day, digits: 2)
        text.append(UInt8(ascii: "T"))
        append(secondOfDay / 3600, digits: 2)
        text.append(UInt8(ascii: ":"))
        append(secondOfDay / 60 % 60, digits: 2)
        text.append(UInt8(ascii: ":"))
        append(secondOfDay % 60, digits: 2)
        if fraction != 0 {
            text.append(UInt8(ascii: "."))
            append(fraction, digits: 3)
        }
        text.append(UInt8(ascii: "Z"))
        return String(decoding: text, as: UTF8.self)
    }

    /// Division rounding toward negative infinity, and its non-negative remainder.
    private static func floorDivision(_ value: Int64, _ divisor: Int64) -> (quotient: Int64, remainder: Int64) {
        let quotient = value >= 0 ? value / divisor : (value - divisor + 1) / divisor
        return (quotient, value - quotient * divisor)
    }

    private static func outOfRange(_ field: String) -> ValidationError {
        ValidationError(code: "invalid_date", message: "\(field) is out of range.", field: field)
    }
}
