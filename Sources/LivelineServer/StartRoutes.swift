import Foundation
import HTTPTypes
import Hummingbird
import LivelineCore
import LivelineStore

/// `POST /v1/activities/{activityId}/start`: the backend starts an activity remotely for an audience of devices
/// (push-to-start on iOS 17.2+, a start message on Android).
struct StartRoutes<Context: RequestContext>: Sendable {
    let store: any Store
    let authenticator: Authenticator
    let clock: WallClock
    let lifecycle: ActivityLifecycle

    /// The most device or user ids one start may name (a larger audience is a tag or `all`; the body stays within 64 KB).
    static var maximumAudienceIDs: Int { 1_000 }
    /// The most tags one start may require: no device carries more.
    static var maximumAudienceTags: Int { DeviceRoutes<Context>.maximumTags }

    func add(to router: Router<Context>) {
        router.group("v1").post("activities/:activityId/start", use: start)
    }

    @Sendable func start(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let activityID = try LifecycleRoutes<Context>.pathID("activityId", context)
        let body = try await RequestBody.read(request)
        return try await IdempotentPOST.respond(
            to: request, body: body.bytes, caller: caller, store: store, now: clock.now(), represent: Self.acceptedResponse
        ) { claim in
            try await lifecycle.start(
                try Self.activityStart(from: body, appID: caller.appID, activityID: activityID),
                delivery: try LifecycleRoutes<Context>.deliveryRequest(body), idempotency: claim
            )
        }
    }

    /// A start as the API answers it: 202, the accepted sequence and the counts.
    @Sendable static func acceptedResponse(_ report: ActivityLifecycle.AcceptedStartReport) -> StoredResponse {
        var json = Representation.accepted(report.start.sequence, warnings: ContentContracts.warnings(report.changes)).objectValue ?? [:]
        json["counts"] = .object([
            "ios": .integer(Int64(report.start.counts.ios)),
            "android": .integer(Int64(report.start.counts.android)),
            "skipped": .integer(Int64(report.start.counts.skipped)),
        ])
        return StoredResponse(status: Int(HTTPResponse.Status.accepted.code), body: JSONValue.object(json).encoded)
    }

    /// The start a request's body asks for, validated.
    static func activityStart(from body: RequestBody, appID: String, activityID: String) throws -> ActivityStart {
        if body.members["dismissalDate"] != nil {
            throw ValidationError(
                code: "dismissal_date_not_allowed", message: "dismissalDate belongs to ending an activity, not to starting one.",
                field: "dismissalDate"
            )
        }
        try body.allowOnly([
            "attributesType", "attributes", "contentState", "alert", "staleDate", "relevanceScore", "audience", "delivery",
            "messageStoragePolicy",
        ])
        let attributesType = try body.requiredString("attributesType")
        try LifecycleRoutes<Context>.validateAttributesType(attributesType)
        let attributes = try body.required("attributes")
        guard let members = attributes.objectValue else {
            throw ValidationError(code: "invalid_attributes", message: "attributes must be a JSON object.", field: "attributes")
        }
        if members[LiveActivityState.startAttributesKey] != nil {
            throw ValidationError(
                code: "reserved_attribute",
                message: "attributes.\(LiveActivityState.startAttributesKey) is Liveline's: it adds the activity's id there for the app.",
                field: "attributes.\(LiveActivityState.startAttributesKey)"
            )
        }
        let contentState = try LifecycleRoutes<Context>.contentState(body, required: true)!
        let common = try LifecycleRoutes<Context>.commonFields(body)
        guard let alert = common.alert else {
            throw APIError.badRequest("missing_field", "alert is required: Apple starts a Live Activity only with an alert.", field: "alert")
        }
        return ActivityStart(
            appID: appID, activityID: activityID, attributesType: attributesType, attributes: attributes,
            contentState: contentState, alert: alert, staleDate: common.staleDate, relevanceScore: common.relevanceScore,
            audience: try Self.audience(body.required("audience"))
        )
    }

    /// `{"deviceIds": […]}`, `{"userIds": […]}`, `{"tags": {"k": "v", …}}` or `{"all": true}`: exactly one.
    static func audience(_ value: JSONValue) throws -> StartAudience {
        guard let members = value.objectValue else { throw APIError.invalidType("audience", expected: "an object", got: value) }
        let kinds = ["deviceIds", "userIds", "tags", "all"]
        if let unknown = members.keys.sorted().first(where: { !kinds.contains($0) }) {
            throw APIError.badRequest("unknown_field", "audience.\(unknown) is not a field of an audience.", field: "audience.\(unknown)")
        }
        guard members.count == 1, let (kind, given) = members.first else {
            throw ValidationError(
                code: "invalid_audience", message: "audience must have exactly one of deviceIds, userIds, tags or all.", field: "audience"
            )
        }
        let field = "audience.\(kind)"
        switch kind {
        case "deviceIds", "userIds":
            guard let array = given.arrayValue else { throw APIError.invalidType(field, expected: "an array of ids", got: given) }
            guard (1...maximumAudienceIDs).contains(array.count) else {
                throw ValidationError(code: "invalid_audience", message: "\(field) must name 1 to \(maximumAudienceIDs) ids.", field: field)
            }
            var ids: [String] = []
            ids.reserveCapacity(array.count)
            for element in array {
                guard let id = element.stringValue else { throw APIError.invalidType(field, expected: "an array of strings", got: element) }
                ids.append(try Identifier.validate(id, field: field))
            }
            return kind == "deviceIds" ? .deviceIDs(ids) : .userIDs(ids)
        case "tags":
            guard let tags = given.objectValue else { throw APIError.invalidType(field, expected: "an object of strings", got: given) }
            guard (1...maximumAudienceTags).contains(tags.count) else {
                throw ValidationError(code: "invalid_audience", message: "\(field) must require 1 to \(maximumAudienceTags) tags.", field: field)
            }
            var required: [String: String] = [:]
            for (key, tag) in tags {
                guard let tag = tag.stringValue else { throw APIError.invalidType("\(field).\(key)", expected: "a string", got: tag) }
                // A tag no device can carry would match nothing: refused as registering it is.
                try DeviceRoutes<Context>.validateTag(key: key, value: tag, field: field)
                required[key] = tag
            }
            return .tags(required)
        default:
            guard given == .bool(true) else {
                throw ValidationError(code: "invalid_audience", message: "audience.all must be true.", field: field)
            }
            return .all
        }
    }
}
