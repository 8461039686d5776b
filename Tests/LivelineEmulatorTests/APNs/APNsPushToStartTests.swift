import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// A push-to-start `start` payload as Apple documents it, with Liveline's activity id inside the attributes.
func startPayload(
    timestamp: Double, activityID: String? = "match-42", attributesType: JSONValue = "MatchAttributes",
    alert: JSONValue? = ["title": "Kick-off", "body": "Arsenal – Chelsea has started"], inputPushToken: Bool = true,
    contentState: JSONValue = ["score": "0-0"]
) -> [UInt8] {
    var attributes: [String: JSONValue] = ["home": "Arsenal", "away": "Chelsea"]
    if let activityID { attributes["liveline"] = ["activityId": .string(activityID)] }
    var extra: [String: JSONValue] = ["attributes-type": attributesType, "attributes": .object(attributes)]
    if let alert { extra["alert"] = alert }
    if inputPushToken { extra["input-push-token"] = 1 }
    return payload(event: "start", timestamp: timestamp, contentState: contentState, extra)
}

/// Push-to-start (iOS 17.2+): simulated iPhones with a push-to-start token per attributes type.
@Suite("APNs push-to-start")
struct APNsPushToStartTests {
    @Test("A valid start makes a Live Activity with a fresh update token; updates and the end to that token apply")
    func startUpdateEnd() async throws {
        try await withEmulator { fixture in
            let phone = try fixture.emulator.createPhone(
                id: "phone-1", deviceID: "device-1", userID: "user-7", tags: ["team": "arsenal"], attributesTypes: ["MatchAttributes"]
            )
            let startToken = try #require(phone.pushToStartTokens["MatchAttributes"])
            #expect(startToken.count == 64 && APNsEmulatorCore.isHexToken(startToken))
            #expect(phone.deviceID == "device-1" && phone.userID == "user-7" && phone.activities.isEmpty)

            let connection = try await fixture.connect()
            let t = fixture.clock.seconds
            let started = try await connection.send(fixture.push(startPayload(timestamp: t), token: startToken))
            #expect(started.status == 200)
            #expect(fixture.emulator.pushes(token: startToken).last?.verdict == .applied)

            let shown = try #require(fixture.emulator.phone(id: "phone-1")?.activities.first)
            #expect(shown.activityID == "match-42")
            #expect(shown.attributesType == "MatchAttributes")
            #expect(shown.inputPushTokenRequested)
            #expect(shown.updateToken.count == 64 && shown.updateToken != startToken)
            #expect(shown.state.contentState == ["score": "0-0"])
            #expect(shown.state.lastEvent == "start" && shown.state.alertCount == 1)
            // The activity is also a device under the per-token views.
            #expect(fixture.emulator.display(token: shown.updateToken)?.attributesType == "MatchAttributes")
            #expect(fixture.emulator.devices().contains { $0.token == shown.updateToken })

            let update = payload(timestamp: t + 1, contentState: ["score": "1-0"])
            #expect(try await connection.send(fixture.push(update, token: shown.updateToken)).status == 200)
            #expect(fixture.emulator.display(token: shown.updateToken)?.contentState == ["score": "1-0"])
            let end = payload(event: "end", timestamp: t + 2, contentState: ["score": "2-1"])
            #expect(try await connection.send(fixture.push(end, token: shown.updateToken)).status == 200)
            let ended = try #require(fixture.emulator.phone(id: "phone-1")?.activities.first?.state)
            #expect(ended.ended && ended.contentState == ["score": "2-1"])
            await connection.close()
        }
    }

