import Foundation
import Hummingbird
import LivelineCore
import NIOCore

/// An error the control API answers with: `{"error": {"code", "message", "field"}}`.
struct ControlAPIError: Error {
    var status: HTTPResponse.Status
    var code: String
    var message: String
    var field: String?

    init(_ status: HTTPResponse.Status, _ code: String, _ message: String, field: String? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
    }

    static func badRequest(_ code: String, _ message: String, field: String? = nil) -> ControlAPIError {
        ControlAPIError(.badRequest, code, message, field: field)
    }

    static func deviceNotFound(_ token: String) -> ControlAPIError {
        ControlAPIError(.notFound, "device_not_found", "No device with token \(token).", field: "token")
    }

    static func phoneNotFound(_ id: String) -> ControlAPIError {
        ControlAPIError(.notFound, "phone_not_found", "No phone with id \(id).", field: "id")
    }

    var json: JSONValue {
        ["error": ["code": .string(code), "message": .string(message), "field": field.map(JSONValue.string) ?? .null]]
    }
}

/// What both emulators' control APIs (``APNsControlAPI``, ``FCMControlAPI``) share: reading JSON bodies, query
/// limits and faults, and writing JSON answers.
enum ControlAPI {
    static let maximumBodyBytes = 64 * 1024

    static func limit(_ request: Request) throws -> Int {
        guard let text = request.uri.queryParameters.get("limit"), !text.isEmpty else { return 100 }
        guard let limit = Int(text), limit >= 1 else {
            throw ControlAPIError.badRequest("invalid_limit", "limit must be a positive integer.", field: "limit")
        }
        return limit
    }

    /// Reads `PUT /faults`: only the faults' own members, each of the right type and in range.
    static func readFaults<Faults: EmulatorFaults>(_ request: Request, as: Faults.Type) async throws -> Faults {
        let body = try await readObject(request, allowed: Faults.memberNames)
        let faults: Faults
        do {
            faults = try JSONDecoder().decode(Faults.self, from: Data(JSONValue.object(body).encoded))
        } catch let DecodingError.typeMismatch(_, context), let DecodingError.valueNotFound(_, context) {
            let field = context.codingPath.first?.stringValue
            throw ControlAPIError.badRequest("invalid_type", "\(field ?? "a member") has the wrong type.", field: field)
        } catch {
            throw ControlAPIError.badRequest("invalid_faults", "The faults could not be read: \(error).")
        }
        if let (field, message) = faults.invalidMember {
            throw ControlAPIError.badRequest("invalid_value", message, field: field)
        }
        return faults
    }

    static func readObject(_ request: Request, allowed: Set<String>) async throws -> [String: JSONValue] {
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: maximumBodyBytes)
        } catch is NIOTooManyBytesError {
            throw ControlAPIError(.contentTooLarge, "body_too_large", "The request body exceeds \(maximumBodyBytes) bytes.")
        }
        let value: JSONValue
        do {
            value = try JSONValue(parsing: buffer.readableBytesView)
        } catch {
            throw ControlAPIError.badRequest("malformed_json", "The request body is not valid JSON: \(error).")
        }
        guard let members = value.objectValue else {
            throw ControlAPIError.badRequest("malformed_json", "The request body must be a JSON object, not \(value.kindName).")
        }
        if let unknown = members.keys.sorted().first(where: { !allowed.contains($0) }) {
            throw ControlAPIError.badRequest("unknown_field", "\(unknown) is not a field of this request.", field: unknown)
        }
        return members
    }

    static func requiredString(_ body: [String: JSONValue], _ field: String) throws -> String {
        guard let value = body[field], value != .null else {
            throw ControlAPIError.badRequest("missing_field", "\(field) is required.", field: field)
        }
        guard let text = value.stringValue, !text.isEmpty else {
            throw ControlAPIError.badRequest("invalid_type", "\(field) must be a non-empty string.", field: field)
        }
        return text
    }

    static func optionalString(_ body: [String: JSONValue], _ field: String) throws -> String? {
        guard let value = body[field], value != .null else { return nil }
        guard let text = value.stringValue, !text.isEmpty else {
            throw ControlAPIError.badRequest("invalid_type", "\(field) must be a non-empty string.", field: field)
        }
        return text
    }

    static func optionalObject(_ body: [String: JSONValue], _ field: String) throws -> JSONValue? {
        guard let value = body[field], value != .null else { return nil }
        guard value.objectValue != nil else {
            throw ControlAPIError.badRequest("invalid_type", "\(field) must be a JSON object.", field: field)
        }
        return value
    }

    /// `registerWith`: absent → the emulator's default (`.none`); `null` → do not register; else `{url, publishableKey}`.
    static func registerWith(_ body: [String: JSONValue]) throws -> LivelineRegistrationTarget?? {
        guard let value = body["registerWith"] else { return .none }
        if value == .null { return .some(nil) }
        guard let object = value.objectValue, let url = object["url"]?.stringValue,
            url.hasPrefix("http://") || url.hasPrefix("https://"), let key = object["publishableKey"]?.stringValue, !key.isEmpty
        else {
            throw ControlAPIError.badRequest(
                "invalid_register_with", "registerWith must be null or {\"url\": \"http(s)://…\", \"publishableKey\": \"pk_…\"}.",
                field: "registerWith"
            )
        }
        return .some(LivelineRegistrationTarget(url: url, publishableKey: key))
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(APIDate.iso8601(date))
        }
        return response(try encoder.encode(value), status: status)
    }

    static func response(_ bytes: some Sequence<UInt8>, status: HTTPResponse.Status) -> Response {
        var buffer = ByteBuffer()
        buffer.writeBytes(bytes)
        return Response(
            status: status, headers: [.contentType: "application/json; charset=utf-8"], body: ResponseBody(byteBuffer: buffer)
        )
    }
}


/// Turns every error into the control API's JSON error shape.
struct ControlErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch {
            let apiError: ControlAPIError
            switch error {
            case let error as ControlAPIError:
                apiError = error
            case let error as any HTTPResponseError where error.status == .notFound:
                apiError = ControlAPIError(.notFound, "not_found", "No route \(request.method) \(request.uri.path).")
            case let error as any HTTPResponseError where error.status == .methodNotAllowed:
                apiError = ControlAPIError(.methodNotAllowed, "method_not_allowed", "\(request.method) is not allowed on \(request.uri.path).")
            case let error as any HTTPResponseError where error.status.code < 500:
                apiError = ControlAPIError(error.status, "http_\(error.status.code)", error.status.reasonPhrase)
            default:
                context.logger.error("Emulator control API error", metadata: ["error": "\(error)"])
                apiError = ControlAPIError(.internalServerError, "internal_error", "The emulator failed to handle this request.")
            }
            return ControlAPI.response(apiError.json.encoded, status: apiError.status)
        }
    }
}

/// Faults an emulator's control API sets with `PUT /faults`.
protocol EmulatorFaults: Decodable {
    /// The JSON members the faults have.
    static var memberNames: Set<String> { get }
    /// The first member out of range, as `(field, message)`, or `nil` when all are valid.
    var invalidMember: (field: String, message: String)? { get }
}

extension APNsFaults: EmulatorFaults {
    static var memberNames: Set<String> { Set(CodingKeys.allCases.map(\.rawValue)) }
}

extension FCMFaults: EmulatorFaults {
    static var memberNames: Set<String> { Set(CodingKeys.allCases.map(\.rawValue)) }
}
