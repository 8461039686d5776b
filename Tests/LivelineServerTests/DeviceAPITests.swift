import Foundation
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import Testing

private let startToken = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"

@Suite("Devices API")
struct DeviceAPITests {
    @Test("PUT creates (201) then updates (200); absent fields keep, null clears, tokens merge per type")
    func createAndUpdate() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let created = try await api.json(
                .put, "/v1/devices/phone-1", key: app.publishableKey,
                [
                    "platform": "ios", "userId": "user-7", "tags": ["team": "red", "tier": "gold"],
                    "pushToStartTokens": ["MatchAttributes": .string(startToken.uppercased())], "osVersion": "17.2.1", "locale": "en-US",
                ]
            )
            #expect(created.status == .created)
            // A phone is answered the device's ids and dates only: what is stored for it is the backend's to read.
            #expect(
                created.json
                    == ["deviceId": "phone-1", "platform": "ios", "createdAt": "2026-11-21T10:00:00Z", "updatedAt": "2026-11-21T10:00:00Z"]
            )
            let stored = try await api.call(.get, "/v1/devices/phone-1", key: app.secretKey)
            #expect(stored["deviceId"] == "phone-1")
            #expect(stored["platform"] == "ios")
            #expect(stored["userId"] == "user-7")
            #expect(stored["tags"] == ["team": "red", "tier": "gold"])
            #expect(stored["pushToStartTokens"] == ["MatchAttributes": ["token": .string(startToken), "updatedAt": "2026-11-21T10:00:00Z"]])
            #expect(stored["droppedPushToStartTokens"] == [:])
            #expect(stored["fcmToken"] == .null && stored["fcmTokenDropped"] == .null)
            #expect(stored["osVersion"] == "17.2.1" && stored["locale"] == "en-US")
            #expect(stored["createdAt"] == "2026-11-21T10:00:00Z")

            // The same with the secret key answers the whole device; absent fields keep what is stored.
            let same = try await api.json(.put, "/v1/devices/phone-1", key: app.secretKey, ["platform": "ios"])
            #expect(same.status == .ok)
            #expect(same.json == stored.json, "absent fields keep what is stored")
            let sameForPhone = try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios"])
            #expect(sameForPhone.json == created.json, "a phone naming another's device id reads nothing of it")

            let changed = try await api.json(
                .put, "/v1/devices/phone-1", key: app.secretKey,
                ["platform": "ios", "userId": nil, "tags": ["team": "blue"], "pushToStartTokens": ["OrderAttributes": "beef"]]
            )
            #expect(changed.status == .ok)
            #expect(changed["userId"] == .null)
            #expect(changed["tags"] == ["team": "blue"])
            #expect(changed["pushToStartTokens"]?.objectValue?.keys.sorted() == ["MatchAttributes", "OrderAttributes"])
            _ = try await api.json(
                .put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios", "pushToStartTokens": ["MatchAttributes": nil]]
            )
            let removed = try await api.call(.get, "/v1/devices/phone-1", key: app.secretKey)
            #expect(removed["pushToStartTokens"]?.objectValue?.keys.sorted() == ["OrderAttributes"])

            // A token APNs rejected shows apart, with its reason, until the phone registers again.
            try await store.dropDeviceToken(appID: app.id, deviceID: "phone-1", token: "beef", reason: "BadDeviceToken", at: testStart)
            let seen = try await api.call(.get, "/v1/devices/phone-1", key: app.secretKey)
            #expect(seen.status == .ok)
            #expect(seen["pushToStartTokens"] == [:])
            #expect(
                seen["droppedPushToStartTokens"]
                    == ["OrderAttributes": ["token": "beef", "reason": "BadDeviceToken", "droppedAt": "2026-11-21T10:00:00Z"]]
            )

            let android = try await api.json(
                .put, "/v1/devices/pixel-1", key: app.publishableKey, ["platform": "android", "fcmToken": "fcm:token-1", "locale": "de-DE"]
            )
            #expect(android.status == .created)
            #expect(android["fcmToken"] == nil)
            #expect(try await api.call(.get, "/v1/devices/pixel-1", key: app.secretKey)["fcmToken"] == "fcm:token-1")
            try await store.dropDeviceToken(appID: app.id, deviceID: "pixel-1", token: "fcm:token-1", reason: "UNREGISTERED", at: testStart)
            let dropped = try await api.call(.get, "/v1/devices/pixel-1", key: app.secretKey)
            #expect(dropped["fcmTokenDropped"] == ["reason": "UNREGISTERED", "droppedAt": "2026-11-21T10:00:00Z"])

            let mismatch = try await api.json(.put, "/v1/devices/pixel-1", key: app.publishableKey, ["platform": "ios"])
            #expect(mismatch.status == .conflict)
            #expect(mismatch.errorCode == "platform_mismatch")
            #expect(mismatch.errorField == "platform")
        }
    }

    @Test("a publishable key may register a device but not read, list or delete one")
    func publishableScope() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios"]).status == .created)
            for (method, path) in [(HTTPRequest.Method.get, "/v1/devices/phone-1"), (.get, "/v1/devices"), (.delete, "/v1/devices/phone-1")] {
                let reply = try await api.call(method, path, key: app.publishableKey)
                #expect(reply.status == .forbidden, "\(method) \(path)")
                #expect(reply.errorCode == "secret_key_required")
            }
            #expect(try await api.call(.get, "/v1/devices/phone-1", key: app.secretKey).status == .ok)
            #expect(try await api.call(.put, "/v1/devices/phone-1", body: #"{"platform":"ios"}"#).status == .unauthorized)
        }
    }

    @Test("invalid registrations are refused with the field at fault")
    func validation() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let tooManyTags = JSONValue.object(Dictionary(uniqueKeysWithValues: (0...64).map { ("k\($0)", JSONValue.string("v")) }))
            let cases: [(body: JSONValue, status: HTTPResponse.Status, code: String, field: String?)] = [
                ([:], .badRequest, "missing_field", "platform"),
                (["platform": "windows"], .unprocessableContent, "invalid_platform", "platform"),
                (["platform": "ios", "pushToken": "aa"], .badRequest, "unknown_field", "pushToken"),
                (["platform": "android", "pushToStartTokens": ["A": "aa"]], .unprocessableContent, "not_for_platform", "pushToStartTokens"),
                (["platform": "ios", "fcmToken": "x"], .unprocessableContent, "not_for_platform", "fcmToken"),
                (["platform": "ios", "pushToStartTokens": ["A": "xyz"]], .unprocessableContent, "invalid_push_token", "pushToStartTokens.A"),
                (["platform": "ios", "pushToStartTokens": ["A": 7]], .badRequest, "invalid_type", "pushToStartTokens.A"),
                (["platform": "ios", "pushToStartTokens": ["Not A Type": "aa"]], .unprocessableContent, "invalid_attributes_type", "pushToStartTokens"),
                (["platform": "ios", "pushToStartTokens": ["aa"]], .badRequest, "invalid_type", "pushToStartTokens"),
                (["platform": "android", "fcmToken": "has space"], .unprocessableContent, "invalid_push_token", "fcmToken"),
                (["platform": "ios", "userId": "no spaces please"], .unprocessableContent, "invalid_id", "userId"),
                (["platform": "ios", "userId": 7], .badRequest, "invalid_type", "userId"),
                (["platform": "ios", "tags": ["a:b": "c"]], .unprocessableContent, "invalid_tag", "tags"),
                (["platform": "ios", "tags": ["": "c"]], .unprocessableContent, "invalid_tag", "tags"),
                (["platform": "ios", "tags": .object([String(repeating: "k", count: 65): "c"])], .unprocessableContent, "invalid_tag", "tags"),
                (["platform": "ios", "tags": ["k": .string(String(repeating: "v", count: 257))]], .unprocessableContent, "invalid_tag", "tags"),
                (["platform": "ios", "tags": ["k": 1]], .badRequest, "invalid_type", "tags.k"),
                (["platform": "ios", "tags": "team=red"], .badRequest, "invalid_type", "tags"),
                (["platform": "ios", "tags": tooManyTags], .unprocessableContent, "too_many_tags", "tags"),
                (["platform": "ios", "osVersion": ""], .unprocessableContent, "invalid_os_version", "osVersion"),
                (["platform": "ios", "locale": .string(String(repeating: "x", count: 65))], .unprocessableContent, "invalid_locale", "locale"),
            ]
            for (body, status, code, field) in cases {
                let reply = try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, body)
                #expect(reply.status == status, "\(body.encodedString): \(reply.json.encodedString)")
                #expect(reply.errorCode == code, "\(body.encodedString)")
                #expect(reply.errorField == field, "\(body.encodedString)")
            }
            let badToken = try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios", "pushToStartTokens": ["A": "xyz"]])
            #expect(badToken["error"]?.objectValue?["message"]?.stringValue?.contains("pushToStartTokens.A") == true, "the message names the field")
            let badID = try await api.json(.put, "/v1/devices/bad%20id", key: app.publishableKey, ["platform": "ios"])
            #expect(badID.status == .unprocessableContent && badID.errorField == "deviceId")
            // 64 tags of the longest key and value fit.
            let most = JSONValue.object(Dictionary(uniqueKeysWithValues: (0..<64).map { index in
                (String(format: "%064d", index), JSONValue.string(String(repeating: "é", count: 256)))
            }))
            #expect(try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios", "tags": most]).status == .created)
        }
    }

    @Test("an instance's platform never changes, as a device's: the other platform is 409 platform_mismatch")
    func instancePlatform() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let ios: JSONValue = ["platform": "ios", "pushToken": .string(String(repeating: "ab", count: 32))]
            #expect(try await api.json(.put, "/v1/activities/p-1/instances/phone-p", key: app.publishableKey, ios).status == .created)
            let android = try await api.json(
                .put, "/v1/activities/p-1/instances/phone-p", key: app.publishableKey, ["platform": "android", "pushToken": "fcm-token-p"]
            )
            #expect(android.status == .conflict)
            #expect(android.errorCode == "platform_mismatch")
            #expect(try await api.json(.put, "/v1/activities/p-1/instances/phone-p", key: app.publishableKey, ios).status == .ok)
        }
    }

    @Test("list by user and by tags, paged with a cursor; delete answers 204 then 404")
    func listAndDelete() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            for (id, user, tags) in [
                ("d1", "u1", ["team": "red", "tier": "gold"]), ("d2", "u1", ["team": "red"]), ("d3", "u2", ["team": "red", "tier": "gold"]),
                ("d4", "u2", ["tier": "gold:plus"]), ("d5", "u3", ["team name": "red team"]),
            ] {
                let body: JSONValue = ["platform": "ios", "userId": .string(user), "tags": .object(tags.mapValues(JSONValue.string))]
                #expect(try await api.json(.put, "/v1/devices/\(id)", key: app.publishableKey, body).status == .created)
            }
            func ids(_ query: String) async throws -> [String] {
                let reply = try await api.call(.get, "/v1/devices\(query)", key: app.secretKey)
                #expect(reply.status == .ok, "\(query): \(reply.json.encodedString)")
                return reply["data"]?.arrayItems.compactMap { $0.objectValue?["deviceId"]?.stringValue } ?? []
            }
            #expect(try await ids("") == ["d1", "d2", "d3", "d4", "d5"])
            #expect(try await ids("?userId=u1") == ["d1", "d2"])
            #expect(try await ids("?tag=team:red&tag=tier:gold") == ["d1", "d3"])
            #expect(try await ids("?userId=u2&tag=team:red") == ["d3"])
            #expect(try await ids("?tag=tier:gold%3Aplus") == ["d4"])
            // Forms, URLSearchParams and Python's urlencode write a space as '+': read as a space, '%2B' as a plus.
            #expect(try await ids("?tag=team+name:red+team") == ["d5"])
            #expect(try await ids("?tag=team%20name:red%20team") == ["d5"])
            #expect(try await ids("?tag=team%2Bname:red%2Bteam").isEmpty)

            let first = try await api.call(.get, "/v1/devices?tag=team:red&limit=2", key: app.secretKey)
            #expect(first["data"]?.arrayItems.count == 2)
            let cursor = try #require(first["nextCursor"]?.stringValue)
            #expect(try await ids("?tag=team:red&limit=2&cursor=\(cursor)") == ["d3"])

            for (query, status, code, field) in [
                ("?tag=team", HTTPResponse.Status.unprocessableContent, "invalid_tag", "tag"),
                ("?tag=:red", .unprocessableContent, "invalid_tag", "tag"),
                ("?tag=team:red%zz", .unprocessableContent, "invalid_tag", "tag"),
                ("?userId=not%20an%20id", .unprocessableContent, "invalid_id", "userId"),
                ("?limit=0", .unprocessableContent, "invalid_limit", "limit"),
                ("?limit=x", .badRequest, "invalid_type", "limit"),
                ("?cursor=!!", .badRequest, "invalid_cursor", "cursor"),
                ("?" + (0...16).map { "tag=k\($0):v" }.joined(separator: "&"), .unprocessableContent, "too_many_tags", "tag"),
            ] {
                let reply = try await api.call(.get, "/v1/devices\(query)", key: app.secretKey)
                #expect(reply.status == status, "\(query)")
                #expect(reply.errorCode == code && reply.errorField == field, "\(query): \(reply.json.encodedString)")
            }

            let deleted = try await api.call(.delete, "/v1/devices/d2", key: app.secretKey)
            #expect(deleted.status == .noContent)
            let again = try await api.call(.delete, "/v1/devices/d2", key: app.secretKey)
            #expect(again.status == .notFound && again.errorCode == "device_not_found" && again.errorField == "deviceId")
            #expect(try await api.call(.get, "/v1/devices/d2", key: app.secretKey).errorCode == "device_not_found")
            #expect(try await ids("?userId=u1") == ["d1"])
        }
    }

    @Test("app B's keys never see or touch app A's device of the same id")
    func tenantIsolation() async throws {
        try await withLiveline { api, store in
            let a = try await createApp(store, name: "A")
            let b = try await createApp(store, name: "B")
            let body: JSONValue = ["platform": "ios", "userId": "u", "tags": ["t": "1"], "pushToStartTokens": ["A": .string(startToken)]]
            #expect(try await api.json(.put, "/v1/devices/shared", key: a.publishableKey, body).status == .created)
            #expect(try await api.call(.get, "/v1/devices/shared", key: b.secretKey).status == .notFound)
            #expect(try await api.call(.get, "/v1/devices?userId=u&tag=t:1", key: b.secretKey)["data"] == [])
            #expect(try await api.call(.get, "/v1/devices", key: b.secretKey)["data"] == [])
            #expect(try await api.call(.delete, "/v1/devices/shared", key: b.secretKey).status == .notFound)
            // B's own device under the same id is B's alone; A's is unchanged.
            let mine = try await api.json(.put, "/v1/devices/shared", key: b.publishableKey, ["platform": "android", "fcmToken": "fcm:b"])
            #expect(mine.status == .created)
            let theirs = try await api.call(.get, "/v1/devices/shared", key: a.secretKey)
            #expect(theirs["platform"] == "ios" && theirs["userId"] == "u" && theirs["tags"] == ["t": "1"])
            #expect(theirs["pushToStartTokens"]?.objectValue?["A"]?.objectValue?["token"] == .string(startToken))
        }
    }
}

