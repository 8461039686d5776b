import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import NIOCore
import Testing

/// A push service that also takes broadcasts, at the edge of a unit test: token pushes go to a ``ScriptedTransport``;
/// broadcasts are recorded and answered from a script.
final class ScriptedBroadcasts: PushTransport, BroadcastTransport, PushTransportDirectory, @unchecked Sendable {
    let tokens = ScriptedTransport()
    private let lock = NSLock()
    private var sent: [OutgoingBroadcast] = []
    private var script: [BroadcastOutcome] = []

    var broadcasts: [OutgoingBroadcast] { lock.withLock { sent } }
    /// The next broadcast outcomes, in order; afterwards broadcasts are delivered.
    func answer(with outcomes: [BroadcastOutcome]) { lock.withLock { script = outcomes } }

    func broadcast(_ broadcast: OutgoingBroadcast) async -> BroadcastOutcome {
        lock.withLock {
            sent.append(broadcast)
            if !script.isEmpty { return script.removeFirst() }
            return .delivered(requestID: "request-\(sent.count)")
        }
    }

    func send(_ push: OutgoingPush) async -> PushOutcome { await tokens.send(push) }
    func transport(appID: String, platform: Platform) async throws -> (any PushTransport)? { self }
    func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async {
        await tokens.credentialsHealth(appID: appID, platform: platform, healthy: healthy, reason: reason)
    }
}

private func whileDispatching<T>(_ store: SQLStore, _ transport: ScriptedBroadcasts, _ body: () async throws -> T) async throws -> T {
    try await running(Dispatcher(store: store, transports: transport, configuration: fastConfiguration()), body)
}

/// A broadcast activity with `subscribers` iPhones registered on its channel and `tokens` iPhones with tokens of their own.
private func broadcastActivity(
    _ store: SQLStore, _ activity: String, policy: ChannelStoragePolicy = .mostRecent, subscribers: Int, tokens: Range<Int>
) async throws -> String {
    let channelID = "Y2hhbm5lbC1\(activity)"
    _ = try await store.assignChannel(
        appID: appID, activityID: activity, channelID: channelID, storagePolicy: policy, maximumChannels: 10, at: Date()
    )
    for index in 0..<subscribers {
        _ = try await store.registerInstance(
            InstanceRegistration(
                appID: appID, activityID: activity, deviceID: "subscriber-\(index)", platform: .ios, pushToken: "", attributesType: "A",
                attributes: [:], userID: nil, channelID: channelID
            ),
            at: Date()
        )
    }
    try await register(store, activity: activity, devices: tokens)
    return channelID
}

