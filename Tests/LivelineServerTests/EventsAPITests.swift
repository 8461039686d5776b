import Foundation
import HTTPTypes
import LivelineCore
import LivelineDispatch
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Testing

/// The `type` of every event on a feed page, in order.
private func types(_ page: Reply) -> [String] {
    (page["data"]?.arrayValue ?? []).compactMap { $0.objectValue?["type"]?.stringValue }
}

@Suite("Lifecycle events and the event feed")
struct EventsAPITests {
    @Test("a phone's registration, updates, its dismissal and the end are events, in order, with their data")
    func lifecycle() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.put, "/v1/activities/order-1/instances/iphone-1", key: app.publishableKey, registerBody).status == .created)
            #expect(try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, ["contentState": ["step": 1]]).status == .accepted)
            #expect(try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, ["contentState": ["step": 2]]).status == .accepted)
            var rotated = registerBody.objectValue ?? [:]
            rotated["pushToken"] = .string(String(repeating: "ab", count: 32))
            #expect(try await api.json(.put, "/v1/activities/order-1/instances/iphone-1", key: app.publishableKey, .object(rotated)).status == .ok)
            #expect(try await api.json(
                .post, "/v1/activities/order-1/instances/iphone-1/events", key: app.publishableKey, ["type": "dismissed"]
            ).status == .ok)
            #expect(try await api.json(.post, "/v1/activities/order-1/end", key: app.secretKey, ["contentState": ["step": 3]]).status == .accepted)
            // Refused changes record nothing.
            #expect(try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, ["contentState": ["step": 4]]).status == .conflict)

            let page = try await api.call(.get, "/v1/events", key: app.secretKey)
            #expect(page.status == .ok)
            #expect(types(page) == [
                "instance.registered", "activity.started", "activity.updated", "instance.token_rotated", "instance.dismissed", "activity.ended",
            ])
            let events = page["data"]?.arrayValue?.compactMap(\.objectValue) ?? []
            #expect(events.allSatisfy { $0["id"]?.stringValue?.hasPrefix("evt_") == true && $0["appId"] == .string(app.id) })
            #expect(events[0]["deviceId"] == "iphone-1")
            #expect(events[0]["data"] == ["platform": "ios"])
            #expect(events[1]["activityId"] == "order-1")
            #expect(events[1]["data"] == ["sequence": 1, "via": "update"])
            #expect(events[2]["data"] == ["sequence": 2, "via": "update"])
            #expect(events[4]["data"] == ["platform": "ios", "reportedBy": "phone"])
            #expect(events[5]["data"] == ["sequence": 3, "endReason": "caller"])

            // Filtering by type, and polling from a cursor.
            let ended = try await api.call(.get, "/v1/events?types=activity.ended,instance.dismissed", key: app.secretKey)
            #expect(types(ended) == ["instance.dismissed", "activity.ended"])
            let first = try await api.call(.get, "/v1/events?limit=2", key: app.secretKey)
            #expect(types(first) == ["instance.registered", "activity.started"])
            let cursor = try #require(first["nextCursor"]?.stringValue)
            let rest = try await api.call(.get, "/v1/events?after=\(cursor)", key: app.secretKey)
            #expect(types(rest).count == 4)
            let polled = try #require(rest["nextCursor"]?.stringValue)
            let nothing = try await api.call(.get, "/v1/events?after=\(polled)", key: app.secretKey)
            #expect(types(nothing).isEmpty)
            #expect(nothing["nextCursor"] == .string(polled))
        }
    }

    @Test("the feed is the app's own, needs the secret key, and refuses bad queries")
    func isolationAndRefusals() async throws {
        try await withLiveline { api, store in
            let one = try await createApp(store, name: "One", bundleID: "com.example.one")
            let two = try await createApp(store, name: "Two", bundleID: "com.example.two")
            _ = try await api.json(.post, "/v1/activities/shared-id/updates", key: one.secretKey, ["contentState": ["a": 1]])
            #expect(types(try await api.call(.get, "/v1/events", key: two.secretKey)).isEmpty)
            #expect(types(try await api.call(.get, "/v1/events", key: one.secretKey)) == ["activity.started"])
            #expect(try await api.call(.get, "/v1/events", key: one.publishableKey).status == .forbidden)
            #expect(try await api.call(.get, "/v1/events").status == .unauthorized)
            #expect(try await api.call(.get, "/v1/events?after=nope!", key: one.secretKey).errorCode == "invalid_cursor")
            #expect(try await api.call(.get, "/v1/events?types=activity.exploded", key: one.secretKey).errorCode == "invalid_event_type")
            #expect(try await api.call(.get, "/v1/events?limit=0", key: one.secretKey).errorCode == "invalid_limit")
        }
    }

    @Test("an app's event ids and cursors are its own numbers: they tell nothing of how many events other apps recorded")
    func publicNumbers() async throws {
        try await withLiveline { api, store in
            let one = try await createApp(store, name: "One", bundleID: "com.example.one")
            let two = try await createApp(store, name: "Two", bundleID: "com.example.two")
            #expect(try await api.json(.post, "/v1/activities/a/updates", key: one.secretKey, ["contentState": ["a": 1]]).status == .accepted)
            for index in 0..<20 {
                #expect(try await api.json(.post, "/v1/activities/b-\(index)/updates", key: two.secretKey, ["contentState": ["b": 1]]).status == .accepted)
            }
            #expect(try await api.json(.post, "/v1/activities/c/updates", key: one.secretKey, ["contentState": ["c": 1]]).status == .accepted)

            let page = try await api.call(.get, "/v1/events?limit=1", key: one.secretKey)
            let firstID = try #require(page["data"]?.arrayValue?.first?.objectValue?["id"]?.stringValue)
            let firstNumber = try #require(Int64(firstID.dropFirst("evt_".count), radix: 36))
            // The feed's positions are 1 and 22 here; the app sees numbers of its own instead.
            #expect(PublicNumbers.numbers.contains(firstNumber), "\(firstID) is the shared counter, not the app's number")
            let cursor = try #require(page["nextCursor"]?.stringValue)
            let cursorDigits = try #require(PageCursorDigits.decode(cursor))
            #expect(cursorDigits == firstNumber, "the cursor is the event's number, not its position")
            let rest = try await api.call(.get, "/v1/events?after=\(cursor)", key: one.secretKey)
            let restIDs = rest["data"]?.arrayValue?.compactMap { $0.objectValue?["id"]?.stringValue } ?? []
            #expect(restIDs.count == 1)
            let secondNumber = try #require(restIDs.first.flatMap { Int64($0.dropFirst("evt_".count), radix: 36) })
            #expect(PublicNumbers.numbers.contains(secondNumber))
            #expect(secondNumber - firstNumber != 21)

            // The same counter is a different number in each app, and the store gives the same number after a reopen.
            #expect(store.publicNumbers(appID: one.id).number(for: 1) != store.publicNumbers(appID: two.id).number(for: 1))
            // A bare position (as cursors were before public numbers) is not read as a position: whatever it is, the
            // app's whole feed follows it, so its own events after a position it chose tell it nothing of where they sit
            // among every app's. A number above the app's numbers is after all of them.
            for position in ["1", "2", "21", "22", "23", String((1 << 52) - 1)] {
                let bare = Base64URL.encode(Array(position.utf8))
                let reply = try await api.call(.get, "/v1/events?after=\(bare)", key: one.secretKey)
                #expect(reply.status == .ok)
                #expect(reply["data"]?.arrayValue?.count == 2, "after \(position)")
            }
            let above = Base64URL.encode(Array(String(1 << 53).utf8))
            let afterAll = try await api.call(.get, "/v1/events?after=\(above)", key: one.secretKey)
            #expect(afterAll["data"]?.arrayValue?.count == 0)
            // An empty page hands back the cursor it was given, which the next poll may send again.
            #expect(afterAll["nextCursor"]?.stringValue == above)
            let third = try await createApp(store, name: "Third", bundleID: "com.example.third")
            for position in ["1", "22"] {
                let bare = Base64URL.encode(Array(position.utf8))
                let empty = try await api.call(.get, "/v1/events?after=\(bare)", key: third.secretKey)
                #expect(empty["data"]?.arrayValue?.count == 0)
                #expect(empty["nextCursor"]?.stringValue == bare, "after \(position)")
                let again = try await api.call(.get, "/v1/events?after=\(bare)", key: third.secretKey)
                #expect(again.status == .ok, "the cursor an empty page gave is refused")
            }
            let filtered = try await api.call(.get, "/v1/events?types=budget.warning&after=\(cursor)", key: one.secretKey)
            #expect(filtered["nextCursor"]?.stringValue == cursor)
        }
    }

    @Test("a remote start is activity.started with its audience; a start still unconfirmed after the timeout is reported once")
    func startAndUnconfirmed() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.put, "/v1/devices/pixel-1", key: app.publishableKey, ["platform": "android", "fcmToken": "fcm-token-of-pixel-1"])
            _ = try await api.json(.post, "/v1/activities/match-1/start", key: app.secretKey, startBody(["all": true]))
            _ = try await store.admitStartAudience(appID: app.id, activityID: "match-1", limit: 100, at: testStart)
            let sweeper = LifetimeSweeper(store: store, now: { clock.now })
            #expect(try await sweeper.sweep().startsUnconfirmed == 0)
            clock.advance(by: 121)
            #expect(try await sweeper.sweep().startsUnconfirmed == 1)
            #expect(try await sweeper.sweep().startsUnconfirmed == 0)
            let page = try await api.call(.get, "/v1/events", key: app.secretKey)
            #expect(types(page) == ["activity.started", "instance.start_unconfirmed"])
            let started = page["data"]?.arrayValue?.first?.objectValue?["data"]?.objectValue
            #expect(started?["via"] == "start")
            #expect(started?["counts"] == ["ios": 0, "android": 1, "skipped": 0])
            let unconfirmed = page["data"]?.arrayValue?.last?.objectValue
            #expect(unconfirmed?["deviceId"] == "pixel-1")
            #expect(unconfirmed?["data"]?.objectValue?["platform"] == "android")
        }
    }

    @Test("credentials turning unhealthy are told once; events past their retention are forgotten")
    func credentialsAndRetention() async throws {
        let clock = TestClock(testStart)
        try await withLiveline(clock: clock) { api, store in
            let app = try await createApp(store)
            let sealer = try CredentialSealer(masterKey: Array(repeating: 3, count: 32))
            let credentials = APNsCredentials(
                teamID: "ABCDE12345", keyID: "KEY1234567", privateKeyPEM: "unused", environment: .sandbox
            )
            try await store.saveCredentials(try credentials.stored(appID: app.id, sealer: sealer, at: testStart))
            try await store.setCredentialsHealth(appID: app.id, provider: .apns, healthy: false, reason: "InvalidProviderToken", at: testStart)
            try await store.setCredentialsHealth(appID: app.id, provider: .apns, healthy: false, reason: "InvalidProviderToken", at: testStart)
            let page = try await api.call(.get, "/v1/events", key: app.secretKey)
            #expect(types(page) == ["credentials.unhealthy"])
            #expect(page["data"]?.arrayValue?.first?.objectValue?["data"] == ["provider": "apns", "reason": "InvalidProviderToken"])

            var policy = LifetimePolicy()
            policy.eventRetention = 3600
            clock.advance(by: 3601)
            #expect(try await LifetimeSweeper(store: store, policy: policy, now: { clock.now }).sweep().eventsPruned == 1)
            #expect(types(try await api.call(.get, "/v1/events", key: app.secretKey)).isEmpty)
        }
    }
}

/// The number a feed cursor carries: the decimal digits inside its base64url.
enum PageCursorDigits {
    static func decode(_ cursor: String) -> Int64? {
        var text = cursor.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        return Data(base64Encoded: text).flatMap { Int64(String(decoding: $0, as: UTF8.self)) }
    }
}