    // APNs itself checks headers, the token and the size (`PayloadEmpty`, `PayloadTooLarge`); it does not read the
    // `aps` of a Live Activity push (Apple's error table has no reason for it). So every payload below is answered
    // 200, and the phone — which does read it — ignores it, as ActivityKit drops a push it cannot use.
    @Test("Starts the phone cannot use, updates to a push-to-start token and starts to an update token are accepted and ignored")
    func ignored() async throws {
        try await withEmulator { fixture in
            let phone = try fixture.emulator.createPhone(id: "phone-1", attributesTypes: ["MatchAttributes", "OrderAttributes"])
            let startToken = try #require(phone.pushToStartTokens["MatchAttributes"])
            let connection = try await fixture.connect()
            let t = fixture.clock.seconds
            let cases: [([UInt8], String)] = [
                (startPayload(timestamp: t, attributesType: "OrderAttributes"), "attributes-type OrderAttributes is not this token's MatchAttributes"),
                (startPayload(timestamp: t, alert: nil), "start without an aps.alert"),
                (startPayload(timestamp: t, contentState: "0-0"), "aps.content-state is missing or not an object"),
                (payload(timestamp: t, contentState: ["score": "0-0"]), "update sent to a push-to-start token"),
                (payload(event: "end", timestamp: t), "end sent to a push-to-start token"),
            ]
            for (body, why) in cases {
                #expect(try await connection.send(fixture.push(body, token: startToken)).status == 200)
                #expect(fixture.emulator.pushes(token: startToken).last?.verdict == .ignored(why))
            }
            #expect(fixture.emulator.phone(id: "phone-1")?.activities.isEmpty == true)
            #expect(fixture.emulator.phone(id: "phone-1")?.ignoredStartCount == cases.count)

            // A valid start without input-push-token (iOS 17.2) still gets an update token; the phone records it was not asked.
            #expect(try await connection.send(fixture.push(startPayload(timestamp: t, inputPushToken: false), token: startToken)).status == 200)
            // The same start again (a retry): the phone already shows match-42.
            #expect(try await connection.send(fixture.push(startPayload(timestamp: t + 1), token: startToken)).status == 200)
            #expect(fixture.emulator.pushes(token: startToken).last?.verdict == .ignored("activity match-42 is already shown on this phone"))
            let activities = try #require(fixture.emulator.phone(id: "phone-1")?.activities)
            #expect(activities.count == 1)
            #expect(activities.first?.inputPushTokenRequested == false)

            let updateToken = try #require(activities.first?.updateToken)
            #expect(try await connection.send(fixture.push(startPayload(timestamp: t + 2, activityID: "match-43"), token: updateToken)).status == 200)
            #expect(fixture.emulator.pushes(token: updateToken).last?.verdict == .ignored("start sent to an update token"))
            #expect(fixture.emulator.phone(id: "phone-1")?.activities.count == 1)
            await connection.close()
        }
    }

    @Test("A rotated push-to-start token answers 410 Unregistered with a timestamp; the new one starts")
    func rotation() async throws {
        try await withEmulator { fixture in
            let phone = try fixture.emulator.createPhone(id: "phone-1", attributesTypes: ["MatchAttributes"])
            let old = try #require(phone.pushToStartTokens["MatchAttributes"])
            fixture.clock.advance(by: 5)
            let rotated = try #require(fixture.emulator.rotatePushToStartToken(phoneID: "phone-1", attributesType: "MatchAttributes"))
            let new = try #require(rotated.pushToStartTokens["MatchAttributes"])
            #expect(new != old)
            #expect(fixture.emulator.rotatePushToStartToken(phoneID: "phone-1", attributesType: "OrderAttributes") == nil)

            let connection = try await fixture.connect()
            let t = fixture.clock.seconds
            let refused = try await connection.send(fixture.push(startPayload(timestamp: t), token: old))
            #expect(refused.status == 410)
            #expect(refused.reason == "Unregistered")
            #expect(refused.json?.objectValue?["timestamp"] == .integer(Int64(fixture.clock.seconds * 1000)))
            #expect(try await connection.send(fixture.push(startPayload(timestamp: t), token: new)).status == 200)
            #expect(fixture.emulator.phone(id: "phone-1")?.activities.count == 1)
            await connection.close()
        }
    }