@Suite("Broadcast delivery")
struct BroadcastDispatchTests {
    @Test("one update to a broadcast activity is one broadcast for every subscriber, plus a push to each token of its own", arguments: StoreKind.available)
    func hybrid(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let channelID = try await broadcastActivity(store, "match-1", subscribers: 50, tokens: 0..<20)
            let transport = ScriptedBroadcasts()
            try await whileDispatching(store, transport) {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-1", contentState: ["home": 1]), at: Date())
                #expect(try await eventually { transport.broadcasts.count == 1 && transport.tokens.pushes.count == 20 })
                #expect(try await eventually { (try await store.activity(appID: appID, activityID: "match-1"))?.broadcastSequence == 1 })
                _ = try await store.endActivity(ActivityEnd(appID: appID, activityID: "match-1", contentState: ["home": 2]), at: Date())
                #expect(try await eventually { transport.broadcasts.count == 2 && transport.tokens.pushes.count == 40 })
                // The delivered end ended the subscribers' instances, as the tokens' ends ended theirs. (Checked while
                // the engine runs: it records the last pushes after the transport took them.)
                #expect(try await eventually {
                    let counts = try await store.activity(appID: appID, activityID: "match-1")?.instanceCounts
                    return counts?[.ended] == 70 && counts?[.active] == nil
                })
            }
            let broadcasts = transport.broadcasts
            #expect(broadcasts.map(\.channelID) == [channelID, channelID])
            #expect(broadcasts.map(\.event) == [.update, .end])
            #expect(broadcasts.map(\.bundleID) == ["com.example.d", "com.example.d"])
            // The payload is the same aps the tokens get.
            let first = try #require(broadcasts.first)
            let payload = String(buffer: first.payload)
            #expect(payload.contains("\"event\":\"update\""))
            #expect(payload == String(buffer: try #require(transport.tokens.pushes.first?.payload)))
            // No token push went to a subscriber.
            #expect(transport.tokens.pushes.allSatisfy { $0.deviceID.hasPrefix("device-") })
            let timeline = try await store.deliveries(appID: appID, activityID: "match-1", cursor: nil, limit: 100).items
            let entries = timeline.filter { $0.channelID != nil }
            #expect(entries.count == 2)
            #expect(entries.allSatisfy { $0.channelID == channelID && $0.status == .delivered && $0.deviceID.isEmpty })
            #expect(Set(entries.compactMap(\.providerID)) == ["request-1", "request-2"])
        }
    }

    @Test("a channel that stores nothing is published with apns-expiration 0", arguments: StoreKind.available)
    func noStorage(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await broadcastActivity(store, "match-2", policy: .none, subscribers: 1, tokens: 0..<0)
            let transport = ScriptedBroadcasts()
            try await whileDispatching(store, transport) {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-2", contentState: ["home": 1]), at: Date())
                #expect(try await eventually { transport.broadcasts.count == 1 })
            }
            #expect(transport.broadcasts.first?.expiration == 0)
        }
    }

    @Test("a broadcast APNs cannot take now is retried; ChannelNotRegistered stops broadcasts and shows on the channel", arguments: StoreKind.available)
    func retriesAndChannelGone(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let channelID = try await broadcastActivity(store, "match-3", subscribers: 1, tokens: 0..<2)
            let transport = ScriptedBroadcasts()
            transport.answer(with: [
                .retryable(reason: "ServiceUnavailable", retryAfter: nil, requestID: "r-1"),
                .delivered(requestID: "r-2"),
                .channelNotRegistered(reason: "ChannelNotRegistered", requestID: "r-3"),
            ])
            try await whileDispatching(store, transport) {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-3", contentState: ["home": 1]), at: Date())
                #expect(try await eventually { (try await store.activity(appID: appID, activityID: "match-3"))?.broadcastSequence == 1 })
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-3", contentState: ["home": 2]), at: Date())
                #expect(try await eventually { (try await store.activity(appID: appID, activityID: "match-3"))?.channel?.status == .unregistered })
                // Token instances still get the latest state; the channel gets nothing more.
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-3", contentState: ["home": 3]), at: Date())
                #expect(try await eventually { transport.tokens.pushes.filter { $0.sequence == 3 }.count == 2 })
                // Nothing is left pending: the subscriber's state is the channel's business, not a token's. (Checked
                // while the engine runs: it records the last pushes after the transport took them.)
                #expect(try await eventually {
                    let activity = try await store.activity(appID: appID, activityID: "match-3")
                    return activity?.dispatchedSequence == activity?.sequence
                })
            }
            #expect(transport.broadcasts.count == 3)
            let statuses = try await store.deliveries(appID: appID, activityID: "match-3", cursor: nil, limit: 100).items
                .filter { $0.channelID == channelID }.sorted { $0.id < $1.id }.map(\.status)
            #expect(statuses == [.retrying, .delivered, .rejected])
        }
    }
}

extension BroadcastDispatchTests {
    @Test("a broadcast refused on every pass is published again after the pass-retry delay, not at once", arguments: StoreKind.available)
    func refusedBroadcastWaits(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await broadcastActivity(store, "match-9", subscribers: 1, tokens: 0..<1)
            let transport = ScriptedBroadcasts()
            transport.answer(with: Array(repeating: .credentialsRejected(reason: "InvalidProviderToken", requestID: nil), count: 10_000))
            var configuration = fastConfiguration()
            configuration.retry.passRetryDelay = .milliseconds(400)
            let started = ContinuousClock.now
            try await running(Dispatcher(store: store, transports: transport, configuration: configuration)) {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-9", contentState: ["home": 1]), at: Date())
                // The token instance is done after the first pass; the broadcast is refused on each one.
                #expect(try await eventually { transport.tokens.pushes.count == 1 && !transport.broadcasts.isEmpty })
                try await Task.sleep(for: .milliseconds(1_000))
            }
            // One pass at once, then one every 400 ms: a few in the time the engine ran (about 1 s, longer when a loaded
            // machine stretches the sleep). Looked at again at once, it was published hundreds of times.
            let ran = started.duration(to: .now)
            let allowed = Int(ran / .milliseconds(400)) + 3
            #expect(transport.broadcasts.count <= allowed, "\(transport.broadcasts.count) broadcasts in \(ran)")
        }
    }
}

