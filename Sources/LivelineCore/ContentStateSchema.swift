import Foundation

/// The type of one field of a ContentState (or of static Attributes), as the app's `Codable` struct
/// declares it.
public indirect enum FieldType: Sendable, Hashable, CustomStringConvertible {
    case string
    case integer
    case number
    case boolean
    /// A `Date`. Callers may send ISO-8601 text; it goes to the phone in the schema's ``DateEncoding``.
    case date
    /// A Swift optional: the field may be missing or `null`.
    case optional(FieldType)
    case array(FieldType)
    /// A nested `Codable` struct.
    case object([String: FieldType])
    /// A `String`-backed enum: one of these values.
    case enumeration([String])

    public var description: String {
        switch self {
        case .string: "string"
        case .integer: "integer"
        case .number: "number"
        case .boolean: "boolean"
        case .date: "date"
        case .optional(let wrapped): "optional \(wrapped)"
        case .array(let element): "array of \(element)"
        case .object: "object"
        case .enumeration(let values): "one of " + values.map { "\"\($0)\"" }.joined(separator: ", ")
        }
    }
}

/// How `Date` fields are encoded for the phone.
public enum DateEncoding: String, Sendable, Hashable, CaseIterable {
    /// Seconds since 2001-01-01T00:00:00Z: what a default `JSONDecoder` (`.deferredToDate`) expects, and so what
    /// ActivityKit expects of a ContentState's `Date`: "the system always decodes JSON payloads for Live Activity updates
    /// using its default encoding strategies" (Apple), and an app cannot change them.
    case secondsSince2001
    /// Seconds since 1970-01-01T00:00:00Z, for a field the app's ContentState decodes itself (a custom
    /// `init(from:)` reading a number of seconds since 1970); a plain `Date` field would read it 31 years late.
    case secondsSince1970

    /// Seconds between 1970-01-01 and 2001-01-01.
    static let referenceOffset: Double = 978_307_200
}

/// The registered contract of an attributes type: the fields of its ContentState and, optionally, of
/// its static Attributes. Registered with `PUT /v1/attributes-types/{name}/schema`.
///
/// Schema JSON: `{"contentState": {fields}, "attributes": {fields}, "dateEncoding": "secondsSince2001"}` where
/// each field's type is a name — `"string"`, `"integer"`, `"number"`, `"boolean"`, `"date"`, with a trailing
/// `?` for an optional — or an object: `{"type": "array", "items": T}`, `{"type": "object", "fields": {…}}`,
/// `{"type": "enum", "values": ["a", "b"]}`, each of which may add `"optional": true`.
public struct AttributesTypeSchema: Sendable, Hashable {
    public var contentState: [String: FieldType]
    public var attributes: [String: FieldType]?
    public var dateEncoding: DateEncoding

    public init(contentState: [String: FieldType], attributes: [String: FieldType]? = nil, dateEncoding: DateEncoding = .secondsSince2001) {
        self.contentState = contentState
        self.attributes = attributes
        self.dateEncoding = dateEncoding
    }

    // MARK: Reading a schema

    /// Reads a schema from its JSON form, naming the offending member on error.
    public init(json: JSONValue) throws(ValidationError) {
        guard let members = json.objectValue else {
            throw ValidationError(code: "invalid_schema", message: "A schema must be a JSON object.", field: nil)
        }
        for key in members.keys where !["contentState", "attributes", "dateEncoding"].contains(key) {
            throw ValidationError(code: "unknown_field", message: "Unknown member '\(key)' in the schema.", field: key)
        }
        guard let state = members["contentState"] else {
            throw ValidationError(code: "missing_field", message: "The schema needs 'contentState': the fields of the ContentState.", field: "contentState")
        }
        contentState = try Self.fields(state, path: "contentState")
        if let attributes = members["attributes"], attributes != .null {
            self.attributes = try Self.fields(attributes, path: "attributes")
        } else {
            self.attributes = nil
        }
        switch members["dateEncoding"] {
        case nil, .null?:
            dateEncoding = .secondsSince2001
        case .string(let name)?:
            guard let encoding = DateEncoding(rawValue: name) else {
                throw ValidationError(
                    code: "invalid_schema", message: "dateEncoding must be 'secondsSince2001' or 'secondsSince1970'.", field: "dateEncoding"
                )
            }
            dateEncoding = encoding
        default:
            throw ValidationError(code: "invalid_schema", message: "dateEncoding must be a string.", field: "dateEncoding")
        }
    }

    private static func fields(_ json: JSONValue, path: String) throws(ValidationError) -> [String: FieldType] {
        guard let members = json.objectValue else {
            throw ValidationError(code: "invalid_schema", message: "\(path) must be an object of field names to types.", field: path)
        }
        var fields: [String: FieldType] = [:]
        for (name, type) in members {
            fields[name] = try fieldType(type, path: path + "." + name)
        }
        return fields
    }

