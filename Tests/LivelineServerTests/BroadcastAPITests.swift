import Foundation
import HTTPTypes
import LivelineCore
import LivelineDispatch
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Testing

/// APNs' channel management at the edge of a unit test: hands out channel ids, records what it was asked, and fails
/// when told to.
final class RecordingChannels: BroadcastChannelManagement, @unchecked Sendable {
    private let lock = NSLock()
    private var created: [(appID: String, policy: ChannelStoragePolicy, id: String)] = []
    private var deleted: [String] = []
    private var asked: [String] = []
    private var failure: ChannelManagementError?
    private var deletionFailure: (error: ChannelManagementError, except: String?)?

    var creations: [(appID: String, policy: ChannelStoragePolicy, id: String)] { lock.withLock { created } }
    var deletions: [String] { lock.withLock { deleted } }
    /// Every channel a deletion was asked for, failed or not.
    var deletionsAsked: [String] { lock.withLock { asked } }
    func fail(with error: ChannelManagementError?) { lock.withLock { failure = error } }
    /// Deletions fail with `error` (none with `nil`), but that of the channel `except`.
    func failDeletions(with error: ChannelManagementError?, except: String? = nil) {
        lock.withLock { deletionFailure = error.map { ($0, except) } }
    }

    func createChannel(appID: String, storagePolicy: ChannelStoragePolicy) async throws(ChannelManagementError) -> String {
        let outcome: Result<String, ChannelManagementError> = lock.withLock {
            if let failure { return .failure(failure) }
            let id = Data("channel-\(created.count + 1)".utf8).base64EncodedString()
            created.append((appID, storagePolicy, id))
            return .success(id)
        }
        return try outcome.get()
    }

    func deleteChannel(appID: String, channelID: String) async throws(ChannelManagementError) {
        let failure: ChannelManagementError? = lock.withLock {
            asked.append(channelID)
            if let deletionFailure, deletionFailure.except != channelID { return deletionFailure.error }
            deleted.append(channelID)
            return nil
        }
        if let failure { throw failure }
    }
}

private let state: JSONValue = ["contentState": ["home": 1, "away": 0]]

private func update(_ extra: [String: JSONValue]) -> JSONValue {
    var members = state.objectValue ?? [:]
    for (key, value) in extra { members[key] = value }
    return .object(members)
}

