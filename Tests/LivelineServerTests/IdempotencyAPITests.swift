import Foundation
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Testing

private let idempotencyKey = HTTPField.Name("Idempotency-Key")!
private let replayed = HTTPField.Name("Idempotent-Replayed")!

extension API {
    /// A POST with a JSON body and an `Idempotency-Key`.
    func post(_ uri: String, key: String, idempotencyKey value: String, _ body: JSONValue) async throws -> Reply {
        try await call(.post, uri, key: key, body: body.encodedString, headers: [idempotencyKey: value])
    }
}

@Suite("Idempotency-Key on the /v1 POSTs")
struct IdempotencyAPITests {
    let update: JSONValue = ["contentState": ["status": "on the way", "minutesAway": 12]]

    @Test("the same key and body again: 202 with the first body, Idempotent-Replayed, and nothing accepted again")
    func updateReplay() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let first = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "retry-1", update)
            #expect(first.status == .accepted)
            #expect(first["sequence"] == .integer(1))
            #expect(first.headers[replayed] == nil)

            let again = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "retry-1", update)
            #expect(again.status == .accepted)
            #expect(again.json == first.json)
            #expect(again.headers[replayed] == "true")
            #expect(again.headers[.contentType] == first.headers[.contentType])

            // Sends nothing again: the activity's sequence is where the first request left it, so the delivery engine,
            // which sends what an instance has not received up to that sequence, has nothing new to send.
            let activity = try #require(try await store.activity(appID: app.id, activityID: "order-1"))
            #expect(activity.sequence == 1)
        }
    }

    @Test("the same key with another body, path or method: 422 idempotency_key_reused")
    func reuse() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "k", update)
            let otherBody = try await api.post(
                "/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "k", ["contentState": ["status": "late"]]
            )
            #expect(otherBody.status == .unprocessableContent)
            #expect(otherBody.errorCode == "idempotency_key_reused")
            #expect(otherBody.errorField == "Idempotency-Key")
            let otherPath = try await api.post("/v1/activities/order-1/end", key: app.secretKey, idempotencyKey: "k", update)
            #expect(otherPath.errorCode == "idempotency_key_reused")
            #expect(try await store.activity(appID: app.id, activityID: "order-1")?.sequence == 1)
            #expect(try await store.activity(appID: app.id, activityID: "order-1")?.state == .active)
        }
    }

    @Test(
        "an invalid key: 400 invalid_idempotency_key",
        arguments: ["", String(repeating: "k", count: 256), "tab\tinside"]
    )
    func invalidKey(_ value: String) async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let reply = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: value, update)
            #expect(reply.status == .badRequest)
            #expect(reply.errorCode == "invalid_idempotency_key")
            #expect(reply.errorField == "Idempotency-Key")
            #expect(try await store.activity(appID: app.id, activityID: "order-1") == nil)
        }
    }

    @Test("a key sent twice in one request: 400 invalid_idempotency_key")
    func keySentTwice() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            var headers = HTTPFields()
            headers.append(HTTPField(name: idempotencyKey, value: "a"))
            headers.append(HTTPField(name: idempotencyKey, value: "b"))
            let reply = try await api.call(.post, "/v1/activities/order-1/updates", key: app.secretKey, body: update.encodedString, headers: headers)
            #expect(reply.status == .badRequest)
            #expect(reply.errorCode == "invalid_idempotency_key")
        }
    }

    @Test("a request refused with a 4xx is not remembered: its key serves the corrected request")
    func refusalNotRemembered() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let refused = try await api.post(
                "/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "k", ["contentState": ["n": 1], "priority": 7]
            )
            #expect(refused.status == .unprocessableContent)
            #expect(refused.errorCode == "invalid_priority")
            let corrected = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "k", update)
            #expect(corrected.status == .accepted)
            #expect(corrected.headers[replayed] == nil)
        }
    }

    @Test("an end retried after it ended the activity: the first 202 again, not 409 activity_ended")
    func endReplay() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, update)
            let end: JSONValue = ["contentState": ["status": "delivered", "minutesAway": 0]]
            let first = try await api.post("/v1/activities/order-1/end", key: app.secretKey, idempotencyKey: "end-1", end)
            #expect(first.status == .accepted)
            #expect(first["event"] == "end")
            let again = try await api.post("/v1/activities/order-1/end", key: app.secretKey, idempotencyKey: "end-1", end)
            #expect(again.status == .accepted)
            #expect(again.json == first.json)
            #expect(again.headers[replayed] == "true")
            let unkeyed = try await api.json(.post, "/v1/activities/order-1/end", key: app.secretKey, end)
            #expect(unkeyed.status == .conflict, "without the key, ending twice is refused as before")
            #expect(try await store.activity(appID: app.id, activityID: "order-1")?.sequence == 2)
        }
    }

    @Test("keys are per app: another app's k is a new key")
    func perApp() async throws {
        try await withLiveline { api, store in
            let a = try await createApp(store, name: "A")
            let b = try await createApp(store, name: "B")
            let first = try await api.post("/v1/activities/order-1/updates", key: a.secretKey, idempotencyKey: "k", update)
            let other = try await api.post(
                "/v1/activities/order-1/updates", key: b.secretKey, idempotencyKey: "k", ["contentState": ["status": "late"]]
            )
            #expect(first.status == .accepted)
            #expect(other.status == .accepted)
            #expect(other.headers[replayed] == nil)
            #expect(try await store.activity(appID: b.id, activityID: "order-1")?.contentState == ["status": "late"])
        }
    }

    @Test("a phone's key (pk_) cannot take or answer for a key of the backend's (sk_): the two are kept apart")
    func publishableApart() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/activities/junk/instances/x", key: app.publishableKey, registerBody)
            // A phone takes the key the backend will use for its update …
            let taken = try await api.post(
                "/v1/activities/junk/instances/x/events", key: app.publishableKey, idempotencyKey: "update-order-1", ["type": "ended"]
            )
            #expect(taken.status == .ok)
            // … and the backend's request under it is performed all the same.
            let backend = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "update-order-1", update)
            #expect(backend.status == .accepted)
            #expect(backend.headers[replayed] == nil)
            #expect(try await store.activity(appID: app.id, activityID: "order-1")?.sequence == 1)
            // Each side keeps its own rules: another phone request under the phones' key is refused as reuse, and the
            // backend's retry is its own first answer.
            _ = try await api.json(.put, "/v1/activities/junk/instances/y", key: app.publishableKey, registerBody)
            let phone = try await api.post(
                "/v1/activities/junk/instances/y/events", key: app.publishableKey, idempotencyKey: "update-order-1", ["type": "ended"]
            )
            #expect(phone.status == .unprocessableContent)
            #expect(phone.errorCode == "idempotency_key_reused")
            let retried = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "update-order-1", update)
            #expect(retried.headers[replayed] == "true")
            #expect(try await store.activity(appID: app.id, activityID: "order-1")?.sequence == 1)
        }
    }

    @Test("after 24 hours a key is free again")
    func afterRetention() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            _ = try await api.post("/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "k", update)
            clock.advance(by: 24 * 3600)
            let fresh = try await api.post(
                "/v1/activities/order-1/updates", key: app.secretKey, idempotencyKey: "k", ["contentState": ["status": "late"]]
            )
            #expect(fresh.status == .accepted)
            #expect(fresh["sequence"] == .integer(2))
            #expect(fresh.headers[replayed] == nil)
        }
    }

    @Test("an instance event under a key: the first instance again, reuse refused")
    func instanceEvent() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/activities/order-1/instances/device-1", key: app.publishableKey, registerBody)
            let path = "/v1/activities/order-1/instances/device-1/events"
            let first = try await api.post(path, key: app.publishableKey, idempotencyKey: "ev-1", ["type": "frequentPushes", "enabled": true])
            #expect(first.status == .ok)
            #expect(first["frequentPushesEnabled"] == true)
            #expect(first["pushToken"] == nil && first["userId"] == nil, "a phone is answered the instance's receipt")
            let again = try await api.post(path, key: app.publishableKey, idempotencyKey: "ev-1", ["type": "frequentPushes", "enabled": true])
            #expect(again.status == .ok)
            #expect(again.json == first.json)
            #expect(again.headers[replayed] == "true")
            let reused = try await api.post(path, key: app.publishableKey, idempotencyKey: "ev-1", ["type": "dismissed"])
            #expect(reused.status == .unprocessableContent)
            #expect(reused.errorCode == "idempotency_key_reused")
            #expect(try await store.instances(appID: app.id, activityID: "order-1", cursor: nil, limit: 1).items.first?.state == .active)
        }
    }
}
