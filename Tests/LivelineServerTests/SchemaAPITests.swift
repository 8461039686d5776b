import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Content-state contracts over the API")
struct SchemaAPITests {
    static let schema: JSONValue = [
        "contentState": ["status": "string", "minutesAway": "integer", "eta": "date?"],
        "attributes": ["orderId": "string"],
    ]

    @Test("PUT registers (201), replaces (200) and GET reads the schema; publishable keys may not")
    func registerAndRead() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let created = try await api.json(.put, "/v1/attributes-types/DeliveryAttributes/schema", key: app.secretKey, Self.schema)
            #expect(created.status == .created)
            #expect(created["attributesType"] == "DeliveryAttributes")
            #expect(created["dateEncoding"] == "secondsSince2001")
            #expect(created["contentState"]?.objectValue?["eta"] == "date?")
            let replaced = try await api.json(.put, "/v1/attributes-types/DeliveryAttributes/schema", key: app.secretKey, Self.schema)
            #expect(replaced.status == .ok)
            let read = try await api.call(.get, "/v1/attributes-types/DeliveryAttributes/schema", key: app.secretKey)
            #expect(read.status == .ok)
            #expect(read["contentState"] == created["contentState"])

            let publishable = try await api.json(.put, "/v1/attributes-types/DeliveryAttributes/schema", key: app.publishableKey, Self.schema)
            #expect(publishable.status == .forbidden)
            let missing = try await api.call(.get, "/v1/attributes-types/OtherAttributes/schema", key: app.secretKey)
            #expect(missing.status == .notFound)
            #expect(missing.errorCode == "schema_not_found")
            let bad = try await api.json(.put, "/v1/attributes-types/DeliveryAttributes/schema", key: app.secretKey, ["contentState": ["a": "int"]])
            #expect(bad.status == .unprocessableContent)
            #expect(bad.errorCode == "invalid_schema")
            #expect(bad.errorField == "contentState.a")

            // Another app sees nothing of it.
            let other = try await createApp(store, name: "Other")
            #expect(try await api.call(.get, "/v1/attributes-types/DeliveryAttributes/schema", key: other.secretKey).status == .notFound)
        }
    }

    @Test("with a schema, a non-conforming update or end is refused naming the field; dates go as seconds since 2001")
    func enforced() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/attributes-types/DeliveryAttributes/schema", key: app.secretKey, Self.schema)
            _ = try await api.json(.put, "/v1/activities/order-1/instances/device-1", key: app.publishableKey, registerBody)

            let wrong = try await api.json(
                .post, "/v1/activities/order-1/updates", key: app.secretKey, ["contentState": ["status": "late", "minutesAway": "128"]]
            )
            #expect(wrong.status == .unprocessableContent)
            #expect(wrong.errorCode == "schema_mismatch")
            #expect(wrong.errorField == "contentState.minutesAway")
            #expect(wrong.json.objectValue?["error"]?.objectValue?["message"] == #"contentState.minutesAway: expected integer, got string "128"."#)

            let right = try await api.json(
                .post, "/v1/activities/order-1/updates", key: app.secretKey,
                ["contentState": ["status": "on the way", "minutesAway": 12, "eta": "2026-11-21T10:00:00Z"]]
            )
            #expect(right.status == .accepted)
            let read = try await api.call(.get, "/v1/activities/order-1", key: app.secretKey)
            #expect(read["contentState"]?.objectValue?["eta"] == .integer(816_948_000))

            let badEnd = try await api.json(.post, "/v1/activities/order-1/end", key: app.secretKey, ["contentState": ["status": 3, "minutesAway": 0]])
            #expect(badEnd.status == .unprocessableContent)
            #expect(badEnd.errorField == "contentState.status")
            #expect(try await api.call(.get, "/v1/activities/order-1", key: app.secretKey)["state"] == "active")

            let badAttributes = try await api.json(
                .put, "/v1/activities/order-2/instances/device-1", key: app.publishableKey,
                ["platform": "ios", "pushToken": .string(iosToken), "attributesType": "DeliveryAttributes", "attributes": ["orderId": 1234]]
            )
            #expect(badAttributes.status == .unprocessableContent)
            #expect(badAttributes.errorField == "attributes.orderId")
        }
    }

    @Test("without a schema, a field whose type changed since the first state is accepted and reported")
    func drift() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let first = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, ["contentState": ["minutesAway": 12]])
            #expect(first.status == .accepted)
            #expect(first["warnings"] == nil)
            let changed = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, ["contentState": ["minutesAway": "12"]])
            #expect(changed.status == .accepted)
            let warning = changed["warnings"]?.arrayValue?.first?.objectValue
            #expect(warning?["code"] == "content_state_type_changed")
            #expect(warning?["field"] == "contentState.minutesAway")
            // The first shape is remembered: going on with the new type keeps warning.
            let again = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, ["contentState": ["minutesAway": "13"]])
            #expect(again["warnings"]?.arrayValue?.count == 1)
            let back = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, ["contentState": ["minutesAway": 14]])
            #expect(back["warnings"] == nil)
        }
    }
}

