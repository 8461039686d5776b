import Foundation
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Testing

/// A valid start's body for `audience`.
func startBody(_ audience: JSONValue, type: String = "MatchAttributes") -> JSONValue {
    [
        "attributesType": .string(type), "attributes": ["home": "Lions", "away": "Tigers"], "contentState": ["home": 0, "away": 0],
        "alert": ["title": "Kick-off", "body": "Lions – Tigers"], "audience": audience,
    ]
}

@Suite("Remote start API")
struct StartAPITests {
    @Test("a start for users counts whom it reaches; the devices become starting instances, then active when their apps register")
    func startForUsers() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let pushToStart = String(repeating: "ab", count: 32)
            for (device, body) in [
                ("iphone-1", ["platform": "ios", "userId": "user-42", "pushToStartTokens": ["MatchAttributes": .string(pushToStart)]] as JSONValue),
                ("pixel-1", ["platform": "android", "userId": "user-42", "fcmToken": "fcm-token-of-pixel-1"]),
                ("iphone-2", ["platform": "ios", "userId": "user-42"]),
                ("iphone-3", ["platform": "ios", "userId": "user-7", "pushToStartTokens": ["MatchAttributes": .string(iosToken)]]),
            ] {
                let registered = try await api.json(.put, "/v1/devices/\(device)", key: app.publishableKey, body)
                #expect(registered.status == .created)
            }
            let started = try await api.json(.post, "/v1/activities/match-42/start", key: app.secretKey, startBody(["userIds": ["user-42"]]))
            #expect(started.status == .accepted)
            #expect(started["event"] == "start")
            #expect(started["sequence"] == .integer(1))
            #expect(started["counts"] == ["ios": 1, "android": 1, "skipped": 1])

            // Admitted by the engine (here by hand: no engine runs in these tests).
            #expect(try await store.admitStartAudience(appID: app.id, activityID: "match-42", limit: 100, at: testStart) == false)
            var read = try await api.call(.get, "/v1/activities/match-42", key: app.secretKey)
            #expect(read["instances"]?.objectValue?["starting"] == .integer(2))
            #expect(read["attributesType"] == "MatchAttributes")
            #expect(read["unconfirmed"]?.objectValue?["count"] == .integer(0))
            // The start's alert is the activity's startAlert; its sequence is the state phones already watching get, as an
            // update without one.
            #expect(read["startAlert"] == ["title": "Kick-off", "body": "Lions – Tigers"])
            #expect(read["alert"] == .null)

