import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineStore
import LivelineTestSupport
import Logging
import Testing

/// Liveline's store and delivery engine sending over real TLS to both emulators: iPhones through APNs, Android phones
/// through FCM HTTP v1 (OAuth service account, messages:send).
struct EmulatedPhones {
    let store: SQLStore
    let apns: APNsEmulator
    let fcm: FCMEmulator
    let transports: PlatformTransports
    /// The APNs directory, which also manages the app's broadcast channels (at the emulator's channel listener).
    let channels: APNsTransportDirectory
    let clock: SharedClock
    let appID: String
    let bundleID: String
    let projectID: String

    func addIPhone(_ deviceID: String, activity: String) async throws -> String {
        let token = apns.addDevice(bundleID: bundleID)
        try await register(deviceID, activity: activity, platform: .ios, token: token)
        return token
    }

    func addAndroid(_ deviceID: String, activity: String) async throws -> String {
        let token = fcm.addDevice(projectID: projectID)
        try await register(deviceID, activity: activity, platform: .android, token: token)
        return token
    }

    func register(_ deviceID: String, activity: String, platform: Platform, token: String) async throws {
        _ = try await store.registerInstance(
            InstanceRegistration(appID: appID, activityID: activity, deviceID: deviceID, platform: platform, pushToken: token,
                                 attributesType: "DeliveryAttributes", attributes: ["order": "1"], userID: nil),
            at: clock.now
        )
    }

    func update(_ activity: String, _ state: JSONValue, alert: LiveActivityAlert? = nil) async throws -> Int64 {
        try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: activity, contentState: state, alert: alert), at: clock.now).sequence
    }

    func makeDispatcher(_ configuration: DispatcherConfiguration = e2eConfiguration()) -> Dispatcher {
        Dispatcher(store: store, transports: transports, configuration: configuration, now: { [clock] in clock.now })
    }

    /// The Android phone's notification for an activity.
    func notification(_ token: String, _ activity: String) -> AndroidLiveNotification? {
        fcm.device(token: token)?.notification(activityID: activity)
    }

    func instance(_ activity: String, _ deviceID: String) async throws -> InstanceRecord? {
        try await store.instances(appID: appID, activityID: activity, cursor: nil, limit: 500).items.first { $0.deviceID == deviceID }
    }
}

func withEmulatedPhones<T>(_ body: (EmulatedPhones) async throws -> T) async throws -> T {
    let root = uniqueTemporaryURL(prefix: "liveline-android-e2e")
    try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: root) }
    let clock = SharedClock()
    let logger = Logger(label: "test.emulators")

    var apnsConfiguration = APNsEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path)
    apnsConfiguration.now = { [clock] in clock.now }
    let apns = try APNsEmulator(configuration: apnsConfiguration, logger: logger)
    let apnsPorts = try await apns.start()
    let key = P256.Signing.PrivateKey()
    apns.registerSigningKey(teamID: "TEAM123456", keyID: "KEY1234567", publicKey: key.publicKey)
    let bundleID = "com.example.e2e"
    apns.registerBundleID(bundleID)

    var fcmConfiguration = FCMEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path)
    fcmConfiguration.now = { [clock] in clock.now }
    let fcm = try FCMEmulator(configuration: fcmConfiguration, logger: logger)
    _ = try await fcm.start()
    let account = try fcm.demoServiceAccount()

    let store = try await SQLStore.open(path: root.appendingPathComponent("liveline.sqlite").path)
    let appID = "app_e2e"
    try await store.createApp(
        AppRecord(id: appID, name: "E2E", bundleID: bundleID, androidPackage: "com.example.e2e", createdAt: clock.now), keys: []
    )
    let sealer = try CredentialSealer(masterKey: Array(repeating: 9, count: 32))
    let apnsCredentials = APNsCredentials(
        teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: key.pemRepresentation, environment: .sandbox,
        baseURL: "https://127.0.0.1:\(apnsPorts.apnsPort)", caCertificatePEM: apns.caCertificatePEM,
        channelManagementBaseURL: apns.boundChannelsPort.map { "https://127.0.0.1:\($0)" }
    )
    try await store.saveCredentials(try apnsCredentials.stored(appID: appID, sealer: sealer, at: clock.now))
    let fcmCredentials = FCMCredentials(serviceAccountJSON: account.json, baseURL: fcm.baseURL, caCertificatePEM: fcm.caCertificatePEM)
    try await store.saveCredentials(try fcmCredentials.stored(appID: appID, sealer: sealer, at: clock.now))

    let apnsDirectory = APNsTransportDirectory(store: store, sealer: sealer, connectionsPerApp: 2, now: { [clock] in clock.now })
    // Patient timeouts, as in FCMTransportTests: these tests run beside others that keep every core busy.
    let fcmDirectory = FCMTransportDirectory(
        store: store, sealer: sealer, clientConfiguration: FCMTransportTests.Environment.clientConfiguration, now: { [clock] in clock.now }
    )
    let environment = EmulatedPhones(
        store: store, apns: apns, fcm: fcm, transports: PlatformTransports(ios: apnsDirectory, android: fcmDirectory),
        channels: apnsDirectory, clock: clock,
        appID: appID, bundleID: bundleID, projectID: account.projectID
    )
    func shutdown() async {
        await apnsDirectory.shutdown()
        await fcmDirectory.shutdown()
        try? await apns.shutdown()
        try? await fcm.shutdown()
        try? await store.close()
    }
    do {
        let result = try await body(environment)
        await shutdown()
        return result
    } catch {
        await shutdown()
        throw error
    }
}

