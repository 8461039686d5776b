import Foundation
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import Testing

/// Every /v1 route with a body that would succeed for the right caller.
let v1Routes: [(method: HTTPRequest.Method, path: String, body: JSONValue?, publishable: Bool)] = [
    (.put, "/v1/activities/order-1/instances/device-1", registerBody, true),
    (.post, "/v1/activities/order-1/instances/device-1/events", ["type": "frequentPushes", "enabled": true], true),
    (.post, "/v1/activities/order-1/updates", ["contentState": ["n": 2]], false),
    (.get, "/v1/activities/order-1", nil, false),
    (.get, "/v1/activities", nil, false),
    (.get, "/v1/activities/order-1/instances", nil, false),
    (.post, "/v1/activities/order-1/end", ["contentState": ["n": 3]], false),
    (.delete, "/v1/activities/order-2", nil, false),
    (.put, "/v1/devices/device-1", ["platform": "ios", "pushToStartTokens": ["DeliveryAttributes": .string(iosToken)]], true),
    (.get, "/v1/devices/device-1", nil, false),
    (.get, "/v1/devices", nil, false),
    (.delete, "/v1/devices/device-1", nil, false),
]

@Suite("Errors, key scopes and tenant isolation")
struct ErrorsAndAccessTests {
    @Test("every /v1 route needs a key: missing → 401, unknown → 401, with the JSON error shape")
    func missingAndUnknownKeys() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let unknown = "sk_" + String(repeating: "A", count: 48)
            for route in v1Routes {
                for key in [nil, unknown, "sk_short", "not-a-key", app.secretKey + "x", String(app.secretKey.dropLast()) + "?"] {
                    let reply = try await api.call(route.method, route.path, key: key, body: route.body?.encodedString)
                    #expect(reply.status == .unauthorized, "\(route.method) \(route.path) with \(key ?? "no key")")
                    #expect(reply.errorCode == (key == nil ? "unauthorized" : "invalid_api_key"))
                    #expect(reply.headers[.wwwAuthenticate] == "Bearer realm=\"liveline\"", "RFC 9110: a 401 carries a challenge")
                    #expect(reply.json.objectValue?["error"]?.objectValue?["message"]?.stringValue?.isEmpty == false)
                }
            }
        }
    }

    @Test("a publishable key may only register devices and instances and report instance events")
    func publishableScope() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, ["contentState": ["n": 1]])
            _ = try await api.json(.post, "/v1/activities/order-2/updates", key: app.secretKey, ["contentState": ["n": 1]])
            for route in v1Routes {
                let reply = try await api.call(route.method, route.path, key: app.publishableKey, body: route.body?.encodedString)
                if route.publishable {
                    #expect(reply.status.code < 300, "\(route.method) \(route.path): \(reply.json)")
                } else {
                    #expect(reply.status == .forbidden, "\(route.method) \(route.path)")
                    #expect(reply.errorCode == "secret_key_required")
                }
            }
            // The secret key may do everything, including what the phone does.
            for route in v1Routes {
                let reply = try await api.call(route.method, route.path, key: app.secretKey, body: route.body?.encodedString)
                #expect(reply.status.code < 300, "\(route.method) \(route.path): \(reply.json)")
            }
        }
    }

    @Test("app B's keys never see or touch app A's activity")
    func tenantIsolation() async throws {
        try await withLiveline { api, store in
            let a = try await createApp(store, name: "A")
            let b = try await createApp(store, name: "B")
            _ = try await api.json(.put, "/v1/activities/order-1/instances/device-1", key: a.publishableKey, registerBody)
            _ = try await api.json(.post, "/v1/activities/order-1/updates", key: a.secretKey, ["contentState": ["owner": "a"]])
            let before = try await api.call(.get, "/v1/activities/order-1", key: a.secretKey)

            for (method, path, body) in [
                (HTTPRequest.Method.get, "/v1/activities/order-1", nil),
                (.get, "/v1/activities/order-1/instances", nil),
                (.post, "/v1/activities/order-1/end", ["contentState": ["owner": "b"]] as JSONValue?),
                (.delete, "/v1/activities/order-1", nil),
                (.post, "/v1/activities/order-1/instances/device-1/events", ["type": "dismissed"]),
            ] {
                for key in [b.secretKey, b.publishableKey] where !(key == b.publishableKey && method != .post) {
                    let reply = try await api.call(method, path, key: key, body: body?.encodedString)
                    if key == b.publishableKey, !path.hasSuffix("/events") {
                        #expect(reply.status == .forbidden)
                    } else {
                        #expect(reply.status == .notFound, "\(method) \(path)")
                    }
                }
            }
            // B's listing shows nothing of A's.
            let list = try await api.call(.get, "/v1/activities", key: b.secretKey)
            #expect(list["data"] == .array([]))
            // Activity ids are per app: B writing to the same id makes B's own activity, and A's is untouched.
            let bUpdate = try await api.json(.post, "/v1/activities/order-1/updates", key: b.secretKey, ["contentState": ["owner": "b"]])
            #expect(bUpdate.status == .accepted)
            #expect(bUpdate["sequence"] == .integer(1))
            let bRegister = try await api.json(.put, "/v1/activities/order-1/instances/device-1", key: b.publishableKey, registerBody)
            #expect(bRegister.status == .created)
            let after = try await api.call(.get, "/v1/activities/order-1", key: a.secretKey)
            #expect(after.json == before.json)
            let aInstances = try await api.call(.get, "/v1/activities/order-1/instances", key: a.secretKey)
            #expect(aInstances["data"]!.arrayItems.count == 1)
        }
    }

    @Test("400 for malformed JSON and wrong types, naming the field")
    func badRequests() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let update = "/v1/activities/a1/updates"
            let cases: [(String, String, String?)] = [
                ("{", "malformed_json", nil),
                ("[1,2]", "malformed_json", nil),
                ("", "malformed_json", nil),
                ("{\"contentState\": {\"a\":1},}", "malformed_json", nil),
                ("{}", "missing_field", "contentState"),
                ("{\"contentState\": {}, \"priority\": \"10\"}", "invalid_type", "priority"),
                ("{\"contentState\": {}, \"priority\": 10.5}", "invalid_type", "priority"),
                ("{\"contentState\": {}, \"relevanceScore\": \"high\"}", "invalid_type", "relevanceScore"),
                ("{\"contentState\": {}, \"staleDate\": true}", "invalid_type", "staleDate"),
                ("{\"contentState\": {}, \"alert\": \"hi\"}", "invalid_type", "alert"),
                ("{\"contentState\": {}, \"alert\": {\"title\": 5, \"body\": \"b\"}}", "invalid_type", "alert.title"),
                ("{\"contentState\": {}, \"alert\": {\"title\": \"t\"}}", "missing_field", "alert.body"),
                ("{\"contentState\": {}, \"alert\": {\"title\": \"t\", \"body\": \"b\", \"colour\": 1}}", "unknown_field", "alert.colour"),
                // A localized title or body: {"locKey": "…", "locArgs": ["…"]}.
                ("{\"contentState\": {}, \"alert\": {\"title\": true, \"body\": \"b\"}}", "invalid_type", "alert.title"),
                ("{\"contentState\": {}, \"alert\": {\"title\": {\"locArgs\": []}, \"body\": \"b\"}}", "missing_field", "alert.title.locKey"),
                ("{\"contentState\": {}, \"alert\": {\"title\": \"t\", \"body\": {\"locKey\": 5}}}", "invalid_type", "alert.body.locKey"),
                ("{\"contentState\": {}, \"alert\": {\"title\": {\"locKey\": \"K\", \"locArgs\": \"x\"}, \"body\": \"b\"}}", "invalid_type", "alert.title.locArgs"),
                ("{\"contentState\": {}, \"alert\": {\"title\": {\"locKey\": \"K\", \"locArgs\": [\"a\", 1]}, \"body\": \"b\"}}", "invalid_type", "alert.title.locArgs[1]"),
                ("{\"contentState\": {}, \"alert\": {\"title\": {\"locKey\": \"K\", \"args\": []}, \"body\": \"b\"}}", "unknown_field", "alert.title.args"),
                ("{\"content_state\": {}}", "unknown_field", "content_state"),
            ]
            // An integer past 64 bits would reach the phones rounded: refused (422, as the body is JSON), not changed.
            for body in [#"{"contentState": {"huge": 123456789012345678901234567890}}"#, #"{"contentState": {"low": -9223372036854775809}}"#] {
                let reply = try await api.call(.post, update, key: app.secretKey, body: body)
                #expect(reply.status == .unprocessableContent, "\(body)")
                #expect(reply.errorCode == "integer_out_of_range", "\(body): \(reply.json)")
            }
            for (body, code, field) in cases {
                let reply = try await api.call(.post, update, key: app.secretKey, body: body)
                #expect(reply.status == .badRequest, "\(body)")
                #expect(reply.errorCode == code, "\(body): \(reply.json)")
                #expect(reply.errorField == field, "\(body): \(reply.json)")
            }
            let emptyKey = try await api.call(
                .post, update, key: app.secretKey, body: #"{"contentState": {}, "alert": {"title": {"locKey": ""}, "body": "b"}}"#
            )
            #expect(emptyKey.status == .unprocessableContent)
            #expect(emptyKey.errorCode == "invalid_alert")
            #expect(emptyKey.errorField == "alert.title.locKey")
            let register = try await api.json(
                .put, "/v1/activities/a1/instances/d1", key: app.publishableKey, ["platform": "ios", "pushToken": 1234]
            )
            #expect(register.status == .badRequest)
            #expect(register.errorField == "pushToken")
            let missingPlatform = try await api.json(.put, "/v1/activities/a1/instances/d1", key: app.publishableKey, ["pushToken": "ab"])
            #expect(missingPlatform.errorField == "platform")
        }
    }

    @Test("422 for semantic errors, naming the field")
    func semanticErrors() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let big = String(repeating: "x", count: 4100)
            let cases: [(JSONValue, String, String)] = [
                (["contentState": [1, 2]], "invalid_content_state", "contentState"),
                (["contentState": "text"], "invalid_content_state", "contentState"),
                (["contentState": ["text": .string(big)]], "payload_too_large", "contentState"),
                (["contentState": ["a": 1], "alert": ["title": .string(big), "body": "b"]], "payload_too_large", "alert"),
                (["contentState": [:], "dismissalDate": "2026-11-21T10:30:00Z"], "dismissal_date_not_allowed", "dismissalDate"),
                (["contentState": [:], "priority": 7], "invalid_priority", "priority"),
                (["contentState": [:], "staleDate": "next tuesday"], "invalid_date", "staleDate"),
                (["contentState": [:], "relevanceScore": -1], "invalid_relevance_score", "relevanceScore"),
            ]
            for (body, code, field) in cases {
                let reply = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, body)
                #expect(reply.status == .unprocessableContent, "\(body)")
                #expect(reply.errorCode == code, "\(reply.json)")
                #expect(reply.errorField == field)
            }
            // A state just under the limit is accepted; the limit counts the whole aps payload, with the default
            // stale date Liveline adds to a first state (an hour on).
            let probe = APNsLiveActivityPayload(
                event: .update, timestamp: 1_795_255_200, contentState: ["text": ""], staleDate: 1_795_255_200 + 3600
            )
            // The same state must also fit in an Android (FCM) message, whose data is the tighter of the two here.
            let fcmProbe = FCMLiveUpdateMessage(
                activityID: "a1", event: .update, sequence: 1, timestamp: 1_795_255_200, contentState: ["text": ""],
                staleDate: 1_795_255_200 + 3600
            )
            let room = min(Limits.maximumAPNsPayloadBytes - probe.byteCount, FCMLiveUpdateMessage.maximumDataBytes - fcmProbe.dataByteCount)
            let fits = String(repeating: "y", count: room)
            let accepted = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["text": .string(fits)]])
            #expect(accepted.status == .accepted)
            let over = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["text": .string(fits + "y")]])
            #expect(over.status == .unprocessableContent)

            let badToken = try await api.json(
                .put, "/v1/activities/a1/instances/d1", key: app.publishableKey, ["platform": "ios", "pushToken": "not-hex!"]
            )
            #expect(badToken.status == .unprocessableContent)
            #expect(badToken.errorCode == "invalid_push_token")
            let badPlatform = try await api.json(
                .put, "/v1/activities/a1/instances/d1", key: app.publishableKey, ["platform": "windows", "pushToken": "ab"]
            )
            #expect(badPlatform.errorField == "platform")
            let badAttributes = try await api.json(
                .put, "/v1/activities/a1/instances/d1", key: app.publishableKey, ["platform": "ios", "pushToken": "ab", "attributes": [1]]
            )
            #expect(badAttributes.errorField == "attributes")
            let farDismissal = try await api.json(
                .post, "/v1/activities/a1/end", key: app.secretKey, ["dismissalDate": "2026-11-21T15:00:00Z"]
            )
            #expect(farDismissal.status == .unprocessableContent)
            #expect(farDismissal.errorField == "dismissalDate")
            let endTooBig = try await api.json(.post, "/v1/activities/a1/end", key: app.secretKey, ["contentState": ["text": .string(big)]])
            #expect(endTooBig.errorCode == "payload_too_large")
        }
    }

    @Test("ids outside [A-Za-z0-9._:-]{1,128}, and the dot segments . and .., get 422 naming the id", arguments: [
        ("/v1/activities/%2E%2E/updates", "activityId"),
        ("/v1/activities/./updates", "activityId"),
        ("/v1/activities/ok/instances/%2E/events", "deviceId"),
        ("/v1/activities/order%201234/updates", "activityId"),
        ("/v1/activities/\(String(repeating: "a", count: 129))/updates", "activityId"),
        ("/v1/activities/%C3%A9t%C3%A9/updates", "activityId"),
        ("/v1/activities/ok/instances/dev%2Fice/events", "deviceId"),
    ])
    func invalidIDs(_ path: String, _ field: String) async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let body: JSONValue = path.hasSuffix("/events") ? ["type": "ended"] : ["contentState": [:]]
            let reply = try await api.json(.post, path, key: app.secretKey, body)
            #expect(reply.status == .unprocessableContent, "\(path): \(reply.json)")
            #expect(reply.errorCode == "invalid_id")
            #expect(reply.errorField == field)
            let userID = try await api.json(
                .put, "/v1/activities/a/instances/d", key: app.publishableKey, ["platform": "ios", "pushToken": "ab", "userId": "a b"]
            )
            #expect(userID.errorField == "userId")
        }
    }

    @Test("404 for an unknown activity, 409 after the end, 413 over 64 KB")
    func statuses() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let missing = try await api.call(.get, "/v1/activities/nope", key: app.secretKey)
            #expect(missing.status == .notFound)
            #expect(missing.errorCode == "activity_not_found")
            #expect(try await api.json(.post, "/v1/activities/nope/end", key: app.secretKey, [:]).status == .notFound)

            let huge = "{\"contentState\": {\"x\": \"" + String(repeating: "z", count: 70_000) + "\"}}"
            let tooLarge = try await api.call(.post, "/v1/activities/a1/updates", key: app.secretKey, body: huge)
            #expect(tooLarge.status == .contentTooLarge)
            #expect(tooLarge.errorCode == "body_too_large")

            let noRoute = try await api.call(.get, "/v2/whatever", key: app.secretKey)
            #expect(noRoute.status == .notFound)
            #expect(noRoute.errorCode == "not_found")
        }
    }

    @Test("no request, however malformed, gets a 500")
    func neverA500() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            var bodies: [String] = [
                "", "null", "true", "0", "\"s\"", "[]", "{}", "{\"contentState\": null}", "{\"contentState\": {\"a\": 1e999}}",
                "{\"contentState\": {\"a\": \"\\ud800\"}}", "\u{00}\u{01}\u{02}", String(repeating: "[", count: 10_000),
                String(repeating: "{\"a\":", count: 5_000), "{\"contentState\": {}, \"staleDate\": 1e300}",
                "{\"contentState\": {}, \"staleDate\": -1}", "{\"contentState\": {}, \"priority\": 99999999999999999999}",
                "{\"platform\": \"ios\", \"pushToken\": \"" + String(repeating: "a", count: 5000) + "\"}",
                "{\"type\": null}", "{\"type\": \"frequentPushes\", \"enabled\": \"yes\"}",
            ]
            var generator = SystemRandomNumberGenerator()
            for _ in 0..<30 {
                bodies.append(String(decoding: (0..<Int.random(in: 1...200, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }, as: UTF8.self))
            }
            let paths = [
                "/v1/activities/a1/updates", "/v1/activities/a1/end", "/v1/activities/a1/instances/d1",
                "/v1/activities/a1/instances/d1/events", "/v1/activities/a1", "/v1/activities?limit=-1&cursor=%FF",
                "/v1/activities/%/updates", "/v1/activities//updates", "/admin/v1/apps",
            ]
            for path in paths {
                for method in [HTTPRequest.Method.get, .post, .put, .delete, .patch] {
                    for body in bodies.prefix(method == .get ? 1 : bodies.count) {
                        for key in [app.secretKey, app.publishableKey] {
                            let reply = try await api.call(method, path, key: key, body: body)
                            #expect(reply.status.code < 500, "\(method) \(path) \(body.prefix(40)): \(reply.status)")
                            if reply.status.code >= 400 {
                                #expect(reply.errorCode != nil, "\(method) \(path): \(reply.json)")
                            }
                        }
                    }
                }
            }
        }
    }
}

