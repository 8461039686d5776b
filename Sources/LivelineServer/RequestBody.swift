import Foundation
import Hummingbird
import LivelineCore
import NIOCore

/// A request's JSON object body, read field by field so every error names its field.
struct RequestBody {
    let members: [String: JSONValue]
    private let prefix: String
    /// The body's bytes as they arrived (empty for a nested object): what an idempotency key's fingerprint covers.
    private(set) var bytes = ByteBuffer()

    init(members: [String: JSONValue], prefix: String = "") {
        self.members = members
        self.prefix = prefix
    }

    /// Reads the body (at most ``Limits/maximumRequestBodyBytes``) as a JSON object.
    /// An empty body counts as `{}` when `allowEmpty` is set.
    static func read(_ request: Request, allowEmpty: Bool = false) async throws -> RequestBody {
        // A body announced too large is refused before any of it is waited for (a client announcing 100 MB and sending
        // a byte would otherwise hold the connection until the body timeout).
        if let announced = request.headers[.contentLength].flatMap({ Int($0) }), announced > Limits.maximumRequestBodyBytes {
            throw APIError.bodyTooLarge
        }
        let buffer = try await request.body.collect(upTo: Limits.maximumRequestBodyBytes)
        if buffer.readableBytes == 0 {
            if allowEmpty { return RequestBody(members: [:]) }
            throw APIError.badRequest("malformed_json", "The request body must be a JSON object.")
        }
        let value: JSONValue
        do {
            value = try JSONValue(parsing: buffer.readableBytesView, exactIntegers: true)
        } catch where error.integerOutOfRange {
            // JSON, and schema-valid wherever any JSON is: refused for a limit of Liveline's, as 422.
            throw ValidationError(
                code: "integer_out_of_range",
                message: "The request body holds an integer past 64 bits (\(error)): it would reach the phones rounded. Send a larger one as a string."
            )
        } catch {
            throw APIError.badRequest("malformed_json", "The request body is not valid JSON: \(error).")
        }
        guard let members = value.objectValue else {
            throw APIError.badRequest("malformed_json", "The request body must be a JSON object, not \(value.kindName).")
        }
        var body = RequestBody(members: members)
        body.bytes = buffer
        return body
    }

    func path(_ key: String) -> String { prefix + key }

    /// Refuses members this route does not know, so a typo (`content_state`) is not silently ignored.
    func allowOnly(_ keys: Set<String>) throws {
        if let unknown = members.keys.sorted().first(where: { !keys.contains($0) }) {
            throw APIError.badRequest("unknown_field", "\(path(unknown)) is not a field of this request.", field: path(unknown))
        }
    }

    /// The member, treating JSON `null` as absent.
    func value(_ key: String) -> JSONValue? {
        guard let value = members[key], value != .null else { return nil }
        return value
    }

    func required(_ key: String) throws -> JSONValue {
        guard let value = value(key) else {
            throw APIError.badRequest("missing_field", "\(path(key)) is required.", field: path(key))
        }
        return value
    }

    func string(_ key: String) throws -> String? {
        guard let value = value(key) else { return nil }
        guard case .string(let string) = value else { throw APIError.invalidType(path(key), expected: "a string", got: value) }
        return string
    }

    func requiredString(_ key: String) throws -> String {
        guard let string = try string(key) else {
            throw APIError.badRequest("missing_field", "\(path(key)) is required.", field: path(key))
        }
        return string
    }

    func bool(_ key: String) throws -> Bool? {
        guard let value = value(key) else { return nil }
        guard case .bool(let bool) = value else { throw APIError.invalidType(path(key), expected: "a boolean", got: value) }
        return bool
    }

    /// An integer; a number with no fractional part (`10.0`) counts, as it does in JSON Schema.
    func integer(_ key: String) throws -> Int64? {
        guard let value = value(key) else { return nil }
        guard let integer = Self.integral(value) else { throw APIError.invalidType(path(key), expected: "an integer", got: value) }
        return integer
    }

    /// The integer a JSON value stands for: an integer, or a number with no fractional part that fits.
    static func integral(_ value: JSONValue) -> Int64? {
        switch value {
        case .integer(let integer): return integer
        case .number(let number): return Int64(exactly: number)
        default: return nil
        }
    }

    func number(_ key: String) throws -> Double? {
        guard let value = value(key) else { return nil }
        switch value {
        case .integer(let integer): return Double(integer)
        case .number(let number): return number
        default: throw APIError.invalidType(path(key), expected: "a number", got: value)
        }
    }

    func object(_ key: String) throws -> RequestBody? {
        guard let value = value(key) else { return nil }
        guard case .object(let members) = value else { throw APIError.invalidType(path(key), expected: "an object", got: value) }
        return RequestBody(members: members, prefix: path(key) + ".")
    }

    func epochSeconds(_ key: String) throws -> Int64? {
        guard let value = value(key) else { return nil }
        do {
            return try APIDate.epochSeconds(from: value, field: path(key))
        } catch where error.code == "invalid_type" {
            throw APIError(.badRequest, code: error.code, message: error.message, field: error.field)
        }
    }
}
