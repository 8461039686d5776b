import Foundation
import HTTPTypes
import Hummingbird
import LivelineCore
import LivelineDispatch
import LivelineStore

/// The app's webhook endpoints (secret key): create (the signing secret is shown once, and stored sealed), list, read,
/// delete, send a test event, and see the deliveries.
///
/// Creation takes no `Idempotency-Key`: its answer carries the signing secret, and remembering the answer would store
/// the secret in the clear.
struct WebhookRoutes<Context: RequestContext>: Sendable {
    let store: any Store
    let authenticator: Authenticator
    let sealer: CredentialSealer
    let clock: WallClock
    /// Which URLs a tenant may give.
    let urls: WebhookURLPolicy
    /// Woken when a test delivery is made.
    let deliverer: (any DeliveryWaking)?

    /// The most endpoints an app may have.
    static var maximumWebhooks: Int { 20 }

    func add(to router: Router<Context>) {
        let v1 = router.group("v1")
        v1.post("webhooks", use: create)
        v1.get("webhooks", use: list)
        v1.get("webhooks/:webhookId", use: read)
        v1.delete("webhooks/:webhookId", use: delete)
        v1.post("webhooks/:webhookId/test", use: test)
        v1.get("webhooks/:webhookId/deliveries", use: deliveries)
    }

    @Sendable func create(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let body = try await RequestBody.read(request)
        try body.allowOnly(["url", "eventTypes", "enabled"])
        let url: String
        do {
            url = try urls.check(try body.requiredString("url")).absoluteString
        } catch let refusal as WebhookURLPolicy.Refusal {
            throw ValidationError(code: "invalid_webhook_url", message: refusal.description, field: "url")
        }
        var types: [LifecycleEventType] = []
        if let value = body.value("eventTypes") {
            guard let list = value.arrayValue else { throw APIError.invalidType("eventTypes", expected: "an array of event types", got: value) }
            for item in list {
                guard let name = item.stringValue, let type = LifecycleEventType(rawValue: name) else {
                    throw ValidationError(code: "invalid_event_type", message: "eventTypes must hold event types such as activity.ended.", field: "eventTypes")
                }
                if !types.contains(type) { types.append(type) }
            }
        }
        var enabled = true
        if let value = body.value("enabled") {
            guard case .bool(let flag) = value else { throw APIError.invalidType("enabled", expected: "a boolean", got: value) }
            enabled = flag
        }
        let limitReached = APIError(
            .conflict, code: "webhook_limit_reached", message: "An app has at most \(Self.maximumWebhooks) webhooks.", field: "url"
        )
        let id = "wh_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        let secret = StandardWebhooks.newSecret()
        let record = WebhookRecord(
            id: id, appID: caller.appID, url: url, eventTypes: types, enabled: enabled,
            sealedSecret: try sealer.seal(Array(secret.utf8), appID: caller.appID, webhookID: id), createdAt: clock.now()
        )
        // Counted in the transaction that creates it: a count read before would let requests at once all pass.
        guard try await store.createWebhook(record, maximum: Self.maximumWebhooks) else { throw limitReached }
        var json = Representation.webhook(record).objectValue ?? [:]
        json["secret"] = .string(secret)
        return Response.json(.object(json), status: .created)
    }

    @Sendable func list(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let webhooks = try await store.webhooks(appID: caller.appID)
        return Response.json(.object(["data": .array(webhooks.map(Representation.webhook))]))
    }

    @Sendable func read(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        return Response.json(Representation.webhook(try await existing(caller, context)))
    }

    @Sendable func delete(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let id = try Self.webhookID(context)
        guard try await store.deleteWebhook(appID: caller.appID, id: id) else { throw Self.notFound(id) }
        return Response(status: .noContent)
    }

