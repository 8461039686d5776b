import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// The simulated apps register with Liveline as the real app would: over real HTTP/1.1 to a local stand-in.
@Suite("Registration with Liveline")
struct RegistrationTests {
    @Test("The requests: a device with its push-to-start tokens or FCM token, and an instance")
    func requests() {
        let ios = RegistrationRequest.iosDevice(
            deviceID: "device 1", userID: "user-7", tags: ["team": "arsenal"], pushToStartTokens: ["MatchAttributes": "ab"]
        )
        #expect(ios.path == "/v1/devices/device%201")
        #expect(
            ios.body == ["platform": "ios", "userId": "user-7", "tags": ["team": "arsenal"], "pushToStartTokens": ["MatchAttributes": "ab"]]
        )
        let android = RegistrationRequest.androidDevice(deviceID: "a/1", userID: nil, tags: nil, fcmToken: "fcm-token")
        #expect(android.path == "/v1/devices/a%2F1")
        #expect(android.body == ["platform": "android", "fcmToken": "fcm-token"])
        let instance = RegistrationRequest.instance(
            activityID: "match-42", deviceID: "device-1", platform: "ios", pushToken: "cd", attributesType: "MatchAttributes"
        )
        #expect(instance.path == "/v1/activities/match-42/instances/device-1")
        #expect(instance.body == ["platform": "ios", "pushToken": "cd", "attributesType": "MatchAttributes"])
        let channel = RegistrationRequest.channelInstance(
            activityID: "match-42", deviceID: "device-1", channelID: "c29tZUNoYW5uZWw=", attributesType: "MatchAttributes"
        )
        #expect(channel.path == "/v1/activities/match-42/instances/device-1")
        #expect(channel.body == ["platform": "ios", "channelId": "c29tZUNoYW5uZWw=", "attributesType": "MatchAttributes"])
        let ios18 = RegistrationRequest.iosDevice(deviceID: "d", userID: nil, tags: nil, pushToStartTokens: [:], osVersion: "18.1")
        #expect(ios18.body == ["platform": "ios", "pushToStartTokens": .object([:]), "osVersion": "18.1"])
    }

    @Test("An iPhone registers at creation, after a rotation and when a start push creates an activity")
    func iPhone() async throws {
        try await withRegistrationServer { url, calls in
            try await withEmulator { fixture in
                let target = LivelineRegistrationTarget(url: url, publishableKey: "pk_test_emulator")
                let phone = try fixture.emulator.createPhone(
                    id: "phone-1", deviceID: "device-1", userID: "user-7", tags: ["team": "arsenal"],
                    attributesTypes: ["MatchAttributes"], registerWith: target
                )
                await fixture.emulator.waitForRegistrations()
                let token = try #require(phone.pushToStartTokens["MatchAttributes"])
                #expect(
                    calls.all == [
                        RegistrationCall(
                            method: "PUT", path: "/v1/devices/device-1", authorization: "Bearer pk_test_emulator",
                            body: [
                                "platform": "ios", "userId": "user-7", "tags": ["team": "arsenal"],
                                "pushToStartTokens": ["MatchAttributes": .string(token)], "osVersion": "18.0",
                            ]
                        )
                    ])
                let registered = try #require(fixture.emulator.phone(id: "phone-1")?.lastRegistration)
                #expect(registered.succeeded && registered.status == 204 && registered.attempts == 1)

                let connection = try await fixture.connect()
                #expect(try await connection.send(fixture.push(startPayload(timestamp: fixture.clock.seconds), token: token)).status == 200)
                await connection.close()
                await fixture.emulator.waitForRegistrations()
                let activity = try #require(fixture.emulator.phone(id: "phone-1")?.activities.first)
                #expect(
                    calls.all.last
                        == RegistrationCall(
                            method: "PUT", path: "/v1/activities/match-42/instances/device-1", authorization: "Bearer pk_test_emulator",
                            body: ["platform": "ios", "pushToken": .string(activity.updateToken), "attributesType": "MatchAttributes"]
                        )
                )
                #expect(activity.lastRegistration?.succeeded == true)

                let rotated = try #require(fixture.emulator.rotatePushToStartToken(phoneID: "phone-1", attributesType: "MatchAttributes"))
                await fixture.emulator.waitForRegistrations()
                #expect(calls.all.count == 3)
                #expect(
                    calls.all.last?.body?.objectValue?["pushToStartTokens"]
                        == ["MatchAttributes": .string(rotated.pushToStartTokens["MatchAttributes"]!)]
                )
            }
        }
    }

    @Test("A refused registration is shown on the phone, not retried on a 4xx, and never breaks the push")
    func refused() async throws {
        try await withRegistrationServer(acceptedKey: "pk_other") { url, calls in
            try await withEmulator { fixture in
                let target = LivelineRegistrationTarget(url: url, publishableKey: "pk_test_emulator")
                _ = try fixture.emulator.createPhone(id: "phone-1", attributesTypes: ["MatchAttributes"], registerWith: target)
                await fixture.emulator.waitForRegistrations()
                let result = try #require(fixture.emulator.phone(id: "phone-1")?.lastRegistration)
                #expect(!result.succeeded && result.status == 401 && result.attempts == 1)
                #expect(calls.all.count == 1)
            }
        }
    }

    @Test("Nobody listening: the registration fails after its retries, the phone says so")
    func unreachable() async throws {
        // Port 1 is never served on a test machine. AsyncHTTPClient keeps trying to connect until the request's
        // deadline, so each attempt ends at its timeout.
        let target = LivelineRegistrationTarget(url: "http://127.0.0.1:1", publishableKey: "pk_test_emulator")
        let result = await LivelineRegistrar.send(
            .iosDevice(deviceID: "d", userID: nil, tags: nil, pushToStartTokens: [:]), to: target,
            policy: .init(attempts: 2, firstDelay: .milliseconds(10), timeout: .milliseconds(300)), clock: { Date() }
        )
        #expect(!result.succeeded && result.status == nil && result.attempts == 2 && result.error != nil)
    }

    @Test("An Android phone registers at creation and when a start message posts the notification")
    func android() async throws {
        try await withRegistrationServer { url, calls in
            try await withFCMEmulator { fixture in
                let target = LivelineRegistrationTarget(url: url, publishableKey: "pk_test_emulator")
                let token = fixture.emulator.addDevice(
                    projectID: fixture.account.projectID, deviceID: "pixel-1", userID: "user-7", tags: ["team": "arsenal"],
                    registerWith: target
                )
                await fixture.emulator.waitForRegistrations()
                #expect(
                    calls.all == [
                        RegistrationCall(
                            method: "PUT", path: "/v1/devices/pixel-1", authorization: "Bearer pk_test_emulator",
                            body: ["platform": "android", "fcmToken": .string(token), "userId": "user-7", "tags": ["team": "arsenal"]]
                        )
                    ])
                let start = liveUpdateBody(
                    token: token, activity: "match-42", event: "start", sequence: 1,
                    extraData: [
                        "liveline_attributes_type": "MatchAttributes", "liveline_attributes": #"{"home":"Arsenal"}"#,
                        "liveline_alert_title": "Kick-off",
                    ]
                )
                #expect(try await fixture.answer(fixture.send(start)).status == 200)
                await fixture.emulator.waitForRegistrations()
                #expect(
                    calls.all.last
                        == RegistrationCall(
                            method: "PUT", path: "/v1/activities/match-42/instances/pixel-1", authorization: "Bearer pk_test_emulator",
                            body: ["platform": "android", "pushToken": .string(token)]
                        )
                )
                let device = try #require(fixture.emulator.device(token: token))
                #expect(device.lastRegistration?.succeeded == true)
                let notification = try #require(device.notifications.first)
                #expect(notification.activityID == "match-42" && notification.visible && notification.lastRegistration?.succeeded == true)

                // An update registers nothing more.
                let update = liveUpdateBody(token: token, activity: "match-42", sequence: 2)
                #expect(try await fixture.answer(fixture.send(update)).status == 200)
                await fixture.emulator.waitForRegistrations()
                #expect(calls.all.count == 2)
            }
        }
    }
}