@Suite("End to end to Android phones through the FCM emulator, beside iPhones")
struct AndroidEndToEndTests {
    @Test("one update reaches an iPhone and an Android phone watching the same activity; the end ends both")
    func mixedPlatforms() async throws {
        try await withEmulatedPhones { env in
            let iphone = try await env.addIPhone("iphone-1", activity: "order-1")
            let pixel = try await env.addAndroid("pixel-1", activity: "order-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                let sequence = try await env.update(
                    "order-1", ["status": "On the way", "minutesAway": 12], alert: LiveActivityAlert(title: "On the way", body: "12 minutes")
                )
                dispatcher.wake()
                #expect(try await waitFor {
                    env.apns.display(token: iphone)?.contentState == ["status": "On the way", "minutesAway": 12]
                        && env.notification(pixel, "order-1")?.contentState == ["status": "On the way", "minutesAway": 12]
                })
                let notification = env.notification(pixel, "order-1")
                #expect(notification?.sequence == sequence)
                #expect(notification?.lastAlertTitle == "On the way")

                // What went over the wire: a data-only, high-priority message in Liveline's contract.
                let message = try #require(env.fcm.messages(token: pixel).first)
                #expect(message.status == 200)
                let body = try JSONValue(parsing: Data(message.body.utf8))
                let sent = try #require(body.objectValue?["message"]?.objectValue)
                #expect(sent["token"] == .string(pixel))
                #expect(sent["notification"] == nil)
                #expect(sent["android"]?.objectValue?["priority"] == "high")
                #expect(sent["android"]?.objectValue?["collapse_key"] == nil)
                let data = try #require(sent["data"]?.objectValue)
                #expect(data["liveline_activity_id"] == "order-1")
                #expect(data["liveline_event"] == "update")
                #expect(data["liveline_sequence"] == .string(String(sequence)))
                #expect(data["liveline_content_state"] == #"{"minutesAway":12,"status":"On the way"}"#)
                #expect(data["liveline_alert_body"] == "12 minutes")
                #expect(data.values.allSatisfy { $0.stringValue != nil })

