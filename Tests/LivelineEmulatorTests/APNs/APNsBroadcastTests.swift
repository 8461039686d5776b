import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

extension EmulatorFixture {
    var channelsPort: Int { emulator.boundChannelsPort ?? -1 }

    func connectChannels() async throws -> HTTP2TestConnection {
        try await HTTP2TestConnection.connect(port: channelsPort, caPEM: emulator.caCertificatePEM)
    }

    /// A channel management request, as Apple's "Sending channel management requests to APNs" shows them.
    func manage(
        _ method: String, _ path: String? = nil, channelID: String? = nil, body: [UInt8]? = nil, extra: [(String, String)] = []
    ) -> TestRequest {
        var headers = [("authorization", "bearer \(providerToken)")]
        if let channelID { headers.append(("apns-channel-id", channelID)) }
        return TestRequest(
            method: method, path: path ?? "/1/apps/\(bundleID)/channels", headers: headers + extra, body: body
        )
    }

    /// A broadcast request, as Apple's "Sending broadcast push notification requests to APNs" shows them.
    func broadcast(
        _ payload: [UInt8], channelID: String?, bundleID: String? = nil, _ changes: [String: String?] = [:]
    ) -> TestRequest {
        var headers: [(String, String)] = [
            ("authorization", "bearer \(providerToken)"), ("apns-push-type", "liveactivity"), ("apns-priority", "10"),
        ]
        if let channelID { headers.append(("apns-channel-id", channelID)) }
        for (name, value) in changes {
            headers.removeAll { $0.0 == name }
            if let value { headers.append((name, value)) }
        }
        return TestRequest(path: "/4/broadcasts/apps/\(bundleID ?? self.bundleID)", headers: headers, body: payload)
    }
}

func createBody(policy: JSONValue = 0, pushType: JSONValue = "LiveActivity") -> [UInt8] {
    JSONValue.object(["message-storage-policy": policy, "push-type": pushType]).encoded
}

/// iOS 18 broadcast channels: the channel management listener, the broadcast endpoint and subscribed activities.
@Suite("APNs broadcast channels")
struct APNsBroadcastTests {
    // MARK: Pure rules

    @Test("Channel management routes: 404 BadPath for an unknown path, 405 MethodNotAllowed for a wrong method")
    func routes() throws {
        #expect(try ChannelManagement.route(method: "POST", path: "/1/apps/com.a/channels") == .create(bundleID: "com.a"))
        #expect(try ChannelManagement.route(method: "GET", path: "/1/apps/com.a/channels") == .read(bundleID: "com.a"))
        #expect(try ChannelManagement.route(method: "DELETE", path: "/1/apps/com.a/channels") == .delete(bundleID: "com.a"))
        #expect(try ChannelManagement.route(method: "GET", path: "/1/apps/com.a/all-channels") == .list(bundleID: "com.a"))
        let cases: [(String, String, Int, String)] = [
            ("PUT", "/1/apps/com.a/channels", 405, "MethodNotAllowed"),
            ("POST", "/1/apps/com.a/all-channels", 405, "MethodNotAllowed"),
            ("POST", "/3/device/abcd", 404, "BadPath"),
            ("POST", "/4/broadcasts/apps/com.a", 404, "BadPath"),
            ("GET", "/1/apps//channels", 404, "BadPath"),
            ("GET", "/1/apps/com.a/channels/extra", 404, "BadPath"),
        ]
        for (method, path, status, reason) in cases {
            #expect(throws: APNsEmulatorCore.Rejection.self) { try ChannelManagement.route(method: method, path: path) }
            do {
                _ = try ChannelManagement.route(method: method, path: path)
            } catch {
                #expect(error.status == status && error.reason == reason, "\(method) \(path)")
            }
        }
        #expect(ChannelManagement.isBase64(ChannelManagement.newChannelID()))
        #expect(!ChannelManagement.isBase64("not base64!"))
        #expect(!ChannelManagement.isBase64(""))
        #expect(BroadcastRules.bundleID(path: "/4/broadcasts/apps/com.a") == "com.a")
        #expect(BroadcastRules.bundleID(path: "/4/broadcasts/apps/") == nil)
        #expect(BroadcastRules.bundleID(path: "/3/device/ab") == nil)
    }