    private static func fieldType(_ json: JSONValue, path: String) throws(ValidationError) -> FieldType {
        switch json {
        case .string(let name):
            let optional = name.hasSuffix("?")
            let base = optional ? String(name.dropLast()) : name
            let type: FieldType
            switch base {
            case "string": type = .string
            case "integer": type = .integer
            case "number": type = .number
            case "boolean": type = .boolean
            case "date": type = .date
            default:
                throw ValidationError(
                    code: "invalid_schema",
                    message: "\(path): unknown type '\(name)'; use string, integer, number, boolean, date (with ? for optional) or an object with 'type'.",
                    field: path
                )
            }
            return optional ? .optional(type) : type
        case .object(let members):
            guard case .string(let kind)? = members["type"] else {
                throw ValidationError(code: "invalid_schema", message: "\(path): a type object needs 'type' (array, object or enum).", field: path)
            }
            let type: FieldType
            var allowed: Set<String> = ["type", "optional"]
            switch kind {
            case "array":
                allowed.insert("items")
                guard let items = members["items"] else {
                    throw ValidationError(code: "invalid_schema", message: "\(path): an array needs 'items'.", field: path)
                }
                type = .array(try fieldType(items, path: path + "[]"))
            case "object":
                allowed.insert("fields")
                guard let nested = members["fields"] else {
                    throw ValidationError(code: "invalid_schema", message: "\(path): an object needs 'fields'.", field: path)
                }
                type = .object(try fields(nested, path: path))
            case "enum":
                allowed.insert("values")
                guard case .array(let values)? = members["values"], !values.isEmpty else {
                    throw ValidationError(code: "invalid_schema", message: "\(path): an enum needs 'values', a non-empty array of strings.", field: path)
                }
                var strings: [String] = []
                for value in values {
                    guard case .string(let string) = value else {
                        throw ValidationError(code: "invalid_schema", message: "\(path): enum values must be strings.", field: path)
                    }
                    strings.append(string)
                }
                type = .enumeration(strings)
            case "string", "integer", "number", "boolean", "date":
                type = try fieldType(.string(kind), path: path)
            default:
                throw ValidationError(code: "invalid_schema", message: "\(path): unknown type '\(kind)'.", field: path)
            }
            for key in members.keys where !allowed.contains(key) {
                throw ValidationError(code: "invalid_schema", message: "\(path): unknown member '\(key)' for type \(kind).", field: path)
            }
            switch members["optional"] {
            case nil, .bool(false)?: return type
            case .bool(true)?: return .optional(type)
            default: throw ValidationError(code: "invalid_schema", message: "\(path): 'optional' must be true or false.", field: path)
            }
        default:
            throw ValidationError(code: "invalid_schema", message: "\(path): a type is a name such as \"integer\" or an object with 'type'.", field: path)
        }
    }

    /// The schema in its JSON form (explicit object forms for composite types).
    public var json: JSONValue {
        var members: [String: JSONValue] = [
            "contentState": Self.json(contentState),
            "dateEncoding": .string(dateEncoding.rawValue),
        ]
        if let attributes { members["attributes"] = Self.json(attributes) }
        return .object(members)
    }

    private static func json(_ fields: [String: FieldType]) -> JSONValue {
        .object(fields.mapValues(json(type:)))
    }

    private static func json(type: FieldType) -> JSONValue {
        switch type {
        case .string, .integer, .number, .boolean, .date: .string(type.description)
        case .optional(let wrapped):
            optionalJSON(json(type: wrapped))
        case .array(let element): .object(["type": "array", "items": json(type: element)])
        case .object(let fields): .object(["type": "object", "fields": json(fields)])
        case .enumeration(let values): .object(["type": "enum", "values": .array(values.map(JSONValue.string))])
        }
    }

    private static func optionalJSON(_ wrapped: JSONValue) -> JSONValue {
        switch wrapped {
        case .string(let name):
            return .string(name.hasSuffix("?") ? name : name + "?")
        case .object(var members):
            members["optional"] = .bool(true)
            return .object(members)
        default:
            return wrapped
        }
    }

    // MARK: Checking values

    /// Checks a content state against the schema and returns it as the phone must receive it (dates encoded).
    ///
    /// - Throws: `ValidationError` with code `schema_mismatch`, naming the field and the expectation, such as
    ///   `contentState.minutesAway: expected integer, got string "128"`.
    public func conform(contentState value: JSONValue) throws(ValidationError) -> JSONValue {
        try conform(value, to: .object(contentState), path: "contentState")
    }

    /// Checks static attributes against the schema's `attributes`, if it has them; returns them as the phone must
    /// receive them.
    public func conform(attributes value: JSONValue) throws(ValidationError) -> JSONValue {
        guard let attributes else { return value }
        return try conform(value, to: .object(attributes), path: "attributes")
    }

