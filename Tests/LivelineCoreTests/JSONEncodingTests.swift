import Foundation
import Testing

@testable import LivelineCore

@Suite("JSON text")
struct JSONEncodingTests {
    private func text(_ build: (inout [UInt8]) -> Void) -> String {
        var out: [UInt8] = []
        build(&out)
        return String(decoding: out, as: UTF8.self)
    }

    @Test("integers are written in decimal, from the smallest to the largest 64-bit value")
    func integers() {
        for value: Int64 in [0, 7, -7, 10, 1_732_000_000_123, -1_000_000, .max, .min] {
            #expect(text { JSONValue.appendInteger(value, to: &$0) } == String(value))
        }
        #expect(text { JSONValue.appendInteger(UInt64.max, to: &$0) } == "18446744073709551615")
        #expect(text { JSONValue.appendInteger(Int8(-128), to: &$0) } == "-128")
        #expect(JSONValue.integer(-42).encodedString == "-42")
        #expect(JSONValue.number(3).encodedString == "3.0")
        #expect(JSONValue.number(-12.5).encodedString == "-12.5")
    }

    @Test("with exact integers, integers are read exactly within 64 bits and refused past them rather than rounded to a double")
    func readingIntegers() throws {
        #expect(try JSONValue(parsing: "9223372036854775807".utf8, exactIntegers: true) == .integer(.max))
        #expect(try JSONValue(parsing: "-9223372036854775808".utf8, exactIntegers: true) == .integer(.min))
        #expect(try JSONValue(parsing: "1E2".utf8, exactIntegers: true) == .number(100))
        #expect(try JSONValue(parsing: "1.5e300".utf8, exactIntegers: true) == .number(1.5e300))
        for text in ["9223372036854775808", "-9223372036854775809", "123456789012345678901234567890", "1e999"] {
            #expect(throws: JSONParseError.self, "\(text)") { try JSONValue(parsing: text.utf8, exactIntegers: true) }
        }
        // Without, as RFC 8259 reads them: the nearest double.
        #expect(try JSONValue(parsing: "123456789012345678901234567890".utf8) == .number(1.2345678901234568e29))
    }

    @Test("strings are quoted, and escaped only where JSON requires it")
    func strings() throws {
        #expect(text { JSONValue.appendString("device-0000042", to: &$0) } == #""device-0000042""#)
        #expect(text { JSONValue.appendString("", to: &$0) } == #""""#)
        #expect(text { JSONValue.appendString("é ✓", to: &$0) } == "\"é ✓\"")
        let awkward = "a\"b\\c\nd\te\r\u{01}"
        let encoded = text { JSONValue.appendString(awkward, to: &$0) }
        #expect(encoded == #""a\"b\\c\nd\te\r\u0001""#)
        #expect(try JSONDecoder().decode(String.self, from: Data(encoded.utf8)) == awkward)
    }
}
