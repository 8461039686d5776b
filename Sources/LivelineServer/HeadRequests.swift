import HTTPTypes
import Hummingbird

/// Serves `HEAD` wherever `GET` is served, as HTTP asks of every general-purpose server (RFC 9110, 9.1 and 9.3.2): the
/// request is answered as its `GET` would be, with the same status and headers (`Content-Length` included) and no
/// body. A load balancer or uptime check that probes `HEAD /healthz` gets the health, not a 405.
///
/// It wraps the router's responder rather than being one of the router's middleware, because the router picks a
/// route by method before any middleware runs.
public struct HeadServingResponder<Responder: HTTPResponder>: HTTPResponder {
    public typealias Context = Responder.Context

    /// The responder asked, with `GET` for a `HEAD`.
    public let responder: Responder

    public func respond(to request: Request, context: Context) async throws -> Response {
        guard request.method == .head else { return try await responder.respond(to: request, context: context) }
        var head = request.head
        head.method = .get
        let response = try await responder.respond(to: Request(head: head, body: request.body), context: context)
        return response.createHeadResponse()
    }
}

/// A router whose responder also serves `HEAD` (``HeadServingResponder``).
public struct HeadServingRouter<Context: RequestContext>: HTTPResponderBuilder {
    /// The router itself.
    public let router: Router<Context>

    /// Wraps `router`.
    public init(_ router: Router<Context>) { self.router = router }

    // A concrete return type: with `some HTTPResponder<Context>` here the release build's compiler crashed (Swift 6,
    // signal 11 emitting `makeApplication`).
    public func buildResponder() -> HeadServingResponder<RouterResponder<Context>> {
        HeadServingResponder(responder: router.buildResponder())
    }
}
