import AsyncHTTPClient
import Foundation
import HTTPTypes
import LivelineCore
import LivelineTestSupport
import NIOCore
import NIOHTTP1
import Testing

@Suite("Webhooks across a kill -9 of a real serve --dev", .tags(.slow), .unlessSkippingSlowTests)
struct WebhookKillTests {
    @Test("every registration, update, end, dismissal and invalidation reaches the endpoint, signed, though the server was killed; /metrics shows the pushes")
    func noneLost() async throws {
        guard FileManager.default.isExecutableFile(atPath: livelineExecutable().path) else {
            Issue.record("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY")
            return
        }
        let root = uniqueTemporaryURL(prefix: "liveline-webhook-kill")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let (receiver, stopReceiver) = try await WebhookReceiver.start()
        var client = HTTPClient(eventLoopGroupProvider: .singleton)
        // A budget of 1 priority-10 push an hour: the first update an iPhone gets reaches the warning share.
        let environment = ["LIVELINE_BUDGET_HOURLY": "1", "LIVELINE_BUDGET_HOURLY_WITH_FREQUENT_PUSHES": "1"]
        var server = try await WalkthroughTests.Server.startListening(root: root, environment: environment)
        // The restart after the kill comes back on the same ports.
        let ports = server.ports
        do {
            #expect(try await waitFor(timeout: .seconds(60)) { server.exported("LIVELINE_PUBLISHABLE_KEY") != nil })
            let secretKey = try #require(server.exported("LIVELINE_SECRET_KEY"))
            let publishable = try #require(server.exported("LIVELINE_PUBLISHABLE_KEY"))
            #expect(try await waitFor(timeout: .seconds(30)) { (try? await WalkthroughTests.call(client, .GET, server.api + "/healthz"))?.status == 200 })
            let created = try await WalkthroughTests.call(client, .POST, server.api + "/v1/webhooks", key: secretKey, body: ["url": .string(receiver.url)])
            #expect(created.status == 201)
            let signingSecret = try #require(created.json.objectValue?["secret"]?.stringValue)

            // Two orders: an iPhone the emulator knows, and one whose token APNs refuses (invalidated); updates to both.
            func phase(_ range: ClosedRange<Int>) async throws {
                for order in range {
                    let known = try await WalkthroughTests.call(client, .POST, server.apnsControl + "/devices", body: ["bundleId": "com.example.liveline.demo"])
                    let token = try #require(known.json.objectValue?["token"]?.stringValue)
                    for (device, pushToken) in [("iphone-\(order)", token), ("stale-\(order)", String(repeating: "0f", count: 32))] {
                        let registered = try await WalkthroughTests.call(
                            client, .PUT, server.api + "/v1/activities/order-\(order)/instances/\(device)", key: publishable,
                            body: ["platform": "ios", "pushToken": .string(pushToken)]
                        )
                        #expect(registered.status == 201)
                    }
                    for step in 1...3 {
                        let update = try await WalkthroughTests.call(
                            client, .POST, server.api + "/v1/activities/order-\(order)/updates", key: secretKey,
                            body: ["contentState": ["step": .integer(Int64(step))]]
                        )
                        #expect(update.status == 202)
                    }
                }
            }
            try await phase(1...4)
            // kill -9 while the engine and the deliverer are at work.
            server.process.signal(SIGKILL)
            server.process.waitUntilExit()
            // A new client for the new process: one kept from before could send its next request on a keep-alive
            // connection to the killed one (CI once saw `remoteConnectionClosed` on the first call after the restart).
            try await client.shutdown()
            client = HTTPClient(eventLoopGroupProvider: .singleton)
            server = try WalkthroughTests.Server.start(root: root, ports: ports, environment: environment)
            #expect(try await waitFor(timeout: .seconds(60)) { (try? await WalkthroughTests.call(client, .GET, server.api + "/healthz"))?.status == 200 })
            try await phase(5...6)
            // The phones show the updates (pushed at priority 10, over the budget's warning share) before they go away.
            #expect(try await waitFor(timeout: .seconds(60)) {
                let warnings = try await WalkthroughTests.call(client, .GET, server.api + "/v1/events?types=budget.warning", key: secretKey)
                return !(warnings.json.objectValue?["data"]?.arrayValue ?? []).isEmpty
            })
            // The phone of order 6 gets a new token (rotated); the phones report a dismissal, or (order 6) the end.
            let rotated = try await WalkthroughTests.call(client, .POST, server.apnsControl + "/devices", body: ["bundleId": "com.example.liveline.demo"])
            let newToken = try #require(rotated.json.objectValue?["token"]?.stringValue)
            #expect(try await WalkthroughTests.call(
                client, .PUT, server.api + "/v1/activities/order-6/instances/iphone-6", key: publishable,
                body: ["platform": "ios", "pushToken": .string(newToken)]
            ).status == 200)
            for order in 1...6 {
                let reported = try await WalkthroughTests.call(
                    client, .POST, server.api + "/v1/activities/order-\(order)/instances/iphone-\(order)/events", key: publishable,
                    body: ["type": order == 6 ? "ended" : "dismissed"]
                )
                #expect(reported.status == 200)
                #expect(try await WalkthroughTests.call(client, .POST, server.api + "/v1/activities/order-\(order)/end", key: secretKey, body: [:]).status == 202)
            }

            // Every event of the feed reaches the endpoint (at least once), each signed with the webhook's secret.
            var feed: [String: String] = [:]
            #expect(try await waitFor(timeout: .seconds(120)) {
                feed = [:]
                var after: String?
                repeat {
                    let url = server.api + "/v1/events?limit=200" + (after.map { "&after=\($0)" } ?? "")
                    let page = try await WalkthroughTests.call(client, .GET, url, key: secretKey).json.objectValue
                    let items = page?["data"]?.arrayValue ?? []
                    for item in items {
                        if let id = item.objectValue?["id"]?.stringValue, let type = item.objectValue?["type"]?.stringValue { feed[id] = type }
                    }
                    after = items.isEmpty ? nil : page?["nextCursor"]?.stringValue
                } while after != nil
                let received = Set(receiver.received.compactMap { $0.headers[HTTPField.Name("webhook-id")!] })
                let types = Set(feed.values)
                return feed.count >= 6 * (2 + 1 + 2 + 2) && types.contains("budget.warning") && types.contains("instance.ended")
                    && Set(feed.keys).isSubset(of: received)
            })
            let types = Set(feed.values)
            for expected in [
                "instance.registered", "instance.token_rotated", "activity.started", "activity.updated", "activity.ended", "instance.dismissed",
                "instance.ended", "instance.invalidated", "budget.warning",
            ] {
                #expect(types.contains(expected), "no \(expected) event")
            }
            for message in receiver.received {
                let headers = message.headers
                #expect(try verifiedByPython(
                    secret: signingSecret, id: headers[HTTPField.Name("webhook-id")!] ?? "", timestamp: headers[HTTPField.Name("webhook-timestamp")!] ?? "",
                    body: message.body, signature: headers[HTTPField.Name("webhook-signature")!] ?? ""
                ))
            }

            // The operator sees the pushes and their outcomes.
            var request = HTTPClientRequest(url: server.api + "/metrics")
            request.method = .GET
            let metrics = String(buffer: try await client.execute(request, timeout: .seconds(10)).body.collect(upTo: 1 << 22))
            #expect(metrics.contains(#"liveline_pushes_total{"#))
            #expect(metrics.contains(#"status="delivered""#))
            #expect(metrics.contains(#"status="invalidated""#))
        } catch {
            Issue.record("\(error)\n\((try? String(contentsOf: server.output, encoding: .utf8)) ?? "")")
        }
        server.stop()
        try await client.shutdown()
        await stopReceiver()
    }
}
