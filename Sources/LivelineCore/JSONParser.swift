/// A strict RFC 8259 JSON parser into ``JSONValue``.
///
/// Strict where lenient parsers are not: no trailing commas, no comments, no leading zeros, no
/// unescaped control characters, valid surrogate pairs only, one value per document. A number
/// written without a fraction or exponent that fits in 64 bits stays an integer.
public struct JSONParseError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The byte offset where parsing failed.
    public var offset: Int
    /// What was wrong.
    public var reason: String
    /// Whether the text is JSON and only an integer in it is past 64 bits (``JSONValue/init(parsing:exactIntegers:)``).
    public var integerOutOfRange = false
    public var description: String { "\(reason) at byte \(offset)" }
}

struct JSONParser {
    private let bytes: [UInt8]
    private var index = 0
    private var depth = 0
    /// Whether an integer past 64 bits is refused (true) or read as the nearest double (false).
    private let exactIntegers: Bool
    static let maximumDepth = 256

    init(_ bytes: [UInt8], exactIntegers: Bool = false) {
        self.bytes = bytes
        self.exactIntegers = exactIntegers
    }

    static func parse(_ bytes: [UInt8], exactIntegers: Bool = false) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(bytes, exactIntegers: exactIntegers)
        parser.skipWhitespace()
        let value = try parser.parseValue()
        parser.skipWhitespace()
        guard parser.index == bytes.count else { throw parser.error("unexpected content after the JSON value") }
        return value
    }

    private func error(_ reason: String) -> JSONParseError { JSONParseError(offset: index, reason: reason) }

    private mutating func skipWhitespace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    private mutating func parseValue() throws(JSONParseError) -> JSONValue {
        guard index < bytes.count else { throw error("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try expectLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        default: throw error("unexpected character")
        }
    }

    private mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw error("unexpected end of input") }
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: count)
        for offset in 0..<count where bytes[index + offset] != expected[offset] { throw error("invalid literal") }
        index += count
    }

    private mutating func enter() throws(JSONParseError) {
        depth += 1
        guard depth <= Self.maximumDepth else { throw error("nesting deeper than \(Self.maximumDepth)") }
    }

    private mutating func parseObject() throws(JSONParseError) -> JSONValue {
        try enter()
        index += 1
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a string key") }
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw error("expected ':'") }
            index += 1
            skipWhitespace()
            guard members[key] == nil else { throw error("duplicate key \"\(key)\"") }
            members[key] = try parseValue()
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "}") else { throw error("expected ',' or '}'") }
            index += 1
            depth -= 1
            return .object(members)
        }
    }

    private mutating func parseArray() throws(JSONParseError) -> JSONValue {
        try enter()
        index += 1
        var items: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return .array(items)
        }
        while true {
            skipWhitespace()
            items.append(try parseValue())
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "]") else { throw error("expected ',' or ']'") }
            index += 1
            depth -= 1
            return .array(items)
        }
    }

    private mutating func parseString() throws(JSONParseError) -> String {
        index += 1  // opening quote
        var runStart = index
        var output = ""
        func flush(_ parser: JSONParser, to end: Int) throws(JSONParseError) -> String {
            guard let text = String(validating: parser.bytes[runStart..<end], as: UTF8.self) else {
                throw parser.error("invalid UTF-8 in string")
            }
            return text
        }
        while true {
            guard index < bytes.count else { throw error("unterminated string") }
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                output += try flush(self, to: index)
                index += 1
                return output
            }
            if byte < 0x20 { throw error("unescaped control character in string") }
            if byte != UInt8(ascii: "\\") {
                index += 1
                continue
            }
            output += try flush(self, to: index)
            index += 1
            guard index < bytes.count else { throw error("unterminated escape") }
            let escape = bytes[index]
            index += 1
            switch escape {
            case UInt8(ascii: "\""): output.append("\"")
            case UInt8(ascii: "\\"): output.append("\\")
            case UInt8(ascii: "/"): output.append("/")
            case UInt8(ascii: "b"): output.append("\u{08}")
            case UInt8(ascii: "f"): output.append("\u{0C}")
            case UInt8(ascii: "n"): output.append("\n")
            case UInt8(ascii: "r"): output.append("\r")
            case UInt8(ascii: "t"): output.append("\t")
            case UInt8(ascii: "u"):
                let first = try parseHex4()
                if (0xD800..<0xDC00).contains(first) {
                    guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                        throw error("unpaired surrogate")
                    }
                    index += 2
                    let second = try parseHex4()
                    guard (0xDC00..<0xE000).contains(second) else { throw error("unpaired surrogate") }
                    let combined = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    output.unicodeScalars.append(Unicode.Scalar(combined)!)
                } else if (0xDC00..<0xE000).contains(first) {
                    throw error("unpaired surrogate")
                } else {
                    output.unicodeScalars.append(Unicode.Scalar(first)!)
                }
            default:
                throw error("invalid escape")
            }
            runStart = index
        }
    }

    private mutating func parseHex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw error("short \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw error("invalid \\u escape")
            }
            value = value * 16 + UInt32(digit)
            index += 1
        }
        return value
    }

    private mutating func parseNumber() throws(JSONParseError) -> JSONValue {
        let start = index
        var isInteger = true
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
            if index < bytes.count, isDigit(bytes[index]) { throw error("leading zero in number") }
        } else {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid fraction") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw error("invalid exponent") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        if isInteger {
            if let integer = Int64(text) { return .integer(integer) }
            // Past 64 bits an integer only fits a double, rounded (123456789012345678901234567890 becomes
            // 1.2345678901234568e+29). RFC 8259 lets a parser limit the range of numbers.
            if exactIntegers {
                throw JSONParseError(
                    offset: start, reason: "integer out of range (a whole number must fit in 64 bits; send a larger one as a string)",
                    integerOutOfRange: true
                )
            }
        }
        guard let double = Double(text), double.isFinite else { throw JSONParseError(offset: start, reason: "number out of range") }
        return .number(double)
    }

    private func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
}

extension JSONValue {
    /// Parses JSON text strictly (RFC 8259). Throws ``JSONParseError``.
    ///
    /// With `exactIntegers`, an integer past 64 bits is refused instead of read as the nearest double: what the API
    /// takes from a caller reaches the phones as it was sent, or not at all.
    public init(parsing bytes: some Sequence<UInt8>, exactIntegers: Bool = false) throws(JSONParseError) {
        self = try JSONParser.parse(Array(bytes), exactIntegers: exactIntegers)
    }
}
