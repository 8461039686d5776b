import HTTPTypes
import Hummingbird
import LivelineCore
import LivelineStore
import Logging
import NIOCore
import NIOHTTP1

/// Turns every error a route throws into Liveline's JSON error shape with the right status.
/// Nothing escapes as a bare 500 page: unexpected errors become `internal_error`, logged once.
struct ErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch {
            let apiError = Self.apiError(for: error, request: request)
            if error is HTTPParserError {
                // The body broke off as something that is not HTTP/1.1 (a chunk size that is not hexadecimal, say): the
                // decoder cannot find the next request, so Hummingbird closes the connection after this answer.
                var response = Response.json(apiError.json, status: apiError.status)
                response.headers[.connection] = "close"
                return response
            }
            if apiError.status == .internalServerError {
                context.logger.error("Unexpected error", metadata: ["error": "\(String(reflecting: error))", "path": "\(request.uri.path)"])
            } else if let failure = error as? PostgresFailure, failure.isConnectionLost {
                context.logger.warning("The database connection was lost", metadata: ["error": "\(failure)", "path": "\(request.uri.path)"])
            }
            var response = Response.json(apiError.json, status: apiError.status)
            if apiError.status == .unauthorized {
                // RFC 9110 §11.6.1: a 401 carries a challenge, here the scheme the API takes (RFC 6750 §3).
                response.headers[.wwwAuthenticate] = "Bearer realm=\"liveline\""
            }
            return response
        }
    }

    static func apiError(for error: any Error, request: Request) -> APIError {
        switch error {
        case let error as APIError:
            return error
        case let error as ValidationError:
            return APIError(error)
        case is NIOTooManyBytesError:
            return .bodyTooLarge
        case let error as HTTPParserError:
            // Thrown by the body's stream when what follows a request's head is not HTTP/1.1.
            return .malformedRequest(error)
        case let error as AppAdministration.ChannelsNotDeleted:
            return APIError(
                .conflict, code: "channels_not_deleted",
                message: error.message(leaving: "leaveChannels=true"),
                field: "leaveChannels"
            )
        case let error as StoreError:
            switch error {
            case .appNotFound: return APIError(.notFound, code: "app_not_found", message: "No such app.", field: "appId")
            case .activityNotFound: return APIError(.notFound, code: "activity_not_found", message: "No such activity in this app.", field: "activityId")
            case .instanceNotFound: return APIError(.notFound, code: "instance_not_found", message: "No such instance on this activity.", field: "deviceId")
            case .activityEnded: return APIError(.conflict, code: "activity_ended", message: "The activity has ended; it takes no further updates.", field: "activityId")
            case .attributesTypeMismatch(let existing):
                return APIError(
                    .conflict, code: "attributes_type_mismatch", message: "The activity has attributes type '\(existing)'.", field: "attributesType"
                )
            case .duplicateApp: return APIError(.conflict, code: "app_exists", message: "An app with this id exists.")
            case .invalidCursor: return .badRequest("invalid_cursor", "cursor is not one this server issued.", field: "cursor")
            case .idempotencyKeyReused: return .idempotencyKeyReused
            case .platformMismatch(let registered):
                return APIError(
                    .conflict, code: "platform_mismatch",
                    message: "This device is registered as '\(registered.rawValue)'; a device's platform never changes (another installation needs its own device id).",
                    field: "platform"
                )
            case .deliveryMismatch(let existing): return .deliveryMismatch(existing: existing)
            case .channelLimitReached(let maximum): return .channelLimitReached(maximum: maximum)
            case .channelMismatch: return .channelMismatch
            case .channelsHeld(let count):
                return APIError(
                    .conflict, code: "channels_held",
                    message: "The app holds \(count) broadcast channel\(count == 1 ? "" : "s") at APNs made while it was being deleted. The app was kept, with its keys revoked. Try again, or pass leaveChannels=true to leave them at APNs.",
                    field: "leaveChannels"
                )
            case .schemaTooNew: return APIError(.internalServerError, code: "internal_error", message: "The server failed to handle this request.")
            }
        case let error as PostgresFailure where error.isRetryable:
            // Concurrent writes on PostgreSQL kept colliding past the Store's retries: nothing was stored.
            return APIError(
                .serviceUnavailable, code: "database_busy",
                message: "The database could not take this write now (it kept colliding with concurrent writes); nothing was stored. Retry it."
            )
        case let error as PostgresFailure where error.isCommitUnknown:
            return APIError(
                .serviceUnavailable, code: "database_unavailable",
                message: "The connection to the database was lost while this write was being committed: it may or may not have been stored. Retry it with the same Idempotency-Key."
            )
        case let error as PostgresFailure where error.isConnectionLost:
            return APIError(
                .serviceUnavailable, code: "database_unavailable",
                message: "The database could not be reached; nothing was stored. Retry it."
            )
        case let error as any HTTPResponseError:
            switch error.status {
            case .notFound:
                return APIError(.notFound, code: "not_found", message: "No route \(request.method) \(request.uri.path).")
            case .methodNotAllowed:
                return APIError(.methodNotAllowed, code: "method_not_allowed", message: "\(request.method) is not allowed on \(request.uri.path).")
            case .contentTooLarge:
                return .bodyTooLarge
            default:
                let status = error.status
                if status.code >= 500 {
                    return APIError(.internalServerError, code: "internal_error", message: "The server failed to handle this request.")
                }
                return APIError(status, code: "http_\(status.code)", message: status.reasonPhrase)
            }
        default:
            return APIError(.internalServerError, code: "internal_error", message: "The server failed to handle this request.")
        }
    }
}

