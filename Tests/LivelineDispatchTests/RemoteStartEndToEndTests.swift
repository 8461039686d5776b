import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
@testable import LivelineStore
import LivelineTestSupport
import Testing

extension EmulatedPhones {
    /// A device of the app as its SDK registers it: straight into the devices tables, so this exercises the engine.
    func addDevice(
        _ deviceID: String, platform: Platform, user: String? = nil, startToken: (type: String, token: String)? = nil, fcm: String? = nil
    ) async throws {
        let millis = SQLStore.millis(clock.now)
        _ = try await store.write(
            "INSERT INTO devices (app_id, device_id, platform, user_id, fcm_token, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [.text(appID), .text(deviceID), .text(platform.rawValue), SQLStore.text(user), SQLStore.text(fcm), .integer(millis), .integer(millis)]
        )
        if let startToken {
            _ = try await store.write(
                "INSERT INTO push_to_start_tokens (app_id, device_id, attributes_type, token, updated_at) VALUES (?, ?, ?, ?, ?)",
                [.text(appID), .text(deviceID), .text(startToken.type), .text(startToken.token), .integer(millis)]
            )
        }
    }

    func start(_ activity: String, for audience: StartAudience, _ state: JSONValue) async throws -> AcceptedStart {
        try await store.startActivity(
            ActivityStart(
                appID: appID, activityID: activity, attributesType: "MatchAttributes", attributes: ["home": "Lions", "away": "Tigers"],
                contentState: state, alert: LiveActivityAlert(title: "Kick-off", body: "Lions – Tigers", sound: "default"),
                audience: audience
            ),
            at: clock.now
        )
    }
}

