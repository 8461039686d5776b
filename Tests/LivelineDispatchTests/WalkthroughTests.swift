import AsyncHTTPClient
import Foundation
import LivelineCore
import LivelineTestSupport
import NIOCore
import NIOHTTP1
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The README's walkthrough, as a new user runs it: the real `liveline serve --dev` (SQLite file, built-in emulators
/// whose simulated apps register with it), driven over HTTP only.
@Suite("The README walkthrough against a real serve --dev", .tags(.slow), .unlessSkippingSlowTests)
struct WalkthroughTests {
    /// A running `liveline serve --dev` and the ports it was given.
    typealias Server = ServeDevProcess

    struct Reply {
        var status: UInt
        var json: JSONValue
        var replayed: Bool
    }

    static func call(
        _ client: HTTPClient, _ method: HTTPMethod, _ url: String, key: String? = nil, body: JSONValue? = nil,
        headers extra: [(String, String)] = []
    ) async throws -> Reply {
        var request = HTTPClientRequest(url: url)
        request.method = method
        if let key { request.headers.add(name: "authorization", value: "Bearer \(key)") }
        for (name, value) in extra { request.headers.add(name: name, value: value) }
        if let body {
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body.encoded))
        }
        let response = try await client.execute(request, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 4 << 20)
        let json = bytes.readableBytes == 0 ? JSONValue.null : (try? JSONValue(parsing: bytes.readableBytesView)) ?? .null
        return Reply(status: response.status.code, json: json, replayed: response.headers.first(name: "idempotent-replayed") == "true")
    }

    @Test("register phones → start for a user → the phones show it, starting then active → update → end; a repeated start sends nothing; phones survive a restart")
    func walkthrough() async throws {
        guard FileManager.default.isExecutableFile(atPath: livelineExecutable().path) else {
            Issue.record("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY")
            return
        }
        let root = uniqueTemporaryURL(prefix: "liveline-walkthrough")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        var server = try await Server.startListening(root: root)
        // The restart below comes back on the same ports, as a user's would.
        let ports = server.ports
        do {
            #expect(try await waitFor(timeout: .seconds(60)) { server.exported("LIVELINE_PUBLISHABLE_KEY") != nil })
            let secret = try #require(server.exported("LIVELINE_SECRET_KEY"))
            #expect(try await waitFor(timeout: .seconds(30)) {
                let api = try? await Self.call(client, .GET, server.api + "/healthz")
                let fcm = try? await Self.call(client, .GET, server.fcmControl + "/healthz")
                return api?.status == 200 && fcm?.status == 200
            })

            // 1. Two simulated iPhones with a push-to-start token, one Android phone; their apps register themselves.
            for device in ["iphone-1", "iphone-2"] {
                let phone = try await Self.call(
                    client, .POST, server.apnsControl + "/phones",
                    body: ["deviceId": .string(device), "userId": "user-42", "attributesTypes": ["MatchAttributes"]]
                )
                #expect(phone.status == 201)
            }
            #expect(try await Self.call(client, .POST, server.fcmControl + "/devices", body: ["deviceId": "pixel-1", "userId": "user-42"]).status == 201)
            #expect(try await waitFor {
                try await Self.call(client, .GET, server.api + "/v1/devices?userId=user-42", key: secret).json.objectValue?["data"]?.arrayValue?.count == 3
            })

            // A push-to-start token rotates: the phone's app registers the new one; the start goes to it, not the old one.
            let before = try await Self.call(client, .GET, server.apnsControl + "/phones").json.objectValue?["phones"]?.arrayValue ?? []
            let rotating = try #require(before.first { $0.objectValue?["deviceId"] == "iphone-2" }?.objectValue)
            let oldToken = try #require(rotating["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.stringValue)
            let phoneID = try #require(rotating["id"]?.stringValue)
            #expect(try await Self.call(client, .POST, server.apnsControl + "/phones/\(phoneID)/push-to-start-tokens/MatchAttributes/rotate").status == 200)
            #expect(try await waitFor {
                let device = try await Self.call(client, .GET, server.api + "/v1/devices/iphone-2", key: secret).json.objectValue
                let token = device?["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.objectValue?["token"]?.stringValue
                return token != nil && token != oldToken
            })

            // 2. The backend starts match-42 for the user, with an idempotency key; the same request again sends nothing.
            let start: JSONValue = [
                "attributesType": "MatchAttributes", "attributes": ["home": "Lions", "away": "Tigers"],
                "contentState": ["home": 0, "away": 0, "minute": 1], "alert": ["title": "Kick-off", "body": "Lions – Tigers has started"],
                "audience": ["userIds": ["user-42"]],
            ]
            let started = try await Self.call(
                client, .POST, server.api + "/v1/activities/match-42/start", key: secret, body: start, headers: [("Idempotency-Key", "start-42")]
            )
            #expect(started.status == 202)
            #expect(started.json.objectValue?["counts"] == ["ios": 2, "android": 1, "skipped": 0])
            let again = try await Self.call(
                client, .POST, server.api + "/v1/activities/match-42/start", key: secret, body: start, headers: [("Idempotency-Key", "start-42")]
            )
            #expect(again.status == 202 && again.replayed)
            #expect(again.json == started.json)

            // 3. Each phone shows it and its app registered the activity's token: every instance is active.
            #expect(try await waitFor {
                let activity = try await Self.call(client, .GET, server.api + "/v1/activities/match-42", key: secret).json.objectValue
                return activity?["instances"]?.objectValue?["active"] == .integer(3)
            })
            let phones = try await Self.call(client, .GET, server.apnsControl + "/phones").json.objectValue?["phones"]?.arrayValue ?? []
            #expect(phones.count == 2)
            for phone in phones {
                let activities = phone.objectValue?["activities"]?.arrayValue ?? []
                #expect(activities.count == 1)
                #expect(activities.first?.objectValue?["state"]?.objectValue?["contentState"] == ["home": 0, "away": 0, "minute": 1])
                // Exactly one start reached each push-to-start token, whatever the repeated POST.
                let startToken = phone.objectValue?["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.stringValue ?? ""
                let pushes = try await Self.call(client, .GET, server.apnsControl + "/pushes?token=\(startToken)").json
                #expect(pushes.objectValue?["pushes"]?.arrayValue?.count == 1, "\(pushes)")
            }

            let oldPushes = try await Self.call(client, .GET, server.apnsControl + "/pushes?token=\(oldToken)").json
            #expect(oldPushes.objectValue?["pushes"]?.arrayValue?.isEmpty == true, "\(oldPushes)")

            // 4. Update, then end: all three phones follow.
            #expect(try await Self.call(
                client, .POST, server.api + "/v1/activities/match-42/updates", key: secret, body: ["contentState": ["home": 1, "away": 0, "minute": 23]]
            ).status == 202)
            #expect(try await Self.call(
                client, .POST, server.api + "/v1/activities/match-42/end", key: secret, body: ["contentState": ["home": 2, "away": 1, "minute": 90]]
            ).status == 202)
            #expect(try await waitFor {
                let phones = try await Self.call(client, .GET, server.apnsControl + "/phones").json.objectValue?["phones"]?.arrayValue ?? []
                let iphonesEnded = phones.allSatisfy { phone in
                    phone.objectValue?["activities"]?.arrayValue?.first?.objectValue?["state"]?.objectValue?["ended"] == true
                }
                let android = try await Self.call(client, .GET, server.fcmControl + "/devices").json.objectValue?["devices"]?.arrayValue?.first
                let notification = android?.objectValue?["notifications"]?.arrayValue?.first?.objectValue
                return iphonesEnded && notification?["ended"] == true && notification?["contentState"] == ["home": 2, "away": 1, "minute": 90]
            })

            // Stop it, start it again: the simulated phones are still there.
            server.stop()
            server = try Server.start(root: root, ports: ports)
            #expect(try await waitFor(timeout: .seconds(60)) {
                let phones = try? await Self.call(client, .GET, server.apnsControl + "/phones").json.objectValue?["phones"]?.arrayValue
                return phones?.count == 2
            })
        } catch {
            Issue.record("\(error)\n\((try? String(contentsOf: server.output, encoding: .utf8)) ?? "")")
        }
        server.stop()
        try await client.shutdown()
    }

    @Test("broadcast: an iOS 18 phone starts into the channel and registers it, an iOS 17 phone keeps a token, 1,000 more subscribers; one update is one broadcast")
    func broadcast() async throws {
        guard FileManager.default.isExecutableFile(atPath: livelineExecutable().path) else {
            Issue.record("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY")
            return
        }
        let root = uniqueTemporaryURL(prefix: "liveline-walkthrough-broadcast")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        let server = try await Server.startListening(root: root)
        do {
            #expect(try await waitFor(timeout: .seconds(60)) { server.exported("LIVELINE_PUBLISHABLE_KEY") != nil })
            let secret = try #require(server.exported("LIVELINE_SECRET_KEY"))
            let publishable = try #require(server.exported("LIVELINE_PUBLISHABLE_KEY"))
            #expect(try await waitFor(timeout: .seconds(30)) { (try? await Self.call(client, .GET, server.api + "/healthz"))?.status == 200 })
            for (device, version) in [("iphone-18", "18.1"), ("iphone-17", "17.5")] {
                let phone = try await Self.call(
                    client, .POST, server.apnsControl + "/phones",
                    body: ["deviceId": .string(device), "userId": "fan-1", "attributesTypes": ["MatchAttributes"], "osVersion": .string(version)]
                )
                #expect(phone.status == 201)
            }
            #expect(try await waitFor {
                try await Self.call(client, .GET, server.api + "/v1/devices?userId=fan-1", key: secret).json.objectValue?["data"]?.arrayValue?.count == 2
            })

            let start: JSONValue = [
                "attributesType": "MatchAttributes", "attributes": ["home": "Lions", "away": "Tigers"],
                "contentState": ["home": 0, "away": 0], "alert": ["title": "Kick-off", "body": "Lions – Tigers"],
                "audience": ["userIds": ["fan-1"]], "delivery": "broadcast",
            ]
            #expect(try await Self.call(client, .POST, server.api + "/v1/activities/final/start", key: secret, body: start).status == 202)
            let channel = try await Self.call(client, .GET, server.api + "/v1/activities/final/channel", key: publishable)
            #expect(channel.status == 200)
            let channelID = try #require(channel.json.objectValue?["channelId"]?.stringValue)
            // Both phones start it and their apps register: the iOS 18 one its channel, the iOS 17 one its token.
            #expect(try await waitFor {
                let activity = try await Self.call(client, .GET, server.api + "/v1/activities/final", key: secret).json.objectValue
                return activity?["instances"]?.objectValue?["active"] == 2
            })
            let instances = try await Self.call(client, .GET, server.api + "/v1/activities/final/instances", key: secret).json
            let byDevice = Dictionary(
                uniqueKeysWithValues: (instances.objectValue?["data"]?.arrayValue ?? []).compactMap { item -> (String, JSONValue)? in
                    item.objectValue?["deviceId"]?.stringValue.map { ($0, item) }
                }
            )
            #expect(byDevice["iphone-18"]?.objectValue?["channelId"] == .string(channelID))
            #expect(byDevice["iphone-17"]?.objectValue?["channelId"] == .null)

            let encoded = channelID.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? channelID
            #expect(try await Self.call(client, .POST, server.apnsControl + "/channels/\(encoded)/subscribers", body: ["count": 1000]).status == 201)
            // The start's pushes settle first (an iPhone that registers its token before the engine recorded its start
            // is caught up once more, and ignores it): the request count stops moving.
            var before = try await Self.call(client, .GET, server.apnsControl + "/statistics").json.objectValue
            while true {
                try await Task.sleep(for: .milliseconds(500))
                let now = try await Self.call(client, .GET, server.apnsControl + "/statistics").json.objectValue
                if now?["totalRequests"] == before?["totalRequests"] { break }
                before = now
            }
            #expect(try await Self.call(
                client, .POST, server.api + "/v1/activities/final/updates", key: secret, body: ["contentState": ["home": 1, "away": 0]]
            ).status == 202)
            #expect(try await waitFor {
                let detail = try await Self.call(client, .GET, server.apnsControl + "/channels/\(encoded)").json.objectValue
                let shown = detail?["subscribersByTimestamp"]?.objectValue ?? [:]
                return detail?["subscribers"] == 1001 && shown.count == 1 && shown["none"] == nil
            })
            #expect(try await waitFor {
                let phones = try await Self.call(client, .GET, server.apnsControl + "/phones").json.objectValue?["phones"]?.arrayValue ?? []
                return phones.allSatisfy { phone in
                    phone.objectValue?["activities"]?.arrayValue?.first?.objectValue?["state"]?.objectValue?["contentState"] == ["home": 1, "away": 0]
                }
            })
            let after = try await Self.call(client, .GET, server.apnsControl + "/statistics").json.objectValue
            // One broadcast for the 1,001 subscribers, one push for the iOS 17 phone's token.
            func count(_ stats: [String: JSONValue]?, _ key: String) -> Int64 {
                if case .integer(let value) = stats?[key] { return value }
                return -1
            }
            #expect(count(after, "broadcasts") == count(before, "broadcasts") + 1)
            #expect(count(after, "totalRequests") == count(before, "totalRequests") + 2)
            let timeline = try await Self.call(client, .GET, server.api + "/v1/activities/final/deliveries", key: secret).json
            #expect((timeline.objectValue?["data"]?.arrayValue ?? []).contains { $0.objectValue?["channelId"] == .string(channelID) })
        } catch {
            Issue.record("\(error)\n\((try? String(contentsOf: server.output, encoding: .utf8)) ?? "")")
        }
        server.stop()
        try await client.shutdown()
    }
}