    @Test("The control API creates, lists, shows and rotates phones")
    func controlAPI() async throws {
        try await withEmulator { fixture in
            let port = fixture.controlPort
            var response = try await controlRequest(
                port: port, "POST", "/phones",
                body: #"{"id":"phone-1","userId":"user-7","tags":{"team":"arsenal"},"attributesTypes":["MatchAttributes"]}"#
            )
            #expect(response.status == 201)
            #expect(response.json?.objectValue?["deviceId"] == "phone-1")
            #expect(response.json?.objectValue?["registerWith"] == .null)
            let token = try #require(response.json?.objectValue?["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.stringValue)
            response = try await controlRequest(port: port, "POST", "/phones", body: #"{"id":"phone-1","attributesTypes":["X"]}"#)
            #expect(response.status == 409)
            response = try await controlRequest(port: port, "POST", "/phones", body: #"{"attributesTypes":[]}"#)
            #expect(response.status == 400 && response.errorField == "attributesTypes")
            response = try await controlRequest(
                port: port, "POST", "/phones", body: #"{"attributesTypes":["X"],"registerWith":{"url":"ftp://x"}}"#
            )
            #expect(response.status == 400 && response.errorField == "registerWith")

            response = try await controlRequest(port: port, "POST", "/phones/phone-1/push-to-start-tokens/MatchAttributes/rotate")
            #expect(response.status == 200)
            let rotated = try #require(response.json?.objectValue?["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.stringValue)
            #expect(rotated != token)
            response = try await controlRequest(port: port, "POST", "/phones/phone-1/push-to-start-tokens/Nope/rotate")
            #expect(response.status == 404)
            response = try await controlRequest(port: port, "GET", "/phones/phone-2")
            #expect(response.status == 404 && response.errorCode == "phone_not_found")

            let connection = try await fixture.connect()
            #expect(try await connection.send(fixture.push(startPayload(timestamp: fixture.clock.seconds), token: rotated)).status == 200)
            await connection.close()
            response = try await controlRequest(port: port, "GET", "/phones")
            let phones = try #require(response.json?.objectValue?["phones"]?.arrayValue)
            #expect(phones.count == 1)
            let activity = try #require(phones.first?.objectValue?["activities"]?.arrayValue?.first?.objectValue)
            #expect(activity["activityId"] == "match-42")
            #expect(activity["attributesType"] == "MatchAttributes")
            #expect(activity["state"]?.objectValue?["contentState"] == ["score": "0-0"])
            let updateToken = try #require(activity["updateToken"]?.stringValue)
            response = try await controlRequest(port: port, "GET", "/devices/\(updateToken)")
            #expect(response.status == 200)
        }
    }

    @Test("The push-to-start rule: type, event and an activity already shown")
    func rule() {
        var push = LiveActivityState.DecodedPush(timestamp: 1, event: "start", contentState: [:])
        push.attributesType = "MatchAttributes"
        push.livelineActivityID = "match-42"
        #expect(PushToStartRule.evaluate(.success(push), tokenAttributesType: "MatchAttributes", shownActivityIDs: []) == .start)
        #expect(
            PushToStartRule.evaluate(.success(push), tokenAttributesType: "MatchAttributes", shownActivityIDs: ["match-42"])
                == .ignored("activity match-42 is already shown on this phone")
        )
        push.livelineActivityID = nil
        #expect(PushToStartRule.evaluate(.success(push), tokenAttributesType: "MatchAttributes", shownActivityIDs: ["match-42"]) == .start)
        #expect(
            PushToStartRule.evaluate(.success(push), tokenAttributesType: "OrderAttributes", shownActivityIDs: [])
                == .ignored("attributes-type MatchAttributes is not this token's OrderAttributes")
        )
        push.event = "update"
        #expect(
            PushToStartRule.evaluate(.success(push), tokenAttributesType: "MatchAttributes", shownActivityIDs: [])
                == .ignored("update sent to a push-to-start token")
        )
    }
}
