import CoreMetrics
import HTTPTypes
import Hummingbird
import Synchronization

/// Counts the HTTP API's requests and times them, by method, route template and status class.
///
/// The route is the matched route's template (`/v1/activities/{activityId}`), never the raw path, so ids stay out of
/// the labels and the series stay bounded; a request no route matched is `unmatched`. Methods outside the standard
/// ones are `other`. The time is to the response's head: what the caller waits for an answer (an accepted update is
/// committed by then).
struct HTTPMetricsMiddleware<Context: RequestContext>: RouterMiddleware {
    let metrics: HTTPRequestMetrics

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        do {
            let response = try await next(request, context)
            metrics.record(method: request.method, route: context.endpointPath, status: response.status.code, since: started)
            return response
        } catch let error as any HTTPResponseError {
            metrics.record(method: request.method, route: context.endpointPath, status: error.status.code, since: started)
            throw error
        } catch {
            metrics.record(method: request.method, route: context.endpointPath, status: 500, since: started)
            throw error
        }
    }
}

/// The request counters and timers, made once per label combination and kept.
final class HTTPRequestMetrics: Sendable {
    /// What a request's counter and timer are found by: the method's and status class's labels, and the matched route
    /// as the router names it (its template is made from it once, with the pair).
    private struct Key: Hashable {
        var method: String
        var endpointPath: String?
        var statusClass: String
    }

    private let factory: any MetricsFactory
    private let made = Mutex<[Key: (Counter, CoreMetrics.Timer)]>([:])

    init(factory: any MetricsFactory) {
        self.factory = factory
    }

    func record(method: HTTPRequest.Method, route: String?, status: Int, since started: ContinuousClock.Instant) {
        let elapsed = ContinuousClock.now - started
        let matched = Self.matchedRoute(route)
        let key = Key(method: Self.methodLabel(method), endpointPath: matched, statusClass: Self.statusClass(status))
        let (counter, timer) = made.withLock { made in
            if let existing = made[key] { return existing }
            let dimensions = [("method", key.method), ("route", Self.routeLabel(matched)), ("status_class", key.statusClass)]
            let pair = (
                Counter(label: MetricNames.httpRequests, dimensions: dimensions, factory: factory),
                CoreMetrics.Timer(label: MetricNames.httpRequestDuration, dimensions: dimensions, factory: factory)
            )
            made[key] = pair
            return pair
        }
        counter.increment()
        let (seconds, attoseconds) = elapsed.components
        timer.recordNanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }

    static let knownMethods: Set<HTTPRequest.Method> = [.get, .head, .post, .put, .delete, .patch, .options]

    static func methodLabel(_ method: HTTPRequest.Method) -> String {
        knownMethods.contains(method) ? method.rawValue : "other"
    }

    /// The route template as the OpenAPI document writes it (`/v1/activities/{activityId}`); `unmatched` when no route
    /// matched.
    static func routeLabel(_ endpointPath: String?) -> String {
        guard let endpointPath = matchedRoute(endpointPath) else { return "unmatched" }
        let components = endpointPath.split(separator: "/").map { component in
            component.hasPrefix(":") ? "{\(component.dropFirst())}" : String(component)
        }
        return "/" + components.joined(separator: "/")
    }

    /// The route the router names, or `nil` when none matched (whatever it called that).
    static func matchedRoute(_ endpointPath: String?) -> String? {
        guard let endpointPath, !endpointPath.isEmpty, endpointPath != "NotFound" else { return nil }
        return endpointPath
    }

    private static let statusClasses = ["1xx", "2xx", "3xx", "4xx", "5xx"]

    /// The status class's label (`2xx`), made of no new string: it is part of every request's key.
    static func statusClass(_ status: Int) -> String {
        (1...5).contains(status / 100) ? statusClasses[status / 100 - 1] : "other"
    }
}
