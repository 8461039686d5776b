import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import MetricsTestKit
import SQLiteNIO
import Synchronization
import Testing

/// Registrations queued together run on PostgreSQL as one set (``RegistrationWrite``): the set's decisions
/// (``RegistrationSet``, pure) and the Store's outcome, which must be the registrations' own, one after another.
@Suite("Registrations as one set")
struct RegistrationSetTests {
    private typealias Key = ActivityKey

    private func member(_ device: String, activity: String, attributes: Bool = true, channel: String? = nil, at millis: Int = 1_000)
        -> RegistrationSet.Member
    {
        RegistrationSet.Member(
            registration: InstanceRegistration(
                appID: "app", activityID: activity, deviceID: device, platform: .ios, pushToken: channel == nil ? "aa" + device : "",
                attributesType: attributes ? "Match" : nil, attributes: attributes ? ["home": .string(device)] : nil, userID: nil,
                channelID: channel
            ),
            nowMillis: millis
        )
    }

    private func created(_ decision: RegistrationSet.Decision) -> RegistrationResult? {
        if case .done(let result) = decision { return result }
        return nil
    }

    @Test("the first registration to an unknown activity creates it, with the first attributes given; the others join it")
    func firstCreatesTheActivity() {
        let set = RegistrationSet(
            [member("d1", activity: "new", attributes: false, at: 1_000), member("d2", activity: "new", at: 2_000),
             member("d3", activity: "new", at: 3_000)],
            activities: [:], existing: []
        )
        #expect(set.newActivities == [
            RegistrationSet.NewActivity(key: Key(appID: "app", activityID: "new"), attributesType: "Match", attributes: ["home": "d2"], nowMillis: 1_000)
        ])
        #expect(set.newInstances.map(\.registration.deviceID) == ["d1", "d2", "d3"])
        #expect(set.decisions.compactMap(created).map(\.instance.deviceID) == ["d1", "d2", "d3"])
        #expect(set.decisions.compactMap(created).allSatisfy { $0.change == .created && !$0.needsDelivery })
        #expect(set.decisions.compactMap(created).map(\.instance.createdAt.timeIntervalSince1970) == [1, 2, 3])
        #expect(set.catchingUp.isEmpty)
        #expect(set.events.map(\.event.type) == [.instanceRegistered, .instanceRegistered, .instanceRegistered])
        #expect(set.events.map(\.event.deviceID) == ["d1", "d2", "d3"])
        #expect(set.events.map(\.nowMillis) == [1_000, 2_000, 3_000])
    }

    @Test("newcomers to an activity with accepted state are caught up, the activity made pending once; a channel's are not")
    func newcomersAreCaughtUp() {
        let live = Key(appID: "app", activityID: "live")
        let channel = Key(appID: "app", activityID: "broadcast")
        let set = RegistrationSet(
            [member("d1", activity: "live"), member("d2", activity: "live"), member("d3", activity: "broadcast", channel: "ch-1")],
            activities: [
                live: .init(state: .active, attributesType: "Match", sequence: 4, channelID: nil),
                channel: .init(state: .active, attributesType: "Match", sequence: 2, channelID: "ch-1"),
            ],
            existing: []
        )
        #expect(set.newActivities.isEmpty)
        #expect(set.catchingUp == [live])
        #expect(set.decisions.compactMap(created).map(\.needsDelivery) == [true, true, false])
    }

    @Test("refusals: an ended activity, and a channel other than the activity's (or one that does not exist)")
    func refusals() {
        let set = RegistrationSet(
            [member("d1", activity: "ended"), member("d2", activity: "live", channel: "ch-2"), member("d3", activity: "nowhere", channel: "ch-1"),
             member("d4", activity: "live")],
            activities: [
                Key(appID: "app", activityID: "ended"): .init(state: .ended, attributesType: "Match", sequence: 3, channelID: nil),
                Key(appID: "app", activityID: "live"): .init(state: .active, attributesType: "Match", sequence: 0, channelID: "ch-1"),
            ],
            existing: []
        )
        #expect(set.decisions[0] == .refused(.activityEnded))
        #expect(set.decisions[1] == .refused(.channelMismatch))
        #expect(set.decisions[2] == .refused(.channelMismatch))
        #expect(created(set.decisions[3])?.instance.deviceID == "d4")
        // Nothing of the refused is written: no activity for the channel registration to "nowhere", one instance, one event.
        #expect(set.newActivities.isEmpty)
        #expect(set.newInstances.map(\.registration.deviceID) == ["d4"])
        #expect(set.events.count == 1)
    }

    @Test("left to their bodies: a device with an instance, one that comes twice, attributes for an existing activity")
    func leftToBodies() {
        let set = RegistrationSet(
            [member("old", activity: "live"), member("d1", activity: "live"), member("d1", activity: "live"),
             member("d2", activity: "bare")],
            activities: [
                Key(appID: "app", activityID: "live"): .init(state: .active, attributesType: "Match", sequence: 1, channelID: nil),
                Key(appID: "app", activityID: "bare"): .init(state: .active, attributesType: nil, sequence: 0, channelID: nil),
            ],
            existing: [RegistrationSet.InstanceKey(appID: "app", activityID: "live", deviceID: "old")]
        )
        #expect(set.decisions[0] == .alone)
        #expect(created(set.decisions[1])?.instance.deviceID == "d1")
        #expect(set.decisions[2] == .alone)
        #expect(set.decisions[3] == .alone)
        #expect(set.newInstances.map(\.registration.deviceID) == ["d1"])
    }

    @Test("the same registration again: a candidate when its device comes once, answered unchanged only when it changes nothing")
    func sameRegistrationAgain() {
        let live = Key(appID: "app", activityID: "live")
        let activity = RegistrationSet.FoundActivity(state: .active, attributesType: "Match", sequence: 1, channelID: nil)
        var set = RegistrationSet(
            [member("same", activity: "live"), member("twice", activity: "live"), member("twice", activity: "live"),
             member("token", activity: "live"), member("new", activity: "live")],
            activities: [live: activity],
            existing: Set(["same", "twice", "token"].map { RegistrationSet.InstanceKey(appID: "app", activityID: "live", deviceID: $0) })
        )
        #expect(set.unchangedCandidates == [0, 3])
        func stored(_ device: String, token: String) -> InstanceRecord {
            var instance = SQLStore.newInstance(member(device, activity: "live").registration, nowMillis: 500)
            instance.pushToken = token
            return instance
        }
        let found = [
            RegistrationSet.InstanceKey(appID: "app", activityID: "live", deviceID: "same"): stored("same", token: "aasame"),
            RegistrationSet.InstanceKey(appID: "app", activityID: "live", deviceID: "token"): stored("token", token: "bb"),
        ]
        #expect(set.unchangedRegistrations.map(\.deviceID) == ["same", "token"])
        set.answerUnchanged(found)
        #expect(set.decisions[0] == .done(RegistrationResult(change: .unchanged, instance: stored("same", token: "aasame"))))
        #expect(set.decisions[1] == .alone && set.decisions[2] == .alone)
        #expect(set.decisions[3] == .alone)  // a new token: the body writes it
        #expect(created(set.decisions[4])?.change == .created)
    }

    @Test("what the same registration again may change: nothing, or its body decides")
    func changesNothing() {
        let r = member("d", activity: "live").registration
        let instance = SQLStore.newInstance(r, nowMillis: 500)
        let active = RegistrationSet.FoundActivity(state: .active, attributesType: "Match", sequence: 1, channelID: "ch")
        #expect(RegistrationSet.changesNothing(r, instance: instance, activity: active))
        var withUser = r
        withUser.userID = "someone"
        #expect(!RegistrationSet.changesNothing(withUser, instance: instance, activity: active))
        var ended = active
        ended.state = .ended
        #expect(!RegistrationSet.changesNothing(r, instance: instance, activity: ended))
        var bare = active
        bare.attributesType = nil
        #expect(!RegistrationSet.changesNothing(r, instance: instance, activity: bare))
        var otherChannel = r
        otherChannel.channelID = "other"
        #expect(!RegistrationSet.changesNothing(otherChannel, instance: instance, activity: active))
        for state in [InstanceState.starting, .invalidated] {
            var waiting = instance
            waiting.state = state
            #expect(!RegistrationSet.changesNothing(r, instance: waiting, activity: active), "\(state)")
        }
        var android = r
        android.platform = .android
        #expect(!RegistrationSet.changesNothing(android, instance: instance, activity: active))
    }

    @Test("array values: quoted and escaped text, NULLs, integers")
    func arrays() {
        #expect(PostgresArray.text(["a", nil, #"q"u\o{t,e}"#, ""]) == .text(#"{"a",NULL,"q\"u\\o{t,e}",""}"#))
        #expect(PostgresArray.text([]) == .text("{}"))
        #expect(PostgresArray.integer([1, nil, -3]) == .text("{1,NULL,-3}"))
    }

    // MARK: The Store

    @Test(
        "registrations queued together come out as each alone: new, caught up, refused, a new token, twice the same",
        arguments: StoreKind.available
    )
    func queuedRegistrationsAsEachAlone(on kind: StoreKind) async throws {
        try await withOneWriter(kind) { store, queued, metrics in
            try await makeApp(store)
            // "live" has accepted state and one instance, and its delivery is done; "over" has ended.
            _ = try await store.registerInstance(registration("old", activity: "live", token: "aa01"), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "live", contentState: ["n": 1]), at: t0)
            _ = try await store.writer.write(durability: .full) { db in
                try db.query("UPDATE activities SET dispatched_sequence = sequence WHERE activity_id = 'live'")
            }
            _ = try await store.registerInstance(registration("x", activity: "over"), at: t0)
            _ = try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "over"), at: t0)

            let later = t0.addingTimeInterval(60)
            var bare = registration("f1", activity: "fresh", token: "aa11")
            bare.attributesType = nil
            bare.attributes = nil
            let registrations = [
                bare,                                                       // creates "fresh", without attributes
                registration("f2", activity: "fresh", token: "aa12"),       // gives "fresh" its attributes
                registration("f3", activity: "fresh", token: "aa13"),
                registration("f3", activity: "fresh", token: "aa13"),       // the same again
                registration("l1", activity: "live", token: "aa21"),        // caught up
                registration("l2", activity: "live", token: "aa22"),
                registration("old", activity: "live", token: "aa02"),       // a new token
                registration("o1", activity: "over", token: "aa31"),        // refused: ended
            ]
            let outcomes = try await queuedTogether(store, queued: queued, registrations.map { r in { try await store.registerInstance(r, at: later) } })

            let changes = outcomes.map { try? $0.get().change }
            #expect(changes[0] == .created && changes[1] == .created && changes[4] == .created && changes[5] == .created)
            #expect([changes[2], changes[3]].compactMap { $0 }.sorted { $0.rawValue < $1.rawValue } == [.created, .unchanged])
            #expect(changes[6] == .updated)
            #expect(throws: StoreError.activityEnded) { try outcomes[7].get() }
            #expect((try? outcomes[4].get())?.needsDelivery == true)
            #expect((try? outcomes[6].get())?.needsDelivery == true)
            #expect((try? outcomes[0].get())?.needsDelivery == false)
            #expect((try? outcomes[0].get())?.instance.createdAt == later)

            let fresh = try #require(try await store.activity(appID: "app_test", activityID: "fresh"))
            #expect(fresh.attributesType == "DeliveryAttributes")
            #expect(fresh.attributes == ["orderId": "1"])
            #expect(fresh.state == .active && fresh.sequence == 0)
            let freshDevices = try await store.instances(appID: "app_test", activityID: "fresh", cursor: nil, limit: 10).items
            #expect(freshDevices.map(\.deviceID) == ["f1", "f2", "f3"])
            #expect(freshDevices.allSatisfy { $0.state == .active && $0.deliveredSequence == 0 && $0.createdAt == later && $0.userID == "user-1" })
            let liveDevices = try await store.instances(appID: "app_test", activityID: "live", cursor: nil, limit: 10).items
            #expect(liveDevices.map(\.deviceID) == ["l1", "l2", "old"])
            #expect(liveDevices.first { $0.deviceID == "old" }?.pushToken == "aa02")
            #expect(liveDevices.first { $0.deviceID == "l1" }?.priority10.used(at: Int64(later.timeIntervalSince1970)) == 0)
            #expect(try await store.instances(appID: "app_test", activityID: "over", cursor: nil, limit: 10).items.map(\.deviceID) == ["x"])
            // "live" is pending again for its newcomers.
            let pending = try await store.reader.query("SELECT dispatched_sequence FROM activities WHERE activity_id = 'live'")
            #expect(pending.first?.column("dispatched_sequence")?.integer == 0)

            // One event each for what was written: five instances registered, one token rotated.
            try await store.sequenceEvents()
            let events = try await store.events(appID: "app_test", after: nil, types: [], limit: 100).filter { $0.createdAt == later }
            #expect(events.filter { $0.type == .instanceRegistered }.compactMap(\.deviceID).sorted() == ["f1", "f2", "f3", "l1", "l2"])
            #expect(events.filter { $0.type == .instanceTokenRotated }.compactMap(\.deviceID) == ["old"])
            #expect(events.count == 6)

            if let metrics {
                // On PostgreSQL the eight were one set: six decided by it (five written, one refused), two by their bodies.
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "set")]).totalValue == 6)
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "body")]).totalValue == 2)
            }
        }
    }

    @Test("the same registrations again, queued together, are answered unchanged as by their bodies, and write nothing", arguments: StoreKind.available)
    func sameRegistrationsAgainQueued(on kind: StoreKind) async throws {
        try await withOneWriter(kind) { store, queued, metrics in
            try await makeApp(store)
            for device in ["a", "b", "c", "d"] {
                _ = try await store.registerInstance(registration(device, activity: "again", token: "aa" + device), at: t0)
            }
            let before = try await store.instances(appID: "app_test", activityID: "again", cursor: nil, limit: 10).items
            var withoutUser = registration("b", activity: "again", token: "aab")
            withoutUser.userID = nil
            var otherUser = registration("d", activity: "again", token: "aad")
            otherUser.userID = "user-2"
            let registrations = [
                registration("a", activity: "again", token: "aaa"),  // the same again
                withoutUser,                                          // the same, without its user id
                registration("c", activity: "again", token: "cc"),   // a new token
                otherUser,                                            // another user
            ]
            let later = t0.addingTimeInterval(60)
            let outcomes = try await queuedTogether(store, queued: queued, registrations.map { r in { try await store.registerInstance(r, at: later) } })
            let results = try outcomes.map { try $0.get() }
            #expect(results.map(\.change) == [.unchanged, .unchanged, .updated, .updated])
            // Answered with the instance as it is stored, as the body answers.
            #expect(results[0].instance == before[0])
            #expect(results[1].instance == before[1])
            let after = try await store.instances(appID: "app_test", activityID: "again", cursor: nil, limit: 10).items
            #expect(after[0] == before[0] && after[1] == before[1])
            #expect(after[2].pushToken == "cc" && after[3].userID == "user-2")
            if let metrics {
                // On PostgreSQL the two registered again were answered by the set; the two that change something by their
                // bodies.
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "set")]).totalValue == 2)
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "body")]).totalValue == 2)
            }
        }
    }

    @Test("registrations and updates queued together are each written as a set, in a transaction of their own", arguments: StoreKind.available)
    func mixedQueueSplitsByKind(on kind: StoreKind) async throws {
        try await withOneWriter(kind) { store, queued, metrics in
            try await makeApp(store)
            let commits = { try metrics?.expectCounter(StoreCommitMetrics.commitsName, [("durability", "full")]).totalValue ?? 0 }
            let before = try commits()
            let later = t0.addingTimeInterval(60)
            let writes: [@Sendable () async throws -> Int64] = [
                { try await store.registerInstance(registration("r1", activity: "watched"), at: later).instance.deliveredSequence },
                { try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "u1", contentState: ["n": 1]), at: later, idempotency: nil).sequence },
                { try await store.registerInstance(registration("r2", activity: "watched"), at: later).instance.deliveredSequence },
                { try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "u2", contentState: ["n": 1]), at: later, idempotency: nil).sequence },
                { try await store.registerInstance(registration("r3", activity: "watched"), at: later).instance.deliveredSequence },
            ]
            let outcomes = try await queuedTogether(store, queued: queued, writes)
            #expect(try outcomes.map { try $0.get() } == [0, 1, 0, 1, 0])
            #expect(try await store.instances(appID: "app_test", activityID: "watched", cursor: nil, limit: 10).items.map(\.deviceID) == ["r1", "r2", "r3"])
            if let metrics {
                // The gate's write, then one transaction for the three registrations and one for the two updates.
                #expect(try commits() - before == 3)
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "set")]).totalValue == 5)
            }
        }
    }
}

extension IdempotentOutcome {
    /// The result of a performed write; a replay has none here (no write in these tests carries a key).
    fileprivate var sequence: Int64 {
        if case .performed(let accepted) = self, let accepted = accepted as? AcceptedSequence { return accepted.sequence }
        return -1
    }
}