    @Test("Create bodies: policy 0 or 1, push-type LiveActivity")
    func createBodies() throws {
        #expect(try ChannelManagement.storagePolicy(fromCreateBody: createBody(policy: 1), length: 10) == 1)
        let cases: [([UInt8], String)] = [
            ([], "PayloadEmpty"), (Array("nope".utf8), "BadPayload"), (createBody(policy: 2), "BadMessageStoragePolicy"),
            (createBody(policy: "0"), "BadMessageStoragePolicy"), (createBody(pushType: "liveactivity"), "InvalidPushType"),
            (createBody(pushType: "Alert"), "InvalidPushType"),
        ]
        for (body, reason) in cases {
            do {
                _ = try ChannelManagement.storagePolicy(fromCreateBody: body, length: body.count)
                Issue.record("accepted \(String(decoding: body, as: UTF8.self))")
            } catch {
                #expect(error.status == 400 && error.reason == reason)
            }
        }
    }

    @Test("Broadcast header checks, in order, without sockets")
    func broadcastRules() throws {
        let channel = BroadcastChannel(id: "c29tZUNoYW5uZWw=", bundleID: "com.a", storagePolicy: 0, createdAt: Date(), order: 0)
        func check(
            _ headers: [(String, String)], channel: BroadcastChannel? = channel, bundleID: String = "com.a", length: Int = 10
        ) -> (Int, String)? {
            let parsed = RequestHeaders(headers.map { ReceivedPush.Header(name: $0.0, value: $0.1) })
            do {
                _ = try BroadcastRules.check(parsed, bundleID: bundleID, bundleRegistered: true, channel: channel, bodyLength: length)
                return nil
            } catch {
                return (error.status, error.reason)
            }
        }
        let good = [("apns-push-type", "liveactivity"), ("apns-channel-id", channel.id)]
        #expect(check(good) == nil)
        #expect(check(good + [("apns-priority", "1")]) == nil)
        #expect(check(good + [("apns-expiration", "0")]) == nil)
        #expect(check([("apns-push-type", "alert"), ("apns-channel-id", channel.id)])! == (400, "InvalidPushType"))
        #expect(check([("apns-channel-id", channel.id)])! == (400, "MissingPushType"))
        #expect(check([("apns-push-type", "liveactivity")])! == (400, "MissingChannelId"))
        #expect(check([("apns-push-type", "liveactivity"), ("apns-channel-id", "%%%")])! == (400, "BadChannelId"))
        #expect(check(good, channel: nil)! == (400, "ChannelNotRegistered"))
        var deleted = channel
        deleted.deleted = true
        #expect(check(good, channel: deleted)! == (400, "ChannelNotRegistered"))
        #expect(check(good, bundleID: "com.b")! == (403, "TopicMismatch"))
        #expect(check(good + [("apns-priority", "7")])! == (400, "BadPriority"))
        #expect(check(good + [("apns-expiration", "1900000000")])! == (400, "BadExpirationDate"))
        #expect(check(good + [("apns-expiration", "soon")])! == (400, "BadExpirationDate"))
        var stored = channel
        stored.storagePolicy = 1
        #expect(check(good + [("apns-expiration", "1900000000")], channel: stored) == nil)
        #expect(check(good + [("apns-request-id", "nope")])! == (400, "BadMessageId"))
        #expect(check(good, length: 0)! == (400, "PayloadEmpty"))
        #expect(check(good, length: 5120) == nil)
        #expect(check(good, length: 5121)! == (413, "PayloadTooLarge"))
        #expect(check(good + [("apns-channel-id", channel.id)])! == (400, "DuplicateHeaders"))
    }

    // MARK: Channel management over HTTP/2

