import Foundation
import LivelineCore
import Testing

@Suite("An accepted state: the next sequence's rules and the one render step")
struct LiveActivityStateTests {
    let now = Date(timeIntervalSince1970: 1_700_000_000.75)

    func head(_ state: ActivityState = .active, sequence: Int64 = 4, timestamp: Int64? = 1_700_000_000) -> ActivityHead {
        ActivityHead(
            state: state, sequence: sequence, timestamp: timestamp, contentState: ["status": "Cooking"], staleDate: 1_700_003_600,
            relevanceScore: 50
        )
    }

    @Test("aps.timestamp is the current second, but always after the previous one")
    func timestamps() {
        #expect(LiveActivityState.nextTimestamp(after: nil, now: now) == 1_700_000_000)
        #expect(LiveActivityState.nextTimestamp(after: 1_699_999_000, now: now) == 1_700_000_000)
        #expect(LiveActivityState.nextTimestamp(after: 1_700_000_000, now: now) == 1_700_000_001)
        #expect(LiveActivityState.nextTimestamp(after: 1_700_000_500, now: now) == 1_700_000_501)
    }

    @Test("an update is the next sequence with exactly its own fields; a first one is sequence 1")
    func update() throws {
        let first = try LiveActivityState.update(
            activityID: "a", after: nil, contentState: ["status": "Ready"], staleDate: nil, relevanceScore: nil, alert: nil, now: now
        )
        #expect(first.sequence == 1 && first.timestamp == 1_700_000_000 && first.event == .update)
        let next = try LiveActivityState.update(
            activityID: "a", after: head(), contentState: ["status": "Ready"], staleDate: nil, relevanceScore: nil, alert: nil, now: now
        )
        #expect(next.sequence == 5 && next.timestamp == 1_700_000_001)
        #expect(next.staleDate == nil && next.relevanceScore == nil, "an update does not inherit the previous stale date or score")
        #expect(throws: NextStateRefusal.activityEnded) {
            try LiveActivityState.update(
                activityID: "a", after: head(.ended), contentState: [:], staleDate: nil, relevanceScore: nil, alert: nil, now: now
            )
        }
    }

    @Test("an end keeps the current content state and score unless it gives its own; its stale date is its own")
    func end() throws {
        let kept = try #require(
            try LiveActivityState.end(
                activityID: "a", after: head(), contentState: nil, staleDate: nil, relevanceScore: nil, alert: nil, dismissalDate: 1_700_000_100,
                now: now
            )
        )
        #expect(kept.event == .end && kept.sequence == 5)
        #expect(kept.contentState == ["status": "Cooking"] && kept.relevanceScore == 50)
        #expect(kept.staleDate == nil, "the final card is not shown out of date for the hours it stays on the Lock Screen")
        #expect(kept.dismissalDate == 1_700_000_100)
        let given = try #require(
            try LiveActivityState.end(
                activityID: "a", after: head(), contentState: ["status": "Done"], staleDate: 1_700_000_900, relevanceScore: 1, alert: nil,
                dismissalDate: nil, now: now
            )
        )
        #expect(given.contentState == ["status": "Done"] && given.staleDate == 1_700_000_900 && given.relevanceScore == 1)
        var empty = head()
        empty.contentState = nil
        #expect(
            try LiveActivityState.end(
                activityID: "a", after: empty, contentState: nil, staleDate: nil, relevanceScore: nil, alert: nil, dismissalDate: nil, now: now
            ) == nil
        )
        #expect(throws: NextStateRefusal.activityEnded) {
            try LiveActivityState.end(
                activityID: "a", after: head(.ended), contentState: nil, staleDate: nil, relevanceScore: nil, alert: nil, dismissalDate: nil,
                now: now
            )
        }
    }

    @Test("one state renders to both platforms with the same sequence, timestamp and fields")
    func render() {
        let state = LiveActivityState(
            activityID: "order-1", event: .end, sequence: 9, timestamp: 1_700_000_005, contentState: ["minutes": 0],
            staleDate: 1_700_000_600, relevanceScore: 10, alert: LiveActivityAlert(title: "Done", body: "Delivered"),
            dismissalDate: 1_700_000_050
        )
        let aps = state.apnsPayload.json.objectValue?["aps"]?.objectValue
        #expect(aps?["timestamp"] == .integer(1_700_000_005))
        #expect(aps?["event"] == "end")
        #expect(aps?["content-state"] == ["minutes": 0])
        #expect(aps?["stale-date"] == .integer(1_700_000_600))
        #expect(aps?["dismissal-date"] == .integer(1_700_000_050))
        let data = state.fcmMessage(now: now).data
        #expect(data[FCMLiveUpdateMessage.Key.sequence] == "9")
        #expect(data[FCMLiveUpdateMessage.Key.timestamp] == "1700000005")
        #expect(data[FCMLiveUpdateMessage.Key.event] == "end")
        #expect(data[FCMLiveUpdateMessage.Key.dismissalDate] == "1700000050")
        #expect(state.fcmMessage(now: now).timeToLive == 8 * 3600)
        #expect(state.apnsExpiration(now: now) == 1_700_000_000 + 8 * 3600)
        // A dismissal date belongs to the end only: an update renders without one.
        var update = state
        update.event = .update
        #expect(update.apnsPayload.dismissalDate == nil && update.fcmMessage(now: now).dismissalDate == nil)
    }

    @Test("a state too large for either push service is refused when it is accepted")
    func validation() {
        let large = String(repeating: "x", count: 4000)
        let state = LiveActivityState(activityID: "a", event: .update, sequence: 1, timestamp: 1, contentState: ["note": .string(large)])
        #expect(throws: ValidationError.self) { try state.validateRenderings(now: now) }
        let small = LiveActivityState(activityID: "a", event: .update, sequence: 1, timestamp: 1, contentState: ["note": "ok"])
        #expect(throws: Never.self) { try small.validateRenderings(now: now) }
    }

    @Test("a start into a channel that APNs would refuse for its size is not made; the checked start with a token is sent instead")
    func channelStartSize() throws {
        let alert = LiveActivityAlert(title: "Kick-off", body: "Lions – Tigers", sound: "default")
        let attributes: JSONValue = ["home": "Lions", "away": "Tigers"]
        let channelID = "dHdpY2UgdGhlIGxlbmd0aCBvZiB0aGUgZXhhbXBsZQ=="
        func state(padding: Int) -> LiveActivityState {
            LiveActivityState(
                activityID: "match-5", event: .update, sequence: 1, timestamp: 1_700_000_000,
                contentState: ["note": .string(String(repeating: "x", count: padding))]
            )
        }
        func tokenStartBytes(_ state: LiveActivityState) -> Int {
            state.apnsStartPayload(attributesType: "MatchAttributes", attributes: attributes, alert: alert).byteCount
        }
        // Padded so that the start with `input-push-token` is 4 bytes under APNs' limit: the API's check of it passes.
        let padding = 100 + (Limits.maximumAPNsPayloadBytes - 4 - tokenStartBytes(state(padding: 100)))
        let large = state(padding: padding)
        #expect(tokenStartBytes(large) == Limits.maximumAPNsPayloadBytes - 4)
        #expect(throws: Never.self) {
            try large.apnsStartPayload(attributesType: "MatchAttributes", attributes: attributes, alert: alert).validate()
        }
        // The same start into the channel is longer by about the channel id: APNs would answer 413.
        let intoChannel = large.apnsStartPayload(attributesType: "MatchAttributes", attributes: attributes, alert: alert, channelID: channelID)
        #expect(intoChannel.byteCount > Limits.maximumAPNsPayloadBytes)
        #expect(large.apnsChannelStartPayload(attributesType: "MatchAttributes", attributes: attributes, alert: alert, channelID: channelID) == nil)

        let small = state(padding: 10)
        let payload = try #require(
            small.apnsChannelStartPayload(attributesType: "MatchAttributes", attributes: attributes, alert: alert, channelID: channelID)
        )
        #expect(payload == small.apnsStartPayload(attributesType: "MatchAttributes", attributes: attributes, alert: alert, channelID: channelID))
    }
}