    private func conform(_ value: JSONValue, to type: FieldType, path: String) throws(ValidationError) -> JSONValue {
        func mismatch() -> ValidationError {
            ValidationError(code: "schema_mismatch", message: "\(path): expected \(type), got \(Self.describe(value)).", field: path)
        }
        switch type {
        case .optional(let wrapped):
            return value == .null ? .null : try conform(value, to: wrapped, path: path)
        case .string:
            guard case .string = value else { throw mismatch() }
            return value
        case .integer:
            switch value {
            case .integer: return value
            case .number(let double) where double.rounded() == double && abs(double) < 9.0e15: return .integer(Int64(double))
            default: throw mismatch()
            }
        case .number:
            switch value {
            case .integer, .number: return value
            default: throw mismatch()
            }
        case .boolean:
            guard case .bool = value else { throw mismatch() }
            return value
        case .date:
            switch value {
            case .integer, .number:
                return value
            case .string(let text):
                guard let date = APIDate.parseISO8601(text) else {
                    throw ValidationError(
                        code: "schema_mismatch", message: "\(path): expected date (ISO-8601 or a number), got string \"\(text)\".", field: path
                    )
                }
                let seconds = date.timeIntervalSince1970 - (dateEncoding == .secondsSince2001 ? DateEncoding.referenceOffset : 0)
                return seconds.rounded() == seconds ? .integer(Int64(seconds)) : .number(seconds)
            default:
                throw mismatch()
            }
        case .enumeration(let values):
            guard case .string(let string) = value, values.contains(string) else { throw mismatch() }
            return value
        case .array(let element):
            guard case .array(let items) = value else { throw mismatch() }
            var out: [JSONValue] = []
            out.reserveCapacity(items.count)
            for (index, item) in items.enumerated() {
                out.append(try conform(item, to: element, path: "\(path)[\(index)]"))
            }
            return .array(out)
        case .object(let fields):
            guard case .object(var members) = value else { throw mismatch() }
            for (name, fieldType) in fields.sorted(by: { $0.key < $1.key }) {
                let fieldPath = path + "." + name
                guard let member = members[name] else {
                    if case .optional = fieldType { continue }
                    throw ValidationError(code: "schema_mismatch", message: "\(fieldPath): expected \(fieldType), but it is missing.", field: fieldPath)
                }
                members[name] = try conform(member, to: fieldType, path: fieldPath)
            }
            // Members the schema does not name are passed on: a `Codable` struct ignores keys it does not declare.
            return .object(members)
        }
    }

    /// `string "128"`, `integer 12`, `null`, …: what a value was, for error messages.
    static func describe(_ value: JSONValue) -> String {
        switch value {
        case .string(let text):
            let shown = text.count > 40 ? String(text.prefix(40)) + "…" : text
            return "string \"\(shown)\""
        case .integer(let number): return "integer \(number)"
        case .number(let number): return "number \(number)"
        case .bool(let flag): return "boolean \(flag)"
        case .null: return "null"
        case .array: return "array"
        case .object: return "object"
        }
    }
}

/// The shape of a JSON value: each field path's kind, for activities without a schema. Liveline remembers the shape
/// of the first accepted content state and reports later fields whose kind changed, because the phone's decoder
/// would silently drop such a state.
public struct JSONShape: Sendable, Hashable {
    /// Field path (`contentState.driver.name`, `contentState.stops[]`) → kind (`string`, `integer`, …).
    public var kinds: [String: String]

    public init(kinds: [String: String]) { self.kinds = kinds }

    /// The shape of `value`, rooted at `path`.
    public init(of value: JSONValue, path: String = "contentState") {
        var kinds: [String: String] = [:]
        Self.walk(value, path: path, into: &kinds)
        self.kinds = kinds
    }

    private static func walk(_ value: JSONValue, path: String, into kinds: inout [String: String]) {
        switch value {
        case .null:
            return  // null says nothing about the declared type (an optional).
        case .object(let members):
            kinds[path] = "object"
            for (name, member) in members { walk(member, path: path + "." + name, into: &kinds) }
        case .array(let items):
            kinds[path] = "array"
            for item in items { walk(item, path: path + "[]", into: &kinds) }
        default:
            kinds[path] = value.kindName
        }
    }

    /// A field whose kind differs from this (remembered) shape.
    public struct Change: Sendable, Hashable {
        public var field: String
        public var was: String
        public var now: String

        public init(field: String, was: String, now: String) {
            self.field = field
            self.was = was
            self.now = now
        }
    }

    /// Fields present in both shapes whose kinds differ, sorted by field. An integer where a number was is no change
    /// (a `Double` decodes both); a number where an integer was is.
    public func changes(to other: JSONShape) -> [Change] {
        var changes: [Change] = []
        for (field, now) in other.kinds {
            guard let was = kinds[field], was != now else { continue }
            if was == "number", now == "integer" { continue }
            changes.append(Change(field: field, was: was, now: now))
        }
        return changes.sorted { $0.field < $1.field }
    }

    /// The shape merged with fields first seen in `other` (a field that was absent or null before).
    public func adding(_ other: JSONShape) -> JSONShape {
        JSONShape(kinds: kinds.merging(other.kinds) { old, _ in old })
    }
}
