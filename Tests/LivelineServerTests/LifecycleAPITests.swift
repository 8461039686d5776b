import Foundation
import LivelineDispatch
import Synchronization
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Lifecycle API")
struct LifecycleAPITests {
    @Test("an alert's title and body may each be text or localized ({locKey, locArgs}); the activity shows them as sent")
    func localizedAlert() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let alert: JSONValue = [
                "title": ["locKey": "order_on_its_way"], "body": ["locKey": "order_minutes_away", "locArgs": ["12"]], "sound": "default",
            ]
            let update = try await api.json(
                .post, "/v1/activities/order-1/updates", key: app.secretKey, ["contentState": ["minutesAway": 12], "alert": alert]
            )
            #expect(update.status == .accepted, "\(update.json)")
            let read = try await api.call(.get, "/v1/activities/order-1", key: app.secretKey)
            #expect(
                read["alert"] == [
                    "title": ["locKey": "order_on_its_way", "locArgs": []], "body": ["locKey": "order_minutes_away", "locArgs": ["12"]],
                    "sound": "default",
                ]
            )
            let mixed = try await api.json(
                .post, "/v1/activities/order-1/updates", key: app.secretKey,
                ["contentState": ["minutesAway": 5], "alert": ["title": "Almost there", "body": ["locKey": "order_minutes_away", "locArgs": ["5"]]]]
            )
            #expect(mixed.status == .accepted, "\(mixed.json)")
            let stored = try await store.activity(appID: app.id, activityID: "order-1")
            #expect(stored?.alert == LiveActivityAlert(title: "Almost there", body: .localized(key: "order_minutes_away", arguments: ["5"])))
        }
    }

    @Test("register → update → read → end → update refused")
    func walkthrough() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let created = try await api.json(.put, "/v1/activities/order-1234/instances/device-1", key: app.publishableKey, registerBody)
            #expect(created.status == .created)
            #expect(created["state"] == "active")
            #expect(created["pushToken"] == nil, "a phone is not answered the token or user stored for a device")
            #expect(created["userId"] == nil)
            let listed = try await api.call(.get, "/v1/activities/order-1234/instances", key: app.secretKey)
            #expect(listed["data"]?.arrayValue?.first?.objectValue?["pushToken"] == .string(iosToken))

            let again = try await api.json(.put, "/v1/activities/order-1234/instances/device-1", key: app.publishableKey, registerBody)
            #expect(again.status == .ok)
            #expect(again.json == created.json)  // idempotent: nothing changed

            let update = try await api.json(
                .post, "/v1/activities/order-1234/updates", key: app.secretKey,
                ["contentState": ["status": "on the way", "minutesAway": 12], "staleDate": "2026-11-21T11:00:00Z", "priority": 10,
                 "relevanceScore": 75, "alert": ["title": "On the way", "body": "12 minutes", "sound": "default"]]
            )
            #expect(update.status == .accepted)
            #expect(update["sequence"] == .integer(1))
            #expect(update["event"] == "update")

            let read = try await api.call(.get, "/v1/activities/order-1234", key: app.secretKey)
            #expect(read.status == .ok)
            #expect(read["state"] == "active")
            #expect(read["attributesType"] == "DeliveryAttributes")
            #expect(read["attributes"] == ["orderId": "1234"])
            #expect(read["contentState"] == ["status": "on the way", "minutesAway": 12])
            #expect(read["sequence"] == .integer(1))
            #expect(read["staleDate"] == "2026-11-21T11:00:00Z")
            #expect(read["priority"] == .integer(10))
            #expect(read["instances"]?.objectValue?["active"] == .integer(1))
            #expect(read["instances"]?.objectValue?["total"] == .integer(1))
            #expect(read["createdAt"] == "2026-11-21T10:00:00Z")

            let end = try await api.json(
                .post, "/v1/activities/order-1234/end", key: app.secretKey,
                ["contentState": ["status": "delivered", "minutesAway": 0], "dismissalDate": "2026-11-21T10:30:00Z"]
            )
            #expect(end.status == .accepted)
            #expect(end["sequence"] == .integer(2))
            #expect(end["event"] == "end")

            let refused = try await api.json(.post, "/v1/activities/order-1234/updates", key: app.secretKey, ["contentState": ["status": "late"]])
            #expect(refused.status == .conflict)
            #expect(refused.errorCode == "activity_ended")
            let endedRead = try await api.call(.get, "/v1/activities/order-1234", key: app.secretKey)
            #expect(endedRead["state"] == "ended")
            #expect(endedRead["contentState"] == ["status": "delivered", "minutesAway": 0])
            #expect(endedRead["dismissalDate"] == "2026-11-21T10:30:00Z")
            let endAgain = try await api.json(.post, "/v1/activities/order-1234/end", key: app.secretKey, [:])
            #expect(endAgain.status == .conflict)
            let lateRegistration = try await api.json(.put, "/v1/activities/order-1234/instances/device-2", key: app.publishableKey, registerBody)
            #expect(lateRegistration.status == .conflict)
        }
    }

    @Test("under rate shaping the default stale date leaves room for the interval: fresh states are not shown stale")
    func staleDateUnderShaping() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(
                .post, "/v1/activities/shaped/updates", key: app.secretKey, ["contentState": ["n": 1], "minUpdateInterval": 360]
            ).status == .accepted)
            clock.advance(by: 10)
            #expect(try await api.json(.post, "/v1/activities/shaped/updates", key: app.secretKey, ["contentState": ["n": 2]]).status == .accepted)
            // Updates 10 s apart alone would make it stale in 2 minutes; the phones get a state every 6.
            let read = try await api.call(.get, "/v1/activities/shaped", key: app.secretKey)
            #expect(read["staleDate"] == .string(APIDate.iso8601(testStart.addingTimeInterval(10 + 720))))
            // A stale date given is kept as given.
            #expect(try await api.json(
                .post, "/v1/activities/shaped/updates", key: app.secretKey, ["contentState": ["n": 3], "staleDate": "2026-11-21T10:05:00Z"]
            ).status == .accepted)
            #expect(try await api.call(.get, "/v1/activities/shaped", key: app.secretKey)["staleDate"] == "2026-11-21T10:05:00Z")
        }
    }

    @Test("an activity with no instances keeps its latest state for instances that register later")
    func stateBeforeInstances() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            for score in ["0-0", "1-0", "2-0"] {
                let reply = try await api.json(.post, "/v1/activities/match-42/updates", key: app.secretKey, ["contentState": ["score": .string(score)]])
                #expect(reply.status == .accepted)
            }
            let registered = try await api.json(.put, "/v1/activities/match-42/instances/phone", key: app.publishableKey, registerBody)
            #expect(registered.status == .created)
            let read = try await api.call(.get, "/v1/activities/match-42", key: app.secretKey)
            #expect(read["contentState"] == ["score": "2-0"])
            #expect(read["sequence"] == .integer(3))
            #expect(read["attributesType"] == "DeliveryAttributes")
        }
    }

    @Test("an update that creates its activity wakes no engine; a phone registering on it, and the next update, do")
    func wakesOnlyWithWork() async throws {
        let wakes = CountingWaker()
        try await withLiveline(delivery: wakes) { api, store in
            let app = try await createApp(store)
            let first = try await api.json(.post, "/v1/activities/match-43/updates", key: app.secretKey, ["contentState": ["score": "0-0"]])
            #expect(first.status == .accepted)
            #expect(wakes.count == 0, "nobody can watch an activity its update created")
            let registered = try await api.json(.put, "/v1/activities/match-43/instances/phone", key: app.publishableKey, registerBody)
            #expect(registered.status == .created)
            #expect(wakes.count == 1, "the phone is caught up on the state it missed")
            let second = try await api.json(.post, "/v1/activities/match-43/updates", key: app.secretKey, ["contentState": ["score": "1-0"]])
            #expect(second.status == .accepted)
            #expect(wakes.count == 2)
        }
    }

    @Test("token rotation overwrites the token; attributes stay from the first registration")
    func rotation() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/activities/a1/instances/d1", key: app.publishableKey, registerBody)
            var rotated = registerBody.objectValue!
            rotated["pushToken"] = "ABCDEF0123456789"
            rotated["attributes"] = ["orderId": "other"]
            let reply = try await api.json(.put, "/v1/activities/a1/instances/d1", key: app.secretKey, .object(rotated))
            #expect(reply.status == .ok)
            #expect(reply["pushToken"] == "abcdef0123456789")
            let read = try await api.call(.get, "/v1/activities/a1", key: app.secretKey)
            #expect(read["attributes"] == ["orderId": "1234"])
            let instances = try await api.call(.get, "/v1/activities/a1/instances", key: app.secretKey)
            #expect(instances["data"] == .array([reply.json]))
        }
    }

    @Test("DELETE ends now and dismisses immediately")
    func deleteDismisses() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["n": 1]])
            clock.advance(by: 60)
            let deleted = try await api.call(.delete, "/v1/activities/a1", key: app.secretKey)
            #expect(deleted.status == .accepted)
            #expect(deleted["event"] == "end")
            let read = try await api.call(.get, "/v1/activities/a1", key: app.secretKey)
            #expect(read["state"] == "ended")
            #expect(read["dismissalDate"] == "2026-11-21T10:01:00Z")
            #expect(try await api.call(.delete, "/v1/activities/a1", key: app.secretKey).status == .conflict)
            #expect(try await api.call(.delete, "/v1/activities/never", key: app.secretKey).status == .notFound)
        }
    }

    @Test("instance events: dismissed is never brought back; ended; frequentPushes")
    func instanceEvents() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/activities/a1/instances/d1", key: app.publishableKey, registerBody)
            _ = try await api.json(.put, "/v1/activities/a1/instances/d2", key: app.publishableKey, registerBody)
            let dismissed = try await api.json(.post, "/v1/activities/a1/instances/d1/events", key: app.publishableKey, ["type": "dismissed"])
            #expect(dismissed.status == .ok)
            #expect(dismissed["state"] == "dismissed")
            var rotated = registerBody.objectValue!
            rotated["pushToken"] = "0011"
            let reRegistered = try await api.json(.put, "/v1/activities/a1/instances/d1", key: app.publishableKey, .object(rotated))
            #expect(reRegistered["state"] == "dismissed")
            _ = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["n": 2]])
            let read = try await api.call(.get, "/v1/activities/a1", key: app.secretKey)
            #expect(read["instances"]?.objectValue?["dismissed"] == .integer(1))
            #expect(read["instances"]?.objectValue?["active"] == .integer(1))

            let frequent = try await api.json(
                .post, "/v1/activities/a1/instances/d2/events", key: app.publishableKey, ["type": "frequentPushes", "enabled": false]
            )
            #expect(frequent["frequentPushesEnabled"] == false)
            let ended = try await api.json(.post, "/v1/activities/a1/instances/d2/events", key: app.publishableKey, ["type": "ended"])
            #expect(ended["state"] == "ended")

            let unknown = try await api.json(.post, "/v1/activities/a1/instances/ghost/events", key: app.publishableKey, ["type": "ended"])
            #expect(unknown.status == .notFound)
            #expect(unknown.errorCode == "instance_not_found")
            let badType = try await api.json(.post, "/v1/activities/a1/instances/d2/events", key: app.publishableKey, ["type": "exploded"])
            #expect(badType.status == .unprocessableContent)
            let missingEnabled = try await api.json(.post, "/v1/activities/a1/instances/d2/events", key: app.publishableKey, ["type": "frequentPushes"])
            #expect(missingEnabled.status == .badRequest)
            #expect(missingEnabled.errorField == "enabled")
        }
    }

    @Test("keyset pagination of activities and instances, with filters")
    func pagination() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            for index in 0..<7 {
                _ = try await api.json(.post, "/v1/activities/act-\(index)/updates", key: app.secretKey, ["contentState": ["i": .integer(Int64(index))]])
                _ = try await api.json(.put, "/v1/activities/act-0/instances/dev-\(index)", key: app.publishableKey, registerBody)
            }
            _ = try await api.json(.post, "/v1/activities/act-2/end", key: app.secretKey, [:])
            var ids: [String] = []
            var uri = "/v1/activities?limit=3"
            while true {
                let page = try await api.call(.get, uri, key: app.secretKey)
                #expect(page.status == .ok)
                ids += page["data"]!.arrayItems.compactMap { $0.objectValue?["activityId"]?.stringValue }
                guard let cursor = page["nextCursor"]?.stringValue else { break }
                uri = "/v1/activities?limit=3&cursor=\(cursor)"
            }
            #expect(ids == (0..<7).map { "act-\($0)" })
            let ended = try await api.call(.get, "/v1/activities?state=ended", key: app.secretKey)
            #expect(ended["data"]!.arrayItems.map { $0.objectValue?["activityId"] } == ["act-2"])
            let typed = try await api.call(.get, "/v1/activities?attributesType=DeliveryAttributes", key: app.secretKey)
            #expect(typed["data"]!.arrayItems.count == 1)

            var devices: [String] = []
            uri = "/v1/activities/act-0/instances?limit=2"
            while true {
                let page = try await api.call(.get, uri, key: app.secretKey)
                devices += page["data"]!.arrayItems.compactMap { $0.objectValue?["deviceId"]?.stringValue }
                guard let cursor = page["nextCursor"]?.stringValue else { break }
                uri = "/v1/activities/act-0/instances?limit=2&cursor=\(cursor)"
            }
            #expect(devices == (0..<7).map { "dev-\($0)" })

            #expect(try await api.call(.get, "/v1/activities?limit=0", key: app.secretKey).status == .unprocessableContent)
            #expect(try await api.call(.get, "/v1/activities?limit=500", key: app.secretKey).status == .unprocessableContent)
            #expect(try await api.call(.get, "/v1/activities?limit=ten", key: app.secretKey).status == .badRequest)
            #expect(try await api.call(.get, "/v1/activities?state=paused", key: app.secretKey).status == .unprocessableContent)
            let badCursor = try await api.call(.get, "/v1/activities?cursor=!!!", key: app.secretKey)
            #expect(badCursor.status == .badRequest)
            #expect(badCursor.errorField == "cursor")
            #expect(try await api.call(.get, "/v1/activities/nothing/instances", key: app.secretKey).status == .notFound)
        }
    }

    @Test("data survives a server restart")
    func restart() async throws {
        let directory = try TemporaryDirectory()
        let app = try await withLiveline(directory: directory) { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/activities/order-9/instances/d1", key: app.publishableKey, registerBody)
            _ = try await api.json(.post, "/v1/activities/order-9/updates", key: app.secretKey, ["contentState": ["eta": 4]])
            _ = try await api.json(.post, "/v1/activities/done/updates", key: app.secretKey, ["contentState": ["eta": 0]])
            _ = try await api.json(.post, "/v1/activities/done/end", key: app.secretKey, [:])
            return app
        }
        try await withLiveline(directory: directory) { api, store in
            #expect(try await store.apps().map(\.id) == [app.id])
            let read = try await api.call(.get, "/v1/activities/order-9", key: app.secretKey)
            #expect(read.status == .ok)
            #expect(read["contentState"] == ["eta": 4])
            #expect(read["instances"]?.objectValue?["active"] == .integer(1))
            #expect(try await api.call(.get, "/v1/activities/done", key: app.secretKey)["state"] == "ended")
            let next = try await api.json(.post, "/v1/activities/order-9/updates", key: app.secretKey, ["contentState": ["eta": 3]])
            #expect(next["sequence"] == .integer(2))
            let refused = try await api.json(.post, "/v1/activities/done/updates", key: app.secretKey, ["contentState": ["eta": 1]])
            #expect(refused.status == .conflict)
        }
    }

    @Test("health, readiness and the OpenAPI document")
    func health() async throws {
        try await withLiveline { api, _ in
            #expect(try await api.call(.get, "/healthz")["status"] == "ok")
            #expect(try await api.call(.get, "/readyz")["status"] == "ready")
            let document = try await api.call(.get, "/openapi.json")
            #expect(document.status == .ok)
            #expect(document["openapi"] == "3.1.0")
        }
    }
}

