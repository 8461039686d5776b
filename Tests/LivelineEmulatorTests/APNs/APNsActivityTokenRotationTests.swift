import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// A Live Activity's update token rotates (ActivityKit's `pushTokenUpdates` yields a new one): the activity moves to
/// the new token, the old one answers 410, the simulated app registers the new one.
@Suite("APNs activity update-token rotation")
struct APNsActivityTokenRotationTests {
    @Test("The control API rotates an activity's update token: the old answers 410 Unregistered, the new one updates it, the app re-registers")
    func rotateToken() async throws {
        try await withRegistrationServer { url, calls in
            try await withEmulator { fixture in
                let target = LivelineRegistrationTarget(url: url, publishableKey: "pk_test_emulator")
                let phone = try fixture.emulator.createPhone(
                    id: "phone-1", deviceID: "device-1", attributesTypes: ["MatchAttributes"], registerWith: target
                )
                let startToken = try #require(phone.pushToStartTokens["MatchAttributes"])
                let connection = try await fixture.connect()
                let t = fixture.clock.seconds
                #expect(try await connection.send(fixture.push(startPayload(timestamp: t), token: startToken)).status == 200)
                await fixture.emulator.waitForRegistrations()
                let old = try #require(fixture.emulator.phone(id: "phone-1")?.activities.first)

                let port = fixture.controlPort
                fixture.clock.advance(by: 3)
                var response = try await controlRequest(port: port, "POST", "/phones/phone-1/activities/match-42/rotate-token")
                #expect(response.status == 200)
                let activities = try #require(response.json?.objectValue?["activities"]?.arrayValue)
                #expect(activities.count == 1)
                let shown = try #require(activities.first?.objectValue)
                let new = try #require(shown["updateToken"]?.stringValue)
                #expect(new != old.updateToken && APNsEmulatorCore.isHexToken(new))
                #expect(shown["activityId"] == "match-42")
                // What the activity shows moved with it.
                #expect(shown["state"]?.objectValue?["contentState"] == ["score": "0-0"])

                // The app registers the new token under the activity, as after the start.
                await fixture.emulator.waitForRegistrations()
                #expect(
                    calls.all.last?.body == ["platform": "ios", "pushToken": .string(new), "attributesType": "MatchAttributes"]
                )
                #expect(calls.all.last?.path == "/v1/activities/match-42/instances/device-1")
                #expect(fixture.emulator.phone(id: "phone-1")?.activities.first?.lastRegistration?.succeeded == true)

                // The old token is gone (410 with the time it stopped), the new one takes the update.
                let update = payload(timestamp: t + 5, contentState: ["score": "1-0"])
                let refused = try await connection.send(fixture.push(update, token: old.updateToken))
                #expect(refused.status == 410 && refused.reason == "Unregistered")
                #expect(refused.json?.objectValue?["timestamp"] == .integer(Int64(fixture.clock.seconds * 1000)))
                #expect(try await connection.send(fixture.push(update, token: new)).status == 200)
                #expect(fixture.emulator.phone(id: "phone-1")?.activities.first?.state.contentState == ["score": "1-0"])
                // A second rotation moves it again.
                let again = try fixture.emulator.rotateActivityToken(phoneID: "phone-1", activityID: "match-42")
                let newest = try #require(again.activities.first?.updateToken)
                #expect(newest != new)
                #expect(try await connection.send(fixture.push(payload(timestamp: t + 6), token: new)).status == 410)
                #expect(try await connection.send(fixture.push(payload(timestamp: t + 6), token: newest)).status == 200)
                await connection.close()

                response = try await controlRequest(port: port, "POST", "/phones/phone-1/activities/order-7/rotate-token")
                #expect(response.status == 404 && response.errorCode == "activity_not_found")
                response = try await controlRequest(port: port, "POST", "/phones/phone-9/activities/match-42/rotate-token")
                #expect(response.status == 404 && response.errorCode == "phone_not_found")
            }
        }
    }

    @Test("Without registerWith the phone rotates and registers nothing")
    func withoutRegistration() async throws {
        try await withEmulator { fixture in
            let phone = try fixture.emulator.createPhone(id: "phone-1", attributesTypes: ["MatchAttributes"], registerWith: .some(nil))
            let connection = try await fixture.connect()
            let startToken = try #require(phone.pushToStartTokens["MatchAttributes"])
            #expect(try await connection.send(fixture.push(startPayload(timestamp: fixture.clock.seconds), token: startToken)).status == 200)
            await connection.close()
            let rotated = try fixture.emulator.rotateActivityToken(phoneID: "phone-1", activityID: "match-42")
            #expect(rotated.activities.count == 1 && rotated.activities.first?.lastRegistration == nil)
            #expect(throws: APNsEmulator.ActivityTokenRotationError.noActivity("x")) {
                try fixture.emulator.rotateActivityToken(phoneID: "phone-1", activityID: "x")
            }
        }
    }
}
