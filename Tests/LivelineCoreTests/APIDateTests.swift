import Foundation
import Testing

@testable import LivelineCore

@Suite("API dates")
struct APIDateTests {
    /// What Foundation's formatter writes for `date`, with fractional seconds only when there are any.
    private func foundation(_ date: Date, fractional: Bool) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = fractional ? [.withInternetDateTime, .withFractionalSeconds] : [.withInternetDateTime]
        return formatter.string(from: date)
    }

    @Test("whole seconds are written as Foundation's ISO-8601 formatter writes them, across eras and leap days")
    func wholeSeconds() {
        var generator = SystemRandomNumberGenerator()
        let fixed: [Int64] = [0, 59, 86_399, 86_400, 951_782_400, 951_868_799, 1_709_164_800, 4_107_542_399, 253_402_300_799, -1, -86_401]
        let random = (0..<2000).map { _ in Int64.random(in: 0..<253_402_300_800, using: &generator) }
        for seconds in fixed + random {
            let date = Date(timeIntervalSince1970: TimeInterval(seconds))
            #expect(APIDate.iso8601(date) == foundation(date, fractional: false), "\(seconds)")
        }
    }

    @Test("milliseconds are written when a date has any, as three digits")
    func milliseconds() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let millis = Int64.random(in: 0..<4_102_444_800_000, using: &generator)
            guard millis % 1000 != 0 else { continue }
            let date = Date(timeIntervalSince1970: TimeInterval(millis) / 1000)
            #expect(APIDate.iso8601(date) == foundation(date, fractional: true), "\(millis)")
        }
        #expect(APIDate.iso8601(Date(timeIntervalSince1970: 1_795_000_000.5)) == "2026-11-18T11:06:40.500Z")
        #expect(APIDate.iso8601(epochSeconds: 1_795_000_000) == "2026-11-18T11:06:40Z")
    }

    @Test("what it writes, it reads back")
    func roundTrip() {
        for millis: Int64 in [0, 1, 999, 1_795_000_000_123, 1_795_000_000_000] {
            let date = Date(timeIntervalSince1970: TimeInterval(millis) / 1000)
            let parsed = APIDate.parseISO8601(APIDate.iso8601(date))
            #expect(parsed.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) } == millis)
        }
    }

    @Test("valid RFC 3339 dates are read as Foundation reads them, across eras, leap days and offsets")
    func readsValidDates() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let seconds = Int64.random(in: 0..<253_402_300_800, using: &generator)
            let date = Date(timeIntervalSince1970: TimeInterval(seconds))
            #expect(APIDate.parseISO8601(foundation(date, fractional: false)) == date)
        }
        #expect(APIDate.parseISO8601("2024-02-29T12:00:00+02:00") == Date(timeIntervalSince1970: 1_709_200_800))
        #expect(APIDate.parseISO8601("2024-02-29T12:00:00-00:30") == Date(timeIntervalSince1970: 1_709_209_800))
        #expect(APIDate.parseISO8601("2026-11-21t10:00:00z") == APIDate.parseISO8601("2026-11-21T10:00:00Z"), "RFC 3339 allows t and z")
        #expect(APIDate.parseISO8601("2026-11-21T10:00:00.25Z")?.timeIntervalSince1970 == 1_795_255_200.25)
    }

    @Test(
        "an invalid date is refused, not rolled over or cut short",
        arguments: [
            "2026-11-31T10:00:00Z", "2026-02-29T10:00:00Z", "2026-13-01T10:00:00Z", "2026-00-10T10:00:00Z", "2026-11-00T10:00:00Z",
            "2026-11-21T24:00:00Z", "2026-11-21T10:60:00Z", "2026-11-21T10:00:61Z", "2026-11-21T10:00:00+99:99",
            "2026-11-21T10:00:00+24:00", "2026-11-21T10:00:00Zjunk", "2026-11-21T10:00:00Z (oops)", "2026-11-21T10:00:00",
            "2026-11-21 10:00:00Z", "2026-11-21T10:00Z", "2026-11-21T10:00:00.Z", "2026-11-21T10:00:00+0200", "26-11-21T10:00:00Z",
            "+2026-11-21T10:00:00Z", "2026-11-21", "",
        ]
    )
    func refusesInvalidDates(_ text: String) {
        #expect(APIDate.parseISO8601(text) == nil)
    }

    @Test("a date before 1970 is out of range for an activity's dates, as a negative number is")
    func rangeOfStrings() {
        #expect(throws: ValidationError.self) { try APIDate.epochSeconds(from: "0001-01-01T00:00:00Z", field: "staleDate") }
        #expect(throws: ValidationError.self) { try APIDate.epochSeconds(from: "1969-12-31T23:59:59Z", field: "staleDate") }
        #expect((try? APIDate.epochSeconds(from: "1970-01-01T00:00:00Z", field: "staleDate")) == 0)
    }
}
