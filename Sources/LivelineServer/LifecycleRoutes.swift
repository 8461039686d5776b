import Foundation
import HTTPTypes
import Hummingbird
import LivelineCore
import LivelineStore

/// The `/v1` lifecycle API: instances register, the backend updates and ends activities.
struct LifecycleRoutes<Context: RequestContext>: Sendable {
    let store: any Store
    let authenticator: Authenticator
    let clock: WallClock
    /// Accepts updates and ends, registers instances, applies what phones report.
    let lifecycle: ActivityLifecycle
    /// Apple's priority-10 budget, for the budget report.
    let budget: PriorityBudget
    /// How long a remotely started instance may stay `starting` before the activity lists it as unconfirmed.
    var startConfirmationTimeout: TimeInterval = 120
    /// The most unconfirmed instances an activity lists.
    static var unconfirmedListed: Int { 100 }

    static var maximumPageSize: Int { 200 }
    static var defaultPageSize: Int { 50 }

    func add(to router: Router<Context>) {
        let v1 = router.group("v1")
        v1.put("activities/:activityId/instances/:deviceId", use: registerInstance)
        v1.post("activities/:activityId/updates", use: update)
        v1.post("activities/:activityId/end", use: end)
        v1.delete("activities/:activityId", use: endAndDismiss)
        v1.get("activities/:activityId", use: activity)
        v1.get("activities", use: activities)
        v1.get("activities/:activityId/instances", use: instances)
        v1.post("activities/:activityId/instances/:deviceId/events", use: instanceEvent)
        v1.get("activities/:activityId/deliveries", use: deliveries)
        v1.get("activities/:activityId/channel", use: channel)
        v1.get("app", use: app)
    }

    // MARK: Handlers: parse → lifecycle → represent

