import AsyncHTTPClient
import Foundation
import LivelineCore
import LivelineTestSupport
import NIOCore
import NIOHTTP1
import Testing

@testable import LivelineKit

#if canImport(Glibc)
import Glibc
#endif

/// A Live Activity the test builds from what the simulated iPhone shows: its update tokens and states are fed by the
/// test, as ActivityKit would feed them to the app.
struct PhoneActivity: LivelineTrackableActivity {
    var livelineActivityID: String
    var attributesTypeName: String
    var pushTokenUpdates: AsyncStream<Data>
    var activityStateUpdates: AsyncStream<LivelineActivityState>
}

/// The issue's "done when": LivelineKit as the app on a simulated iPhone, against a real `liveline serve --dev`.
@Suite("LivelineKit against a real serve --dev", .tags(.slow), .unlessSkippingSlowTests)
struct KitEndToEndTests {
    typealias Server = ServeDevProcess

    static func call(_ client: HTTPClient, _ method: HTTPMethod, _ url: String, key: String? = nil, body: JSONValue? = nil) async throws -> (
        status: UInt, json: JSONValue
    ) {
        var request = HTTPClientRequest(url: url)
        request.method = method
        if let key { request.headers.add(name: "authorization", value: "Bearer \(key)") }
        if let body {
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body.encoded))
        }
        let response = try await client.execute(request, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 4 << 20)
        let json = bytes.readableBytes == 0 ? JSONValue.null : (try? JSONValue(parsing: bytes.readableBytesView)) ?? .null
        return (response.status.code, json)
    }

    /// Polls `condition` every 200 ms until it holds or `seconds` pass.
    static func waitFor(_ seconds: Double = 30, _ condition: () async throws -> Bool) async throws -> Bool {
        let deadline = Date() + seconds
        while Date() < deadline {
            if try await condition() { return true }
            try await Task.sleep(nanoseconds: 200_000_000)
        }
        return try await condition()
    }

    static func data(hex: String) -> Data {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16) ?? 0)
            index = next
        }
        return Data(bytes)
    }

    @Test("register device and push-to-start token → remote start → track registers the update token → offline, the token rotates twice → back online, the newest token is registered → the update reaches it; dismissed is reported")
    func remoteStartRotationOffline() async throws {
        guard FileManager.default.isExecutableFile(atPath: livelineExecutable().path) else {
            Issue.record("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY")
            return
        }
        let root = uniqueTemporaryURL(prefix: "livelinekit-e2e")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let server = try await Server.startListening(root: root)
        var relay: TCPRelay?
        do {
            #expect(try await Self.waitFor(60) { server.exported("LIVELINE_PUBLISHABLE_KEY") != nil })
            let secret = try #require(server.exported("LIVELINE_SECRET_KEY"))
            let publishable = try #require(server.exported("LIVELINE_PUBLISHABLE_KEY"))
            // As long as for the keys: on a crowded machine (CI runs many tests side by side) a debug build's first
            // answers can take that long.
            #expect(try await Self.waitFor(60) { (try? await Self.call(http, .GET, server.api + "/healthz"))?.status == 200 })
            let apns = server.apnsControl

            // A simulated iPhone whose own app does not register: only LivelineKit talks to Liveline.
            let created = try await Self.call(
                http, .POST, apns + "/phones",
                body: ["id": "kit-phone", "deviceId": "kit-device", "userId": "kit-user", "attributesTypes": ["MatchAttributes"], "registerWith": .null]
            )
            #expect(created.status == 201)
            let phone = try await Self.call(http, .GET, apns + "/phones/kit-phone").json
            let pushToStartToken = try #require(phone.objectValue?["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.stringValue)

            // LivelineKit, reaching the server through a relay the test can cut.
            let liveRelay = try await TCPRelay.start(targetPort: server.apiPort)
            relay = liveRelay
            let configuration = LivelineConfiguration(
                serverURL: URL(string: "http://127.0.0.1:\(liveRelay.port)")!, publishableKey: publishable, deviceID: "kit-device",
                storageDirectory: root.appendingPathComponent("kit"), retry: LivelineRetryPolicy(initialDelay: 0.2, maximumDelay: 1)
            )
            let kit = try LivelineClient(configuration: configuration)
            let events = await kit.events()
            await kit.registerDevice(userID: "kit-user", locale: "en-US")
            await kit.setPushToStartToken(Self.data(hex: pushToStartToken), attributesType: "MatchAttributes")
            #expect(try await Self.waitFor {
                let device = try await Self.call(http, .GET, server.api + "/v1/devices/kit-device", key: secret).json.objectValue
                return device?["userId"] == "kit-user"
                    && device?["pushToStartTokens"]?.objectValue?["MatchAttributes"]?.objectValue?["token"] == .string(pushToStartToken)
            })

            // The backend starts the activity remotely; the phone shows it with its own update token.
            let start: JSONValue = [
                "attributesType": "MatchAttributes", "attributes": ["home": "Lions", "away": "Tigers"],
                "contentState": ["home": 0, "away": 0], "alert": ["title": "Kick-off", "body": "Lions – Tigers"],
                "audience": ["userIds": ["kit-user"]],
            ]
            let started = try await Self.call(http, .POST, server.api + "/v1/activities/kit-match/start", key: secret, body: start)
            #expect(started.status == 202)
            #expect(started.json.objectValue?["counts"]?.objectValue?["ios"] == 1)
            var firstToken = ""
            #expect(try await Self.waitFor {
                let activity = try await Self.call(http, .GET, apns + "/phones/kit-phone").json.objectValue?["activities"]?.arrayValue?.first
                firstToken = activity?.objectValue?["updateToken"]?.stringValue ?? ""
                return activity?.objectValue?["activityId"] == "kit-match" && !firstToken.isEmpty
            })

            // The app tracks the Live Activity: its update token reaches Liveline through LivelineKit.
            let (tokens, tokenInput) = AsyncStream.makeStream(of: Data.self)
            let (states, stateInput) = AsyncStream.makeStream(of: LivelineActivityState.self)
            let tracking = Task {
                await kit.track(
                    PhoneActivity(livelineActivityID: "kit-match", attributesTypeName: "MatchAttributes", pushTokenUpdates: tokens, activityStateUpdates: states)
                )
            }
            tokenInput.yield(Self.data(hex: firstToken))
            stateInput.yield(.active)
            #expect(try await Self.waitFor {
                let activity = try await Self.call(http, .GET, server.api + "/v1/activities/kit-match", key: secret).json.objectValue
                return activity?["instances"]?.objectValue?["active"] == 1
            })
            // Let the start's pushes settle (the emulator's request count stops moving) before the token changes.
            var before = try await Self.call(http, .GET, apns + "/statistics").json.objectValue?["totalRequests"]
            while true {
                try await Task.sleep(nanoseconds: 500_000_000)
                let now = try await Self.call(http, .GET, apns + "/statistics").json.objectValue?["totalRequests"]
                if now == before { break }
                before = now
            }

            // Offline. The token rotates twice; LivelineKit's registration fails and waits in the outbox.
            liveRelay.cut()
            var newest = firstToken
            for _ in 0..<2 {
                let rotated = try await Self.call(http, .POST, apns + "/phones/kit-phone/activities/kit-match/rotate-token")
                #expect(rotated.status == 200)
                newest = try #require(rotated.json.objectValue?["activities"]?.arrayValue?.first?.objectValue?["updateToken"]?.stringValue)
                tokenInput.yield(Self.data(hex: newest))
            }
            #expect(newest != firstToken)
            let expectedToken = newest
            let waitsOffline = try await Self.waitFor {
                let waiting = await kit.pendingOperations()
                return waiting.count == 1 && waiting[0].attempts >= 1
                    && waiting[0].kind == .registerActivity(activityID: "kit-match", attributesType: "MatchAttributes", pushToken: expectedToken)
            }
            let stillWaiting = await kit.pendingOperations()
            try #require(waitsOffline, "\(stillWaiting)")
            // It failed and said so (the events before it are the earlier sends).
            var sawRetry = false
            var iterator = events.makeAsyncIterator()
            while let event = await iterator.next() {
                if case .willRetry(let operation, _, _) = event, operation.key == .activity("kit-match") {
                    sawRetry = true
                    break
                }
            }
            #expect(sawRetry)
            // The server still holds the first token.
            let instancesURL = server.api + "/v1/activities/kit-match/instances"
            let offlineInstance = try await Self.call(http, .GET, instancesURL, key: secret).json.objectValue?["data"]?.arrayValue?.first
            #expect(offlineInstance?.objectValue?["pushToken"] == .string(firstToken))

            // Online again: the retry registers the newest token.
            liveRelay.restore()
            #expect(try await Self.waitFor { await kit.pendingOperations().isEmpty })
            let instance = try await Self.call(http, .GET, instancesURL, key: secret).json.objectValue?["data"]?.arrayValue?.first?.objectValue
            #expect(instance?["pushToken"] == .string(expectedToken))
            #expect(instance?["state"] == "active")

            // The backend's update reaches the phone at the newest token.
            let update = try await Self.call(
                http, .POST, server.api + "/v1/activities/kit-match/updates", key: secret, body: ["contentState": ["home": 1, "away": 0]]
            )
            #expect(update.status == 202)
            #expect(try await Self.waitFor {
                let shown = try await Self.call(http, .GET, apns + "/devices/\(expectedToken)").json.objectValue
                return shown?["contentState"] == ["home": 1, "away": 0]
            })
            let shownOnPhone = try await Self.call(http, .GET, apns + "/phones/kit-phone").json.objectValue?["activities"]?.arrayValue?.first?.objectValue
            #expect(shownOnPhone?["updateToken"] == .string(expectedToken))
            #expect(shownOnPhone?["state"]?.objectValue?["contentState"] == ["home": 1, "away": 0])

            // The person dismisses it: LivelineKit reports it and the server shows it.
            stateInput.yield(.dismissed)
            await tracking.value
            #expect(try await Self.waitFor {
                let activity = try await Self.call(http, .GET, server.api + "/v1/activities/kit-match", key: secret).json.objectValue
                return activity?["instances"]?.objectValue?["dismissed"] == 1
            })
            // The server commits the report before LivelineKit reads its answer: the outbox empties a moment later.
            #expect(try await Self.waitFor { await kit.pendingOperations().isEmpty })
            tokenInput.finish()
            stateInput.finish()
        } catch {
            Issue.record("\(error)\n\((try? String(contentsOf: server.output, encoding: .utf8)) ?? "")")
        }
        await relay?.close()
        server.stop()
        try await http.shutdown()
    }
}