@Suite("Query parameters")
struct QueryParameterTests {
    @Test("every route the OpenAPI document gives query parameters refuses one it does not take (400 unknown_parameter), before anything else")
    func unknownParametersRefused() async throws {
        let document = try JSONValue(parsing: Array(LivelineApplication.openAPIDocument.utf8))
        let paths = try #require(document.objectValue?["paths"]?.objectValue)
        let parameters = document.objectValue?["components"]?.objectValue?["parameters"]?.objectValue ?? [:]
        var routes: [(method: HTTPRequest.Method, path: String)] = []
        for (path, item) in paths {
            for (method, operation) in item.objectValue ?? [:] {
                guard let method = HTTPRequest.Method(method.uppercased()), ["GET", "PUT", "POST", "DELETE", "PATCH"].contains(method.rawValue)
                else { continue }
                let declared = (operation.objectValue?["parameters"]?.arrayValue ?? []).map { parameter -> JSONValue in
                    guard case .string(let reference)? = parameter.objectValue?["$ref"] else { return parameter }
                    return parameters[String(reference.split(separator: "/").last ?? "")] ?? parameter
                }
                guard declared.contains(where: { $0.objectValue?["in"] == "query" }) else { continue }
                // Any id: the query is checked before the path's ids are looked up.
                let concrete = path.split(separator: "/").map { $0.hasPrefix("{") ? "x1" : String($0) }.joined(separator: "/")
                routes.append((method, "/" + concrete))
            }
        }
        #expect(routes.count == 7, "\(routes)")
        let found = routes
        let adminToken = "admin-token-0123456789abcdef"
        try await withLiveline(adminToken: adminToken) { api, store in
            let app = try await createApp(store)
            for route in found {
                let key = route.path.hasPrefix("/admin/") ? adminToken : app.secretKey
                let reply = try await api.call(route.method, route.path + "?bogus=1", key: key)
                #expect(reply.status == .badRequest, "\(route)")
                #expect(reply.errorCode == "unknown_parameter", "\(route): \(reply.json)")
                #expect(reply.errorField == "bogus", "\(route)")
            }
            // A misspelt filter is refused, never read as no filter at all.
            let misspelt = try await api.call(.get, "/v1/devices?user_id=user-42", key: app.secretKey)
            #expect(misspelt.errorCode == "unknown_parameter")
            #expect(misspelt.errorField == "user_id")
            #expect(try await api.call(.get, "/v1/devices?userId=user-42&limit=5", key: app.secretKey).status == .ok)
            #expect(try await api.call(.get, "/v1/activities?state=active&attributesType=MatchAttributes&limit=5", key: app.secretKey).status == .ok)
        }
    }
}