extension BroadcastDispatchTests {
    @Test("a broadcast APNs takes says the app's credentials work again, for an app whose activity has only subscribers", arguments: StoreKind.available)
    func broadcastRestoresHealth(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await broadcastActivity(store, "match-4", subscribers: 2, tokens: 0..<0)
            let transport = ScriptedBroadcasts()
            transport.answer(with: [.credentialsRejected(reason: "InvalidProviderToken", requestID: nil)])
            try await whileDispatching(store, transport) {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match-4", contentState: ["home": 1]), at: Date())
                #expect(try await eventually { transport.broadcasts.count >= 2 })
                #expect(try await eventually { transport.tokens.healthReported.last == true })
            }
            #expect(transport.tokens.healthReported.first == false)
            #expect(transport.tokens.pushes.isEmpty)
        }
    }
}

extension BroadcastDispatchTests {
    @Test("broadcasts draw down the priority-10 budget as token pushes do: past it they go at priority 5", arguments: StoreKind.available)
    func broadcastsKeepTheBudget(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await broadcastActivity(store, "match-5", subscribers: 3, tokens: 0..<0)
            let transport = ScriptedBroadcasts()
            var configuration = fastConfiguration()
            configuration.budget = PriorityBudget(hourly: 3)
            try await running(Dispatcher(store: store, transports: transport, configuration: configuration)) {
                for minute in 1...5 {
                    _ = try await store.acceptUpdate(
                        ActivityUpdate(appID: appID, activityID: "match-5", contentState: ["minute": .integer(Int64(minute))]), at: Date()
                    )
                    #expect(try await eventually {
                        (try await store.activity(appID: appID, activityID: "match-5"))?.broadcastSequence == Int64(minute)
                    })
                }
                // An alert lights the screen: priority 10 whatever the budget, and counted.
                _ = try await store.acceptUpdate(
                    ActivityUpdate(
                        appID: appID, activityID: "match-5", contentState: ["minute": 6], alert: LiveActivityAlert(title: "Goal", body: "1 – 0", sound: nil)
                    ),
                    at: Date()
                )
                #expect(try await eventually { (try await store.activity(appID: appID, activityID: "match-5"))?.broadcastSequence == 6 })
            }
            #expect(transport.broadcasts.map(\.priority) == [10, 10, 10, 5, 5, 10])
            let activity = try #require(try await store.activity(appID: appID, activityID: "match-5"))
            #expect(activity.broadcastPriority10.used(at: Int64(Date().timeIntervalSince1970)) == 4)
        }
    }
}

/// Channel deletions at the edge of a unit test; the first `failures` deletions fail.
private final class DeletingChannels: BroadcastChannelManagement, @unchecked Sendable {
    private let lock = NSLock()
    private var deleted: [String] = []
    private var failures: Int

    init(failures: Int = 0) { self.failures = failures }
    var deletions: [String] { lock.withLock { deleted } }

    func createChannel(appID: String, storagePolicy: ChannelStoragePolicy) async throws(ChannelManagementError) -> String {
        throw ChannelManagementError(.refused, "not in this test")
    }

    func deleteChannel(appID: String, channelID: String) async throws(ChannelManagementError) {
        let fails: Bool = lock.withLock {
            if failures > 0 {
                failures -= 1
                return true
            }
            deleted.append(channelID)
            return false
        }
        if fails { throw ChannelManagementError(.unavailable, "HTTP 503") }
    }
}

