import Foundation
import Hummingbird
import LivelineCore
import LivelineStore

/// Content-state contracts: the schema registered for an attributes type, or — without one — the shape of the
/// first accepted state, so that a state the phone's decoder would silently drop is caught at the API.
struct ContentContracts: Sendable {
    let store: any SchemaStore

    /// What checking a content state gave.
    struct Checked: Sendable {
        /// The state to store and send (dates encoded as the schema says).
        var contentState: JSONValue
        /// The shape to remember (schema-less activities), or nil to keep what is stored.
        var shape: JSONShape?
        /// Fields whose kind differs from the remembered shape.
        var changes: [JSONShape.Change]
    }

    /// The schema of an attributes type, if one is registered.
    func schema(appID: String, attributesType: String?) async throws -> AttributesTypeSchema? {
        guard let attributesType, let stored = try await store.schema(appID: appID, attributesType: attributesType) else { return nil }
        return try AttributesTypeSchema(json: stored.schema)
    }

    /// Checks a content state for an activity: against its attributes type's schema (422 on a mismatch), or against
    /// the shape remembered from its first accepted state.
    func check(_ contentState: JSONValue, appID: String, activity: ActivityRecord?, remember: Bool) async throws -> Checked {
        if let schema = try await schema(appID: appID, attributesType: activity?.attributesType) {
            return Checked(contentState: try schema.conform(contentState: contentState), shape: nil, changes: [])
        }
        let shape = JSONShape(of: contentState)
        guard let activity else { return Checked(contentState: contentState, shape: remember ? shape : nil, changes: []) }
        guard let remembered = activity.contentShape else {
            return Checked(contentState: contentState, shape: remember ? shape : nil, changes: [])
        }
        let merged = remembered.adding(shape)
        return Checked(
            contentState: contentState, shape: remember && merged != remembered ? merged : nil, changes: remembered.changes(to: shape)
        )
    }

    /// The 202 response's `warnings` for fields whose kind changed.
    static func warnings(_ changes: [JSONShape.Change]) -> [JSONValue] {
        changes.map { change in
            .object([
                "code": "content_state_type_changed",
                "field": .string(change.field),
                "message": .string(
                    "\(change.field) was \(change.was) in earlier states and is \(change.now) now; a phone whose ContentState declares it as \(change.was) cannot decode this state and silently keeps the old one."
                ),
            ])
        }
    }
}

/// `PUT` and `GET /v1/attributes-types/{name}/schema`: register and read the content-state contract of an attributes type.
struct SchemaRoutes<Context: RequestContext>: Sendable {
    let store: any Store
    let authenticator: Authenticator
    let clock: WallClock

    func add(to router: Router<Context>) {
        let v1 = router.group("v1")
        v1.put("attributes-types/:attributesType/schema", use: put)
        v1.get("attributes-types/:attributesType/schema", use: get)
    }

    @Sendable func put(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let name = try Self.attributesType(context)
        let body = try await RequestBody.read(request)
        let schema = try AttributesTypeSchema(json: .object(body.members))
        let existed = try await store.schema(appID: caller.appID, attributesType: name) != nil
        let stored = try await store.saveSchema(appID: caller.appID, attributesType: name, schema: schema.json, at: clock.now())
        return Response.json(Self.representation(stored), status: existed ? .ok : .created)
    }

    @Sendable func get(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let name = try Self.attributesType(context)
        guard let stored = try await store.schema(appID: caller.appID, attributesType: name) else {
            throw APIError(.notFound, code: "schema_not_found", message: "No schema is registered for '\(name)'.", field: "attributesType")
        }
        return Response.json(Self.representation(stored))
    }

    static func attributesType(_ context: Context) throws -> String {
        guard let raw = context.parameters.get("attributesType") else {
            throw APIError.badRequest("missing_field", "attributesType is required.", field: "attributesType")
        }
        let name = raw.removingPercentEncoding ?? raw
        try LifecycleRoutes<Context>.validateAttributesType(name)
        return name
    }

    static func representation(_ stored: StoredSchema) -> JSONValue {
        var json = stored.schema.objectValue ?? [:]
        json["attributesType"] = .string(stored.attributesType)
        json["createdAt"] = Representation.date(stored.createdAt)
        json["updatedAt"] = Representation.date(stored.updatedAt)
        return .object(json)
    }
}