@Suite("Who sets a device's audience fields")
struct AudienceFromTests {
    static let adminToken = "admin-token-0123456789abcdef"

    @Test("by default the publishable key sets userId and tags; with audienceFrom backend only the secret key does")
    func backendSetsTheAudience() async throws {
        try await withLiveline(adminToken: Self.adminToken) { api, store in
            let app = try await createApp(store)
            let other = try await createApp(store)
            #expect(try await api.call(.get, "/v1/app", key: app.secretKey)["devices"] == ["audienceFrom": "app"])
            let byPhone = try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios", "userId": "user-7"])
            #expect(byPhone.status == .created)

            let set = try await api.json(.put, "/admin/v1/apps/\(app.id)/devices", key: Self.adminToken, ["audienceFrom": "backend"])
            #expect(set.status == .ok)
            #expect(set["devices"] == ["audienceFrom": "backend"])
            #expect(try await api.call(.get, "/v1/app", key: app.secretKey)["devices"] == ["audienceFrom": "backend"])

            // The phone may no longer name its user or tags, not even to clear them; nothing is written.
            for body: JSONValue in [
                ["platform": "ios", "userId": "user-8"], ["platform": "ios", "userId": nil], ["platform": "ios", "tags": ["team": "red"]],
                ["platform": "ios", "tags": nil], ["platform": "ios", "userId": "user-8", "pushToStartTokens": ["MatchAttributes": .string(startToken)]],
            ] {
                let refused = try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, body)
                #expect(refused.status == .forbidden, "\(body)")
                #expect(refused.errorCode == "secret_key_required")
                #expect(refused["error"]?.objectValue?["field"] == (body.objectValue?["userId"] != nil ? "userId" : "tags"))
                #expect(try await api.json(.put, "/v1/devices/phone-9", key: app.publishableKey, body).status == .forbidden)
            }
            let kept = try await api.call(.get, "/v1/devices/phone-1", key: app.secretKey)
            #expect(kept["userId"] == "user-7" && kept["tags"] == [:] && kept["pushToStartTokens"] == [:])
            #expect(try await api.call(.get, "/v1/devices/phone-9", key: app.secretKey).status == .notFound)
            // Nor on an instance; its token it registers, and the secret key names the user.
            for userID: JSONValue in ["user-8", nil] {
                let refused = try await api.json(
                    .put, "/v1/activities/match-1/instances/phone-1", key: app.publishableKey,
                    ["platform": "ios", "pushToken": "aa01", "userId": userID]
                )
                #expect(refused.status == .forbidden && refused.errorCode == "secret_key_required", "\(userID)")
                #expect(refused["error"]?.objectValue?["field"] == "userId")
            }
            #expect(try await api.call(.get, "/v1/activities/match-1", key: app.secretKey).status == .notFound, "nothing was written")
            let instance = try await api.json(
                .put, "/v1/activities/match-1/instances/phone-1", key: app.publishableKey, ["platform": "ios", "pushToken": "aa01"]
            )
            #expect(instance.status == .created)
            let named = try await api.json(
                .put, "/v1/activities/match-1/instances/phone-1", key: app.secretKey, ["platform": "ios", "pushToken": "aa01", "userId": "user-8"]
            )
            #expect(named.status == .ok && named["userId"] == "user-8")

            // Its tokens it still registers; the backend sets the audience, and the tokens stay.
            let tokens = try await api.json(
                .put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios", "pushToStartTokens": ["MatchAttributes": .string(startToken)]]
            )
            #expect(tokens.status == .ok)
            let byBackend = try await api.json(
                .put, "/v1/devices/phone-1", key: app.secretKey, ["platform": "ios", "userId": "user-8", "tags": ["team": "red"]]
            )
            #expect(byBackend.status == .ok)
            #expect(byBackend["userId"] == "user-8" && byBackend["tags"] == ["team": "red"])
            #expect(byBackend["pushToStartTokens"]?.objectValue?.keys.sorted() == ["MatchAttributes"])

            // Another app's rule is its own.
            #expect(try await api.json(.put, "/v1/devices/phone-1", key: other.publishableKey, ["platform": "ios", "userId": "u"]).status == .created)

            // And back.
            _ = try await api.json(.put, "/admin/v1/apps/\(app.id)/devices", key: Self.adminToken, ["audienceFrom": "app"])
            #expect(try await api.json(.put, "/v1/devices/phone-1", key: app.publishableKey, ["platform": "ios", "userId": "user-9"]).status == .ok)
        }
    }

    @Test("the admin route checks its body and its app")
    func adminRoute() async throws {
        try await withLiveline(adminToken: Self.adminToken) { api, store in
            let app = try await createApp(store)
            let bad = try await api.json(.put, "/admin/v1/apps/\(app.id)/devices", key: Self.adminToken, ["audienceFrom": "phone"])
            #expect(bad.status == .unprocessableContent && bad.errorCode == "invalid_audience_from")
            let missing = try await api.json(.put, "/admin/v1/apps/\(app.id)/devices", key: Self.adminToken, [:])
            #expect(missing.status == .badRequest)
            let unknown = try await api.json(.put, "/admin/v1/apps/\(app.id)/devices", key: Self.adminToken, ["audienceFrom": "app", "x": 1])
            #expect(unknown.status == .badRequest)
            let noApp = try await api.json(.put, "/admin/v1/apps/app_nope/devices", key: Self.adminToken, ["audienceFrom": "backend"])
            #expect(noApp.status == .notFound && noApp.errorCode == "app_not_found")
            let listed = try await api.call(.get, "/admin/v1/apps", key: Self.adminToken)
            #expect(listed["data"]?.arrayValue?.first?.objectValue?["devices"] == ["audienceFrom": "app"])
        }
    }
}
