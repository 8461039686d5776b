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
        try QueryParameters.refuseUnknown(in: request, allowed: ["after", "types", "limit"])
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
        // An empty page hands back the cursor it was given, as given: re-made from the counter it stands for, a cursor
        // outside the app's numbers (read as before or after every counter) would come back as one this server refuses
        // ("MA", for 0) or as one of the app's numbers, read as some arbitrary position the next time.
        let nextCursor: JSONValue =
            if let last = events.last { .string(PageCursor.encode(counter: last.position, numbers)) }
            else { query["after"].map { .string(String($0)) } ?? .null }
        return Response.json(.object(["data": .array(events.map(Representation.event)), "nextCursor": nextCursor]))
    }
}

extension Representation {
    /// One lifecycle event, as the feed shows it and webhooks send it.
    static func event(_ record: EventRecord) -> JSONValue { record.json }
}