@Suite("Default stale dates over the API")
struct StalenessAPITests {
    @Test("an update without staleDate gets one from the observed interval; an explicit one is kept")
    func defaults() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.post, "/v1/activities/m1/updates", key: app.secretKey, ["contentState": ["n": 1]])
            #expect(try await api.call(.get, "/v1/activities/m1", key: app.secretKey)["staleDate"] == "2026-11-21T11:00:00Z")
            clock.advance(by: 600)
            _ = try await api.json(.post, "/v1/activities/m1/updates", key: app.secretKey, ["contentState": ["n": 2]])
            // Ten minutes after the first: stale twenty minutes on.
            #expect(try await api.call(.get, "/v1/activities/m1", key: app.secretKey)["staleDate"] == "2026-11-21T10:30:00Z")
            clock.advance(by: 5)
            _ = try await api.json(.post, "/v1/activities/m1/updates", key: app.secretKey, ["contentState": ["n": 3], "staleDate": "2026-11-21T12:00:00Z"])
            #expect(try await api.call(.get, "/v1/activities/m1", key: app.secretKey)["staleDate"] == "2026-11-21T12:00:00Z")
        }
    }
}

@Suite("The Android message size rule")
struct AndroidSizeAPITests {
    @Test("a state whose APNs payload fits but whose FCM data would not is refused with 422 when the call arrives")
    func fcmDataTooLarge() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let staleDate: Int64 = 1_795_255_200 + 3600
            let apnsProbe = APNsLiveActivityPayload(event: .update, timestamp: 1_795_255_200, contentState: ["text": ""], staleDate: staleDate)
            let fcmProbe = FCMLiveUpdateMessage(
                activityID: "a1", event: .update, sequence: 1, timestamp: 1_795_255_200, contentState: ["text": ""], staleDate: staleDate
            )
            // Between the two limits: over FCM's 4096 bytes of data, within APNs' 4096 bytes of payload.
            let length = Limits.maximumAPNsPayloadBytes - apnsProbe.byteCount
            #expect(fcmProbe.dataByteCount + length > FCMLiveUpdateMessage.maximumDataBytes)
            let reply = try await api.json(
                .post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["text": .string(String(repeating: "y", count: length))]]
            )
            #expect(reply.status == .unprocessableContent)
            #expect(reply.errorCode == "payload_too_large")
            #expect(reply.json.objectValue?["error"]?.objectValue?["message"]?.stringValue?.contains("FCM") == true)
            #expect(try await api.call(.get, "/v1/activities/a1", key: app.secretKey).status == .notFound, "nothing was stored")
        }
    }
}

@Suite("Budget report over the API")
struct BudgetAPITests {
    @Test("GET /v1/activities/{id} shows the priority-10 budget and its use")
    func report() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/activities/m1/instances/d1", key: app.publishableKey, registerBody)
            let read = try await api.call(.get, "/v1/activities/m1", key: app.secretKey)
            let budget = read["budget"]?.objectValue
            #expect(budget?["hourlyLimit"] == .integer(10))
            #expect(budget?["hourlyLimitWithFrequentPushes"] == .integer(40))
            #expect(budget?["maxUsedLastHour"] == .integer(0))
            #expect(budget?["instancesAtLimit"] == .integer(0))
            #expect(budget?["lastWarningAt"] == .null)
        }
    }
}

@Suite("Per-app budget over the admin API")
struct AppBudgetAPITests {
    @Test("PUT /admin/v1/apps/{id}/budget sets and clears the app's budget; the activity report follows it")
    func setAndClear() async throws {
        let admin = "admin-token-0123456789"
        try await withLiveline(adminToken: admin) { api, store in
            let app = try await createApp(store)
            let set = try await api.json(.put, "/admin/v1/apps/\(app.id)/budget", key: admin, ["hourly": 4, "hourlyWithFrequentPushes": 12])
            #expect(set.status == .ok)
            #expect(set["budget"] == ["hourly": 4, "hourlyWithFrequentPushes": 12])
            _ = try await api.json(.put, "/v1/activities/m1/instances/d1", key: app.publishableKey, registerBody)
            let report = try await api.call(.get, "/v1/activities/m1", key: app.secretKey)["budget"]?.objectValue
            #expect(report?["hourlyLimit"] == .integer(4))
            #expect(report?["hourlyLimitWithFrequentPushes"] == .integer(12))

            let bad = try await api.json(.put, "/admin/v1/apps/\(app.id)/budget", key: admin, ["hourly": 5, "hourlyWithFrequentPushes": 2])
            #expect(bad.status == .unprocessableContent)
            #expect(bad.errorCode == "invalid_budget")
            let cleared = try await api.json(.put, "/admin/v1/apps/\(app.id)/budget", key: admin, ["hourly": .null])
            #expect(cleared["budget"] == ["hourly": .null, "hourlyWithFrequentPushes": .null])
            #expect(try await api.json(.put, "/admin/v1/apps/app_nope/budget", key: admin, ["hourly": 1]).status == .notFound)
            #expect(try await api.json(.put, "/admin/v1/apps/\(app.id)/budget", key: app.secretKey, ["hourly": 1]).status == .unauthorized)
        }
    }
}