extension Response {
    /// A JSON response from a ``JSONValue``.
    static func json(_ value: JSONValue, status: HTTPResponse.Status = .ok) -> Response {
        let bytes = value.encoded
        var buffer = ByteBuffer()
        buffer.writeBytes(bytes)
        return Response(
            status: status,
            headers: [.contentType: "application/json; charset=utf-8"],
            body: ResponseBody(byteBuffer: buffer)
        )
    }
}

/// Answers a known path asked with a method it does not serve with 405 `method_not_allowed` and an
/// `Allow` header listing the methods it does serve; an unknown path stays 404 `not_found`.
///
/// Added to the router after every route, so it wraps only the router's not-found responder (the
/// router applies a middleware to the routes added after it, and every middleware to the not-found
/// responder).
struct MethodNotAllowedMiddleware<Context: RequestContext>: RouterMiddleware {
    /// A served path, matched component by component as the router matches it, and the methods it serves.
    struct ServedPath: Sendable {
        var components: [RouterPath.Element]
        var methods: Set<HTTPRequest.Method>

        func matches(_ path: [Substring]) -> Bool {
            path.count == components.count && zip(components, path).allSatisfy { component, given in component ~= given }
        }
    }

    let servedPaths: [ServedPath]

    init(routes: [Router<Context>.RouteDescription]) {
        var paths: [String: ServedPath] = [:]
        for route in routes {
            paths["\(route.path)", default: ServedPath(components: route.path.components, methods: [])].methods.insert(route.method)
        }
        servedPaths = Array(paths.values)
    }

    /// The methods served at `path`; empty for an unknown path.
    func allowedMethods(_ path: String) -> Set<HTTPRequest.Method> {
        let given = path.split(separator: "/")
        return servedPaths.reduce(into: []) { allowed, served in
            if served.matches(given) { allowed.formUnion(served.methods) }
        }
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var allowed = allowedMethods(request.uri.path)
        // HEAD is served wherever GET is (HeadServingResponder).
        if allowed.contains(.get) { allowed.insert(.head) }
        guard !allowed.isEmpty, !allowed.contains(request.method) else { return try await next(request, context) }
        let error = APIError(.methodNotAllowed, code: "method_not_allowed", message: "\(request.method) is not allowed on \(request.uri.path).")
        var response = Response.json(error.json, status: error.status)
        response.headers[.allow] = allowed.map(\.rawValue).sorted().joined(separator: ", ")
        return response
    }
}
