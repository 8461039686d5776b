import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

@testable import LivelineStore

@Suite("Store: shared fan-outs cut into slices")
struct SliceTests {
    private let t0 = Date(timeIntervalSince1970: 1_795_000_000)

    /// Registers `count` iPhones on `activity` (device ids `d000`, `d001`, …) and accepts one update.
    private func seed(_ store: SQLStore, activity: String = "a", count: Int) async throws {
        try await makeApp(store)
        for index in 0..<count {
            _ = try await store.registerInstance(
                InstanceRegistration(
                    appID: "app_test", activityID: activity, deviceID: String(format: "d%03d", index), platform: .ios,
                    pushToken: String(format: "%064x", index + 1), attributesType: nil, attributes: nil, userID: nil
                ),
                at: t0
            )
        }
        _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: activity, contentState: ["n": 1]), at: t0)
    }

    /// Records that a pass of `pass` sent activity `a`'s sequence 1 to the iPhones `from` through `through` (a mark).
    private func markSent(from: String, through: String, pass: Int64, in store: SQLStore) async throws {
        var progress = DeliveryProgress(appID: "app_test", activityID: "a")
        progress.marks = [
            DeliveryMark(
                platform: .ios, sequence: 1, pass: pass, fromDevice: from, throughDevice: through, priority: 10,
                sentAt: Int64(t0.timeIntervalSince1970)
            )
        ]
        try await store.recordProgress(progress, at: t0)
    }

    /// The device ids a slice's pages read, page by page, as the engine reads them.
    private func devices(of slice: FanOutSlice, in store: SQLStore, pageSize: Int = 4) async throws -> [String] {
        var devices: [String] = []
        var cursor = slice.after
        while true {
            let page = try await store.pendingInstances(
                appID: slice.appID, activityID: slice.activityID, below: 1, platforms: [.ios], after: cursor, through: slice.through,
                limit: pageSize
            )
            devices += page.map(\.deviceID)
            guard page.count == pageSize, let last = page.last else { return devices }
            cursor = last.deviceID
        }
    }

    @Test("the claim's holder cuts the pending instances into slices that cover each instance once", arguments: StoreKind.available)
    func planCoversEveryInstanceOnce(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 25)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(
                try await store.planSlices(appID: "app_test", activityID: "a", owner: "other", below: 1, platforms: [.ios], size: 10, now: t0) == 0,
                "only the claim's holder plans"
            )
            let count = try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0)
            #expect(count == 3)
            var slices: [FanOutSlice] = []
            while let taken = try await store.claimSlice(owner: "w", now: t0, lease: 30, of: nil) {
                #expect(taken.claim.activity.sequence == 1, "a slice comes with its activity's state")
                slices.append(taken.slice)
            }
            #expect(slices.map(\.index) == [0, 1, 2])
            #expect(slices.map(\.after) == [nil, "d009", "d019"])
            #expect(slices.map(\.through) == ["d009", "d019", nil])
            var covered: [String] = []
            for slice in slices { covered += try await devices(of: slice, in: store) }
            #expect(covered == (0..<25).map { String(format: "d%03d", $0) })
            #expect(
                try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 5, now: t0) == 3,
                "a plan that exists is kept (its holder died, a new one adopts it)"
            )
            #expect(
                try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 100, now: t0) == 3,
                "even when what is left to send would fit in one slice"
            )
        }
    }

    @Test(
        "a slice's claim seeks marks only when a mark of the sequence reaches into its range, and its pages then skip what it covers",
        arguments: StoreKind.available
    )
    func sliceConsultsMarksInItsRange(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 30)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            // A pass before marked d012 – d014: inside the middle slice (d009, d019] only.
            try await markSent(from: "d012", through: "d014", pass: claim.pass, in: store)
            var consulting: [Int: Bool] = [:]
            var read: [Int: [String]] = [:]
            while let taken = try await store.claimSlice(owner: "w", now: t0, lease: 30, of: nil) {
                consulting[taken.slice.index] = taken.claim.sequenceMarked
                read[taken.slice.index] = try await store.pendingInstances(
                    appID: "app_test", activityID: "a", below: 1, platforms: [.ios], after: taken.slice.after, through: taken.slice.through,
                    limit: 100, consultingMarks: taken.claim.sequenceMarked
                ).map(\.deviceID)
            }
            #expect(consulting == [0: false, 1: true, 2: false])
            #expect(read[1] == ["d010", "d011", "d015", "d016", "d017", "d018", "d019"])
            #expect(read[0]?.count == 10 && read[2]?.count == 10)
        }
    }

    @Test(
        "the holder plans around the marks of its sequence when its claim found some, and without them when it found none",
        arguments: StoreKind.available
    )
    func planCountsAroundTheMarksTheClaimFound(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 25)
            let first = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(!first.sequenceMarked, "nothing sent yet")
            // The pass stopped after marking d000 – d014 sent; the next holder finds ten still to send.
            try await markSent(from: "d000", through: "d014", pass: first.pass, in: store)
            try await store.releaseClaim(appID: "app_test", activityID: "a", owner: first.owner, platforms: [.ios], retryAt: nil)
            let next = try #require(try await store.claimToSend(owner: "next", now: t0, lease: 30))
            #expect(next.sequenceMarked)
            #expect(
                try await store.planSlices(
                    appID: "app_test", activityID: "a", owner: next.owner, below: 1, platforms: [.ios], size: 10, now: t0,
                    consultingMarks: next.sequenceMarked
                ) == 0,
                "the ten left fit in one slice"
            )
            #expect(
                try await store.planSlices(
                    appID: "app_test", activityID: "a", owner: next.owner, below: 1, platforms: [.ios], size: 10, now: t0, consultingMarks: false
                ) == 3,
                "without the marks, all 25 count"
            )
        }
    }

    @Test("a claim says whether its activity has slices left by a holder that stopped", arguments: StoreKind.available)
    func claimSaysWhetherSlicesAreLeft(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 25)
            let first = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(!first.slicesLeft, "none planned yet")
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: first.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            // The holder stopped before its slices were sent: the next claim of the activity finds them.
            try await store.releaseClaim(appID: "app_test", activityID: "a", owner: first.owner, platforms: [.ios], retryAt: nil)
            let next = try #require(try await store.claimToSend(owner: "next", now: t0, lease: 30))
            #expect(next.slicesLeft)
            let held = try #require(try await store.heldClaim(appID: "app_test", activityID: "a", owner: "next", now: t0))
            #expect(held.slicesLeft)
            try await store.dropSlices(appID: "app_test", activityID: "a", owner: "next")
            let dropped = try #require(try await store.heldClaim(appID: "app_test", activityID: "a", owner: "next", now: t0))
            #expect(!dropped.slicesLeft)
        }
    }

    @Test("a fan-out that fits in one slice, or an exact multiple's last slice, is not cut needlessly", arguments: StoreKind.available)
    func smallFanOutsAreNotCut(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 20)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 20, now: t0) == 0)
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 2)
            #expect(try await store.sliceOutcomes(appID: "app_test", activityID: "a") == [nil, nil])
        }
    }

    @Test("an activity with slices stays pending until their holder drops them, though no instance is behind any more", arguments: StoreKind.available)
    func slicesKeepTheActivityPending(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 25)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            // The slices' engines sent every instance; the holder stopped before dropping the slices.
            _ = try await store.write("UPDATE instances SET delivered_sequence = 1", [])
            let done = try await store.releaseClaim(appID: "app_test", activityID: "a", owner: claim.owner, platforms: [.ios], retryAt: nil)
            #expect(!done, "the slices keep it pending")
            let next = try await store.claimPendingActivity(owner: "next", now: t0, lease: 30, platforms: [.ios])
            #expect(next?.claim?.owner == "next", "claimed by the next holder, not marked done: \(String(describing: next))")
            try await store.dropSlices(appID: "app_test", activityID: "a", owner: "next")
            #expect(try await store.releaseClaim(appID: "app_test", activityID: "a", owner: "next", platforms: [.ios], retryAt: nil))
        }
    }

    @Test("the rest's answer says when the next slice is due, apart from the activities: at once unclaimed, at its lease's end held, never once sent", arguments: StoreKind.available)
    func sliceDue(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 30)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 60))
            #expect(try await store.nextClaimable() == ClaimableTimes(next: t0.addingTimeInterval(60), slice: nil), "the lead's lease alone")
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            let unclaimed = try await store.nextClaimable()
            #expect(unclaimed.slice.map { $0 <= t0 } == true, "unclaimed slices are due at once: \(unclaimed)")
            #expect(unclaimed.next == unclaimed.slice)
            var slices: [SliceClaim] = []
            for _ in 0..<3 { slices.append(try #require(try await store.claimSlice(owner: "node-2", now: t0, lease: 30, of: nil))) }
            #expect(try await store.nextClaimable() == ClaimableTimes(next: t0.addingTimeInterval(30), slice: t0.addingTimeInterval(30)))
            for taken in slices { try await store.finishSlice(taken.slice, owner: "node-2", outcome: .done) }
            #expect(try await store.nextClaimable() == ClaimableTimes(next: t0.addingTimeInterval(60), slice: nil), "every slice sent")
        }
    }

    @Test(
        "the slices say they were completed only when every one was sent completed: at the lowest sequence, never by one handed back",
        arguments: StoreKind.available
    )
    func slicesCompleted(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 30)
            #expect(try await store.slicesCompleted(appID: "app_test", activityID: "a") == nil, "no slices")
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 60))
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            var slices: [FanOutSlice] = []
            for _ in 0..<3 { slices.append(try #require(try await store.claimSlice(owner: "w", now: t0, lease: 30, of: nil)).slice) }
            try await store.finishSlice(slices[0], owner: "w", outcome: .done, completed: 2)
            // Handed back: whatever it says, it is sent again.
            try await store.finishSlice(slices[1], owner: "w", outcome: nil, completed: 1)
            try await store.finishSlice(slices[2], owner: "w", outcome: .done, completed: 1)
            #expect(try await store.slicesCompleted(appID: "app_test", activityID: "a") == nil, "one slice is not sent yet")
            let again = try #require(try await store.claimSlice(owner: "w", now: t0, lease: 30, of: nil))
            #expect(again.slice == slices[1])
            try await store.finishSlice(again.slice, owner: "w", outcome: .retryLater, completed: nil)
            #expect(try await store.slicesCompleted(appID: "app_test", activityID: "a") == nil, "one slice was sent without completing")
        }
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 30)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 60))
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            for completed: Int64 in [2, 1, 3] {
                let taken = try #require(try await store.claimSlice(owner: "w", now: t0, lease: 30, of: nil))
                try await store.finishSlice(taken.slice, owner: "w", outcome: .done, completed: completed)
            }
            #expect(try await store.slicesCompleted(appID: "app_test", activityID: "a") == 1)
        }
    }

    @Test("slices are leased: held ones are not claimed twice, a lapsed one is taken over, one handed back is claimed again", arguments: StoreKind.available)
    func leases(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seed(store, count: 30)
            let claim = try #require(try await store.claimToSend(owner: "lead", now: t0, lease: 30))
            #expect(try await store.planSlices(appID: "app_test", activityID: "a", owner: claim.owner, below: 1, platforms: [.ios], size: 10, now: t0) == 3)
            let key = ActivityKey(appID: "app_test", activityID: "a")
            let first = try #require(try await store.claimSlice(owner: "node-1", now: t0, lease: 30, of: key))
            let second = try #require(try await store.claimSlice(owner: "node-2", now: t0, lease: 30, of: nil))
            let third = try #require(try await store.claimSlice(owner: "node-2", now: t0, lease: 30, of: nil))
            #expect(Set([first.slice.index, second.slice.index, third.slice.index]) == [0, 1, 2])
            #expect(try await store.claimSlice(owner: "node-3", now: t0.addingTimeInterval(10), lease: 30, of: nil) == nil)
            #expect(try await store.nextClaimable().next == t0.addingTimeInterval(30), "the slices' leases run out first")

            // node-1 renews and reads its slice; node-2 cannot.
            #expect(try await store.renewSlice(first.slice, owner: "node-1", now: t0.addingTimeInterval(20), lease: 30))
            #expect(try await !store.renewSlice(first.slice, owner: "node-2", now: t0.addingTimeInterval(20), lease: 30))
            #expect(try await store.heldSlice(first.slice, owner: "node-1", now: t0.addingTimeInterval(21))?.activity.sequence == 1)
            #expect(try await store.heldSlice(first.slice, owner: "node-2", now: t0.addingTimeInterval(21)) == nil)

            // node-1 sends its slice; node-2 hands one back and then dies holding the other.
            try await store.finishSlice(first.slice, owner: "node-1", outcome: .done)
            try await store.finishSlice(second.slice, owner: "node-2", outcome: nil)
            let handedBack = try #require(try await store.claimSlice(owner: "node-3", now: t0.addingTimeInterval(25), lease: 30, of: nil))
            #expect(handedBack.slice == second.slice)
            #expect(try await store.claimSlice(owner: "node-3", now: t0.addingTimeInterval(25), lease: 30, of: nil) == nil)
            let takenOver = try #require(try await store.claimSlice(owner: "node-3", now: t0.addingTimeInterval(31), lease: 30, of: nil))
            #expect(takenOver.slice == third.slice, "the dead node's lease ran out")
            #expect(try await !store.renewSlice(third.slice, owner: "node-2", now: t0.addingTimeInterval(32), lease: 30))
            try await store.finishSlice(third.slice, owner: "node-2", outcome: .done)
            #expect(try await store.sliceOutcomes(appID: "app_test", activityID: "a") == [.done, nil, nil], "a lost slice's outcome is not its old holder's")

            try await store.finishSlice(handedBack.slice, owner: "node-3", outcome: .retryLater)
            try await store.finishSlice(takenOver.slice, owner: "node-3", outcome: .done)
            #expect(try await store.sliceOutcomes(appID: "app_test", activityID: "a") == [.done, .retryLater, .done])
            #expect(try await store.claimSlice(owner: "node-3", now: t0.addingTimeInterval(100), lease: 30, of: nil) == nil, "sent slices stay sent")

            try await store.dropSlices(appID: "app_test", activityID: "a", owner: "node-3")
            #expect(try await store.sliceOutcomes(appID: "app_test", activityID: "a").count == 3, "only the activity's holder drops them")
            try await store.dropSlices(appID: "app_test", activityID: "a", owner: claim.owner)
            #expect(try await store.sliceOutcomes(appID: "app_test", activityID: "a").isEmpty)
        }
    }
}
