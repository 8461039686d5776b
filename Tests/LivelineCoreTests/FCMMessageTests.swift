import Foundation
import LivelineCore
import Testing

@Suite("FCM live update message")
struct FCMMessageTests {
    let update = FCMLiveUpdateMessage(
        activityID: "order-1234", event: .update, sequence: 7, timestamp: 1_763_700_000,
        contentState: ["minutesAway": 5, "driver": "Ana", "progress": 0.5], staleDate: 1_763_700_600,
        alert: LiveActivityAlert(title: "Almost there", body: "5 minutes away", sound: "default")
    )

    @Test("data carries the contract's keys, every value a string")
    func contractKeys() {
        #expect(
            update.data == [
                "liveline_activity_id": "order-1234",
                "liveline_event": "update",
                "liveline_sequence": "7",
                "liveline_timestamp": "1763700000",
                "liveline_content_state": #"{"driver":"Ana","minutesAway":5,"progress":0.5}"#,
                "liveline_stale_date": "1763700600",
                "liveline_alert_title": "Almost there",
                "liveline_alert_body": "5 minutes away",
            ]
        )
    }

    @Test("absent optionals are left out; start carries its attributes; end its dismissal date")
    func optionalsAndEvents() throws {
        let bare = FCMLiveUpdateMessage(activityID: "a", event: .update, sequence: 1, timestamp: 2, contentState: [:])
        #expect(Set(bare.data.keys) == ["liveline_activity_id", "liveline_event", "liveline_sequence", "liveline_timestamp", "liveline_content_state"])
        #expect(bare.data["liveline_content_state"] == "{}")

        let start = FCMLiveUpdateMessage(
            activityID: "match-42", event: .start, sequence: 1, timestamp: 100, contentState: ["home": 0, "away": 0],
            attributesType: "MatchAttributes", attributes: ["venue": "Stadium", "home": "A"]
        )
        try start.validate()
        #expect(start.data["liveline_attributes_type"] == "MatchAttributes")
        #expect(start.data["liveline_attributes"] == #"{"home":"A","venue":"Stadium"}"#)
        #expect(start.data["liveline_event"] == "start")

        let end = FCMLiveUpdateMessage(activityID: "a", event: .end, sequence: 3, timestamp: 5, contentState: ["done": true], dismissalDate: 60)
        try end.validate()
        #expect(end.data["liveline_dismissal_date"] == "60")
    }

    @Test("the size is the UTF-8 bytes of keys and values; more than 4096 is refused naming the size")
    func sizeRule() throws {
        let data = update.data
        let expected = data.reduce(0) { $0 + $1.key.utf8.count + $1.value.utf8.count }
        #expect(update.dataByteCount == expected)
        #expect(FCMLiveUpdateMessage.dataByteCount(["é": "ü€"]) == 2 + 5)
        #expect(FCMLiveUpdateMessage.maximumDataBytes == 4096)

        func message(padding: Int) -> FCMLiveUpdateMessage {
            FCMLiveUpdateMessage(activityID: "a", event: .update, sequence: 1, timestamp: 2, contentState: ["p": .string(String(repeating: "x", count: padding))])
        }
        let overhead = message(padding: 0).dataByteCount
        let fits = message(padding: 4096 - overhead)
        #expect(fits.dataByteCount == 4096)
        try fits.validate()

        let tooBig = message(padding: 4097 - overhead)
        #expect(tooBig.dataByteCount == 4097)
        let error = try #require(throws: ValidationError.self) { try tooBig.validate() }
        #expect(error.code == "payload_too_large")
        #expect(error.message.contains("4097"))
        #expect(error.message.contains("4096"))
    }

    @Test("validation refuses what an app could not use")
    func validation() {
        let dismissalOnUpdate = FCMLiveUpdateMessage(activityID: "a", event: .update, sequence: 1, timestamp: 2, contentState: [:], dismissalDate: 3)
        #expect(throws: ValidationError.self) { try dismissalOnUpdate.validate() }
        let startWithoutAttributes = FCMLiveUpdateMessage(activityID: "a", event: .start, sequence: 1, timestamp: 2, contentState: [:])
        #expect(throws: ValidationError.self) { try startWithoutAttributes.validate() }
        let notAnObject = FCMLiveUpdateMessage(activityID: "a", event: .update, sequence: 1, timestamp: 2, contentState: [1, 2])
        #expect(throws: ValidationError.self) { try notAnObject.validate() }
    }

    @Test("the request body parses as JSON with token, data and android settings")
    func bodyParses() throws {
        let body = update.requestBody(token: "device-token:APA91b-xyz")
        let json = try JSONValue(parsing: body)
        let message = try #require(json.objectValue?["message"]?.objectValue)
        #expect(Set(message.keys) == ["token", "data", "android"])
        #expect(message["token"] == "device-token:APA91b-xyz")
        let data = try #require(message["data"]?.objectValue)
        #expect(data.count == update.data.count)
        for (key, value) in update.data { #expect(data[key] == .string(value)) }
        // Non-collapsible: Google throttles collapsible messages to a burst of 20 per device, then one every 3 minutes.
        #expect(message["android"] == ["priority": "high", "ttl": "28800s"])

        var normal = update
        normal.priority = .normal
        normal.timeToLive = 60
        let android = try JSONValue(parsing: normal.requestBody(token: "t")).objectValue?["message"]?.objectValue?["android"]
        #expect(android == ["priority": "normal", "ttl": "60s"])
    }

    @Test("one encoding serves many tokens; each token is spliced in as a JSON string")
    func tokenSplicing() throws {
        let encoded = update.encoded()
        let first = encoded.body(token: "token-one")
        let second = encoded.body(token: "token-two")
        #expect(first == update.requestBody(token: "token-one"))
        #expect(Array(first.prefix(FCMEncodedMessage.prefix.count)) == FCMEncodedMessage.prefix)
        #expect(Array(first.suffix(encoded.suffix.count)) == encoded.suffix)
        #expect(Array(second.suffix(encoded.suffix.count)) == encoded.suffix)
        #expect(first.count == FCMEncodedMessage.prefix.count + #""token-one""#.utf8.count + encoded.suffix.count)

        let awkward = #"a"b\c"#
        let parsed = try JSONValue(parsing: encoded.body(token: awkward))
        #expect(parsed.objectValue?["message"]?.objectValue?["token"] == .string(awkward))

        var appended: [UInt8] = [1, 2]
        encoded.append(token: "token-one", to: &appended)
        #expect(Array(appended.dropFirst(2)) == first)
    }
}