@Suite("Remote start end to end, through the APNs and FCM emulators")
struct RemoteStartEndToEndTests {
    @Test("a start reaches an iPhone's push-to-start token and an Android phone; each turns active when its app registers")
    func startThenConfirm() async throws {
        try await withEmulatedPhones { env in
            // The push-to-start token, as the emulator issues tokens today.
            let startToken = env.apns.addDevice(bundleID: env.bundleID)
            let fcmToken = env.fcm.addDevice(projectID: env.projectID)
            try await env.addDevice("iphone-1", platform: .ios, user: "user-42", startToken: ("MatchAttributes", startToken))
            try await env.addDevice("pixel-1", platform: .android, user: "user-42", fcm: fcmToken)
            try await env.addDevice("iphone-2", platform: .ios, user: "user-42")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                let accepted = try await env.start("match-42", for: .userIDs(["user-42"]), ["home": 0, "away": 0])
                #expect(accepted.counts == AudienceCounts(ios: 1, android: 1, skipped: 1))
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: startToken)?.attributesType == "MatchAttributes" })
                #expect(try await waitFor { env.notification(fcmToken, "match-42")?.contentState == ["home": 0, "away": 0] })

                // The start push as Apple documents it.
                let push = try #require(env.apns.pushes(token: startToken).first)
                #expect(push.status == 200)
                #expect(push.verdict == .applied)
                #expect(push.header("apns-push-type") == "liveactivity")
                #expect(push.header("apns-topic") == "com.example.e2e.push-type.liveactivity")
                #expect(push.header("apns-priority") == "10")
                let aps = try #require(try JSONValue(parsing: push.payload.utf8).objectValue?["aps"]?.objectValue)
                #expect(aps["event"] == "start")
                #expect(aps["attributes-type"] == "MatchAttributes")
                #expect(aps["attributes"] == .object(["home": "Lions", "away": "Tigers", "liveline": .object(["activityId": "match-42"])]))
                #expect(aps["content-state"] == .object(["home": 0, "away": 0]))
                #expect(aps["alert"] == .object(["title": "Kick-off", "body": "Lions – Tigers", "sound": "default"]))
                #expect(aps["input-push-token"] == 1)
                if case .integer = aps["timestamp"] {} else { Issue.record("aps.timestamp is not an integer: \(String(describing: aps["timestamp"]))") }
                let notification = try #require(env.notification(fcmToken, "match-42"))
                #expect(notification.attributesType == "MatchAttributes")
                #expect(notification.lastAlertTitle == "Kick-off")

                #expect(try await waitFor { try await env.instance("match-42", "iphone-1")?.deliveredSequence == 1 })
                #expect(try await env.instance("match-42", "iphone-1")?.state == .starting)

                // An update before the iPhone registered: the Android phone gets it at once; the iPhone's push-to-start
                // token gets nothing more.
                _ = try await env.update("match-42", ["home": 1, "away": 0])
                dispatcher.wake()
                #expect(try await waitFor { env.notification(fcmToken, "match-42")?.contentState == ["home": 1, "away": 0] })
                #expect(env.apns.pushes(token: startToken).count == 1)

                // The iPhone's app registers the activity's update token: it turns active and is caught up at once.
                let updateToken = env.apns.addDevice(bundleID: env.bundleID)
                try await env.register("iphone-1", activity: "match-42", platform: .ios, token: updateToken)
                try await env.register("pixel-1", activity: "match-42", platform: .android, token: fcmToken)
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: updateToken)?.contentState == ["home": 1, "away": 0] })
                #expect(try await env.instance("match-42", "iphone-1")?.state == .active)
                #expect(try await env.instance("match-42", "pixel-1")?.state == .active)

                let deliveries = try await env.store.deliveries(appID: env.appID, activityID: "match-42", cursor: nil, limit: 50).items
                #expect(deliveries.contains { $0.deviceID == "iphone-1" && $0.event == .start && $0.status == .delivered })
            }
        }
    }

    @Test("an iPhone started remotely whose app registers its update token only after the end is sent the end there")
    func registeredAfterTheEnd() async throws {
        try await withEmulatedPhones { env in
            let startToken = env.apns.addDevice(bundleID: env.bundleID)
            try await env.addDevice("iphone-1", platform: .ios, startToken: ("MatchAttributes", startToken))
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.start("match-3", for: .all, ["minute": 1])
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: startToken)?.attributesType == "MatchAttributes" })
                #expect(try await waitFor { try await env.instance("match-3", "iphone-1")?.deliveredSequence == 1 })
                // The backend ends the activity before the phone's app woke up to register the update token.
                _ = try await env.store.endActivity(
                    ActivityEnd(appID: env.appID, activityID: "match-3", contentState: ["minute": 90]), at: env.clock.now
                )
                dispatcher.wake()
                #expect(try await waitFor { try await env.store.activity(appID: env.appID, activityID: "match-3")?.dispatchedSequence == 2 })
                #expect(env.apns.pushes(token: startToken).count == 1, "a push-to-start token takes nothing but the start")
                // Now the app registers: the only way the end can reach the Live Activity the start created.
                let updateToken = env.apns.addDevice(bundleID: env.bundleID)
                try await env.register("iphone-1", activity: "match-3", platform: .ios, token: updateToken)
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: updateToken)?.ended == true })
                #expect(env.apns.display(token: updateToken)?.contentState == ["minute": 90])
                #expect(try await waitFor { try await env.instance("match-3", "iphone-1")?.state == .ended })
                // Any other device, or another token once registered, is still refused on the ended activity.
                await #expect(throws: StoreError.activityEnded) {
                    try await env.register("iphone-2", activity: "match-3", platform: .ios, token: env.apns.addDevice(bundleID: env.bundleID))
                }
                await #expect(throws: StoreError.activityEnded) {
                    try await env.register("iphone-1", activity: "match-3", platform: .ios, token: env.apns.addDevice(bundleID: env.bundleID))
                }
            }
        }
    }

    @Test("a start not yet sent when the phone rotates its push-to-start token goes to the new token")
    func rotatedBeforeTheStartWentOut() async throws {
        try await withEmulatedPhones { env in
            let oldToken = env.apns.addDevice(bundleID: env.bundleID)
            try await env.addDevice("iphone-1", platform: .ios, startToken: ("MatchAttributes", oldToken))
            var unavailable = APNsFaults()
            unavailable.unavailableRate = 1
            env.apns.setFaults(unavailable)
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.start("match-5", for: .all, ["minute": 1])
                dispatcher.wake()
                #expect(try await waitFor { env.apns.pushes(token: oldToken).count >= 2 })
                // The phone rotates its push-to-start token and registers the new one; APNs refuses the old one from now on.
                let newToken = env.apns.addDevice(bundleID: env.bundleID)
                _ = try await env.store.putDevice(
                    DeviceRegistration(appID: env.appID, deviceID: "iphone-1", platform: .ios, pushToStartTokens: ["MatchAttributes": newToken]),
                    at: env.clock.now
                )
                env.apns.expireDevice(token: oldToken)
                env.apns.setFaults(APNsFaults())
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: newToken)?.attributesType == "MatchAttributes" })
                #expect(try await waitFor { try await env.instance("match-5", "iphone-1")?.deliveredSequence == 1 })
                #expect(try await env.instance("match-5", "iphone-1")?.state == .starting)
                #expect(env.apns.pushes(token: oldToken).allSatisfy { $0.status != 200 })
            }
        }
    }

    @Test("a push-to-start token APNs no longer takes is dropped from its device, and its instance invalidated")
    func refusedToken() async throws {
        try await withEmulatedPhones { env in
            let startToken = env.apns.addDevice(bundleID: env.bundleID)
            env.apns.expireDevice(token: startToken)
            try await env.addDevice("iphone-1", platform: .ios, startToken: ("MatchAttributes", startToken))
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.start("match-7", for: .all, ["minute": 1])
                dispatcher.wake()
                #expect(try await waitFor { try await env.instance("match-7", "iphone-1")?.state == .invalidated })
                #expect(try await waitFor {
                    try await env.store.write(
                        "SELECT drop_reason FROM push_to_start_tokens WHERE device_id = 'iphone-1' AND dropped_at IS NOT NULL", []
                    ).first?.column("drop_reason")?.string != nil
                })
                let again = try await env.start("match-8", for: .all, ["minute": 1])
                #expect(again.counts == AudienceCounts(ios: 0, android: 0, skipped: 1))
            }
        }
    }

    @Test("an activity ended before its start went out starts nowhere: the iPhone's instance ends without a push")
    func endedBeforeStart() async throws {
        try await withEmulatedPhones { env in
            let startToken = env.apns.addDevice(bundleID: env.bundleID)
            try await env.addDevice("iphone-1", platform: .ios, startToken: ("MatchAttributes", startToken))
            _ = try await env.start("match-9", for: .all, ["minute": 1])
            // Admitted, then ended before the engine sent the start.
            #expect(try await env.store.admitStartAudience(appID: env.appID, activityID: "match-9", limit: 100, at: env.clock.now) == false)
            #expect(try await env.instance("match-9", "iphone-1")?.state == .starting)
            _ = try await env.store.endActivity(ActivityEnd(appID: env.appID, activityID: "match-9"), at: env.clock.now)
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                dispatcher.wake()
                #expect(try await waitFor {
                    try await env.store.activity(appID: env.appID, activityID: "match-9")?.dispatchedSequence == 2
                })
            }
            #expect(try await env.instance("match-9", "iphone-1")?.state == .ended)
            #expect(env.apns.pushes(token: startToken).isEmpty)
        }
    }
}