            // The iPhone's app registers the activity's own token.
            let confirmed = try await api.json(
                .put, "/v1/activities/match-42/instances/iphone-1", key: app.publishableKey,
                ["platform": "ios", "pushToken": .string(iosToken), "attributesType": "MatchAttributes"]
            )
            #expect(confirmed.status == .ok)
            #expect(confirmed["state"] == "active")
            read = try await api.call(.get, "/v1/activities/match-42", key: app.secretKey)
            #expect(read["instances"]?.objectValue?["starting"] == .integer(1))
            #expect(read["instances"]?.objectValue?["active"] == .integer(1))
        }
    }

    @Test("instances still starting after the confirmation time are listed as unconfirmed, with their device")
    func unconfirmed() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            _ = try await api.json(
                .put, "/v1/devices/pixel-1", key: app.publishableKey, ["platform": "android", "fcmToken": "fcm-token-of-pixel-1"]
            )
            _ = try await api.json(.post, "/v1/activities/match-1/start", key: app.secretKey, startBody(["all": true]))
            _ = try await store.admitStartAudience(appID: app.id, activityID: "match-1", limit: 100, at: testStart)
            clock.advance(by: 121)
            let read = try await api.call(.get, "/v1/activities/match-1", key: app.secretKey)
            let unconfirmed = read["unconfirmed"]?.objectValue
            #expect(unconfirmed?["count"] == .integer(1))
            #expect(unconfirmed?["afterSeconds"] == .integer(120))
            let first = unconfirmed?["instances"]?.arrayValue?.first?.objectValue
            #expect(first?["deviceId"] == "pixel-1")
            #expect(first?["platform"] == "android")
        }
    }

    @Test("an update of a remotely started activity must fit the start push a phone still waiting for its start gets")
    func updateFitsTheStart() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            var body = startBody(["all": true]).objectValue!
            body["attributes"] = ["notes": .string(String(repeating: "a", count: 1_500))]
            #expect(try await api.json(.post, "/v1/activities/match-5/start", key: app.secretKey, .object(body)).status == .accepted)
            // 2,600 bytes of state fit an update (4,096 bytes) but not a start beside 1,500 bytes of attributes.
            let large = try await api.json(
                .post, "/v1/activities/match-5/updates", key: app.secretKey, ["contentState": ["commentary": .string(String(repeating: "b", count: 2_600))]]
            )
            #expect(large.status == .unprocessableContent)
            #expect(large.errorCode == "payload_too_large")
            #expect(large.errorField == "contentState")
            let small = try await api.json(
                .post, "/v1/activities/match-5/updates", key: app.secretKey, ["contentState": ["commentary": .string(String(repeating: "b", count: 1_000))]]
            )
            #expect(small.status == .accepted)
            // An activity started on the phones has no start to carry: the same large state is accepted.
            #expect(try await api.json(
                .post, "/v1/activities/order-5/updates", key: app.secretKey, ["contentState": ["commentary": .string(String(repeating: "b", count: 2_600))]]
            ).status == .accepted)
        }
    }

    @Test("refusals: publishable key, missing alert, reserved attribute, bad audiences, ended activity, another attributes type")
    func refusals() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let path = "/v1/activities/match-1/start"
            #expect(try await api.json(.post, path, key: app.publishableKey, startBody(["all": true])).status == .forbidden)

            var noAlert = startBody(["all": true]).objectValue!
            noAlert["alert"] = nil
            let missing = try await api.json(.post, path, key: app.secretKey, .object(noAlert))
            #expect(missing.status == .badRequest)
            #expect(missing.errorField == "alert")

            var reserved = startBody(["all": true]).objectValue!
            reserved["attributes"] = ["liveline": ["activityId": "other"]]
            let reservedReply = try await api.json(.post, path, key: app.secretKey, .object(reserved))
            #expect(reservedReply.status == .unprocessableContent)
            #expect(reservedReply.errorCode == "reserved_attribute")

            for (audience, status, field) in [
                (["all": false] as JSONValue, HTTPResponse.Status.unprocessableContent, "audience.all"),
                (["deviceIds": []], .unprocessableContent, "audience.deviceIds"),
                (["deviceIds": ["bad id"]], .unprocessableContent, "audience.deviceIds"),
                (["userIds": ["u"], "all": true], .unprocessableContent, "audience"),
                (["everyone": true], .badRequest, "audience.everyone"),
                (["tags": ["team": 1]], .badRequest, "audience.tags.team"),
                // Tags no device can carry (as PUT /v1/devices refuses them).
                (["tags": ["a:b": "c"]], .unprocessableContent, "audience.tags"),
                (["tags": ["": "c"]], .unprocessableContent, "audience.tags"),
                (["tags": ["team": .string(String(repeating: "x", count: 257))]], .unprocessableContent, "audience.tags"),
                ("all", .badRequest, "audience"),
            ] {
                let reply = try await api.json(.post, path, key: app.secretKey, startBody(audience))
                #expect(reply.status == status, "\(audience)")
                #expect(reply.errorField == field, "\(audience)")
                if field == "audience.tags" { #expect(reply.errorCode == "invalid_tag", "\(audience)") }
            }

            var withDismissal = startBody(["all": true]).objectValue!
            withDismissal["dismissalDate"] = 1_795_259_000
            #expect(try await api.json(.post, path, key: app.secretKey, .object(withDismissal)).errorCode == "dismissal_date_not_allowed")

            #expect(try await api.json(.post, path, key: app.secretKey, startBody(["all": true])).status == .accepted)
            let otherType = try await api.json(.post, path, key: app.secretKey, startBody(["all": true], type: "OtherAttributes"))
            #expect(otherType.status == .conflict)
            #expect(otherType.errorCode == "attributes_type_mismatch")
            _ = try await api.call(.delete, "/v1/activities/match-1", key: app.secretKey)
            let ended = try await api.json(.post, path, key: app.secretKey, startBody(["all": true]))
            #expect(ended.status == .conflict)
            #expect(ended.errorCode == "activity_ended")
        }
    }

    @Test("a phone's registration does not fix the attributes type against the backend: its start sets it; its own type binds after")
    func registrationDoesNotBindTheType() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            // Anyone with the publishable key registers first, under a guessable activity id, with a type of its own.
            let registered = try await api.json(
                .put, "/v1/activities/match-77/instances/stranger", key: app.publishableKey,
                ["platform": "ios", "pushToken": .string(String(repeating: "ab", count: 32)), "attributesType": "EvilType",
                 "attributes": ["x": "y"]]
            )
            #expect(registered.status == .created)
            let path = "/v1/activities/match-77/start"
            #expect(try await api.json(.post, path, key: app.secretKey, startBody(["all": true])).status == .accepted)
            let activity = try #require(try await store.activity(appID: app.id, activityID: "match-77"))
            #expect(activity.attributesType == "MatchAttributes")
            // The backend's own type binds from now on.
            let otherType = try await api.json(.post, path, key: app.secretKey, startBody(["all": true], type: "OtherAttributes"))
            #expect(otherType.status == .conflict)
            #expect(otherType.errorCode == "attributes_type_mismatch")
        }
    }

    @Test("a start targets only the calling app's devices; another app's activity of the same id is untouched")
    func tenantIsolation() async throws {
        try await withLiveline { api, store in
            let first = try await createApp(store, name: "First")
            let second = try await createApp(store, name: "Second")
            _ = try await api.json(
                .put, "/v1/devices/pixel-1", key: first.publishableKey, ["platform": "android", "fcmToken": "fcm-token-of-pixel-1"]
            )
            let fromSecond = try await api.json(
                .post, "/v1/activities/match-1/start", key: second.secretKey, startBody(["deviceIds": ["pixel-1"]])
            )
            #expect(fromSecond["counts"] == ["ios": 0, "android": 0, "skipped": 1])
            _ = try await store.admitStartAudience(appID: second.id, activityID: "match-1", limit: 100, at: testStart)
            #expect(try await store.instances(appID: second.id, activityID: "match-1", cursor: nil, limit: 10).items.isEmpty)
            #expect(try await api.call(.get, "/v1/activities/match-1", key: first.secretKey).status == .notFound)
        }
    }
}

