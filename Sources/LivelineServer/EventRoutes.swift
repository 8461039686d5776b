import Foundation
import Hummingbird
import LivelineCore
import LivelineStore

/// `GET /v1/events`: the app's lifecycle events, oldest first, for backends that poll rather than receive webhooks.
struct EventRoutes<Context: RequestContext>: Sendable {
    let store: any Store
    let authenticator: Authenticator

    func add(to router: Router<Context>) {
        router.group("v1").get("events", use: events)
    }

    /// The events after `after` (a `nextCursor`; from the oldest kept without it), of `types` (comma-separated; all
    /// without it), at most `limit`. `nextCursor` is always given: poll with it to get only what is newer.
    @Sendable func events(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let query = request.uri.queryParameters
        let numbers = store.publicNumbers(appID: caller.appID)
        let after = try PageCursor.counter(request, "after", numbers)
        var types: Set<LifecycleEventType> = []
        if let list = query["types"].map(String.init) {
            for name in list.split(separator: ",", omittingEmptySubsequences: false) {
                guard let type = LifecycleEventType(rawValue: String(name)) else {
                    throw ValidationError(
                        code: "invalid_event_type",
                        message: "types must be comma-separated event types, such as activity.updated,instance.invalidated.", field: "types"
                    )
                }
                types.insert(type)
            }
        }
        let limit = try LifecycleRoutes<Context>.limit(request)
        let events = try await store.events(appID: caller.appID, after: after, types: types, limit: limit)
        let position = events.last?.position ?? after
        return Response.json(
            .object([
                "data": .array(events.map(Representation.event)),
                "nextCursor": position.map { .string(PageCursor.encode(counter: $0, numbers)) } ?? .null,
            ])
        )
    }
}

extension Representation {
    /// One lifecycle event, as the feed shows it and webhooks send it.
    static func event(_ record: EventRecord) -> JSONValue { record.json }
}