extension JSONValue {
    var arrayItems: [JSONValue] {
        if case .array(let items) = self { return items }
        return []
    }
}

@Suite("Over real HTTP")
struct LiveServerTests {
    @Test("the application serves the lifecycle over a real socket, and refuses oversized bodies with JSON")
    func live() async throws {
        let directory = try TemporaryDirectory()
        let store = try await SQLStore.open(path: directory.databasePath)
        let created = try await createApp(store)
        var configuration = LivelineConfiguration(port: 0)
        configuration.dataDirectory = directory.url.path
        let app = LivelineApplication.makeApplication(configuration: configuration, store: store, logger: .init(label: "test"))
        do {
            try await app.test(.live) { client in
                let api = API(client: client)
                #expect(try await api.json(.put, "/v1/activities/o1/instances/d1", key: created.publishableKey, registerBody).status == .created)
                #expect(try await api.json(.post, "/v1/activities/o1/updates", key: created.secretKey, ["contentState": ["eta": 1]]).status == .accepted)
                #expect(try await api.call(.get, "/v1/activities/o1", key: created.secretKey)["contentState"] == ["eta": 1])
                let huge = "{\"contentState\": {\"x\": \"" + String(repeating: "z", count: 100_000) + "\"}}"
                let tooLarge = try await api.call(.post, "/v1/activities/o1/updates", key: created.secretKey, body: huge)
                #expect(tooLarge.status == .contentTooLarge)
                #expect(tooLarge.errorCode == "body_too_large")
                #expect(try await api.call(.get, "/healthz")["status"] == "ok")
            }
            try await store.close()
        } catch {
            try? await store.close()
            throw error
        }
    }
}

/// Counts the wake-ups the API gives the delivery engine.
private final class CountingWaker: DeliveryWaking, Sendable {
    private let wakes = Mutex(0)
    var count: Int { wakes.withLock { $0 } }
    func wake() { wakes.withLock { $0 += 1 } }
}