@Suite("Broadcast activities through the API")
struct BroadcastAPITests {
    @Test("a first update with delivery broadcast creates the channel once; the activity and GET …/channel show it")
    func firstUpdateCreatesChannel() async throws {
        let channels = RecordingChannels()
        try await withLiveline(channels: channels) { api, store in
            let app = try await createApp(store)
            let accepted = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            #expect(accepted.status == .accepted)
            #expect(channels.creations.count == 1)
            #expect(channels.creations.first?.policy == .mostRecent)
            #expect(channels.creations.first?.appID == app.id)
            let channelID = try #require(channels.creations.first?.id)

            let read = try await api.call(.get, "/v1/activities/match-1", key: app.secretKey)
            #expect(read["delivery"] == "broadcast")
            #expect(read["channelId"] == .string(channelID))
            let channel = read["channel"]?.objectValue
            #expect(channel?["status"] == "active")
            #expect(channel?["messageStoragePolicy"] == "mostRecent")
            #expect(channel?["broadcastSequence"] == .integer(0))

            // The app reads it with its publishable key, to start the Live Activity with pushType .channel(id).
            let forApp = try await api.call(.get, "/v1/activities/match-1/channel", key: app.publishableKey)
            #expect(forApp.status == .ok)
            #expect(forApp["channelId"] == .string(channelID))

            // Later updates keep the channel; asking for another delivery or policy is refused.
            #expect(try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, state).status == .accepted)
            #expect(try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, update(["delivery": "broadcast"])).status == .accepted)
            #expect(channels.creations.count == 1)
            let token = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, update(["delivery": "token"]))
            #expect(token.status == .conflict)
            #expect(token.errorCode == "delivery_mismatch")
            let policy = try await api.json(
                .post, "/v1/activities/match-1/updates", key: app.secretKey, update(["messageStoragePolicy": "none"])
            )
            #expect(policy.status == .conflict)
            #expect(policy.errorCode == "storage_policy_mismatch")
        }
    }

    @Test("a token activity has no channel, and keeps its delivery")
    func tokenActivity() async throws {
        let channels = RecordingChannels()
        try await withLiveline(channels: channels) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, state).status == .accepted)
            let read = try await api.call(.get, "/v1/activities/order-1", key: app.secretKey)
            #expect(read["delivery"] == "token")
            #expect(read["channelId"] == .null)
            let channel = try await api.call(.get, "/v1/activities/order-1/channel", key: app.publishableKey)
            #expect(channel.status == .notFound)
            #expect(channel.errorCode == "channel_not_found")
            // An activity that does not exist looks the same to the publishable key; the secret key is told.
            let unknown = try await api.call(.get, "/v1/activities/order-404/channel", key: app.publishableKey)
            #expect(unknown.status == .notFound && unknown.errorCode == "channel_not_found")
            #expect(try await api.call(.get, "/v1/activities/order-404/channel", key: app.secretKey).errorCode == "activity_not_found")
            let later = try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            #expect(later.errorCode == "delivery_mismatch")
            let policy = try await api.json(
                .post, "/v1/activities/order-2/updates", key: app.secretKey, update(["messageStoragePolicy": "none"])
            )
            #expect(policy.status == .unprocessableContent)
            #expect(policy.errorCode == "storage_policy_without_broadcast")
            let bad = try await api.json(.post, "/v1/activities/order-3/updates", key: app.secretKey, update(["delivery": "carrier-pigeon"]))
            #expect(bad.errorCode == "invalid_delivery")
            #expect(channels.creations.isEmpty)
        }
    }

    @Test("a broadcast payload may reach 5,120 bytes of aps, not more, its content state 4,096; a token one stays at 4,096")
    func payloadLimits() async throws {
        try await withLiveline(channels: RecordingChannels()) { api, store in
            let app = try await createApp(store)
            let alert: JSONValue = ["title": .string(String(repeating: "t", count: 1200)), "body": .string(String(repeating: "b", count: 1200))]
            let refused = try await api.json(
                .post, "/v1/activities/match-1/updates", key: app.secretKey,
                ["contentState": ["note": .string(String(repeating: "x", count: 3000))], "alert": alert, "delivery": "broadcast"]
            )
            #expect(refused.status == .unprocessableContent)
            #expect(refused.errorCode == "payload_too_large")
            #expect(refused.message?.contains("5120") == true, "\(refused.message ?? "")")
            // A content state over ActivityKit's 4 KB of a Live Activity's data, in a payload under 5,120 bytes.
            let overData = try await api.json(
                .post, "/v1/activities/match-1/updates", key: app.secretKey,
                ["contentState": ["note": .string(String(repeating: "x", count: 4200))], "delivery": "broadcast"]
            )
            #expect(overData.status == .unprocessableContent)
            #expect(overData.errorCode == "payload_too_large")
            #expect(overData.errorField == "contentState")
            #expect(overData.message?.contains("4096") == true, "\(overData.message ?? "")")
            // Nothing was stored, no channel kept.
            #expect(try await api.call(.get, "/v1/activities/match-1", key: app.secretKey).status == .notFound)
            let token = try await api.json(
                .post, "/v1/activities/order-1/updates", key: app.secretKey,
                ["contentState": ["note": .string(String(repeating: "x", count: 4100))]]
            )
            #expect(token.errorCode == "payload_too_large")
            #expect(token.message?.contains("4096") == true)
        }
    }

    @Test("an iOS-only app's broadcasts may use all 5,120 bytes; with an Android package, FCM's 4,096 bytes hold them too")
    func payloadLimitsWithoutAndroid() async throws {
        try await withLiveline(channels: RecordingChannels()) { api, store in
            // A content state within a Live Activity's 4,096 bytes, and an alert that takes the payload past 4,096.
            let note: JSONValue = ["note": .string(String(repeating: "x", count: 3600))]
            let alert: JSONValue = ["title": .string(String(repeating: "t", count: 700)), "body": "b"]
            let large: JSONValue = ["contentState": note, "alert": alert, "delivery": "broadcast"]
            let iosOnly = try await createApp(store, name: "iOS only", bundleID: "com.example.ios", androidPackage: nil)
            let accepted = try await api.json(.post, "/v1/activities/match-1/updates", key: iosOnly.secretKey, large)
            #expect(accepted.status == .accepted, "\(accepted.json)")
            let ended = try await api.json(.post, "/v1/activities/match-1/end", key: iosOnly.secretKey, ["contentState": note, "alert": alert])
            #expect(ended.status == .accepted, "\(ended.json)")
            let both = try await createApp(store, name: "Both", bundleID: "com.example.both")
            let refused = try await api.json(.post, "/v1/activities/match-1/updates", key: both.secretKey, large)
            #expect(refused.status == .unprocessableContent)
            #expect(refused.errorCode == "payload_too_large")
            #expect(refused.message?.contains("FCM") == true, "\(refused.message ?? "")")
            // A token activity of the iOS-only app stays at APNs' 4,096 bytes.
            let token = try await api.json(
                .post, "/v1/activities/order-1/updates", key: iosOnly.secretKey, ["contentState": ["note": .string(String(repeating: "x", count: 4100))]]
            )
            #expect(token.errorCode == "payload_too_large")
        }
    }

    @Test("an iPhone registers the channel it subscribed to instead of a token; the wrong channel or both are refused")
    func channelInstances() async throws {
        let channels = RecordingChannels()
        try await withLiveline(channels: channels) { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            let channelID = try #require(channels.creations.first?.id)
            let registered = try await api.json(
                .put, "/v1/activities/match-1/instances/iphone-18", key: app.publishableKey,
                ["platform": "ios", "channelId": .string(channelID), "attributesType": "MatchAttributes"]
            )
            #expect(registered.status == .created)
            #expect(registered["channelId"] == .string(channelID))
            let listed = try await api.call(.get, "/v1/activities/match-1/instances", key: app.secretKey)
            #expect(listed["data"]?.arrayValue?.first?.objectValue?["pushToken"] == "")
            // An iOS 17 phone of the same activity keeps its token: hybrid delivery.
            let older = try await api.json(
                .put, "/v1/activities/match-1/instances/iphone-17", key: app.publishableKey, ["platform": "ios", "pushToken": .string(iosToken)]
            )
            #expect(older.status == .created)
            #expect(older["channelId"] == .null)

            let wrong = try await api.json(
                .put, "/v1/activities/match-1/instances/iphone-x", key: app.publishableKey, ["platform": "ios", "channelId": "bm9wZQ=="]
            )
            #expect(wrong.status == .conflict)
            #expect(wrong.errorCode == "channel_mismatch")
            let both = try await api.json(
                .put, "/v1/activities/match-1/instances/iphone-y", key: app.publishableKey,
                ["platform": "ios", "channelId": .string(channelID), "pushToken": .string(iosToken)]
            )
            #expect(both.errorCode == "token_and_channel")
            let android = try await api.json(
                .put, "/v1/activities/match-1/instances/pixel-1", key: app.publishableKey, ["platform": "android", "channelId": .string(channelID)]
            )
            #expect(android.errorCode == "channel_not_allowed")
            let unknownActivity = try await api.json(
                .put, "/v1/activities/match-9/instances/iphone-18", key: app.publishableKey, ["platform": "ios", "channelId": .string(channelID)]
            )
            #expect(unknownActivity.errorCode == "channel_mismatch")
            let read = try await api.call(.get, "/v1/activities/match-1", key: app.secretKey)
            #expect(read["instances"]?.objectValue?["active"] == .integer(2))
        }
    }

    @Test("the channel limit, APNs' own limit and an unreachable APNs are clear errors, and store nothing")
    func limitsAndFailures() async throws {
        let channels = RecordingChannels()
        var settings = BroadcastSettings()
        settings.maximumChannels = 1
        try await withLiveline(channels: channels, broadcast: settings) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.post, "/v1/activities/a/updates", key: app.secretKey, update(["delivery": "broadcast"])).status == .accepted)
            let full = try await api.json(.post, "/v1/activities/b/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            #expect(full.status == .conflict)
            #expect(full.errorCode == "channel_limit_reached")
            #expect(channels.creations.count == 1)
        }
        try await withLiveline(channels: channels) { api, store in
            let app = try await createApp(store)
            channels.fail(with: ChannelManagementError(.limitReached, "CannotCreateChannelConfig"))
            let apple = try await api.json(.post, "/v1/activities/a/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            #expect(apple.status == .conflict)
            #expect(apple.errorCode == "channel_limit_reached")
            channels.fail(with: ChannelManagementError(.unavailable, "HTTP 503 ServiceUnavailable"))
            let down = try await api.json(.post, "/v1/activities/a/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            #expect(down.status == .serviceUnavailable)
            #expect(down.errorCode == "apns_unavailable")
            channels.fail(with: ChannelManagementError(.noCredentials, "none"))
            let none = try await api.json(.post, "/v1/activities/a/updates", key: app.secretKey, update(["delivery": "broadcast"]))
            #expect(none.errorCode == "apns_credentials_missing")
            #expect(try await api.call(.get, "/v1/activities/a", key: app.secretKey).status == .notFound)
        }
    }

    @Test("the app's defaults choose broadcast and the storage policy for activities that do not say")
    func appDefaults() async throws {
        let channels = RecordingChannels()
        let adminToken = "admin-token-0123456789abcdef"
        try await withLiveline(adminToken: adminToken, channels: channels) { api, store in
            let app = try await createApp(store)
            let set = try await api.json(
                .put, "/admin/v1/apps/\(app.id)/broadcast", key: adminToken, ["defaultDelivery": "broadcast", "messageStoragePolicy": "none"]
            )
            #expect(set.status == .ok)
            #expect(set["broadcast"] == ["defaultDelivery": "broadcast", "messageStoragePolicy": "none"])
            _ = try await api.json(.post, "/v1/activities/match-1/updates", key: app.secretKey, state)
            #expect(channels.creations.first?.policy == ChannelStoragePolicy.none)
            let read = try await api.call(.get, "/v1/activities/match-1", key: app.secretKey)
            #expect(read["delivery"] == "broadcast")
            #expect(read["channel"]?.objectValue?["messageStoragePolicy"] == "none")
            // The request still decides.
            _ = try await api.json(.post, "/v1/activities/order-1/updates", key: app.secretKey, update(["delivery": "token"]))
            #expect(try await api.call(.get, "/v1/activities/order-1", key: app.secretKey)["delivery"] == "token")
            let bad = try await api.json(.put, "/admin/v1/apps/\(app.id)/broadcast", key: adminToken, ["defaultDelivery": "fax"])
            #expect(bad.errorCode == "invalid_delivery")
        }
    }

    @Test("a broadcast start admits iPhones on iOS 18 into the channel; older ones and Android phones keep their tokens")
    func broadcastStart() async throws {
        let channels = RecordingChannels()
        try await withLiveline(channels: channels) { api, store in
            let app = try await createApp(store)
            for (device, body) in [
                ("iphone-18", ["platform": "ios", "osVersion": "18.1", "pushToStartTokens": ["MatchAttributes": .string(iosToken)]] as JSONValue),
                ("iphone-17", ["platform": "ios", "osVersion": "17.5.1", "pushToStartTokens": ["MatchAttributes": .string(String(repeating: "cd", count: 32))]]),
                ("pixel-1", ["platform": "android", "fcmToken": "fcm-token-of-pixel-1"]),
            ] {
                #expect(try await api.json(.put, "/v1/devices/\(device)", key: app.publishableKey, body).status == .created)
            }
            var body = startBody(["all": true]).objectValue ?? [:]
            body["delivery"] = "broadcast"
            let started = try await api.json(.post, "/v1/activities/match-42/start", key: app.secretKey, .object(body))
            #expect(started.status == .accepted)
            let channelID = try #require(channels.creations.first?.id)
            _ = try await store.admitStartAudience(appID: app.id, activityID: "match-42", limit: 100, at: testStart)
            let page = try await store.instances(appID: app.id, activityID: "match-42", cursor: nil, limit: 10)
            let byDevice = Dictionary(uniqueKeysWithValues: page.items.map { ($0.deviceID, $0) })
            #expect(byDevice["iphone-18"]?.channelID == channelID)
            #expect(byDevice["iphone-17"]?.channelID == nil)
            #expect(byDevice["pixel-1"]?.channelID == nil)
            #expect(page.items.allSatisfy { $0.state == .starting })
        }
    }
}
