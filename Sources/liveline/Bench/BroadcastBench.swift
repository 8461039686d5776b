import ArgumentParser
import AsyncHTTPClient
import Crypto
import Foundation
import LivelineCore
import LivelineEmulator
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

extension Bench {
    /// iOS 18 broadcast delivery on the real path: a `liveline serve` child process whose app pushes to the strict APNs
    /// emulator (running in this process), with its simulated phones.
    struct Broadcast: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "broadcast",
            abstract: "Time one update to a broadcast activity with many channel subscribers and some iOS 17 token instances.",
            discussion: """
                A `liveline serve` child process gets an app whose APNs credentials point at the strict APNs emulator \
                (in this process: its push listener, its channel management listener and its simulated phones). The \
                bench creates the activity with `"delivery": "broadcast"` through the API (Liveline creates its channel \
                at the emulator), subscribes --subscribers simulated iOS 18 Live Activities to the channel, and \
                registers --tokens iOS 17 instances with tokens of their own through the API. Then it posts --updates \
                updates, one at a time, and for each prints the APNs requests it caused (broadcasts and token pushes, \
                counted by the emulator) and the time from the POST until every subscriber and every token phone shows it.
                """
        )

        @Option(help: "Simulated iOS 18 Live Activities subscribed to the activity's channel.") var subscribers = 100_000
        @Option(help: "iOS 17 instances of the same activity, each with a token of its own, registered through the API.")
        var tokens = 10_000
        @Option(help: "Updates to post, one after another.") var updates = 3
        @Option(help: "HTTP/1.1 keep-alive connections for the registrations.") var connections = 16
        @OptionGroup var server: Bench.ServerOptions

        func validate() throws {
            guard subscribers >= 0, tokens >= 0, updates >= 1, connections >= 1 else {
                throw ValidationError("--subscribers and --tokens must not be negative; --updates and --connections must be positive.")
            }
            guard server.nodes == 1 else { throw ValidationError("bench broadcast runs one server: --nodes must be 1.") }
        }

        func run() async throws {
            let root = FileManager.default.temporaryDirectory.appendingPathComponent("liveline-bench-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: root) }
            BenchChildren.shared.removeOnInterrupt(root.path)
            var logger = Logger(label: "liveline.bench")
            logger.logLevel = .warning
            let emulator = try APNsEmulator(
                configuration: APNsEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path), logger: logger
            )
            let ports = try await emulator.start()
            do {
                try await measure(emulator: emulator, ports: ports, root: root)
            } catch {
                try? await emulator.shutdown()
                throw error
            }
            try await emulator.shutdown()
        }

        private func measure(emulator: APNsEmulator, ports: (apnsPort: Int, controlPort: Int), root: URL) async throws {
            guard let channelsPort = emulator.boundChannelsPort else { throw ServerUnderTest.Failure(description: "The emulator has no channel listener.") }
            let key = P256.Signing.PrivateKey()
            let bundleID = "com.example.bench"
            emulator.registerSigningKey(teamID: Bench.teamID, keyID: Bench.keyID, publicKey: key.publicKey)
            emulator.registerBundleID(bundleID)

            try await Bench.withServer(server, directory: root.appendingPathComponent("server")) { server in
                let app = try await server.createApp(name: "Bench", bundleID: bundleID)
                try await server.setAPNs(
                    appID: app.id, baseURL: "https://127.0.0.1:\(ports.apnsPort)", caCertificatePEM: emulator.caCertificatePEM, signingKey: key,
                    channelManagementBaseURL: "https://127.0.0.1:\(channelsPort)"
                )
                let http = HTTPClient(eventLoopGroupProvider: .singleton)
                defer { _ = http.shutdown() }
                let secret = "Bearer \(app.secretKey)"
                let activity = "bench-match"

                // The activity and its channel, through the API.
                let created = try await Self.post(
                    http, server.baseURL + BenchRequests.updatePath(activityID: activity), authorization: secret,
                    body: #"{"contentState": {"score": "0-0", "minute": 0}, "delivery": "broadcast"}"#
                )
                guard created.status == .accepted else {
                    throw ServerUnderTest.Failure(description: "The broadcast activity was refused: \(created.status) \(created.body)")
                }
                let read = try await Self.get(http, server.baseURL + "/v1/activities/\(activity)/channel", authorization: secret)
                guard let channelID = try JSONValue(parsing: read.body.utf8).objectValue?["channelId"]?.stringValue else {
                    throw ServerUnderTest.Failure(description: "No channel id: \(read.body)")
                }
                var remaining = subscribers
                while remaining > 0 {
                    let batch = min(remaining, 200_000)
                    guard emulator.addSubscribers(channelID: channelID, count: batch, attributesType: "MatchAttributes") != nil else {
                        throw ServerUnderTest.Failure(description: "The emulator does not know channel \(channelID).")
                    }
                    remaining -= batch
                }

                // iOS 17 phones: a device at the emulator, an instance registered through the API.
                let deviceTokens = (0..<tokens).map { _ in emulator.addDevice(bundleID: bundleID) }
                let load = try await HTTPLoad.connect(
                    host: "127.0.0.1", port: server.port, connections: connections, eventLoop: MultiThreadedEventLoopGroup.singleton.next()
                )
                let publishable = "Bearer \(app.publishableKey)"
                let registered = try await load.run(count: tokens) { index in
                    LoadRequest(
                        method: .PUT, uri: BenchRequests.registrationPath(activityID: activity, deviceID: "ios17-\(index)"),
                        authorization: publishable, body: BenchRequests.registrationBody(pushToken: deviceTokens[index])
                    )
                }
                await load.close()
                let allocator = Bench.allocator(process: server.pid)
                Bench.say(
                    "liveline bench broadcast: \(BenchRequests.grouped(subscribers)) channel subscribers (iOS 18), "
                        + "\(BenchRequests.grouped(tokens)) token instances (iOS 17) on one activity; server pid \(server.pid) (\(allocator))"
                )
                Bench.say("  token registrations   \(Bench.describe(registered, count: tokens))")
                // The creating update's pushes settle first (the token phones were registered after it and are caught up).
                _ = try await Self.waitUntil(seconds: 120) {
                    deviceTokens.allSatisfy { emulator.display(token: $0)?.contentState != nil }
                }

                for round in 1...updates {
                    let before = emulator.statistics
                    let shownBefore = Set(emulator.channel(id: channelID)?.subscribersByTimestamp.keys.map { $0 } ?? [])
                    let score = "\(round)-0"
                    let started = ContinuousClock.now
                    let accepted = try await Self.post(
                        http, server.baseURL + BenchRequests.updatePath(activityID: activity), authorization: secret,
                        body: #"{"contentState": {"score": "\#(score)", "minute": \#(round)}}"#
                    )
                    guard accepted.status == .accepted else {
                        throw ServerUnderTest.Failure(description: "Update \(round) was refused: \(accepted.status) \(accepted.body)")
                    }
                    let expected: JSONValue = ["score": .string(score), "minute": .integer(Int64(round))]
                    let channelShown = try await Self.waitUntil(seconds: 300) {
                        guard let detail = emulator.channel(id: channelID) else { return false }
                        // Every subscriber shows one timestamp, a new one: this update's.
                        guard detail.subscribersByTimestamp.count == 1, let shown = detail.subscribersByTimestamp.keys.first else { return false }
                        return shown != "none" && !shownBefore.contains(shown)
                    }.map { $0 - started }
                    let tokensShown = try await Self.waitUntil(seconds: 300) {
                        deviceTokens.allSatisfy { emulator.display(token: $0)?.contentState == expected }
                    }.map { $0 - started }
                    // Late requests (retries) are counted too: a moment for stragglers.
                    try await Task.sleep(for: .milliseconds(200))
                    let after = emulator.statistics
                    let broadcasts = after.broadcasts - before.broadcasts
                    let requests = after.totalRequests - before.totalRequests
                    Bench.say(
                        "  update \(round): APNs requests \(BenchRequests.grouped(requests)) (broadcasts \(broadcasts), token pushes "
                            + "\(BenchRequests.grouped(requests - broadcasts)))   every subscriber shows it "
                            + (channelShown.map { String(format: "%.3f s", $0.seconds) } ?? "not within 300 s")
                            + "   every token phone "
                            + (tokensShown.map { String(format: "%.3f s", $0.seconds) } ?? "not within 300 s")
                    )
                }
            }
        }

        /// Polls `condition` every 10 ms until it holds (returning when) or `seconds` pass (nil).
        static func waitUntil(seconds: Int, _ condition: () -> Bool) async throws -> ContinuousClock.Instant? {
            let deadline = ContinuousClock.now + .seconds(seconds)
            while ContinuousClock.now < deadline {
                if condition() { return ContinuousClock.now }
                try await Task.sleep(for: .milliseconds(10))
            }
            return condition() ? ContinuousClock.now : nil
        }

        static func post(_ http: HTTPClient, _ url: String, authorization: String, body: String) async throws -> (status: HTTPResponseStatus, body: String) {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "authorization", value: authorization)
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
            let response = try await http.execute(request, timeout: .seconds(60))
            return (response.status, String(buffer: try await response.body.collect(upTo: 1 << 20)))
        }

        static func get(_ http: HTTPClient, _ url: String, authorization: String) async throws -> (status: HTTPResponseStatus, body: String) {
            var request = HTTPClientRequest(url: url)
            request.headers.add(name: "authorization", value: authorization)
            let response = try await http.execute(request, timeout: .seconds(60))
            return (response.status, String(buffer: try await response.body.collect(upTo: 1 << 20)))
        }
    }
}
