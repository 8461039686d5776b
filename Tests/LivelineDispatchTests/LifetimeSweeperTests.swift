import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Testing

/// A clock the test moves by hand.
final class ManualClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date
    init(_ start: Date) { current = start }
    var now: Date { lock.withLock { current } }
    func set(_ date: Date) { lock.withLock { current = date } }
}

@Suite("Lifetime sweeper (injected clock, no sleeping)")
struct LifetimeSweeperTests {
    let t0 = Date(timeIntervalSince1970: 1_795_255_200)

    func instance(_ activity: String, _ device: String, token: String) -> InstanceRegistration {
        InstanceRegistration(
            appID: appID, activityID: activity, deviceID: device, platform: .ios, pushToken: token, attributesType: "A", attributes: [:],
            userID: nil
        )
    }

    @Test("an activity nobody ends is ended with its last state at 7 h 45 min, and its end goes out", arguments: StoreKind.available)
    func endsAtLifetime(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let clock = ManualClock(t0)
            _ = try await store.registerInstance(instance("old", "d1", token: token(1)), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "old", contentState: ["score": "2-1"]), at: t0)
            _ = try await store.registerInstance(instance("young", "d2", token: token(2)), at: t0.addingTimeInterval(3600))
            let sweeper = LifetimeSweeper(store: store, now: { clock.now })

            clock.set(t0.addingTimeInterval(7 * 3600 + 44 * 60))
            #expect(try await sweeper.sweep() == LifetimeSweeper.Sweep())

            clock.set(t0.addingTimeInterval(7 * 3600 + 45 * 60))
            #expect(try await sweeper.sweep().endedForLifetime == 1)
            let old = try #require(try await store.activity(appID: appID, activityID: "old"))
            #expect(old.state == .ended)
            #expect(old.endReason == .lifetime)
            #expect(old.event == .end)
            #expect(old.contentState == ["score": "2-1"], "ended with its last state")
            #expect(try await store.activity(appID: appID, activityID: "young")?.state == .active)

