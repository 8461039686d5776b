import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
@testable import LivelineStore
import LivelineTestSupport
import Testing

extension EmulatedPhones {
    /// A broadcast activity as the API makes one: its channel created at the emulator's channel management listener
    /// (real HTTP/2 + TLS, the app's provider token), then recorded.
    func broadcastActivity(_ activity: String, policy: ChannelStoragePolicy = .mostRecent) async throws -> String {
        let channelID = try await channels.createChannel(appID: appID, storagePolicy: policy)
        _ = try await store.assignChannel(
            appID: appID, activityID: activity, channelID: channelID, storagePolicy: policy, maximumChannels: 10, at: clock.now
        )
        return channelID
    }

    /// An iPhone on iOS 18 that started the activity with `pushType: .channel(id)` and registered the channel.
    func registerSubscriber(_ deviceID: String, activity: String, channelID: String) async throws {
        _ = try await store.registerInstance(
            InstanceRegistration(
                appID: appID, activityID: activity, deviceID: deviceID, platform: .ios, pushToken: "", attributesType: "MatchAttributes",
                attributes: [:], userID: nil, channelID: channelID
            ),
            at: clock.now
        )
    }

    /// Whether every subscriber of the channel shows a state with a `timestamp` none of them showed in `before`.
    func everySubscriberMovedOn(_ channelID: String, from before: Set<String>) -> Bool {
        guard let detail = apns.channel(id: channelID), detail.subscribersByTimestamp.count == 1,
            let shown = detail.subscribersByTimestamp.keys.first
        else { return false }
        return shown != "none" && !before.contains(shown)
    }

    func shownTimestamps(_ channelID: String) -> Set<String> {
        Set(apns.channel(id: channelID)?.subscribersByTimestamp.keys.map { $0 } ?? [])
    }
}

