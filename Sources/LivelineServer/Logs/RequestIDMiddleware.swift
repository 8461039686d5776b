import Foundation
import HTTPTypes
import Hummingbird
import LivelineCore
import Logging

/// Gives every HTTP request an id: the caller's `X-Request-Id` when it is 1–128 visible ASCII characters (no space: a
/// text log line's fields are separated by spaces, and an id with them could forge fields in it), else a new random
/// UUID (``RandomUUID``: unique, not secret, and without a system call). The id is echoed in the response's
/// `X-Request-Id` and is the `request.id` of the request's logger metadata, so every line logged while handling the
/// request carries it.
///
/// Once the request is answered it logs one line at debug level: method, route template, status and duration. Never
/// the raw path, the query, the headers or the body: those carry ids, cursors and credentials (`Authorization`).
struct RequestIDMiddleware<Context: RequestContext>: RouterMiddleware {
    /// The `X-Request-Id` header.
    static var headerName: HTTPField.Name { HTTPField.Name("X-Request-Id")! }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let id = Self.requestID(given: request.headers[Self.headerName])
        var context = context
        context.logger[metadataKey: "request.id"] = .string(id)
        let started = ContinuousClock.now
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as any HTTPResponseError {
            response = try error.response(from: request, context: context)
        }
        response.headers[Self.headerName] = id
        if context.logger.logLevel <= .debug {
            let elapsed = (ContinuousClock.now - started).components
            let milliseconds = Double(elapsed.seconds) * 1000 + Double(elapsed.attoseconds) / 1e15
            context.logger.debug(
                "Request answered",
                metadata: [
                    "http.method": "\(request.method.rawValue)",
                    "http.route": "\(HTTPRequestMetrics.routeLabel(context.endpointPath))",
                    "http.status": "\(response.status.code)",
                    "duration_ms": "\((milliseconds * 1000).rounded() / 1000)",
                ]
            )
        }
        return response
    }

    /// The caller's id when it is usable (1–128 visible ASCII characters, no space), else a new UUID.
    static func requestID(given: String?) -> String {
        if let given, (1...128).contains(given.utf8.count), given.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) {
            return given
        }
        return RandomUUID.next().lowercasedString
    }
}