            // The end push goes to the phone.
            let transport = ScriptedTransport()
            try await whileDispatching(store, transport) { (dispatcher: Dispatcher) async throws in
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: token(1)).contains { $0.event == .end } })
            }
            #expect(transport.pushes(to: token(2)).isEmpty)
        }
    }

    @Test("the lifetime counts from the first phone's registration, not from a backend update hours before it", arguments: StoreKind.available)
    func lifetimeFromFirstInstance(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let clock = ManualClock(t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["minute": 0]), at: t0)
            _ = try await store.registerInstance(instance("match", "d1", token: token(1)), at: t0.addingTimeInterval(3 * 3600))
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "nobody", contentState: ["n": 1]), at: t0)
            let sweeper = LifetimeSweeper(store: store, now: { clock.now })
            clock.set(t0.addingTimeInterval(7 * 3600 + 45 * 60))
            #expect(try await sweeper.sweep().endedForLifetime == 1, "the activity no phone watches ends; the match goes on")
            #expect(try await store.activity(appID: appID, activityID: "match")?.state == .active)
            #expect(try await store.activity(appID: appID, activityID: "nobody")?.endReason == .lifetime)
            clock.set(t0.addingTimeInterval(3 * 3600 + 7 * 3600 + 45 * 60))
            #expect(try await sweeper.sweep().endedForLifetime == 1)
            #expect(try await store.activity(appID: appID, activityID: "match")?.endReason == .lifetime)
        }
    }

    @Test("instances are marked ended 12 hours after registering; an activity whose instances are all gone ends", arguments: StoreKind.available)
    func instancesAndAllGone(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let clock = ManualClock(t0)
            let policy = LifetimePolicy(endAfter: 100 * 3600)  // out of the way: this test is about instances
            let sweeper = LifetimeSweeper(store: store, policy: policy, now: { clock.now })
            _ = try await store.registerInstance(instance("match", "early", token: token(1)), at: t0)
            _ = try await store.registerInstance(instance("match", "late", token: token(2)), at: t0.addingTimeInterval(6 * 3600))
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "lonely", contentState: ["n": 1]), at: t0)

            clock.set(t0.addingTimeInterval(12 * 3600 - 1))
            #expect(try await sweeper.sweep().instancesEnded == 0)
            clock.set(t0.addingTimeInterval(12 * 3600))
            let first = try await sweeper.sweep()
            #expect(first.instancesEnded == 1)
            #expect(first.endedWithAllInstancesGone == 0, "one instance is still active")
            let instances = try await store.instances(appID: appID, activityID: "match", cursor: nil, limit: 10).items
            #expect(instances.first { $0.deviceID == "early" }?.state == .ended)
            #expect(instances.first { $0.deviceID == "late" }?.state == .active)

            // The last one is dismissed by the user: nothing is left to show the activity.
            _ = try await store.recordInstanceEvent(appID: appID, activityID: "match", deviceID: "late", event: .dismissedOnDevice, at: clock.now)
            let second = try await sweeper.sweep()
            #expect(second.endedWithAllInstancesGone == 1)
            #expect(try await store.activity(appID: appID, activityID: "match")?.endReason == .allInstancesGone)
            // An activity that never had instances keeps its state for later registrations.
            #expect(try await store.activity(appID: appID, activityID: "lonely")?.state == .active)

            // An invalidated instance is not gone: the phone registers the activity's new token, which revives it.
            _ = try await store.registerInstance(instance("rotating", "phone", token: token(3)), at: clock.now)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "rotating", contentState: ["n": 1]), at: clock.now)
            try await store.recordProgress(
                DeliveryProgress(
                    appID: appID, activityID: "rotating", invalidated: [PushedInstance(deviceID: "phone", token: token(3), sequence: 1)]
                ),
                at: clock.now
            )
            #expect(try await sweeper.sweep().endedWithAllInstancesGone == 0)
            #expect(try await store.registerInstance(instance("rotating", "phone", token: token(4)), at: clock.now).instance.state == .active)
        }
    }

    @Test(
        "instances registered in the cutoff's own hour end only when they registered before the cutoff itself",
        arguments: StoreKind.available
    )
    func cutoffWithinItsHour(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            // t0 is on the hour; the cutoff falls at 30 minutes past it, 12 hours later.
            let registered: [(device: String, at: TimeInterval)] = [("hour-before", -60), ("same-hour-before", 1_799), ("at-cutoff", 1_800), ("same-hour-after", 1_801)]
            for (index, phone) in registered.enumerated() {
                _ = try await store.registerInstance(instance("match", phone.device, token: token(index + 1)), at: t0.addingTimeInterval(phone.at))
            }
            let ended = try await store.endInstances(registeredBefore: t0.addingTimeInterval(1_800), at: t0.addingTimeInterval(12 * 3600 + 1_800))
            #expect(ended == 3)
            let states = try await store.instances(appID: appID, activityID: "match", cursor: nil, limit: 10).items.map { ($0.deviceID, $0.state) }
            #expect(
                Dictionary(uniqueKeysWithValues: states)
                    == ["hour-before": .ended, "same-hour-before": .ended, "at-cutoff": .ended, "same-hour-after": .active]
            )
        }
    }

    @Test("the caller's end is recorded as such; ended activities are purged after the retention period", arguments: StoreKind.available)
    func callerEndAndPurge(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let clock = ManualClock(t0)
            let sweeper = LifetimeSweeper(store: store, policy: LifetimePolicy(retention: 24 * 3600), now: { clock.now })
            _ = try await store.registerInstance(instance("done", "d1", token: token(1)), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "done", contentState: ["n": 1]), at: t0)
            _ = try await store.endActivity(ActivityEnd(appID: appID, activityID: "done"), at: t0.addingTimeInterval(60))
            #expect(try await store.activity(appID: appID, activityID: "done")?.endReason == .caller)

            clock.set(t0.addingTimeInterval(60 + 24 * 3600 - 1))
            #expect(try await sweeper.sweep().purged == 0)
            clock.set(t0.addingTimeInterval(60 + 24 * 3600))
            #expect(try await sweeper.sweep().purged == 1)
            #expect(try await store.activity(appID: appID, activityID: "done") == nil)
            #expect(try await store.instances(appID: appID, activityID: "done", cursor: nil, limit: 10).items.isEmpty)
        }
    }

    @Test("requests remembered under idempotency keys are forgotten by the sweep once their 24 hours are over", arguments: StoreKind.available)
    func prunesIdempotencyKeys(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let clock = ManualClock(t0)
            let sweeper = LifetimeSweeper(store: store, now: { clock.now })
            let claim = IdempotencyClaim<AcceptedSequence>(key: "retry-1", fingerprint: [1]) { _ in StoredResponse(status: 202, body: []) }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "keyed", contentState: ["n": 1]), at: t0, idempotency: claim)

            clock.set(t0.addingTimeInterval(24 * 3600))
            #expect(try await sweeper.sweep().idempotencyKeysPruned == 0)
            #expect(try await store.idempotencyRecord(appID: appID, key: "retry-1") != nil)
            clock.set(t0.addingTimeInterval(24 * 3600 + 1))
            #expect(try await sweeper.sweep().idempotencyKeysPruned == 1)
            #expect(try await store.idempotencyRecord(appID: appID, key: "retry-1") == nil)
        }
    }
}
