import Foundation
import LivelineCore
import Testing

@Suite("APNs Live Activity payload")
struct APNsPayloadTests {
    @Test("update payload uses Apple's key names and exact bytes")
    func updatePayload() throws {
        let payload = APNsLiveActivityPayload(
            event: .update, timestamp: 1_763_700_000,
            contentState: ["minutesAway": 5, "driver": "Ana", "progress": 0.5],
            staleDate: 1_763_700_600, relevanceScore: 50,
            alert: LiveActivityAlert(title: "Almost there", body: "5 minutes away", sound: "default")
        )
        let text = String(decoding: payload.encoded(), as: UTF8.self)
        #expect(
            text == #"{"aps":{"alert":{"body":"5 minutes away","sound":"default","title":"Almost there"},"content-state":{"driver":"Ana","minutesAway":5,"progress":0.5},"event":"update","relevance-score":50.0,"stale-date":1763700600,"timestamp":1763700000}}"#
        )
        #expect(payload.byteCount == payload.encoded().count)
        try payload.validate()
    }

    @Test("a localized alert goes as Apple's loc-key and loc-args, is kept in that form, and is shown to the API as locKey and locArgs")
    func localizedAlert() throws {
        let alert = LiveActivityAlert(
            title: .localized(key: "%@ is on an adventure!", arguments: ["Power Panda"]), body: .localized(key: "ADVENTURE_BODY", arguments: []),
            sound: "chime.aiff"
        )
        let payload = APNsLiveActivityPayload(
            event: .start, timestamp: 10, contentState: ["level": 1], alert: alert, attributesType: "AdventureAttributes", attributes: ["hero": "Panda"]
        )
        let text = String(decoding: payload.encoded(), as: UTF8.self)
        #expect(
            text.contains(#""alert":{"body":{"loc-key":"ADVENTURE_BODY"},"sound":"chime.aiff","title":{"loc-args":["Power Panda"],"loc-key":"%@ is on an adventure!"}}"#),
            "\(text)"
        )
        try payload.validate()
        // The Store keeps the alert as APNs takes it and reads it back the same; text alerts read as they always did.
        #expect(LiveActivityAlert(json: alert.json) == alert)
        #expect(LiveActivityAlert(json: ["title": "a", "body": "b"]) == LiveActivityAlert(title: "a", body: "b"))
        #expect(LiveActivityAlert(json: ["title": ["loc-args": ["x"]], "body": "b"]) == nil)
        #expect(LiveActivityAlert(json: ["title": ["loc-key": "K", "loc-args": [1]], "body": "b"]) == nil)
        #expect(
            alert.apiJSON == [
                "title": ["locKey": "%@ is on an adventure!", "locArgs": ["Power Panda"]], "body": ["locKey": "ADVENTURE_BODY", "locArgs": []],
                "sound": "chime.aiff",
            ]
        )
    }

    @Test("end payload carries dismissal-date; start carries attributes and input-push-token")
    func endAndStart() throws {
        let end = APNsLiveActivityPayload(event: .end, timestamp: 10, contentState: ["done": true], dismissalDate: 20)
        let endAPS = try #require(end.json.objectValue?["aps"]?.objectValue)
        #expect(endAPS["dismissal-date"] == .integer(20))
        #expect(endAPS["event"] == "end")
        try end.validate()

        let start = APNsLiveActivityPayload(
            event: .start, timestamp: 10, contentState: ["score": "0-0"],
            alert: LiveActivityAlert(title: "Kick-off", body: "The match started"),
            attributesType: "MatchAttributes", attributes: ["home": "A", "away": "B"], inputPushToken: true
        )
        let startAPS = try #require(start.json.objectValue?["aps"]?.objectValue)
        #expect(startAPS["attributes-type"] == "MatchAttributes")
        #expect(startAPS["attributes"] == ["home": "A", "away": "B"])
        #expect(startAPS["input-push-token"] == .integer(1))
        try start.validate()
    }

    @Test("the timestamp is a JSON number, never a string")
    func timestampIsNumber() {
        let payload = APNsLiveActivityPayload(event: .update, timestamp: 42, contentState: [:])
        #expect(String(decoding: payload.encoded(), as: UTF8.self).contains(#""timestamp":42"#))
    }

    @Test("dismissal-date is refused on an update")
    func dismissalOnUpdate() {
        let payload = APNsLiveActivityPayload(event: .update, timestamp: 1, contentState: [:], dismissalDate: 2)
        #expect(throws: ValidationError.self) { try payload.validate() }
    }

    @Test("a content state that is not an object is refused")
    func contentStateMustBeObject() {
        let payload = APNsLiveActivityPayload(event: .update, timestamp: 1, contentState: "hello")
        #expect(throws: ValidationError(code: "invalid_content_state", message: "contentState must be a JSON object.", field: "contentState")) {
            try payload.validate()
        }
    }

    @Test("a start without attributes or alert is refused")
    func startNeedsAttributes() {
        let payload = APNsLiveActivityPayload(event: .start, timestamp: 1, contentState: [:])
        #expect(throws: ValidationError.self) { try payload.validate() }
    }

    @Test("payload size limit is exactly 4096 bytes")
    func sizeLimit() throws {
        func payload(padding: Int) -> APNsLiveActivityPayload {
            APNsLiveActivityPayload(event: .update, timestamp: 1, contentState: ["text": .string(String(repeating: "x", count: padding))])
        }
        let overhead = payload(padding: 0).byteCount
        try payload(padding: 4096 - overhead).validate()
        #expect(payload(padding: 4096 - overhead).byteCount == 4096)
        #expect(throws: ValidationError.self) { try payload(padding: 4097 - overhead).validate() }
    }

    @Test("multi-byte characters count as their UTF-8 bytes")
    func utf8Size() {
        let ascii = APNsLiveActivityPayload(event: .update, timestamp: 1, contentState: ["t": "aaaa"])
        let emoji = APNsLiveActivityPayload(event: .update, timestamp: 1, contentState: ["t": "🚚🚚"])
        #expect(emoji.byteCount == ascii.byteCount + 4)
    }
}