    @Test("Create, read, list and delete a channel; apns-request-id is echoed, or made when absent")
    func manageChannels() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connectChannels()
            let requestID = "6a1b8c3e-1f2d-4e5a-9b7c-0d1e2f3a4b5c"
            let created = try await connection.send(
                fixture.manage("POST", body: createBody(policy: 1), extra: [("apns-request-id", requestID)])
            )
            #expect(created.status == 201)
            #expect(created.header("apns-request-id") == requestID)
            let id = try #require(created.header("apns-channel-id"))
            #expect(ChannelManagement.isBase64(id))
            let second = try await connection.send(fixture.manage("POST", body: createBody(policy: 0)))
            #expect(second.status == 201)
            let generated = try #require(second.header("apns-request-id"))
            #expect(RequestHeaders.isUUID(generated))
            let secondID = try #require(second.header("apns-channel-id"))

            let read = try await connection.send(fixture.manage("GET", channelID: id))
            #expect(read.status == 200)
            #expect(read.json == ["message-storage-policy": 1, "push-type": "LiveActivity"])
            let list = try await connection.send(fixture.manage("GET", "/1/apps/\(fixture.bundleID)/all-channels"))
            #expect(list.status == 200)
            #expect(list.json == ["channels": [.string(id), .string(secondID)]])