@Suite("Remote start API: Idempotency-Key")
struct StartIdempotencyTests {
    @Test("the same start with the same key is answered with the first response and accepts nothing; another body is refused")
    func replay() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let body = startBody(["all": true]).encodedString
            let key: HTTPFields = [HTTPField.Name("Idempotency-Key")!: "start-match-1"]
            let first = try await api.call(.post, "/v1/activities/match-1/start", key: app.secretKey, body: body, headers: key)
            #expect(first.status == .accepted)
            let again = try await api.call(.post, "/v1/activities/match-1/start", key: app.secretKey, body: body, headers: key)
            #expect(again.status == .accepted)
            #expect(again.json == first.json)
            #expect(again.headers[HTTPField.Name("Idempotent-Replayed")!] == "true")
            #expect(try await store.activity(appID: app.id, activityID: "match-1")?.sequence == 1)

            let other = try await api.json(.post, "/v1/activities/match-1/start", key: app.secretKey, startBody(["userIds": ["u1"]]))
            #expect(other.status == .accepted)
            let reused = try await api.call(
                .post, "/v1/activities/match-1/start", key: app.secretKey, body: startBody(["userIds": ["u2"]]).encodedString, headers: key
            )
            #expect(reused.status == .unprocessableContent)
            #expect(reused.errorCode == "idempotency_key_reused")
        }
    }
}