@Suite("Broadcast channels' end")
struct BroadcastChannelSweepTests {
    @Test("the sweeper deletes an ended activity's channel once it left the screens, retries a failed delete, and purges only then", arguments: StoreKind.available)
    func deleteAfterDismissal(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let start = Date(timeIntervalSince1970: 1_800_000_000)
            let channelID = "Y2hhbm5lbC1tYXRjaA=="
            _ = try await store.assignChannel(
                appID: appID, activityID: "match", channelID: channelID, storagePolicy: .mostRecent, maximumChannels: 10, at: start
            )
            #expect(try await store.liveChannelCount(appID: appID) == 1)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["home": 1]), at: start)
            _ = try await store.endActivity(
                ActivityEnd(appID: appID, activityID: "match", dismissalDate: Int64(start.timeIntervalSince1970) + 600), at: start
            )
            try await recordEndBroadcast(store, activityID: "match", channelID: channelID, at: start)
            let channels = DeletingChannels(failures: 1)
            let clock = LockedDate(start)
            let sweeper = LifetimeSweeper(
                store: store, policy: LifetimePolicy(retention: 3600), now: { clock.value }, channels: channels
            )
            // Still on screen until its dismissal date: kept.
            clock.value = start.addingTimeInterval(300)
            #expect(try await sweeper.sweep().channelsDeleted == 0)
            // Past it: the first delete fails (APNs busy), the next sweep deletes it.
            clock.value = start.addingTimeInterval(700)
            #expect(try await sweeper.sweep().channelsDeleted == 0)
            // Past the retention the activity stays while its channel is held at APNs…
            clock.value = start.addingTimeInterval(4000)
            let sweep = try await sweeper.sweep()
            #expect(sweep.channelsDeleted == 1)
            #expect(channels.deletions == [channelID])
            #expect(try await store.liveChannelCount(appID: appID) == 0)
            // …and once deleted, it is purged (in the same pass, after the delete).
            #expect(sweep.purged == 1)
            #expect(try await store.activity(appID: appID, activityID: "match") == nil)
        }
    }

    @Test("an activity with a channel APNs would not delete is not purged", arguments: StoreKind.available)
    func keptWhileHeld(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let start = Date(timeIntervalSince1970: 1_800_000_000)
            _ = try await store.assignChannel(
                appID: appID, activityID: "match", channelID: "aGVsZA==", storagePolicy: .none, maximumChannels: 10, at: start
            )
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["home": 1]), at: start)
            _ = try await store.registerInstance(
                InstanceRegistration(
                    appID: appID, activityID: "match", deviceID: "iphone-1", platform: .ios, pushToken: "", attributesType: nil, attributes: nil,
                    userID: "user-7", channelID: "aGVsZA=="
                ),
                at: start
            )
            _ = try await store.endActivity(ActivityEnd(appID: appID, activityID: "match"), at: start)
            #expect(try await store.purgeActivities(endedBefore: start.addingTimeInterval(60)) == 0)
            let record = try #require(try await store.activity(appID: appID, activityID: "match"))
            #expect(record.channel?.status == .active)
            // Its instances (and their user ids) go at the retention all the same: only the row naming the channel stays.
            #expect(try await store.instances(appID: appID, activityID: "match", cursor: nil, limit: 10).items.isEmpty)
            try await recordEndBroadcast(store, activityID: "match", channelID: "aGVsZA==", at: start)
            // Four hours after the end it has surely left the screens.
            #expect(try await store.channelsToDelete(now: start.addingTimeInterval(3600), limit: 10).isEmpty)
            #expect(try await store.channelsToDelete(now: start.addingTimeInterval(4 * 3600 + 1), limit: 10).map(\.channelID) == ["aGVsZA=="])
        }
    }

    @Test(
        "a channel whose end broadcast has not gone out is kept past the dismissal, until the end goes out or twelve hours pass",
        arguments: StoreKind.available
    )
    func keptUntilTheEndIsBroadcast(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let start = Date(timeIntervalSince1970: 1_800_000_000)
            for activityID in ["sent-late", "never-sent"] {
                _ = try await store.assignChannel(
                    appID: appID, activityID: activityID, channelID: "\(activityID)-channel", storagePolicy: .mostRecent, maximumChannels: 10,
                    at: start
                )
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: activityID, contentState: ["home": 1]), at: start)
                // Ended and dismissed at once (DELETE /v1/activities/{id}): the dismissal date is now.
                _ = try await store.endActivity(
                    ActivityEnd(appID: appID, activityID: activityID, dismissalDate: Int64(start.timeIntervalSince1970)), at: start
                )
                // APNs is unavailable: the end is being retried, not settled.
                try await recordEndBroadcast(
                    store, activityID: activityID, channelID: "\(activityID)-channel", status: .retrying, settled: false, at: start
                )
            }
            // Past the dismissal date, but the phones have not been told the activity ended: deleting the channel would
            // leave it on their screens.
            #expect(try await store.channelsToDelete(now: start.addingTimeInterval(600), limit: 10).isEmpty)
            // The end goes out for one of them: its channel goes.
            try await recordEndBroadcast(store, activityID: "sent-late", channelID: "sent-late-channel", at: start.addingTimeInterval(900))
            #expect(try await store.channelsToDelete(now: start.addingTimeInterval(901), limit: 10).map(\.channelID) == ["sent-late-channel"])
            // The other's end never goes out: its channel goes twelve hours after the end, when no screen can show it.
            #expect(try await store.channelsToDelete(now: start.addingTimeInterval(12 * 3600 - 1), limit: 10).map(\.channelID) == ["sent-late-channel"])
            #expect(
                Set(try await store.channelsToDelete(now: start.addingTimeInterval(12 * 3600), limit: 10).map(\.channelID))
                    == ["sent-late-channel", "never-sent-channel"]
            )
        }
    }

    @Test("the Store refuses a channel for an activity that already has a state by tokens, and keeps the first of two", arguments: StoreKind.available)
    func assignment(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "order", contentState: ["step": 1]), at: Date())
            await #expect(throws: StoreError.deliveryMismatch(existing: .token)) {
                _ = try await store.assignChannel(
                    appID: appID, activityID: "order", channelID: "eA==", storagePolicy: .none, maximumChannels: 10, at: Date()
                )
            }
            let first = try await store.assignChannel(
                appID: appID, activityID: "match", channelID: "Zmlyc3Q=", storagePolicy: .none, maximumChannels: 10, at: Date()
            )
            let second = try await store.assignChannel(
                appID: appID, activityID: "match", channelID: "c2Vjb25k", storagePolicy: .mostRecent, maximumChannels: 10, at: Date()
            )
            #expect(first.id == "Zmlyc3Q=")
            #expect(second.id == "Zmlyc3Q=")
            await #expect(throws: StoreError.channelLimitReached(maximum: 1)) {
                _ = try await store.assignChannel(
                    appID: appID, activityID: "other", channelID: "b3RoZXI=", storagePolicy: .none, maximumChannels: 1, at: Date()
                )
            }
        }
    }
}

/// Records the activity's end broadcast on `channelID` as the engine does when it went out (or was given up for good).
private func recordEndBroadcast(_ store: SQLStore, activityID: String, channelID: String, status: DeliveryStatus = .delivered, settled: Bool = true, at date: Date)
    async throws
{
    let sequence = try #require(try await store.activity(appID: appID, activityID: activityID)).sequence
    let attempt = DeliveryRecord(
        appID: appID, activityID: activityID, deviceID: "", platform: .ios, sequence: sequence, event: .end, priority: 10, status: status,
        providerID: nil, reason: status == .delivered ? nil : "ServiceUnavailable", latencyMilliseconds: 1, attempt: 1, attemptedAt: date,
        channelID: channelID
    )
    try await store.recordBroadcast(attempt, settled: settled, channelGone: false, priority10: nil, at: date)
}

/// A date the test moves.
private final class LockedDate: @unchecked Sendable {
    private let lock = NSLock()
    private var date: Date
    init(_ date: Date) { self.date = date }
    var value: Date {
        get { lock.withLock { date } }
        set { lock.withLock { date = newValue } }
    }
}
