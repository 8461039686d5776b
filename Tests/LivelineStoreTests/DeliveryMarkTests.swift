import Foundation
import LivelineCore
import SQLiteNIO
import Testing

@testable import LivelineStore
import LivelineTestSupport

/// A fan-out's progress as marks of runs (docs/progress-marks.md), on both stores: what a mark speaks for, what it
/// does not, what the API shows, and how a verified pass settles the activity.
@Suite("Store: delivery marks")
struct DeliveryMarkTests {
    private static let activity = "order-1"

    private static func devices(_ range: ClosedRange<Int>) -> [String] { range.map { "d\($0)" } }

    private static func register(_ devices: [String], in store: SQLStore, token: (String) -> String = { "aa" + $0 }) async throws {
        for device in devices { _ = try await store.registerInstance(registration(device, token: token(device)), at: t0) }
    }

    /// `devices` registered, the activity's first update accepted, and the activity claimed by the engine "w".
    private static func claimedUpdate(to devices: [String], in store: SQLStore) async throws -> DispatchClaim {
        try await register(devices, in: store)
        _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: activity, contentState: ["n": 1]), at: t0)
        return try #require(try await store.claimToSend(owner: "w", now: t0, lease: 30))
    }

    private static func mark(
        _ from: String, _ through: String, sequence: Int64 = 1, pass: Int64, priority: Int = 10, platform: Platform = .ios
    ) -> DeliveryMark {
        DeliveryMark(
            platform: platform, sequence: sequence, pass: pass, fromDevice: from, throughDevice: through, priority: priority,
            sentAt: Int64(t0.timeIntervalSince1970)
        )
    }

    private static func record(_ marks: [DeliveryMark], in store: SQLStore) async throws {
        var progress = DeliveryProgress(appID: "app_test", activityID: activity)
        progress.marks = marks
        try await store.recordProgress(progress, at: t0)
    }

    private static func pending(_ store: SQLStore, below sequence: Int64 = 1) async throws -> [String] {
        try await store.pendingInstances(
            appID: "app_test", activityID: activity, below: sequence, platforms: [.ios, .android], after: nil, through: nil, limit: 100
        ).map(\.deviceID)
    }

    private static func delivered(_ store: SQLStore) async throws -> [String: Int64] {
        let items = try await store.instances(appID: "app_test", activityID: activity, cursor: nil, limit: 100).items
        return Dictionary(uniqueKeysWithValues: items.map { ($0.deviceID, $0.deliveredSequence) })
    }

    private static func markCount(_ store: SQLStore) async throws -> Int {
        try await store.reader.query("SELECT COUNT(*) AS n FROM delivery_marks").first?.column("n")?.integer ?? -1
    }

    @Test(
        "a mark speaks for the instances of its range and platform that joined before its pass, not for one that joined or took a token since",
        arguments: StoreKind.available
    )
    func markCoversWhatItsPassRead(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let claim = try await Self.claimedUpdate(to: Self.devices(1...6), in: store)
            #expect(claim.pass == 1, "the claim raises the activity's pass counter")
            // After the claim: a new phone, and a new token for d3. The pass read neither.
            try await Self.register(["d7"], in: store)
            _ = try await store.registerInstance(registration("d3", token: "bb3"), at: t0)
            try await Self.record([Self.mark("d1", "d7", pass: claim.pass)], in: store)

            #expect(try await Self.pending(store) == ["d3", "d7"])
            #expect(
                try await store.pendingInstanceCount(
                    appID: "app_test", activityID: Self.activity, below: 1, platforms: [.ios], after: nil, through: nil
                ) == 2
            )
            #expect(try await Self.delivered(store) == ["d1": 1, "d2": 1, "d3": 0, "d4": 1, "d5": 1, "d6": 1, "d7": 0])
            // A mark of another platform, or of an older pass, speaks for nobody here.
            try await Self.record([Self.mark("d3", "d7", pass: claim.pass + 1, platform: .android), Self.mark("d3", "d3", pass: 1)], in: store)
            #expect(try await Self.pending(store) == ["d3", "d7"])
            // The marks' priority-10 pushes count against the budgets of the instances they speak for.
            let usage = try await store.priority10Usage(appID: "app_test", activityID: Self.activity)
            #expect(usage.map { $0.tally.used(at: Int64(t0.timeIntervalSince1970)) }.sorted() == [0, 0, 1, 1, 1, 1, 1])
        }
    }

    @Test(
        "a verified release settles the activity: nothing waits, the marks go but those of priority-10 pushes, and a phone that joins after is sent",
        arguments: StoreKind.available
    )
    func verifiedReleaseSettles(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let claim = try await Self.claimedUpdate(to: Self.devices(1...8), in: store)
            try await Self.record([Self.mark("d1", "d4", pass: claim.pass, priority: 5), Self.mark("d5", "d8", pass: claim.pass)], in: store)
            #expect(try await Self.pending(store).isEmpty)
            let done = try await store.releaseClaim(
                appID: "app_test", activityID: Self.activity, owner: "w", platforms: [.ios, .android], retryAt: nil, claimedSequence: nil, sendStart: nil,
                verified: SettledPass(sequence: 1, pass: claim.pass, at: t0)
            )
            #expect(done)
            let activity = try await store.reader.query(
                "SELECT settled_sequence, settled_pass FROM activities WHERE activity_id = ?", [.text(Self.activity)]
            ).first
            #expect(activity?.column("settled_sequence")?.integer == 1 && activity?.column("settled_pass")?.integer == Int(claim.pass))
            #expect(try await Self.markCount(store) == 1, "the priority-5 mark went; the priority-10 one counts for an hour")
            #expect(try await Self.delivered(store).values.allSatisfy { $0 == 1 })
            #expect(try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(1), lease: 30) == nil)

            // A phone that joins after the pass is not settled: it is sent, by a pass that claims the activity again.
            try await Self.register(["d9"], in: store)
            #expect(try await Self.pending(store) == ["d9"])
            let again = try #require(try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(2), lease: 30))
            #expect(again.pass == claim.pass + 1)
            // The settled sequence has the later marks' place: pruned once an hour and more old, with nothing lost.
            try await store.pruneDeliveryMarks(sentBefore: t0.addingTimeInterval(7_200))
            #expect(try await Self.markCount(store) == 0)
            #expect(try await Self.delivered(store) == Dictionary(uniqueKeysWithValues: (1...9).map { ("d\($0)", $0 == 9 ? 0 : 1) }))
        }
    }

    @Test(
        "a mark of a pass before an instance joined neither speaks for it nor hides a later pass's mark that does",
        arguments: StoreKind.available
    )
    func olderPassMarkDoesNotHideLaterOne(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let claim = try await Self.claimedUpdate(to: Self.devices(1...6), in: store)
            // d3 takes a new token after the claim: it joins at the claim's pass, and only a later pass's marks speak for it.
            _ = try await store.registerInstance(registration("d3", token: "bb3"), at: t0)
            // The older pass's mark is the nearest to d3 from either side (it starts and ends at d3); the later pass's
            // covers d1 – d6 around it.
            try await Self.record([Self.mark("d3", "d3", pass: claim.pass)], in: store)
            #expect(try await Self.pending(store) == Self.devices(1...6))
            try await Self.record([Self.mark("d1", "d6", pass: claim.pass + 1)], in: store)
            #expect(try await Self.pending(store).isEmpty)
            #expect(
                try await store.pendingInstanceCount(
                    appID: "app_test", activityID: Self.activity, below: 1, platforms: [.ios, .android], after: nil, through: nil
                ) == 0
            )
            #expect(try await Self.delivered(store).values.allSatisfy { $0 == 1 })
        }
    }

    @Test("a release whose pass was not verified leaves the activity unsettled, pending while anything waits", arguments: StoreKind.available)
    func unverifiedReleaseDoesNotSettle(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let claim = try await Self.claimedUpdate(to: Self.devices(1...6), in: store)
            // d5 failed and is left for a retry: the marks end before it and start after it.
            try await Self.record([Self.mark("d1", "d4", pass: claim.pass)], in: store)
            let done = try await store.releaseClaim(
                appID: "app_test", activityID: Self.activity, owner: "w", platforms: [.ios, .android], retryAt: nil, sendStart: nil
            )
            #expect(!done)
            #expect(try await Self.pending(store) == ["d5", "d6"])
            // A verification that a newer sequence overtook settles nothing either.
            _ = try #require(try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(1), lease: 30))
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: Self.activity, contentState: ["n": 2]), at: t0)
            let stale = try await store.releaseClaim(
                appID: "app_test", activityID: Self.activity, owner: "w", platforms: [.ios, .android], retryAt: nil, claimedSequence: nil, sendStart: nil,
                verified: SettledPass(sequence: 1, pass: claim.pass + 1, at: t0)
            )
            #expect(!stale)
            #expect(try await Self.pending(store, below: 2) == Self.devices(1...6))
        }
    }

    @Test(
        "past a settled sequence, what the API shows and a change of state writes come from it and the newer marks, the older priority-10 ones kept aside",
        arguments: StoreKind.available
    )
    func settledSequenceBoundsTheMarksRead(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let first = try await Self.claimedUpdate(to: Self.devices(1...6), in: store)
            try await Self.record([Self.mark("d1", "d6", pass: first.pass)], in: store)
            let settled = try await store.releaseClaim(
                appID: "app_test", activityID: Self.activity, owner: "w", platforms: [.ios, .android], retryAt: nil, claimedSequence: nil, sendStart: nil,
                verified: SettledPass(sequence: 1, pass: first.pass, at: t0)
            )
            #expect(settled)
            #expect(try await Self.markCount(store) == 1, "the priority-10 mark of sequence 1 stays for the budgets")
            // A second update, half sent: its marks speak for d1 – d3.
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: Self.activity, contentState: ["n": 2]), at: t0)
            let second = try #require(try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(1), lease: 30))
            try await Self.record([Self.mark("d1", "d3", sequence: 2, pass: second.pass)], in: store)
            #expect(try await Self.delivered(store) == ["d1": 2, "d2": 2, "d3": 2, "d4": 1, "d5": 1, "d6": 1])
            // Dismissed on the phone: each row keeps what it had, from the newer mark or from the settled sequence.
            for device in ["d2", "d5"] {
                _ = try await store.recordInstanceEvent(
                    appID: "app_test", activityID: Self.activity, deviceID: device, event: .dismissedOnDevice, at: t0
                )
            }
            try await store.write("DELETE FROM delivery_marks", [])
            #expect(try await Self.delivered(store) == ["d1": 1, "d2": 2, "d3": 1, "d4": 1, "d5": 1, "d6": 1])
        }
    }

    @Test("a change of state, or a new token, writes what the marks said into the instance's row first", arguments: StoreKind.available)
    func changesKeepWhatMarksSaid(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let claim = try await Self.claimedUpdate(to: Self.devices(1...5), in: store)
            try await Self.record([Self.mark("d1", "d5", pass: claim.pass)], in: store)
            // d2 is dismissed on the phone: no longer sent to, its row keeps sequence 1 whatever the marks become.
            _ = try await store.recordInstanceEvent(
                appID: "app_test", activityID: Self.activity, deviceID: "d2", event: .dismissedOnDevice, at: t0
            )
            // d4 registers the same token again (nothing changes) and d5 a new one (it is behind, its budget kept).
            _ = try await store.registerInstance(registration("d4", token: "aad4"), at: t0)
            _ = try await store.registerInstance(registration("d5", token: "bb5"), at: t0)
            try await store.write("DELETE FROM delivery_marks", [])
            let rows = try await store.reader.query(
                "SELECT device_id, delivered_sequence, priority10_tally FROM instances WHERE activity_id = ? ORDER BY device_id",
                [.text(Self.activity)]
            )
            let row = { (device: String) in rows.first { $0.column("device_id")?.string == device } }
            #expect(row("d2")?.column("delivered_sequence")?.integer == 1)
            #expect(row("d5")?.column("delivered_sequence")?.integer == 0)
            let now = Int64(t0.timeIntervalSince1970)
            #expect(
                row("d5")?.column("priority10_tally")?.integer.map { Priority10Tally(packed: Int64($0)).used(at: now) } == 1,
                "the new token's Live Activity is the same one: its priority-10 push still counts"
            )
            #expect(try await Self.delivered(store) == ["d1": 0, "d2": 1, "d3": 0, "d4": 0, "d5": 0])
        }
    }
}

