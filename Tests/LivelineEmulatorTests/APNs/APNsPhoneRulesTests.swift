import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// The simulated phone: APNs accepts (200), the phone applies or silently ignores.
@Suite("Simulated phone")
struct PhoneRulesTests {
    /// Sends the payloads in order on one connection; every answer must be 200.
    func deliver(_ payloads: [[UInt8]], _ fixture: EmulatorFixture) async throws -> [PhoneVerdict?] {
        let connection = try await fixture.connect()
        var verdicts: [PhoneVerdict?] = []
        for body in payloads {
            let response = try await connection.send(fixture.push(body))
            #expect(response.status == 200)
            verdicts.append(fixture.emulator.pushes(token: fixture.token, limit: 1).last?.verdict)
        }
        await connection.close()
        return verdicts
    }

    @Test("A timestamp not newer than the last applied one is ignored")
    func staleTimestamps() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            let verdicts = try await deliver(
                [
                    payload(timestamp: t, contentState: ["eta": 10]),
                    payload(timestamp: t, contentState: ["eta": 9]),
                    payload(timestamp: t - 1, contentState: ["eta": 8]),
                    payload(timestamp: t + 1, contentState: ["eta": 7]),
                ], fixture)
            #expect(verdicts == [.applied, .ignored("stale timestamp"), .ignored("stale timestamp"), .applied])
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.contentState == ["eta": 7])
            #expect(display.appliedCount == 2)
            #expect(display.ignoredCount == 2)
            #expect(fixture.emulator.statistics.ignored == 2)
        }
    }

    @Test("Accepted pushes are counted per token and aps.timestamp, applied or ignored, beyond the history's limit")
    func acceptedPushCounts() async throws {
        try await withEmulator(historyLimit: 2) { fixture in
            let t = fixture.clock.seconds
            let other = fixture.emulator.addDevice(bundleID: "com.example.liveline.demo")
            _ = try await deliver(
                [
                    payload(timestamp: t, contentState: ["eta": 10]),
                    payload(timestamp: t, contentState: ["eta": 10]),
                    payload(timestamp: t - 1, contentState: ["eta": 8]),
                    payload(timestamp: t + 1, contentState: ["eta": 7]),
                    payload(timestamp: t, contentState: ["eta": 10]),
                    // Accepted, but the phone cannot read a timestamp from it: not counted.
                    rawPayload(#"{"aps":{"event":"update"}}"#),
                ], fixture)
            #expect(fixture.emulator.acceptedPushCounts(token: fixture.token) == [t - 1: 1, t: 3, t + 1: 1])
            #expect(fixture.emulator.acceptedPushCounts(token: fixture.token.uppercased()) == [t - 1: 1, t: 3, t + 1: 1])
            #expect(fixture.emulator.acceptedPushCounts(token: other) == [:])
            #expect(fixture.emulator.acceptedPushCounts() == [fixture.token: [t - 1: 1, t: 3, t + 1: 1]])
            #expect(fixture.emulator.pushes(token: fixture.token, limit: 100).count == 2)
        }
    }

    @Test("After end, updates are ignored; a past dismissal date dismisses at once")
    func updateAfterEnd() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            let verdicts = try await deliver(
                [
                    payload(timestamp: t, contentState: ["eta": 3]),
                    payload(event: "end", timestamp: t + 1, contentState: ["eta": 0]),
                    payload(timestamp: t + 2, contentState: ["eta": 5]),
                ], fixture)
            #expect(verdicts == [.applied, .applied, .ignored("ended")])
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.ended)
            #expect(!display.dismissed)
            #expect(display.contentState == ["eta": 0])
            #expect(display.lastEvent == "end")
            // Without a dismissal date the system keeps it up to 4 hours.
            #expect(display.dismissalDate == fixture.clock.now + 4 * 3600)
            fixture.clock.advance(by: 4 * 3600)
            #expect(fixture.emulator.display(token: fixture.token)?.dismissed == true)
        }
    }

    @Test("An end with a dismissal date in the past dismisses now; later pushes are ignored as dismissed")
    func immediateDismissal() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            let verdicts = try await deliver(
                [
                    payload(event: "end", timestamp: t, contentState: ["eta": 0], ["dismissal-date": .integer(Int64(t - 10))]),
                    payload(timestamp: t + 1),
                ], fixture)
            #expect(verdicts == [.applied, .ignored("dismissed")])
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.ended)
            #expect(display.dismissed)
        }
    }

    @Test("A future dismissal date dismisses when the clock passes it")
    func laterDismissal() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            _ = try await deliver(
                [payload(event: "end", timestamp: t, contentState: ["eta": 0], ["dismissal-date": .integer(Int64(t + 120))])], fixture
            )
            #expect(fixture.emulator.display(token: fixture.token)?.dismissed == false)
            #expect(fixture.emulator.display(token: fixture.token)?.dismissalDate == Date(timeIntervalSince1970: t + 120))
            fixture.clock.advance(by: 119)
            #expect(fixture.emulator.display(token: fixture.token)?.dismissed == false)
            fixture.clock.advance(by: 1)
            #expect(fixture.emulator.display(token: fixture.token)?.dismissed == true)
        }
    }

    @Test("The display goes stale when the clock passes the stale date")
    func staleDate() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            _ = try await deliver(
                [payload(timestamp: t, ["stale-date": .integer(Int64(t + 60)), "relevance-score": 75.5])], fixture
            )
            var display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.staleDate == Date(timeIntervalSince1970: t + 60))
            #expect(display.relevanceScore == 75.5)
            #expect(!display.isStale)
            fixture.clock.advance(by: 61)
            display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.isStale)
            // A newer update without a stale date is fresh again.
            _ = try await deliver([payload(timestamp: t + 61)], fixture)
            #expect(fixture.emulator.display(token: fixture.token)?.isStale == false)
        }
    }

    @Test("Alerts are counted and the last one kept")
    func alerts() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            let alert: JSONValue = ["title": "Delivery", "body": "Two minutes away", "sound": "default"]
            _ = try await deliver([payload(timestamp: t, ["alert": alert]), payload(timestamp: t + 1)], fixture)
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.alertCount == 1)
            #expect(display.lastAlert == alert)
        }
    }

    @Test("A start needs attributes-type, attributes and alert")
    func startValidation() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            let alert: JSONValue = ["title": "Kick-off", "body": "The match started"]
            let verdicts = try await deliver(
                [
                    payload(event: "start", timestamp: t, ["attributes": ["matchId": "42"], "alert": alert]),
                    payload(event: "start", timestamp: t, ["attributes-type": "MatchAttributes", "alert": alert]),
                    payload(event: "start", timestamp: t, ["attributes-type": "MatchAttributes", "attributes": ["matchId": "42"]]),
                    payload(event: "start", timestamp: t, ["attributes-type": 7, "attributes": ["matchId": "42"], "alert": alert]),
                    payload(
                        event: "start", timestamp: t, contentState: ["score": "0-0"],
                        ["attributes-type": "MatchAttributes", "attributes": ["matchId": "42"], "alert": alert, "input-push-token": 1]
                    ),
                ], fixture)
            #expect(
                verdicts == [
                    .ignored("start without a string aps.attributes-type"), .ignored("start without an aps.attributes object"),
                    .ignored("start without an aps.alert"), .ignored("start without a string aps.attributes-type"), .applied,
                ])
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.attributesType == "MatchAttributes")
            #expect(display.attributes == ["matchId": "42"])
            #expect(display.contentState == ["score": "0-0"])
            #expect(display.lastEvent == "start")
            #expect(display.alertCount == 1)
        }
    }

    struct UnusablePayload: Sendable, CustomTestStringConvertible {
        var body: String
        var why: String
        var testDescription: String { why }
    }

    static let unusable: [UnusablePayload] = [
        UnusablePayload(body: "not json", why: "payload is not valid JSON"),
        UnusablePayload(body: "[1,2]", why: "payload is not a JSON object with an aps object"),
        UnusablePayload(body: #"{"content-state":{}}"#, why: "payload is not a JSON object with an aps object"),
        UnusablePayload(body: #"{"aps":"update"}"#, why: "payload is not a JSON object with an aps object"),
        UnusablePayload(body: #"{"aps":{"event":"update","content-state":{}}}"#, why: "aps.timestamp is missing or not a number"),
        UnusablePayload(body: #"{"aps":{"timestamp":"1800000000","event":"update","content-state":{}}}"#, why: "aps.timestamp is missing or not a number"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"refresh","content-state":{}}}"#, why: "aps.event is not start, update or end"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"content-state":{}}}"#, why: "aps.event is not start, update or end"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"update"}}"#, why: "aps.content-state is missing or not an object"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"update","content-state":[1]}}"#, why: "aps.content-state is missing or not an object"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{},"dismissal-date":1800000100}}"#, why: "aps.dismissal-date on a update event"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"end","content-state":{},"dismissal-date":"soon"}}"#, why: "aps.dismissal-date is not a number"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{},"stale-date":"2027-01-15T08:00:00Z"}}"#, why: "aps.stale-date is not a number"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{},"relevance-score":"high"}}"#, why: "aps.relevance-score is not a number"),
        UnusablePayload(body: #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{},"alert":7}}"#, why: "aps.alert is not an object"),
    ]

    @Test("APNs accepts a payload the phone cannot use; the phone ignores it and keeps its display", arguments: unusable)
    func unusablePayload(_ unusable: UnusablePayload) async throws {
        try await withEmulator { fixture in
            let verdicts = try await deliver([rawPayload(unusable.body)], fixture)
            guard case .ignored(let why) = verdicts.first ?? nil else {
                Issue.record("expected the push to be ignored, got \(String(describing: verdicts.first))")
                return
            }
            #expect(why.hasPrefix(unusable.why))
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.contentState == nil)
            #expect(display.appliedCount == 0)
            #expect(display.ignoredCount == 1)
            #expect(display.lastIgnoredReason == why)
        }
    }

    @Test("An activity the user dismissed is not resurrected")
    func userDismissal() async throws {
        try await withEmulator { fixture in
            let t = fixture.clock.seconds
            _ = try await deliver([payload(timestamp: t)], fixture)
            #expect(fixture.emulator.dismissActivity(token: fixture.token))
            let verdicts = try await deliver([payload(timestamp: t + 1, contentState: ["eta": 1])], fixture)
            #expect(verdicts == [.ignored("dismissed")])
            #expect(fixture.emulator.display(token: fixture.token)?.contentState == ["eta": 5])
        }
    }

    @Test("The system ends an activity after 8 hours and removes it 4 hours later")
    func systemLimits() async throws {
        try await withEmulator { fixture in
            let started = fixture.clock.now
            _ = try await deliver([payload(timestamp: fixture.clock.seconds)], fixture)
            fixture.clock.advance(by: 8 * 3600 - 1)
            #expect(fixture.emulator.display(token: fixture.token)?.ended == false)
            fixture.clock.advance(by: 1)
            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.ended)
            #expect(display.endedAt == started + 8 * 3600)
            #expect(!display.dismissed)
            fixture.clock.advance(by: 4 * 3600)
            #expect(fixture.emulator.display(token: fixture.token)?.dismissed == true)
        }
    }
}