@Suite("JSON values")
struct JSONValueTests {
    @Test("numbers keep their kind through a parse and encode")
    func numbersKeepKind() throws {
        let value = try JSONValue(parsing: Data(#"{"a":5,"b":5.5,"c":-0.25,"d":1e3,"e":12345678901234}"#.utf8))
        let members = try #require(value.objectValue)
        #expect(members["a"] == .integer(5))
        #expect(members["b"] == .number(5.5))
        #expect(members["e"] == .integer(12_345_678_901_234))
        #expect(value.encodedString.contains(#""a":5,"#))
        #expect(value.encodedString.contains(#""b":5.5"#))
    }

    @Test("strings are escaped and round-trip", arguments: ["plain", "quote \" and \\ backslash", "line\nbreak\ttab", "\u{01}ctl", "ünïcödé 🚚"])
    func stringRoundTrip(_ text: String) throws {
        let encoded = JSONValue.string(text).encoded
        #expect(try JSONValue(parsing: Data(encoded)) == .string(text))
    }

    @Test("nested values round-trip")
    func nestedRoundTrip() throws {
        let value: JSONValue = ["list": [1, 2.5, "x", true, nil, ["k": "v"]], "empty": [:]]
        #expect(try JSONValue(parsing: Data(value.encoded)) == value)
    }

    @Test("malformed JSON throws", arguments: ["{", "{\"a\":}", "nul", "[1,]", ""])
    func malformed(_ text: String) {
        #expect(throws: (any Error).self) { try JSONValue(parsing: Data(text.utf8)) }
    }
}

@Suite("Strict JSON parsing")
struct JSONParserTests {
    @Test("rejects what RFC 8259 rejects", arguments: [
        "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "{'a':1}", "[1] [2]", "\"\u{01}\"", "\"\\x\"", "\"\\ud800\"", "NaN",
        "{\"a\":1,\"a\":2}", String(repeating: "[", count: 300) + String(repeating: "]", count: 300),
    ])
    func rejects(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSONValue(parsing: Data(text.utf8)) }
    }

    @Test("accepts what RFC 8259 accepts")
    func accepts() throws {
        #expect(try JSONValue(parsing: Data(" {\"a\" : [ 1 , -2.5e3, 0, true, false, null ] } ".utf8))
            == ["a": [1, -2500.0, 0, true, false, nil]])
        #expect(try JSONValue(parsing: Data(#""\ud83d\ude9a \u00e9 \/""#.utf8)) == "🚚 é /")
        #expect(try JSONValue(parsing: Data("5.0".utf8)) == .number(5))
        #expect(try JSONValue(parsing: Data("99999999999999999999".utf8)) == .number(1e20))
    }
}
