import Hummingbird

/// The query of a route that takes query parameters (the listings' filters and pages, the app deletion's option): a
/// name the route does not take is refused with 400 `unknown_parameter`, as an unknown field of a body is. Ignored, a
/// misspelt filter (`?user_id=` for `?userId=`) would widen a listing to every row, and its caller would never know.
enum QueryParameters {
    /// Throws 400 `unknown_parameter` naming the first parameter of `request`'s query that is not in `allowed`.
    static func refuseUnknown(in request: Request, allowed: Set<String>) throws {
        for (name, _) in request.uri.queryParameters where !allowed.contains(String(name)) {
            throw APIError.badRequest(
                "unknown_parameter",
                "\(name) is not a query parameter of this route; it takes \(allowed.sorted().joined(separator: ", ")).",
                field: String(name)
            )
        }
    }
}
