import Foundation
import HTTPTypes
import LivelineCore
import LivelineDispatch
import Testing

@testable import liveline

/// The bodies `liveline push` sends, from its flags.
@Suite struct PushRequestTests {
    func start(devices: [String] = [], users: [String] = [], tags: [String] = [], all: Bool = false) throws -> JSONValue {
        try PushRequests.start(
            attributesType: "MatchAttributes", attributes: #"{"home": "Lions"}"#, contentState: #"{"minute": 1}"#,
            alertTitle: "Kick-off", alertBody: "It has started", devices: devices, users: users, tags: tags, all: all
        )
    }

    @Test func startForUsers() throws {
        let body = try start(users: ["user-1", "user-2"])
        #expect(body.objectValue?["audience"] == .object(["userIds": ["user-1", "user-2"]]))
        #expect(body.objectValue?["attributes"] == .object(["home": "Lions"]))
        #expect(body.objectValue?["alert"] == .object(["title": "Kick-off", "body": "It has started"]))
        #expect(body.objectValue?["attributesType"] == "MatchAttributes")
    }

    @Test func startForTagsAndAll() throws {
        #expect(try start(tags: ["team:lions", "tier:gold:plus"]).objectValue?["audience"]
            == .object(["tags": .object(["team": "lions", "tier": "gold:plus"])]))
        #expect(try start(all: true).objectValue?["audience"] == .object(["all": true]))
        #expect(try start(devices: ["d1"]).objectValue?["audience"] == .object(["deviceIds": ["d1"]]))
    }

    @Test func exactlyOneAudience() {
        #expect(throws: (any Error).self) { try start() }
        #expect(throws: (any Error).self) { try start(devices: ["d1"], all: true) }
        #expect(throws: (any Error).self) { try start(tags: ["no-colon"]) }
    }

    @Test func jsonFlagsMustBeObjects() {
        #expect(throws: (any Error).self) {
            try PushRequests.start(
                attributesType: "T", attributes: "[1]", contentState: "{}", alertTitle: "a", alertBody: "b", devices: [], users: [],
                tags: [], all: true
            )
        }
        #expect(throws: (any Error).self) { try PushRequests.alert(title: "only a title", body: nil) }
    }
}

@Suite("liveline webhooks listen")
struct WebhooksListenTests {
    @Test("a delivery signed with the secret is printed with its event; anything else is refused with the reason")
    func describe() throws {
        let secret = StandardWebhooks.newSecret()
        let key = try #require(StandardWebhooks.key(of: secret))
        let body = Array(#"{"id":"evt_1","type":"activity.ended","activityId":"order-1","deviceId":null,"data":{"endReason":"caller"}}"#.utf8)
        let now = Date()
        let timestamp = Int64(now.timeIntervalSince1970)
        var headers = HTTPFields()
        headers[HTTPField.Name("webhook-id")!] = "evt_1"
        headers[HTTPField.Name("webhook-timestamp")!] = String(timestamp)
        headers[HTTPField.Name("webhook-signature")!] = StandardWebhooks.signature(key: key, id: "evt_1", timestamp: timestamp, body: body)
        let good = WebhooksCommand.Listen.describe(key: key, headers: headers, body: body, now: now)
        #expect(good.verified)
        #expect(good.text == #"✔ activity.ended  evt_1  activity=order-1  {"endReason":"caller"}"#)
        let tampered = WebhooksCommand.Listen.describe(key: key, headers: headers, body: body + [32], now: now)
        #expect(!tampered.verified)
        let stale = WebhooksCommand.Listen.describe(key: key, headers: headers, body: body, now: now.addingTimeInterval(600))
        #expect(!stale.verified)
        #expect(!WebhooksCommand.Listen.describe(key: key, headers: HTTPFields(), body: body, now: now).verified)
    }
}