@Suite("Broadcast channels end to end, through the APNs emulator")
struct BroadcastEndToEndTests {
    @Test("create, publish to 2,000 subscribers with one request each time, hybrid tokens and Android, end, then delete the channel")
    func lifecycle() async throws {
        try await withEmulatedPhones { env in
            let channelID = try await env.broadcastActivity("match-1")
            #expect(env.apns.channels().map(\.channelID) == [channelID])
            #expect(env.apns.channels().first?.storagePolicy == 1)
            _ = env.apns.addSubscribers(channelID: channelID, count: 2000, attributesType: "MatchAttributes")
            try await env.registerSubscriber("iphone-18", activity: "match-1", channelID: channelID)
            let older = try await env.addIPhone("iphone-17", activity: "match-1")
            let android = try await env.addAndroid("pixel-1", activity: "match-1")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                let before = env.apns.statistics
                let shownBefore = env.shownTimestamps(channelID)
                _ = try await env.update("match-1", ["home": 1, "away": 0])
                dispatcher.wake()
                #expect(try await waitFor { env.everySubscriberMovedOn(channelID, from: shownBefore) })
                #expect(try await waitFor { env.apns.display(token: older)?.contentState == ["home": 1, "away": 0] })
                #expect(try await waitFor { env.notification(android, "match-1")?.contentState == ["home": 1, "away": 0] })
                // One broadcast for 2,000 subscribers, and one push for the iOS 17 token: two APNs requests.
                let after = env.apns.statistics
                #expect(after.broadcasts - before.broadcasts == 1)
                #expect(after.totalRequests - before.totalRequests == 2)

                // The broadcast as Apple documents it.
                let broadcast = try #require(env.apns.pushes(token: nil).first { $0.channelID == channelID })
                #expect(broadcast.status == 200)
                #expect(broadcast.header("apns-channel-id") == channelID)
                #expect(broadcast.header("apns-push-type") == "liveactivity")
                #expect(broadcast.header("apns-topic") == nil)

                // The end: one broadcast; the subscribers show it ended.
                _ = try await env.store.endActivity(
                    ActivityEnd(appID: env.appID, activityID: "match-1", contentState: ["home": 2, "away": 1]), at: env.clock.now
                )
                dispatcher.wake()
                #expect(try await waitFor { env.apns.channel(id: channelID)?.ended == 2000 })
                #expect(try await waitFor { env.apns.display(token: older)?.ended == true })
                #expect(env.apns.statistics.broadcasts - before.broadcasts == 2)
            }
            let timeline = try await env.store.deliveries(appID: env.appID, activityID: "match-1", cursor: nil, limit: 50).items
            let broadcasts = timeline.filter { $0.channelID == channelID }
            #expect(broadcasts.count == 2)
            #expect(broadcasts.allSatisfy { $0.status == .delivered && $0.providerID != nil })
            #expect(try await env.instance("match-1", "iphone-18")?.state == .ended)

            // Once the ended activity has left the screens, the sweeper deletes its channel at APNs.
            let sweeper = LifetimeSweeper(
                store: env.store, now: { [clock = env.clock] in clock.now.addingTimeInterval(5 * 3600) }, channels: env.channels
            )
            #expect(try await sweeper.sweep().channelsDeleted == 1)
            #expect(env.apns.channels().isEmpty)
            #expect(try await env.store.activity(appID: env.appID, activityID: "match-1")?.channel?.status == .deleted)
        }
    }

    @Test("a channel APNs no longer knows is shown as unregistered; the token phones of the activity still get every state")
    func channelNotRegistered() async throws {
        try await withEmulatedPhones { env in
            let channelID = try await env.broadcastActivity("match-2")
            let older = try await env.addIPhone("iphone-17", activity: "match-2")
            // Deleted behind Liveline's back.
            try await env.channels.deleteChannel(appID: env.appID, channelID: channelID)
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-2", ["minute": 10])
                dispatcher.wake()
                #expect(try await waitFor { try await env.store.activity(appID: env.appID, activityID: "match-2")?.channel?.status == .unregistered })
                #expect(try await waitFor { env.apns.display(token: older)?.contentState == ["minute": 10] })
                _ = try await env.update("match-2", ["minute": 11])
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: older)?.contentState == ["minute": 11] })
            }
            let entries = try await env.store.deliveries(appID: env.appID, activityID: "match-2", cursor: nil, limit: 50).items
                .filter { $0.channelID == channelID }
            // One refusal, and nothing after it. (Under a loaded full run, once, an attempt before it failed on the way
            // and was retried, as a broadcast is: a `retrying` entry before the refusal.)
            let refusals = entries.filter { $0.status == .rejected }
            #expect(refusals.count == 1, "\(entries.map { "\($0.status) \($0.reason ?? "-")" })")
            #expect(refusals.first?.reason == "ChannelNotRegistered")
            #expect(entries.allSatisfy { $0.status == .rejected || $0.status == .retrying }, "\(entries.map(\.status))")
            #expect(entries.sorted { $0.id < $1.id }.last?.status == .rejected, "nothing was sent to the channel after its refusal")
            // Told to the backend as delivery.failed, with the channel.
            let failed = try await env.store.events(appID: env.appID, after: nil, types: [.deliveryFailed], limit: 10)
            #expect(failed.count == 1)
            #expect(failed.first?.data.objectValue?["channelId"] == .string(channelID))
        }
    }

    @Test("a remote start of a broadcast activity starts an iOS 18 phone into the channel and an iOS 17 phone with a token")
    func remoteStartIntoChannel() async throws {
        try await withEmulatedPhones { env in
            let newer = try env.apns.createPhone(id: "phone-18", bundleID: env.bundleID, attributesTypes: ["MatchAttributes"], registerWith: .some(nil), osVersion: "18.2")
            let older = try env.apns.createPhone(id: "phone-17", bundleID: env.bundleID, attributesTypes: ["MatchAttributes"], registerWith: .some(nil), osVersion: "17.5")
            for (phone, version) in [(newer, "18.2"), (older, "17.5")] {
                try await env.addDevice(phone.deviceID, platform: .ios, startToken: ("MatchAttributes", phone.pushToStartTokens["MatchAttributes"]!))
                _ = try await env.store.write("UPDATE devices SET os_version = ? WHERE device_id = ?", [.text(version), .text(phone.deviceID)])
            }
            let channelID = try await env.broadcastActivity("match-5")
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.start("match-5", for: .all, ["home": 0, "away": 0])
                dispatcher.wake()
                #expect(try await waitFor { env.apns.phone(id: "phone-18")?.activities.first?.channelID == channelID })
                #expect(try await waitFor { env.apns.phone(id: "phone-17")?.activities.first?.inputPushTokenRequested == true })
                // The iOS 18 phone's start carried input-push-channel and no input-push-token.
                let start = try #require(env.apns.pushes(token: newer.pushToStartTokens["MatchAttributes"]).first)
                let aps = try #require(try JSONValue(parsing: start.payload.utf8).objectValue?["aps"]?.objectValue)
                #expect(aps["input-push-channel"] == .string(channelID))
                #expect(aps["input-push-token"] == nil)
                #expect(env.apns.phone(id: "phone-17")?.activities.first?.channelID == nil)

                // An update reaches the iOS 18 phone by the channel's one broadcast.
                _ = try await env.update("match-5", ["home": 1, "away": 0])
                dispatcher.wake()
                #expect(try await waitFor {
                    env.apns.phone(id: "phone-18")?.activities.first?.state.contentState == ["home": 1, "away": 0]
                })
                #expect(env.apns.statistics.broadcasts >= 1)
            }
        }
    }

    @Test("a channel that stores nothing takes broadcasts with apns-expiration 0, as APNs requires")
    func noStorage() async throws {
        try await withEmulatedPhones { env in
            let channelID = try await env.broadcastActivity("match-3", policy: .none)
            _ = env.apns.addSubscribers(channelID: channelID, count: 10)
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-3", ["minute": 1])
                dispatcher.wake()
                #expect(try await waitFor { env.everySubscriberMovedOn(channelID, from: ["none"]) })
            }
            let broadcast = try #require(env.apns.pushes(token: nil).first { $0.channelID == channelID })
            #expect(broadcast.header("apns-expiration") == "0")
            #expect(broadcast.status == 200)
        }
    }

    @Test("broadcasts go to the credentials' broadcast host when they name one, while pushes keep the push host")
    func broadcastHostOfItsOwn() async throws {
        try await withEmulatedPhones { env in
            let channelID = try await env.broadcastActivity("match-5")
            _ = env.apns.addSubscribers(channelID: channelID, count: 20)
            // The push host now answers nothing; the emulator's host is named for broadcasts alone.
            var stored = try #require(try await env.store.credentials(appID: env.appID, provider: .apns))
            var settings = try #require(stored.settings.objectValue)
            settings["broadcastBaseUrl"] = settings["baseUrl"]
            settings["baseUrl"] = "https://127.0.0.1:9"
            stored.settings = .object(settings)
            stored.updatedAt = env.clock.now.addingTimeInterval(1)
            try await env.store.saveCredentials(stored)
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("match-5", ["minute": 5])
                dispatcher.wake()
                #expect(try await waitFor { env.everySubscriberMovedOn(channelID, from: ["none"]) })
                // The phones apply the broadcast before the engine records it; stopping the engine now could cancel
                // that record, so wait for it here.
                #expect(try await waitFor {
                    try await env.store.activity(appID: env.appID, activityID: "match-5")?.broadcastSequence == 1
                })
            }
            let broadcast = try #require(env.apns.pushes(token: nil).first { $0.channelID == channelID })
            #expect(broadcast.status == 200)
            // And without it, broadcasts go to the push host: nothing answers there, and the next state waits.
            settings["broadcastBaseUrl"] = nil
            stored.settings = .object(settings)
            stored.updatedAt = env.clock.now.addingTimeInterval(2)
            try await env.store.saveCredentials(stored)
            let before = env.apns.statistics.broadcasts
            let second = env.makeDispatcher()
            try await running(second) { () async throws in
                _ = try await env.update("match-5", ["minute": 6])
                second.wake()
                #expect(try await waitFor {
                    try await env.store.deliveries(appID: env.appID, activityID: "match-5", cursor: nil, limit: 50).items
                        .contains { $0.channelID == channelID && $0.status == .retrying }
                })
            }
            #expect(env.apns.statistics.broadcasts == before)
        }
    }

    @Test("an engine stopped while APNs refuses a broadcast, then restarted, publishes it once APNs takes it")
    func restartMidBroadcast() async throws {
        try await withEmulatedPhones { env in
            let channelID = try await env.broadcastActivity("match-4")
            _ = env.apns.addSubscribers(channelID: channelID, count: 500)
            var faults = APNsFaults()
            faults.unavailableRate = 1
            env.apns.setFaults(faults)
            let first = env.makeDispatcher()
            try await running(first) { () async throws in
                _ = try await env.update("match-4", ["minute": 45])
                first.wake()
                #expect(try await waitFor {
                    try await env.store.deliveries(appID: env.appID, activityID: "match-4", cursor: nil, limit: 50).items
                        .contains { $0.channelID == channelID && $0.status == .retrying }
                })
            }
            env.apns.setFaults(APNsFaults())
            let second = env.makeDispatcher()
            try await running(second) { () async throws in
                second.wake()
                #expect(try await waitFor(timeout: .seconds(60)) { env.everySubscriberMovedOn(channelID, from: ["none"]) })
                #expect(try await waitFor { try await env.store.activity(appID: env.appID, activityID: "match-4")?.broadcastSequence == 1 })
            }
        }
    }
}