extension Priority10Tally {
    /// The walk of every mark the index is checked against: the tally with each priority-10 mark that speaks for
    /// `instance` counted in its own quarter.
    fileprivate func counting(_ marks: [DeliveryMark], for instance: InstanceRecord) -> Priority10Tally {
        var tally = self
        for mark in marks where mark.priority == 10 && mark.covers(instance) {
            tally = tally.counting(pushAt: mark.sentAt)
        }
        return tally
    }
}

/// The index of priority-10 marks finds what a walk of every mark finds.
@Suite("Priority-10 mark index")
struct Priority10MarkIndexTests {
    @Test("for every instance, the index counts the pushes of the marks that cover it, as a walk of the marks does")
    func indexAgreesWithTheWalk() {
        var generator = SystemRandomNumberGenerator()
        let now: Int64 = 1_795_255_200
        // Twelve passes over 88 minutes (some older than the tally's window when the newest is counted), of two
        // sequences, each cutting the devices into runs of its own, some at priority 5.
        var marks: [DeliveryMark] = []
        for pass in Int64(1)...12 {
            var device = Int.random(in: 0..<5, using: &generator)
            while device < 400 {
                let length = Int.random(in: 1..<40, using: &generator)
                marks.append(
                    DeliveryMark(
                        platform: Bool.random(using: &generator) ? .ios : .android, sequence: pass % 2, pass: pass,
                        fromDevice: String(format: "d%04d", device), throughDevice: String(format: "d%04d", device + length - 1),
                        priority: Int.random(in: 0..<4, using: &generator) == 0 ? 5 : 10, sentAt: now + pass * 440
                    )
                )
                device += length + Int.random(in: 0..<3, using: &generator)
            }
        }
        let index = Priority10MarkIndex(marks.shuffled(using: &generator))
        // Every id a mark may name, and ids between them: "d00125" sorts after "d0012" and before "d0013", so a mark
        // that ends at "d0012" does not cover it; nor does one that starts at "d0013".
        let devices = (0..<410).flatMap { [String(format: "d%04d", $0), String(format: "d%04d5", $0)] } + ["", "c", "e"]
        for device in devices {
            for joinedPass in Int64(0)...12 {
                for platform in Platform.allCases {
                    let instance = InstanceRecord(
                        appID: "app", activityID: "a", deviceID: device, platform: platform, pushToken: "t",
                        userID: nil, state: .active, frequentPushesEnabled: nil, deliveredSequence: 0, createdAt: Date(), updatedAt: Date(),
                        priority10: .empty(at: now), joinedPass: joinedPass
                    )
                    #expect(index.counting(instance.priority10, for: instance) == instance.priority10.counting(marks, for: instance))
                }
            }
        }
    }

    @Test("an index of no priority-10 mark is empty and counts nothing")
    func emptyIndex() {
        let mark = DeliveryMark(platform: .ios, sequence: 1, pass: 1, fromDevice: "a", throughDevice: "z", priority: 5, sentAt: 1_795_255_200)
        let index = Priority10MarkIndex([mark])
        let tally = Priority10Tally.empty(at: 1_795_255_200)
        #expect(index.isEmpty)
        #expect(index.counting(tally, forDevice: "m", platform: .ios, joinedPass: 0) == tally)
        #expect(!Priority10MarkIndex([DeliveryMark(platform: .ios, sequence: 1, pass: 1, fromDevice: "a", throughDevice: "z", priority: 10, sentAt: 1_795_255_200)]).isEmpty)
    }
}