            let deleted = try await connection.send(fixture.manage("DELETE", channelID: id))
            #expect(deleted.status == 204)
            #expect(deleted.body.isEmpty)
            #expect(try await connection.send(fixture.manage("GET", channelID: id)).reason == "ChannelNotRegistered")
            #expect(try await connection.send(fixture.manage("DELETE", channelID: id)).reason == "ChannelNotRegistered")
            let after = try await connection.send(fixture.manage("GET", "/1/apps/\(fixture.bundleID)/all-channels"))
            #expect(after.json == ["channels": [.string(secondID)]])
            #expect(fixture.emulator.channels().map(\.channelID) == [secondID])
            #expect(fixture.emulator.statistics.channelManagementRequests == 8)
            await connection.close()
        }
    }

    @Test("Channel management errors: Apple's statuses and reasons")
    func managementErrors() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connectChannels()
            let id = try #require(try await connection.send(fixture.manage("POST", body: createBody())).header("apns-channel-id"))
            let cases: [(TestRequest, Int, String)] = [
                (fixture.manage("GET"), 400, "MissingChannelId"),
                (fixture.manage("DELETE"), 400, "MissingChannelId"),
                (fixture.manage("GET", channelID: "***"), 400, "BadChannelId"),
                (fixture.manage("GET", channelID: ChannelManagement.newChannelID()), 400, "ChannelNotRegistered"),
                (fixture.manage("GET", "/1/apps/com.example.other/channels", channelID: id), 400, "FeatureNotEnabled"),
                (fixture.manage("POST", body: createBody(policy: 3)), 400, "BadMessageStoragePolicy"),
                (fixture.manage("POST", body: createBody(pushType: "Alert")), 400, "InvalidPushType"),
                (fixture.manage("POST"), 400, "PayloadEmpty"),
                (fixture.manage("PUT"), 405, "MethodNotAllowed"),
                (fixture.manage("GET", "/1/apps/\(fixture.bundleID)/nothing"), 404, "BadPath"),
                (fixture.push(payload(timestamp: fixture.clock.seconds)), 404, "BadPath"),
                (fixture.broadcast(payload(timestamp: fixture.clock.seconds), channelID: id), 404, "BadPath"),
                (
                    TestRequest(method: "GET", path: "/1/apps/\(fixture.bundleID)/all-channels", headers: []), 403,
                    "MissingProviderToken"
                ),
            ]
            for (request, status, reason) in cases {
                let response = try await connection.send(request)
                #expect(response.status == status && response.reason == reason, "\(request.method) \(request.path)")
                #expect(response.header("apns-request-id") != nil)
            }
            // A channel of another app is not registered for this one.
            fixture.emulator.registerBundleID("com.example.other")
            let other = try await connection.send(fixture.manage("GET", "/1/apps/com.example.other/channels", channelID: id))
            #expect(other.status == 400 && other.reason == "ChannelNotRegistered")
            await connection.close()

            // Channel management on the push listener: Apple's answers for a path it does not have.
            let push = try await fixture.connect()
            let onPush = try await push.send(fixture.manage("POST", body: createBody()))
            #expect(onPush.status == 404 && onPush.reason == "BadPath")
            let listOnPush = try await push.send(fixture.manage("GET", "/1/apps/\(fixture.bundleID)/all-channels"))
            #expect(listOnPush.status == 405 && listOnPush.reason == "MethodNotAllowed")
            await push.close()
        }
    }

    @Test("The per-app channel limit answers CannotCreateChannelConfig; deleting one makes room")
    func channelLimit() async throws {
        try await withEmulator(configure: { $0.maximumChannelsPerApp = 2 }) { fixture in
            let connection = try await fixture.connectChannels()
            let first = try await connection.send(fixture.manage("POST", body: createBody()))
            #expect(try await connection.send(fixture.manage("POST", body: createBody())).status == 201)
            let refused = try await connection.send(fixture.manage("POST", body: createBody()))
            #expect(refused.status == 400 && refused.reason == "CannotCreateChannelConfig")
            // Another app has its own allowance.
            fixture.emulator.registerBundleID("com.example.other")
            #expect(try await connection.send(fixture.manage("POST", "/1/apps/com.example.other/channels", body: createBody())).status == 201)
            let id = try #require(first.header("apns-channel-id"))
            #expect(try await connection.send(fixture.manage("DELETE", channelID: id)).status == 204)
            #expect(try await connection.send(fixture.manage("POST", body: createBody())).status == 201)
            await connection.close()
        }
    }

    // MARK: Broadcasts

    @Test("An accepted broadcast is applied to every subscriber: ordering, end, stale; recorded and counted")
    func broadcastApplies() async throws {
        try await withEmulator { fixture in
            let id = fixture.emulator.createChannel(bundleID: fixture.bundleID, storagePolicy: 0)
            #expect(fixture.emulator.addSubscribers(channelID: id, count: 3, attributesType: "MatchAttributes")?.total == 3)
            let connection = try await fixture.connect()
            let t = fixture.clock.seconds.rounded(.down)
            let requestID = "6a1b8c3e-1f2d-4e5a-9b7c-0d1e2f3a4b5c"
            let accepted = try await connection.send(
                fixture.broadcast(
                    payload(timestamp: t + 10, contentState: ["score": "1-0"], ["stale-date": .integer(Int64(t + 60))]), channelID: id,
                    ["apns-request-id": requestID, "apns-expiration": "0"]
                )
            )
            #expect(accepted.status == 200)
            #expect(accepted.header("apns-request-id") == requestID)
            #expect(RequestHeaders.isUUID(accepted.header("apns-unique-id") ?? ""))
            var detail = try #require(fixture.emulator.channel(id: id))
            #expect(detail.subscribersByTimestamp == [BroadcastChannelDetail.key(t + 10): 3])
            #expect(detail.summary.broadcasts == 1 && detail.stale == 0 && detail.ended == 0)
            #expect(fixture.emulator.channelSubscribers(id: id)?.allSatisfy { $0.contentState == ["score": "1-0"] } == true)

            // APNs may reorder: an older timestamp is ignored by every subscriber.
            #expect(try await connection.send(fixture.broadcast(payload(timestamp: t + 5, contentState: ["score": "0-0"]), channelID: id)).status == 200)
            detail = try #require(fixture.emulator.channel(id: id))
            #expect(detail.subscribersByTimestamp == [BroadcastChannelDetail.key(t + 10): 3])
            let ignored = try #require(fixture.emulator.pushes(limit: 1).last)
            #expect(ignored.kind == "broadcast" && ignored.channelID == id && ignored.token == "")
            #expect(ignored.verdict == .ignored("stale timestamp") && ignored.subscribersIgnored == 3 && ignored.subscribersApplied == 0)

            // A broadcast never starts an activity.
            #expect(try await connection.send(fixture.broadcast(startPayload(timestamp: t + 20), channelID: id)).status == 200)
            #expect(fixture.emulator.pushes(limit: 1).last?.verdict == .ignored("start sent on a channel"))

            fixture.clock.advance(by: 61)
            #expect(fixture.emulator.channel(id: id)?.stale == 3)
            let end = payload(event: "end", timestamp: t + 70, contentState: ["score": "2-1"])
            #expect(try await connection.send(fixture.broadcast(end, channelID: id, ["apns-priority": "5"])).status == 200)
            detail = try #require(fixture.emulator.channel(id: id))
            #expect(detail.ended == 3 && detail.subscribersByTimestamp == [BroadcastChannelDetail.key(t + 70): 3])
            #expect(try await connection.send(fixture.broadcast(payload(timestamp: t + 80), channelID: id, ["apns-priority": "1"])).status == 200)
            #expect(fixture.emulator.pushes(limit: 1).last?.verdict == .ignored("ended"))

            let statistics = fixture.emulator.statistics
            #expect(statistics.broadcasts == 5 && statistics.broadcastApplied == 6 && statistics.broadcastIgnored == 9)
            #expect(fixture.emulator.channels().first?.broadcasts == 5)
            // Token pushes still carry kind "token" and no channel.
            #expect(try await connection.send(fixture.push(payload(timestamp: t))).status == 200)
            let tokenPush = try #require(fixture.emulator.pushes(limit: 1).last)
            #expect(tokenPush.kind == "token" && tokenPush.channelID == nil)
            await connection.close()
        }
    }

    @Test("Broadcast refusals: no-storage expiration, oversize, other app's channel, deleted channel, headers")
    func broadcastErrors() async throws {
        try await withEmulator { fixture in
            let noStorage = fixture.emulator.createChannel(bundleID: fixture.bundleID, storagePolicy: 0)
            let stored = fixture.emulator.createChannel(bundleID: fixture.bundleID, storagePolicy: 1)
            let otherApp = fixture.emulator.createChannel(bundleID: "com.example.other", storagePolicy: 0)
            fixture.emulator.addSubscribers(channelID: noStorage, count: 2)
            let management = try await fixture.connectChannels()
            let gone = try #require(try await management.send(fixture.manage("POST", body: createBody())).header("apns-channel-id"))
            #expect(try await management.send(fixture.manage("DELETE", channelID: gone)).status == 204)
            await management.close()

            let connection = try await fixture.connect()
            let t = fixture.clock.seconds.rounded(.down)
            let body = payload(timestamp: t)
            let later = fixture.clock.seconds + 3600
            let big = payload(timestamp: t, contentState: ["text": .string(String(repeating: "x", count: 5200))])
            let cases: [(TestRequest, Int, String)] = [
                (fixture.broadcast(body, channelID: noStorage, ["apns-expiration": String(Int(later))]), 400, "BadExpirationDate"),
                (fixture.broadcast(big, channelID: noStorage), 413, "PayloadTooLarge"),
                (fixture.broadcast(body, channelID: otherApp), 403, "TopicMismatch"),
                (fixture.broadcast(body, channelID: gone), 400, "ChannelNotRegistered"),
                (fixture.broadcast(body, channelID: nil), 400, "MissingChannelId"),
                (fixture.broadcast(body, channelID: "!!"), 400, "BadChannelId"),
                (fixture.broadcast(body, channelID: noStorage, ["apns-push-type": "alert"]), 400, "InvalidPushType"),
                (fixture.broadcast(body, channelID: noStorage, ["apns-priority": "7"]), 400, "BadPriority"),
                (fixture.broadcast(body, channelID: noStorage, ["authorization": nil]), 403, "MissingProviderToken"),
                (fixture.broadcast(body, channelID: noStorage, bundleID: "com.example.unknown"), 400, "FeatureNotEnabled"),
                (TestRequest(method: "GET", path: "/4/broadcasts/apps/\(fixture.bundleID)", headers: []), 405, "MethodNotAllowed"),
            ]
            for (request, status, reason) in cases {
                let response = try await connection.send(request)
                #expect(response.status == status && response.reason == reason, "\(reason)")
                #expect(response.header("apns-request-id") != nil && response.header("apns-unique-id") == nil)
            }
            // Refused broadcasts reach nobody.
            #expect(fixture.emulator.channel(id: noStorage)?.subscribersByTimestamp == ["none": 2])
            // A channel that stores the latest message takes a future expiration.
            let accepted = try await connection.send(fixture.broadcast(body, channelID: stored, ["apns-expiration": String(Int(later))]))
            #expect(accepted.status == 200)
            #expect(fixture.emulator.statistics.broadcasts == 1)
            await connection.close()
        }
    }

    @Test("reorderBroadcasts holds a broadcast back and applies it after the next one")
    func reorderFault() async throws {
        try await withEmulator { fixture in
            let id = fixture.emulator.createChannel(bundleID: fixture.bundleID)
            fixture.emulator.addSubscribers(channelID: id, count: 2)
            fixture.emulator.setFaults(APNsFaults(reorderBroadcasts: true))
            let connection = try await fixture.connect()
            let t = fixture.clock.seconds.rounded(.down)
            #expect(try await connection.send(fixture.broadcast(payload(timestamp: t + 1), channelID: id)).status == 200)
            #expect(fixture.emulator.channel(id: id)?.subscribersByTimestamp == ["none": 2])
            #expect(try await connection.send(fixture.broadcast(payload(timestamp: t + 2), channelID: id)).status == 200)
            // The newer one came first; the held older one arrived after it and was ignored.
            #expect(fixture.emulator.channel(id: id)?.subscribersByTimestamp == [BroadcastChannelDetail.key(t + 2): 2])
            let shown = try #require(fixture.emulator.channelSubscribers(id: id, limit: 1)?.first)
            #expect(shown.appliedCount == 1 && shown.ignoredCount == 1 && shown.lastIgnoredReason == "stale timestamp")
            await connection.close()
        }
    }

    @Test("100,000 subscribers on one channel all apply one broadcast")
    func manySubscribers() async throws {
        try await withEmulator { fixture in
            let id = fixture.emulator.createChannel(bundleID: fixture.bundleID)
            let added = try await controlRequest(
                port: fixture.controlPort, "POST", "/channels/\(Self.pathEncoded(id))/subscribers",
                body: #"{"count": 100000, "attributesType": "MatchAttributes"}"#
            )
            #expect(added.status == 201)
            #expect(added.json == ["channelId": .string(id), "created": 100_000, "subscribers": 100_000])
            let connection = try await fixture.connect()
            let t = fixture.clock.seconds.rounded(.down) + 1
            #expect(try await connection.send(fixture.broadcast(payload(timestamp: t, contentState: ["score": "3-3"]), channelID: id)).status == 200)
            await connection.close()
            let detail = try await controlRequest(port: fixture.controlPort, "GET", "/channels/\(Self.pathEncoded(id))")
            #expect(detail.status == 200)
            let object = try #require(detail.json?.objectValue)
            #expect(object["subscribersByTimestamp"] == JSONValue.object([BroadcastChannelDetail.key(t): 100_000]))
            #expect(object["subscribers"] == 100_000 && object["broadcasts"] == 1 && object["ended"] == 0)
            let record = try #require(fixture.emulator.pushes(limit: 1).last)
            #expect(record.subscribersApplied == 100_000 && record.subscribersIgnored == 0)
            let last = try #require(fixture.emulator.channelSubscribers(id: id, limit: 100_000)?.last)
            #expect(last.contentState == ["score": "3-3"] && last.attributesType == "MatchAttributes")
        }
    }

    static func pathEncoded(_ id: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return id.addingPercentEncoding(withAllowedCharacters: allowed) ?? id
    }

    // MARK: Control API

    @Test("Control API: channels, one channel, subscribers; unknown channel is channel_not_found")
    func controlAPI() async throws {
        try await withEmulator { fixture in
            let id = fixture.emulator.createChannel(bundleID: fixture.bundleID, storagePolicy: 1)
            let path = "/channels/\(Self.pathEncoded(id))"
            let added = try await controlRequest(port: fixture.controlPort, "POST", path + "/subscribers", body: #"{"count": 3}"#)
            #expect(added.status == 201 && added.json?.objectValue?["subscribers"] == 3)
            let missing = try await controlRequest(
                port: fixture.controlPort, "POST", "/channels/\(Self.pathEncoded(ChannelManagement.newChannelID()))/subscribers",
                body: #"{"count": 3}"#
            )
            #expect(missing.status == 404 && missing.errorCode == "channel_not_found")
            let tooMany = try await controlRequest(port: fixture.controlPort, "POST", path + "/subscribers", body: #"{"count": 200001}"#)
            #expect(tooMany.status == 400 && tooMany.errorField == "count")

            let list = try await controlRequest(port: fixture.controlPort, "GET", "/channels")
            let first = try #require(list.json?.objectValue?["channels"]?.arrayValue?.first?.objectValue)
            #expect(first["channelId"] == .string(id) && first["bundleId"] == .string(fixture.bundleID))
            #expect(first["storagePolicy"] == 1 && first["subscribers"] == 3 && first["broadcasts"] == 0)
            #expect(first["createdAt"]?.stringValue != nil)

            let detail = try await controlRequest(port: fixture.controlPort, "GET", path)
            #expect(detail.json?.objectValue?["subscribersByTimestamp"] == ["none": 3])
            #expect(detail.json?.objectValue?["stale"] == 0)
            let subscribers = try await controlRequest(port: fixture.controlPort, "GET", path + "/subscribers?limit=2")
            #expect(subscribers.json?.objectValue?["subscribers"]?.arrayValue?.count == 2)
            let unknown = try await controlRequest(port: fixture.controlPort, "GET", "/channels/bm9uZQ%3D%3D")
            #expect(unknown.status == 404 && unknown.errorCode == "channel_not_found")

            // Base64 ids may hold "/" and "+": percent-encoded in the path, they still name the channel.
            let slashed = "ab/+cd/+ef8="
            fixture.emulator.core.state.withLock {
                $0.channels[slashed] = BroadcastChannel(
                    id: slashed, bundleID: fixture.bundleID, storagePolicy: 0, createdAt: fixture.clock.now, order: 99
                )
            }
            let encoded = try await controlRequest(port: fixture.controlPort, "GET", "/channels/\(Self.pathEncoded(slashed))")
            #expect(encoded.status == 200 && encoded.json?.objectValue?["channelId"] == .string(slashed))
        }
    }

    // MARK: Push-to-start into a channel

    @Test("An iOS 18 phone's start with input-push-channel subscribes the activity and registers its channelId")
    func pushToStartIntoChannel() async throws {
        try await withRegistrationServer { url, calls in
            try await withEmulator { fixture in
                let target = LivelineRegistrationTarget(url: url, publishableKey: "pk_test_emulator")
                let id = fixture.emulator.createChannel(bundleID: fixture.bundleID)
                let phone = try fixture.emulator.createPhone(
                    id: "phone-18", deviceID: "device-18", attributesTypes: ["MatchAttributes"], registerWith: target, osVersion: "18.2"
                )
                #expect(phone.osVersion == "18.2")
                await fixture.emulator.waitForRegistrations()
                #expect(calls.all.first?.body?.objectValue?["osVersion"] == "18.2")
                let token = try #require(phone.pushToStartTokens["MatchAttributes"])
                let connection = try await fixture.connect()
                let t = fixture.clock.seconds.rounded(.down)
                var start = try #require(try JSONValue(parsing: startPayload(timestamp: t, inputPushToken: false)).objectValue)
                var aps = try #require(start["aps"]?.objectValue)
                aps["input-push-channel"] = .string(id)
                start["aps"] = .object(aps)
                #expect(try await connection.send(fixture.push(JSONValue.object(start).encoded, token: token)).status == 200)
                await fixture.emulator.waitForRegistrations()
                let activity = try #require(fixture.emulator.phone(id: "phone-18")?.activities.first)
                #expect(activity.channelID == id)
                #expect(!APNsEmulatorCore.isHexToken(activity.updateToken))
                #expect(
                    calls.all.last
                        == RegistrationCall(
                            method: "PUT", path: "/v1/activities/match-42/instances/device-18", authorization: "Bearer pk_test_emulator",
                            body: ["platform": "ios", "channelId": .string(id), "attributesType": "MatchAttributes"]
                        )
                )
                #expect(fixture.emulator.channel(id: id)?.summary.subscribers == 1)
                // It now applies the channel's broadcasts.
                let update = payload(timestamp: t + 1, contentState: ["score": "1-0"])
                #expect(try await connection.send(fixture.broadcast(update, channelID: id)).status == 200)
                let updated = try #require(fixture.emulator.phone(id: "phone-18")?.activities.first)
                #expect(updated.state.contentState == ["score": "1-0"])

                // With input-push-token as well, it also gets an update token and registers it as before.
                let second = try fixture.emulator.createPhone(id: "phone-18b", attributesTypes: ["MatchAttributes"], registerWith: target)
                // The new phone's device registration first: it runs in the background, and could otherwise land after
                // the instance registration looked at below (CI saw it last).
                await fixture.emulator.waitForRegistrations()
                aps["input-push-token"] = 1
                start["aps"] = .object(aps)
                let secondToken = try #require(second.pushToStartTokens["MatchAttributes"])
                #expect(try await connection.send(fixture.push(JSONValue.object(start).encoded, token: secondToken)).status == 200)
                await fixture.emulator.waitForRegistrations()
                let both = try #require(fixture.emulator.phone(id: "phone-18b")?.activities.first)
                #expect(both.channelID == id && APNsEmulatorCore.isHexToken(both.updateToken))
                #expect(calls.all.last?.body?.objectValue?["pushToken"] == .string(both.updateToken))
                await connection.close()
            }
        }
    }

    @Test("An iOS 17 phone does not start from a start that names a channel (Apple: it will not start)")
    func olderPhoneIgnoresChannel() async throws {
        try await withEmulator { fixture in
            let id = fixture.emulator.createChannel(bundleID: fixture.bundleID)
            let phone = try fixture.emulator.createPhone(id: "phone-17", attributesTypes: ["MatchAttributes"], osVersion: "17.2")
            let token = try #require(phone.pushToStartTokens["MatchAttributes"])
            let connection = try await fixture.connect()
            let t = fixture.clock.seconds.rounded(.down)
            let start = startPayload(timestamp: t, inputPushToken: false)
            var object = try #require(try JSONValue(parsing: start).objectValue)
            var aps = try #require(object["aps"]?.objectValue)
            aps["input-push-channel"] = .string(id)
            object["aps"] = .object(aps)
            // APNs takes it; the phone starts nothing.
            #expect(try await connection.send(fixture.push(JSONValue.object(object).encoded, token: token)).status == 200)
            let after = try #require(fixture.emulator.phone(id: "phone-17"))
            #expect(after.activities.isEmpty)
            #expect(after.ignoredStartCount == 1)
            #expect(after.lastIgnoredStartReason?.contains("iOS 18") == true)
            #expect(fixture.emulator.channel(id: id)?.summary.subscribers == 0)
            // The same start without the channel starts it, with an update token.
            #expect(try await connection.send(fixture.push(start, token: token)).status == 200)
            let started = try #require(fixture.emulator.phone(id: "phone-17")?.activities.first)
            #expect(started.channelID == nil && APNsEmulatorCore.isHexToken(started.updateToken))
            await connection.close()
        }
    }

    // MARK: Persistence

    @Test("Channels and phones' channel activities survive a reload; anonymous subscribers do not")
    func persistence() throws {
        let clock: @Sendable () -> Date = { Date(timeIntervalSince1970: 1_800_000_000) }
        let first = APNsEmulatorCore(pushHistoryLimit: 10, clockSkew: 5, clock: clock)
        let kept = first.createChannel(bundleID: "com.a", storagePolicy: 1)
        let gone = first.createChannel(bundleID: "com.a", storagePolicy: 0)
        first.state.withLock { $0.channels[gone]?.deleted = true }
        _ = first.addSubscribers(channelID: kept, count: 5, attributesType: nil)
        first.state.withLock { state in
            var device = APNsEmulatorCore.Device(bundleID: "com.a", sequence: 0)
            device.channelID = kept
            state.devices["channel-abc"] = device
        }
        let data = try first.encodePhones()
        let second = APNsEmulatorCore(pushHistoryLimit: 10, clockSkew: 5, clock: clock)
        try second.loadPhones(data)
        #expect(second.channelSummaries().map(\.channelID) == [kept])
        #expect(second.channelSummaries().first?.storagePolicy == 1)
        #expect(second.channelSummaries().first?.subscribers == 1)
        #expect(second.state.withLock { $0.channels[gone]?.deleted } == true)
        #expect(second.state.withLock { $0.bundles.contains("com.a") })
    }
}