    @Sendable func registerInstance(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .publishableOrSecret)
        let activityID = try Self.pathID("activityId", context)
        let deviceID = try Self.pathID("deviceId", context)
        let body = try await RequestBody.read(request)
        try body.allowOnly(["platform", "pushToken", "channelId", "attributesType", "attributes", "userId"])
        let platformName = try body.requiredString("platform")
        guard let platform = Platform(rawValue: platformName) else {
            throw ValidationError(code: "invalid_platform", message: "platform must be 'ios' or 'android'.", field: "platform")
        }
        // An iPhone that subscribed the activity to its broadcast channel registers the channel instead of a token.
        let channelID = try body.string("channelId")
        let pushToken: String
        if let channelID {
            guard platform == .ios else {
                throw ValidationError(code: "channel_not_allowed", message: "Only an iPhone subscribes to a broadcast channel.", field: "channelId")
            }
            guard body.members["pushToken"] == nil else {
                throw ValidationError(
                    code: "token_and_channel", message: "Give pushToken or channelId, not both: a Live Activity has one or the other.",
                    field: "channelId"
                )
            }
            guard !channelID.isEmpty, channelID.utf8.count <= 256 else {
                throw ValidationError(code: "invalid_channel_id", message: "channelId must be 1 to 256 characters.", field: "channelId")
            }
            pushToken = ""
        } else {
            pushToken = try PushToken.validate(try body.requiredString("pushToken"), platform: platform)
        }
        let attributesType = try body.string("attributesType")
        if let attributesType { try Self.validateAttributesType(attributesType) }
        var attributes: JSONValue?
        if let value = body.value("attributes") {
            guard value.objectValue != nil else {
                throw ValidationError(code: "invalid_attributes", message: "attributes must be a JSON object.", field: "attributes")
            }
            attributes = value
        }
        let userID = try body.string("userId").map { userID throws(ValidationError) in try Identifier.validate(userID, field: "userId") }
        // The app's devices take their user ids from its backend: a phone (the publishable key, which is public) names
        // none, on its instances as on its devices.
        if caller.scope == .publishable, body.members["userId"] != nil, try await store.app(id: caller.appID)?.audienceFrom == .backend {
            throw APIError(
                .forbidden, code: "secret_key_required",
                message: "This app sets user ids from its backend (audienceFrom: backend): register the instance without userId, or set it with the secret key.",
                field: "userId"
            )
        }
        let result = try await lifecycle.register(
            InstanceRegistration(
                appID: caller.appID, activityID: activityID, deviceID: deviceID, platform: platform, pushToken: pushToken,
                attributesType: attributesType, attributes: attributes, userID: userID, channelID: channelID
            )
        )
        return Response.json(Representation.instance(result.instance, for: caller.scope), status: result.change == .created ? .created : .ok)
    }

    @Sendable func update(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let activityID = try Self.pathID("activityId", context)
        let body = try await RequestBody.read(request)
        return try await IdempotentPOST.respond(
            to: request, body: body.bytes, caller: caller, store: store, now: clock.now(), represent: Self.acceptedResponse
        ) { claim in
            try body.allowOnly([
                "contentState", "alert", "staleDate", "relevanceScore", "priority", "dismissalDate", "minUpdateInterval", "delivery",
                "messageStoragePolicy",
            ])
            if body.members["dismissalDate"] != nil {
                throw ValidationError(
                    code: "dismissal_date_not_allowed",
                    message: "dismissalDate belongs to ending an activity: POST /v1/activities/{activityId}/end.",
                    field: "dismissalDate"
                )
            }
            let common = try Self.commonFields(body)
            return try await lifecycle.accept(
                ActivityUpdate(
                    appID: caller.appID, activityID: activityID, contentState: try Self.contentState(body, required: true)!,
                    alert: common.alert, staleDate: common.staleDate, relevanceScore: common.relevanceScore, priority: common.priority,
                    minUpdateInterval: try Self.minUpdateInterval(body)
                ),
                delivery: try Self.deliveryRequest(body), idempotency: claim
            )
        }
    }

    @Sendable func end(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let activityID = try Self.pathID("activityId", context)
        let body = try await RequestBody.read(request, allowEmpty: true)
        return try await IdempotentPOST.respond(
            to: request, body: body.bytes, caller: caller, store: store, now: clock.now(), represent: Self.acceptedResponse
        ) { claim in
            try body.allowOnly(["contentState", "alert", "staleDate", "relevanceScore", "priority", "dismissalDate"])
            let contentState = try Self.contentState(body, required: false)
            let common = try Self.commonFields(body)
            return try await lifecycle.end(
                ActivityEnd(
                    appID: caller.appID, activityID: activityID, contentState: contentState, alert: common.alert,
                    dismissalDate: try body.epochSeconds("dismissalDate"), staleDate: common.staleDate,
                    relevanceScore: common.relevanceScore, priority: common.priority
                ),
                idempotency: claim
            )
        }
    }

    @Sendable func endAndDismiss(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let activityID = try Self.pathID("activityId", context)
        let outcome = try await lifecycle.end(ActivityEnd(appID: caller.appID, activityID: activityID), dismissingNow: true)
        return IdempotentPOST.answer(outcome, represent: Self.acceptedResponse)
    }

    /// The activity's broadcast channel, for the app to subscribe its Live Activity (`pushType: .channel(id)`): the
    /// publishable key may read it.
    @Sendable func channel(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .publishableOrSecret)
        let activityID = try Self.pathID("activityId", context)
        let channel: BroadcastChannel
        do {
            channel = try await lifecycle.channel(appID: caller.appID, activityID: activityID)
        } catch let error as APIError where error.code == "activity_not_found" && caller.scope == .publishable {
            // The publishable key is public: it learns no more than that there is no channel, not whether the activity
            // exists (its ids are meant not to be guessed).
            throw APIError.notBroadcast(activityID)
        }
        return Response.json(
            .object([
                "activityId": .string(activityID), "channelId": .string(channel.id),
                "messageStoragePolicy": .string(channel.storagePolicy.rawValue), "status": .string(channel.status.rawValue),
            ])
        )
    }

    /// The delivery a start or update body asks for (`delivery`, `messageStoragePolicy`).
    static func deliveryRequest(_ body: RequestBody) throws -> DeliveryRequest {
        var request = DeliveryRequest()
        if let delivery = try body.string("delivery") {
            guard let value = ActivityDelivery(rawValue: delivery) else {
                throw ValidationError(code: "invalid_delivery", message: "delivery must be 'token' or 'broadcast'.", field: "delivery")
            }
            request.delivery = value
        }
        if let policy = try body.string("messageStoragePolicy") {
            guard let value = ChannelStoragePolicy(rawValue: policy) else {
                throw ValidationError(
                    code: "invalid_storage_policy", message: "messageStoragePolicy must be 'mostRecent' or 'none'.", field: "messageStoragePolicy"
                )
            }
            request.storagePolicy = value
        }
        return request
    }

    @Sendable func activity(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let activityID = try Self.pathID("activityId", context)
        guard let record = try await store.activity(appID: caller.appID, activityID: activityID) else {
            throw APIError.activityNotFound(activityID)
        }
        var json = Representation.activity(record).objectValue ?? [:]
        json["budget"] = try await budgetReport(record)
        // Started remotely, and the phone never registered the activity's token: visible, not silent.
        let unconfirmed = try await lifecycle.unconfirmedStarts(
            appID: caller.appID, activityID: activityID, allowed: startConfirmationTimeout, limit: Self.unconfirmedListed
        )
        json["unconfirmed"] = .object([
            "count": .integer(Int64(unconfirmed.count)),
            "afterSeconds": .integer(Int64(startConfirmationTimeout.rounded())),
            "instances": .array(unconfirmed.instances.map { instance in
                .object([
                    "deviceId": .string(instance.deviceID), "platform": .string(instance.platform.rawValue),
                    "startingSince": Representation.date(instance.updatedAt),
                ])
            }),
        ])
        return Response.json(.object(json))
    }

    @Sendable func activities(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        try QueryParameters.refuseUnknown(in: request, allowed: ["state", "attributesType", "limit", "cursor"])
        let query = request.uri.queryParameters
        var filter = ActivityFilter()
        if let state = query["state"].map(String.init) {
            guard let parsed = ActivityState(rawValue: state) else {
                throw ValidationError(code: "invalid_state", message: "state must be 'active' or 'ended'.", field: "state")
            }
            filter.state = parsed
        }
        if let attributesType = query["attributesType"].map(String.init) {
            try Self.validateAttributesType(attributesType)
            filter.attributesType = attributesType
        }
        let page = try await store.activities(
            appID: caller.appID, filter: filter, cursor: try PageCursor.query(request, .identifier), limit: try Self.limit(request)
        )
        return Response.json(Representation.page(page, Representation.activity))
    }

    @Sendable func instances(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        try QueryParameters.refuseUnknown(in: request, allowed: ["limit", "cursor"])
        let activityID = try Self.pathID("activityId", context)
        _ = try await existingActivity(caller, activityID)
        let page = try await store.instances(
            appID: caller.appID, activityID: activityID, cursor: try PageCursor.query(request, .identifier),
            limit: try Self.limit(request)
        )
        return Response.json(Representation.page(page, Representation.instance))
    }

    @Sendable func instanceEvent(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .publishableOrSecret)
        let activityID = try Self.pathID("activityId", context)
        let deviceID = try Self.pathID("deviceId", context)
        let body = try await RequestBody.read(request)
        return try await IdempotentPOST.respond(
            to: request, body: body.bytes, caller: caller, store: store, now: clock.now(),
            represent: { instance in Self.instanceResponse(instance, for: caller.scope) }
        ) { claim in
            try body.allowOnly(["type", "enabled"])
            let report: ActivityLifecycle.InstanceReport
            switch try body.requiredString("type") {
            case let type where type == "dismissed" || type == "ended":
                if body.members["enabled"] != nil {
                    throw APIError.badRequest("unknown_field", "enabled belongs only to the frequentPushes event.", field: "enabled")
                }
                report = type == "dismissed" ? .dismissed : .ended
            case "frequentPushes":
                guard let enabled = try body.bool("enabled") else {
                    throw APIError.badRequest("missing_field", "enabled is required for the frequentPushes event.", field: "enabled")
                }
                report = .frequentPushes(enabled: enabled)
            default:
                throw ValidationError(
                    code: "invalid_event_type", message: "type must be 'dismissed', 'ended' or 'frequentPushes'.", field: "type"
                )
            }
            return try await lifecycle.report(
                report, appID: caller.appID, activityID: activityID, deviceID: deviceID, idempotency: claim
            )
        }
    }

    @Sendable func deliveries(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        try QueryParameters.refuseUnknown(in: request, allowed: ["limit", "cursor"])
        let activityID = try Self.pathID("activityId", context)
        _ = try await existingActivity(caller, activityID)
        // The Store's cursors carry an attempt's id, a counter all apps share; the app sees its own number for it.
        let numbers = store.publicNumbers(appID: caller.appID)
        let before = try PageCursor.counter(request, "cursor", numbers)
        let page = try await store.deliveries(
            appID: caller.appID, activityID: activityID, cursor: before.map { PageCursor.encode(position: $0) }, limit: try Self.limit(request)
        )
        let next = page.nextCursor == nil ? nil : page.items.last.map { PageCursor.encode(counter: $0.id, numbers) }
        return Response.json(
            .object(["data": .array(page.items.map { Representation.delivery($0, numbers) }), "nextCursor": Representation.optional(next)])
        )
    }

    @Sendable func app(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        guard let app = try await store.app(id: caller.appID) else { throw StoreError.appNotFound }
        var credentials: [JSONValue] = []
        for provider in CredentialProvider.allCases {
            if let stored = try await store.credentials(appID: caller.appID, provider: provider) {
                credentials.append(Representation.credentials(stored))
            }
        }
        var json = Representation.app(app).objectValue ?? [:]
        json["credentials"] = .array(credentials)
        return Response.json(.object(json))
    }

    /// How the activity's iOS instances stand against their hourly priority-10 budget.
    private func budgetReport(_ record: ActivityRecord) async throws -> JSONValue {
        let now = Int64(clock.now().timeIntervalSince1970)
        let budget = (try await store.app(id: record.appID))?.budget.applied(to: self.budget) ?? self.budget
        var maximum = 0
        var atLimit = 0
        var warned = 0
        for usage in try await store.priority10Usage(appID: record.appID, activityID: record.activityID) {
            let used = usage.tally.used(at: now)
            maximum = max(maximum, used)
            if used >= budget.limit(frequentPushes: usage.frequentPushes) { atLimit += 1 }
            if budget.warns(used: used, frequentPushes: usage.frequentPushes) { warned += 1 }
        }
        return .object([
            "hourlyLimit": .integer(Int64(budget.hourly)),
            "hourlyLimitWithFrequentPushes": .integer(Int64(budget.hourlyWithFrequentPushes)),
            "maxUsedLastHour": .integer(Int64(maximum)),
            "instancesAtWarning": .integer(Int64(warned)),
            "instancesAtLimit": .integer(Int64(atLimit)),
            "lastWarningAt": Representation.date(record.budgetWarnedAt),
        ])
    }

    /// The caller's activity, or 404 (also for another app's activity: ids are per app).
    private func existingActivity(_ caller: Caller, _ activityID: String) async throws -> ActivityRecord {
        guard let record = try await store.activityWithoutInstanceCounts(appID: caller.appID, activityID: activityID) else {
            throw APIError.activityNotFound(activityID)
        }
        return record
    }

    // MARK: Responses

    /// An accepted update or end as the API answers it: 202 and the accepted sequence. The first response and the one
    /// remembered under an idempotency key are this same rendering.
    @Sendable static func acceptedResponse(_ accepted: ActivityLifecycle.Accepted) -> StoredResponse {
        StoredResponse(
            status: Int(HTTPResponse.Status.accepted.code),
            body: Representation.accepted(accepted.sequence, warnings: ContentContracts.warnings(accepted.changes)).encoded
        )
    }

    /// An instance after a reported event, as the API answers it: 200 and the instance.
    @Sendable static func instanceResponse(_ instance: InstanceRecord, for scope: APIKeyScope) -> StoredResponse {
        StoredResponse(status: Int(HTTPResponse.Status.ok.code), body: Representation.instance(instance, for: scope).encoded)
    }

    // MARK: Input rules

    static func pathID(_ name: String, _ context: Context) throws -> String {
        guard let value = context.parameters.get(name) else {
            throw APIError.badRequest("missing_field", "\(name) is required.", field: name)
        }
        // Foundation's decoding costs a measurable share of a request on Linux: only a value with an escape needs it.
        let decoded = value.utf8.contains(UInt8(ascii: "%")) ? (value.removingPercentEncoding ?? value) : value
        return try Identifier.validate(decoded, field: name)
    }

    static func limit(_ request: Request) throws -> Int {
        guard let text = request.uri.queryParameters["limit"] else { return defaultPageSize }
        guard let limit = Int(text) else {
            throw APIError.badRequest("invalid_type", "limit must be an integer.", field: "limit")
        }
        guard (1...maximumPageSize).contains(limit) else {
            throw ValidationError(code: "invalid_limit", message: "limit must be between 1 and \(maximumPageSize).", field: "limit")
        }
        return limit
    }

    static func validateAttributesType(_ name: String) throws(ValidationError) {
        let valid = !name.isEmpty && name.utf8.count <= 128 && name.utf8.allSatisfy { byte in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".")
        }
        guard valid else {
            throw ValidationError(
                code: "invalid_attributes_type",
                message: "attributesType must be the Swift type name of the ActivityAttributes (letters, digits, '_', '.').",
                field: "attributesType"
            )
        }
    }

    /// `minUpdateInterval`: seconds between two states sent to the phones, 0 (off) to 3600.
    static func minUpdateInterval(_ body: RequestBody) throws -> Double? {
        guard let value = body.value("minUpdateInterval"), value != .null else { return nil }
        let seconds: Double
        switch value {
        case .integer(let integer): seconds = Double(integer)
        case .number(let number): seconds = number
        default:
            throw APIError.badRequest("invalid_type", "minUpdateInterval must be a number of seconds.", field: "minUpdateInterval")
        }
        guard seconds.isFinite, (0...3600).contains(seconds) else {
            throw ValidationError(
                code: "invalid_min_update_interval", message: "minUpdateInterval must be between 0 (off) and 3600 seconds.",
                field: "minUpdateInterval"
            )
        }
        return seconds
    }

    static func contentState(_ body: RequestBody, required: Bool) throws -> JSONValue? {
        guard let value = body.value("contentState") else {
            if required { throw APIError.badRequest("missing_field", "contentState is required.", field: "contentState") }
            return nil
        }
        guard value.objectValue != nil else {
            throw ValidationError(
                code: "invalid_content_state",
                message: "contentState must be a JSON object that decodes into the app's ContentState, not \(value.kindName).",
                field: "contentState"
            )
        }
        return value
    }

    struct CommonFields {
        var alert: LiveActivityAlert?
        var staleDate: Int64?
        var relevanceScore: Double?
        var priority: Int?
    }

    /// An alert's `title` or `body`: a string shown as it is, or `{"locKey": "…", "locArgs": ["…"]}`, the key of one
    /// of the app's localized strings and the arguments for its placeholders (`locArgs` optional, strings only).
    static func alertText(_ alert: RequestBody, _ key: String) throws -> AlertText {
        let value = try alert.required(key)
        switch value {
        case .string(let text):
            return .text(text)
        case .object:
            let localized = try alert.object(key)!
            try localized.allowOnly(["locKey", "locArgs"])
            let locKey = try localized.requiredString("locKey")
            guard !locKey.isEmpty else {
                throw ValidationError(
                    code: "invalid_alert", message: "\(localized.path("locKey")) must name one of the app's localized strings.",
                    field: localized.path("locKey")
                )
            }
            var arguments: [String] = []
            if let list = localized.value("locArgs") {
                guard let values = list.arrayValue else {
                    throw APIError.invalidType(localized.path("locArgs"), expected: "an array of strings", got: list)
                }
                for (index, argument) in values.enumerated() {
                    guard let text = argument.stringValue else {
                        throw APIError.invalidType(localized.path("locArgs") + "[\(index)]", expected: "a string", got: argument)
                    }
                    arguments.append(text)
                }
            }
            return .localized(key: locKey, arguments: arguments)
        default:
            throw APIError.invalidType(alert.path(key), expected: "a string or an object with locKey and locArgs", got: value)
        }
    }

    static func commonFields(_ body: RequestBody) throws -> CommonFields {
        var fields = CommonFields()
        if let alert = try body.object("alert") {
            try alert.allowOnly(["title", "body", "sound"])
            fields.alert = LiveActivityAlert(
                title: try alertText(alert, "title"), body: try alertText(alert, "body"), sound: try alert.string("sound")
            )
        }
        fields.staleDate = try body.epochSeconds("staleDate")
        if let score = try body.number("relevanceScore") {
            guard score.isFinite, score >= 0 else {
                throw ValidationError(code: "invalid_relevance_score", message: "relevanceScore must be a number of 0 or more.", field: "relevanceScore")
            }
            fields.relevanceScore = score
        }
        if let priority = try body.integer("priority") {
            guard priority == 5 || priority == 10 else {
                throw ValidationError(code: "invalid_priority", message: "priority must be 5 or 10.", field: "priority")
            }
            fields.priority = Int(priority)
        }
        return fields
    }
}