    /// Sends a `webhook.test` message to the endpoint (not an event of the feed), through the same signing, retries and
    /// delivery log as events.
    @Sendable func test(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        // It takes no body; one that is sent must still be a JSON object without members, not ignored.
        try await RequestBody.read(request, allowEmpty: true).allowOnly([])
        let webhook = try await existing(caller, context)
        guard webhook.enabled else {
            // Nothing is sent to a disabled endpoint: a test would wait as pending for ever.
            throw APIError(
                .conflict, code: "webhook_disabled",
                message: "The webhook is disabled; nothing is sent to it. Delete it and create it again to resume.", field: "webhookId"
            )
        }
        let now = clock.now()
        let eventID = "evt_test_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(20)
        let payload: JSONValue = [
            "id": .string(eventID), "type": "webhook.test", "createdAt": .string(APIDate.iso8601(now)), "appId": .string(caller.appID),
            "activityId": .null, "deviceId": .null, "data": ["webhookId": .string(webhook.id)],
        ]
        guard let delivery = try await store.enqueueWebhookTest(
            appID: caller.appID, webhookID: webhook.id, eventID: eventID, payload: payload.encodedString, at: now
        ) else { throw Self.notFound(webhook.id) }
        deliverer?.wake()
        return Response.json(Representation.webhookDelivery(delivery, store.publicNumbers(appID: caller.appID)), status: .accepted)
    }

    @Sendable func deliveries(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        try QueryParameters.refuseUnknown(in: request, allowed: ["limit", "cursor"])
        let webhook = try await existing(caller, context)
        let numbers = store.publicNumbers(appID: caller.appID)
        let before = try PageCursor.counter(request, "cursor", numbers)
        let limit = try LifecycleRoutes<Context>.limit(request)
        let page = try await store.webhookDeliveries(appID: caller.appID, webhookID: webhook.id, before: before, limit: limit)
        let next: JSONValue = page.count == limit ? page.last.map { .string(PageCursor.encode(counter: $0.id, numbers)) } ?? .null : .null
        return Response.json(.object(["data": .array(page.map { Representation.webhookDelivery($0, numbers) }), "nextCursor": next]))
    }

    private func existing(_ caller: Caller, _ context: Context) async throws -> WebhookRecord {
        let id = try Self.webhookID(context)
        guard let webhook = try await store.webhook(appID: caller.appID, id: id) else { throw Self.notFound(id) }
        return webhook
    }

    static func webhookID(_ context: Context) throws -> String {
        guard let raw = context.parameters.get("webhookId") else { throw notFound("") }
        // Decoded as the other ids of a path are, so a message names the id as the caller wrote it.
        let id = raw.utf8.contains(UInt8(ascii: "%")) ? (raw.removingPercentEncoding ?? raw) : raw
        guard id.utf8.count <= 64 else {
            throw APIError(
                .notFound, code: "webhook_not_found", message: "No webhook has an id that long (\(id.utf8.count) bytes; ids are at most 64).",
                field: "webhookId"
            )
        }
        return id
    }

    static func notFound(_ id: String) -> APIError {
        APIError(.notFound, code: "webhook_not_found", message: "No webhook '\(id)' in this app.", field: "webhookId")
    }
}

extension Representation {
    /// A webhook endpoint, without its secret.
    static func webhook(_ record: WebhookRecord) -> JSONValue {
        .object([
            "id": .string(record.id),
            "url": .string(record.url),
            "eventTypes": .array(record.eventTypes.map { .string($0.rawValue) }),
            "enabled": .bool(record.enabled),
            "createdAt": date(record.createdAt),
            "disabledAt": date(record.disabledAt),
            "disabledReason": optional(record.disabledReason),
        ])
    }

    /// A webhook delivery; its id is the number the app sees for it (``PublicNumbers``).
    static func webhookDelivery(_ record: WebhookDeliveryRecord, _ numbers: PublicNumbers) -> JSONValue {
        .object([
            "id": .integer(numbers.shown(record.id)),
            "eventId": .string(record.eventID),
            "status": .string(record.status.rawValue),
            "attempts": .integer(Int64(record.attempts)),
            "lastStatusCode": record.lastStatusCode.map { .integer(Int64($0)) } ?? .null,
            "lastError": optional(record.lastError),
            "latencyMs": record.lastLatencyMilliseconds.map(JSONValue.number) ?? .null,
            "lastAttemptAt": date(record.lastAttemptAt),
            "nextAttemptAt": record.status == .pending ? date(record.nextAttemptAt) : .null,
            "createdAt": date(record.createdAt),
            "finishedAt": date(record.finishedAt),
        ])
    }
}