                _ = try await env.store.endActivity(
                    ActivityEnd(appID: env.appID, activityID: "order-1", contentState: ["status": "Delivered", "minutesAway": 0]), at: env.clock.now
                )
                dispatcher.wake()
                #expect(try await waitFor {
                    env.apns.display(token: iphone)?.ended == true && env.notification(pixel, "order-1")?.ended == true
                })
                #expect(env.notification(pixel, "order-1")?.contentState == ["status": "Delivered", "minutesAway": 0])
                // Two deliveries per phone. (On a loaded machine a send can fail in transport and be retried: that
                // attempt is in the timeline too, as retrying.)
                #expect(try await waitFor {
                    try await env.store.deliveries(appID: env.appID, activityID: "order-1", cursor: nil, limit: 100).items
                        .count(where: { $0.status == .delivered }) == 4
                })
            }
            let deliveries = try await env.store.deliveries(appID: env.appID, activityID: "order-1", cursor: nil, limit: 100).items
            let android = deliveries.filter { $0.platform == .android && $0.status != .retrying }
            #expect(android.count == 2)
            #expect(android.allSatisfy { $0.status == .delivered && ($0.providerID ?? "").hasPrefix("projects/\(env.projectID)/messages/") })
        }
    }

    @Test("a localized alert reaches the iPhone as loc-key and loc-args, and the Android phone as its string resource's name and arguments")
    func localizedAlert() async throws {
        try await withEmulatedPhones { env in
            let iphone = try await env.addIPhone("iphone-1", activity: "order-1")
            let pixel = try await env.addAndroid("pixel-1", activity: "order-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                let alert = LiveActivityAlert(
                    title: .localized(key: "order_on_its_way", arguments: []), body: .localized(key: "order_minutes_away", arguments: ["12"])
                )
                _ = try await env.update("order-1", ["status": "On the way", "minutesAway": 12], alert: alert)
                dispatcher.wake()
                #expect(try await waitFor {
                    env.apns.display(token: iphone)?.alertCount == 1 && env.notification(pixel, "order-1")?.alertCount == 1
                })
                #expect(
                    env.apns.display(token: iphone)?.lastAlert
                        == ["title": ["loc-key": "order_on_its_way"], "body": ["loc-key": "order_minutes_away", "loc-args": ["12"]]]
                )
                let notification = env.notification(pixel, "order-1")
                #expect(notification?.lastAlertTitle == "order_on_its_way")
                #expect(notification?.lastAlertBody == "order_minutes_away")
                let message = try #require(env.fcm.messages(token: pixel).first)
                let data = try #require(
                    try JSONValue(parsing: Data(message.body.utf8)).objectValue?["message"]?.objectValue?["data"]?.objectValue
                )
                #expect(data["liveline_alert_title_loc_key"] == "order_on_its_way")
                #expect(data["liveline_alert_title_loc_args"] == "[]")
                #expect(data["liveline_alert_body_loc_key"] == "order_minutes_away")
                #expect(data["liveline_alert_body_loc_args"] == #"["12"]"#)
                #expect(data["liveline_alert_title"] == nil && data["liveline_alert_body"] == nil)
            }
        }
    }

    @Test("an Android phone whose FCM token rotates gets the latest state at once on the new token, nothing more on the old")
    func rotation() async throws {
        try await withEmulatedPhones { env in
            let old = try await env.addAndroid("pixel-1", activity: "match-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-1", ["score": "1-0"])
                dispatcher.wake()
                #expect(try await waitFor { env.notification(old, "match-1")?.contentState == ["score": "1-0"] })

                let new = env.fcm.addDevice(projectID: env.projectID)
                try await env.register("pixel-1", activity: "match-1", platform: .android, token: new)
                dispatcher.wake()
                #expect(try await waitFor { env.notification(new, "match-1")?.contentState == ["score": "1-0"] })

                _ = try await env.update("match-1", ["score": "2-0"])
                dispatcher.wake()
                #expect(try await waitFor { env.notification(new, "match-1")?.contentState == ["score": "2-0"] })
                #expect(env.notification(old, "match-1")?.contentState == ["score": "1-0"])
                #expect(env.fcm.messages(token: old).count == 1)
            }
        }
    }

    @Test("UNREGISTERED invalidates only that instance; the others keep receiving")
    func unregistered() async throws {
        try await withEmulatedPhones { env in
            let gone = try await env.addAndroid("pixel-gone", activity: "match-1")
            let kept = try await env.addAndroid("pixel-kept", activity: "match-1")
            let iphone = try await env.addIPhone("iphone-1", activity: "match-1")
            // The phones are devices too, with the same FCM tokens, as the app registers them for remote starts.
            for (device, token) in [("pixel-gone", gone), ("pixel-kept", kept)] {
                _ = try await env.store.putDevice(
                    DeviceRegistration(appID: env.appID, deviceID: device, platform: .android, fcmToken: .set(token)), at: Date()
                )
            }
            env.fcm.unregisterDevice(token: gone)
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-1", ["score": "1-0"])
                dispatcher.wake()
                #expect(try await waitFor {
                    let invalidated = try await env.instance("match-1", "pixel-gone")?.state == .invalidated
                    return invalidated && env.notification(kept, "match-1")?.contentState == ["score": "1-0"]
                        && env.apns.display(token: iphone)?.contentState == ["score": "1-0"]
                })
                #expect(env.fcm.messages(token: gone).first?.errorCode == "UNREGISTERED")
                // The token refused on an update is the device's own: it is dropped there too, so that the next
                // remote start skips the device instead of sending to it again.
                let goneDevice = try await env.store.device(appID: env.appID, deviceID: "pixel-gone")
                #expect(goneDevice?.fcmTokenDropReason == "UNREGISTERED")
                #expect(try await env.store.device(appID: env.appID, deviceID: "pixel-kept")?.fcmTokenDroppedAt == nil)
                _ = try await env.update("match-1", ["score": "2-0"])
                dispatcher.wake()
                #expect(try await waitFor { env.notification(kept, "match-1")?.contentState == ["score": "2-0"] })
                #expect(env.fcm.messages(token: gone).count == 1, "nothing more is sent to an invalidated token")
                let keptInstance = try await env.instance("match-1", "pixel-kept")
                #expect(keptInstance?.state == .active)
            }
        }
    }

    @Test("a token FCM says is not a registration token (400 INVALID_ARGUMENT, FCM's detail alone) invalidates that instance only")
    func malformedToken() async throws {
        try await withEmulatedPhones { env in
            try await env.register("pixel-bad", activity: "match-1", platform: .android, token: "not/a.token!")
            let kept = try await env.addAndroid("pixel-kept", activity: "match-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-1", ["score": "1-0"])
                dispatcher.wake()
                #expect(try await waitFor {
                    try await env.instance("match-1", "pixel-bad")?.state == .invalidated
                        && env.notification(kept, "match-1")?.contentState == ["score": "1-0"]
                })
                _ = try await env.update("match-1", ["score": "2-0"])
                dispatcher.wake()
                #expect(try await waitFor { env.notification(kept, "match-1")?.contentState == ["score": "2-0"] })
            }
            #expect(env.fcm.statistics.byErrorCode["INVALID_ARGUMENT", default: 0] == 1, "nothing more is sent to an invalidated token")
            let credentials = try await env.store.credentials(appID: env.appID, provider: .fcm)
            #expect(credentials?.healthy == true)
        }
    }

    @Test("another Firebase project's token (403 SENDER_ID_MISMATCH) is refused alone: the other phones receive, the credentials stay healthy")
    func senderIDMismatch() async throws {
        try await withEmulatedPhones { env in
            let foreign = env.fcm.addDevice(projectID: "another-project")
            try await env.register("pixel-foreign", activity: "match-1", platform: .android, token: foreign)
            let kept = try await env.addAndroid("pixel-kept", activity: "match-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                for (index, score) in ["1-0", "2-0"].enumerated() {
                    _ = try await env.update("match-1", ["score": .string(score)])
                    dispatcher.wake()
                    #expect(try await waitFor { env.notification(kept, "match-1")?.contentState == ["score": .string(score)] })
                    #expect(try await waitFor { env.fcm.statistics.byErrorCode["SENDER_ID_MISMATCH", default: 0] == index + 1 })
                }
                #expect(try await waitFor {
                    try await env.store.deliveries(appID: env.appID, activityID: "match-1", cursor: nil, limit: 100).items
                        .filter { $0.deviceID == "pixel-foreign" }.count == 2
                })
            }
            let credentials = try await env.store.credentials(appID: env.appID, provider: .fcm)
            #expect(credentials?.healthy == true, "one token of another project says nothing of the service account")
            // The token stays (it may be the app's own mistake, not the phone's), each refusal in the timeline.
            #expect(try await env.instance("match-1", "pixel-foreign")?.state == .active)
            let refused = try await env.store.deliveries(appID: env.appID, activityID: "match-1", cursor: nil, limit: 100).items
                .filter { $0.deviceID == "pixel-foreign" }
            #expect(refused.count == 2)
            #expect(refused.allSatisfy { $0.status == .rejected && $0.reason == "SENDER_ID_MISMATCH" })
        }
    }

    @Test("503 UNAVAILABLE with Retry-After is retried, no sooner than asked, and delivered")
    func retried() async throws {
        try await withEmulatedPhones { env in
            let pixel = try await env.addAndroid("pixel-1", activity: "match-1")
            env.fcm.setFaults(FCMFaults(unavailableRate: 1, retryAfterSeconds: 1))
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-1", ["score": "1-0"])
                dispatcher.wake()
                #expect(try await waitFor { env.fcm.statistics.byErrorCode["UNAVAILABLE", default: 0] >= 1 })
                env.fcm.setFaults(.none)
                #expect(try await waitFor { env.notification(pixel, "match-1")?.contentState == ["score": "1-0"] })
                #expect(try await waitFor {
                    try await env.store.deliveries(appID: env.appID, activityID: "match-1", cursor: nil, limit: 100).items.first?.status == .delivered
                })
            }
            // Newest first: the delivery, after one or more refusals.
            let attempts = try await env.store.deliveries(appID: env.appID, activityID: "match-1", cursor: nil, limit: 100).items.reversed()
            // Retry-After: 1 was honoured: the delivery came at least that long after the last refusal, as the timeline
            // times them. (Timed from when the test saw the refusal, a loaded run saw it late, and the wait looked short.)
            let lastRefusal = attempts.last { $0.status == .retrying }
            let delivery = attempts.last { $0.status == .delivered }
            if let lastRefusal, let delivery {
                #expect(delivery.attemptedAt.timeIntervalSince(lastRefusal.attemptedAt) >= 0.9, "Retry-After: 1 was honoured")
            } else {
                Issue.record("no refusal or no delivery in the timeline: \(attempts.map(\.status))")
            }
            #expect(attempts.first?.status == .retrying)
            #expect(attempts.first?.reason == "UNAVAILABLE")
            #expect(attempts.last?.status == .delivered)
        }
    }

    @Test("the OAuth access token is reused, then refreshed shortly before it expires")
    func accessTokenReuse() async throws {
        try await withEmulatedPhones { env in
            let pixel = try await env.addAndroid("pixel-1", activity: "match-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                for (index, minutes) in [0, 10, 40].enumerated() {
                    env.clock.advance(by: TimeInterval(minutes * 60))
                    _ = try await env.update("match-1", ["n": .integer(Int64(index))])
                    dispatcher.wake()
                    #expect(try await waitFor { env.notification(pixel, "match-1")?.contentState == ["n": .integer(Int64(index))] })
                }
                #expect(env.fcm.statistics.tokensIssued == 1, "one access token served three sends over 50 minutes")
                // 58 minutes after it was issued: within the refresh margin of its hour.
                env.clock.advance(by: 8 * 60)
                _ = try await env.update("match-1", ["n": 3])
                dispatcher.wake()
                #expect(try await waitFor { env.notification(pixel, "match-1")?.contentState == ["n": 3] })
                #expect(env.fcm.statistics.tokensIssued == 2)
                #expect(env.fcm.statistics.byStatus[401] == nil, "refreshed before FCM refused it")
            }
        }
    }

    @Test(
        "a dispatcher stopped during a fan-out to a thousand Android phones, then restarted, loses nothing",
        .tags(.slow), .unlessSkippingSlowTests
    )
    func crashDuringFanOut() async throws {
        try await withEmulatedPhones { env in
            var tokens: [String] = []
            for index in 0..<1000 { tokens.append(try await env.addAndroid(String(format: "a%05d", index), activity: "big")) }
            env.fcm.setFaults(FCMFaults(delayMilliseconds: 5))
            var configuration = e2eConfiguration()
            configuration.pushesInFlight = 16
            let first = env.makeDispatcher(configuration)
            _ = try await env.update("big", ["n": 1])
            try await running(first) { () async throws in
                // A generous bound, as in the iOS test: what is checked is the restart, below.
                #expect(try await waitFor(timeout: .seconds(120)) { env.fcm.statistics.accepted >= 100 })
            }
            #expect(env.fcm.statistics.accepted < 1000, "stopped part-way")
            env.fcm.setFaults(.none)
            let second = env.makeDispatcher()
            try await running(second) { () async throws in
                second.wake()
                let done = try await waitFor(timeout: .seconds(60)) {
                    tokens.allSatisfy { env.notification($0, "big")?.contentState == ["n": 1] }
                }
                #expect(done, "\(tokens.filter { env.notification($0, "big")?.contentState != ["n": 1] }.count) phones behind")
                #expect(try await waitFor { try await env.store.activity(appID: env.appID, activityID: "big")?.dispatchedSequence == 1 })
            }
            let activity = try await env.store.activity(appID: env.appID, activityID: "big")
            #expect(activity?.instanceCounts[.active] == 1000)
        }
    }
}
