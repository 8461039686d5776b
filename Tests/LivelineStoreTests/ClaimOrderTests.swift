import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import SQLiteNIO
import Testing

@testable import LivelineStore

@Suite("SQLite store: claiming pending activities")
struct ClaimOrderTests {
    @Test("a claim reads the pending activities in index order, never sorts them all, and looks for instances by key")
    func claimUsesTheIndex() async throws {
        try await withTemporaryStore { store, _ in
            let pick = try await store.reader.query("EXPLAIN QUERY PLAN \(SQLStore.pickStatement)", [.integer(1), .integer(1)])
                .compactMap { $0.column("detail")?.string }
            #expect(pick.contains { $0.contains("USING INDEX activities_due") }, "\(pick)")
            #expect(!pick.contains { $0.contains("TEMP B-TREE") }, "\(pick)")
            let keys = ["a", "b", "c"].map { ActivityKey(appID: "app_test", activityID: $0) }
            let settle = SQLStore.settleStatement(keys, platforms: [.ios, .android])
            #expect(settle.sql.components(separatedBy: "(?, ?)").count - 1 == 4, "three keys fill a list of four")
            let plan = try await store.reader.query("EXPLAIN QUERY PLAN \(settle.sql)", settle.binds).compactMap { $0.column("detail")?.string }
            // Only the list of keys is scanned; every table is searched by key.
            #expect(plan.filter { $0.hasPrefix("SCAN") }.allSatisfy { $0.hasSuffix("VALUES CLAUSE") }, "\(plan)")
            #expect(plan.contains("SEARCH i USING PRIMARY KEY (app_id=? AND activity_id=?)"), "\(plan)")
            // When the next activity is due: the first unleased one in the index's order, and the leased ones by theirs.
            let due = try await store.reader.query("EXPLAIN QUERY PLAN \(SQLStore.dueStatement)", []).compactMap { $0.column("detail")?.string }
            #expect(due.contains { $0.contains("USING INDEX activities_due") }, "\(due)")
            #expect(due.contains { $0.contains("USING INDEX activities_claimed") }, "\(due)")
            #expect(!due.contains { $0.hasPrefix("SCAN activities") && !$0.contains("INDEX") }, "\(due)")
        }
    }

    @Test("claims take what is due now, oldest change first, before anything deferred; nothing deferred before it is due", arguments: StoreKind.available)
    func claimOrder(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await update(["b": .ios, "a": .ios, "c": .ios], in: store, from: t0)
            // "b" is deferred for a minute: "a" and "c" go first, in the order they changed.
            let first = try #require(try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(5), lease: 30))
            #expect(first.activity.activityID == "b")
            try await store.deferClaim(appID: "app_test", activityID: "b", owner: "w", sequence: 1, until: t0.addingTimeInterval(60))
            let second = try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(5), lease: 30)
            let third = try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(5), lease: 30)
            #expect([second?.activity.activityID, third?.activity.activityID] == ["a", "c"])
            #expect(try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(30), lease: 30, platforms: [.ios]) == nil)
            #expect(try await store.nextClaimable().next == t0.addingTimeInterval(35), "the leases of a and c run out first")
            let due = try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(36), lease: 30)
            #expect(due?.activity.activityID == "a", "a's lease ran out")
        }
    }

    @Test("an activity with nothing behind for the engine's platforms is marked done by the claim and leased to nobody", arguments: StoreKind.available)
    func claimSettlesWhatHasNothingToSend(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            // "nobody": no instance at all. "android": one instance, on a platform this engine does not send to.
            // "watched": an iPhone behind, so it is claimed though it changed last.
            try await update(["nobody": nil, "android": .android, "watched": .ios], in: store, from: t0)

            let now = t0.addingTimeInterval(5)
            let key = { ActivityKey(appID: "app_test", activityID: $0) }
            // One look: the two with nothing behind are marked done, in the order they fell due; "watched" is leased.
            let found = try #require(try await store.claimPendingActivity(owner: "w", now: now, lease: 30, platforms: [.ios]))
            #expect(found.settled == [key("nobody"), key("android")])
            #expect(found.claim?.activity.activityID == "watched")
            #expect(found.claim?.owner == "w")
            #expect(found.claim?.activity.dispatchedSequence == 0, "a claimed activity is not marked done")
            // The settled ones are done: nothing else is due, and their rows carry no lease.
            #expect(try await store.claimPendingActivity(owner: "w", now: now.addingTimeInterval(10), lease: 30, platforms: [.ios]) == nil)
            for activityID in ["nobody", "android"] {
                let settled = try #require(try await store.activity(appID: "app_test", activityID: activityID))
                #expect(settled.dispatchedSequence == settled.sequence)
            }

            // A newer state for the Android phone is claimed by an engine that sends to Android.
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "android", contentState: ["n": 2]), at: now)
            #expect(try await store.claimToSend(owner: "w2", now: now, lease: 30)?.activity.activityID == "android")
        }
    }

    @Test("a claim says which of its app's credentials are stored, with their version and health, and a re-read of it says so anew", arguments: StoreKind.available)
    func claimSaysWhichCredentialsAreStored(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await update(["watched": .ios], in: store, from: t0)
            let now = t0.addingTimeInterval(5)
            let claim = try #require(try await store.claimToSend(owner: "w", now: now, lease: 30))
            #expect(claim.credentials == [:], "none stored")
            try await store.saveCredentials(
                StoredCredentials(appID: "app_test", provider: .apns, settings: ["teamId": .string("TEAM123456")], sealedSecret: [1, 2, 3], updatedAt: t0)
            )
            try await store.setCredentialsHealth(appID: "app_test", provider: .apns, healthy: false, reason: "InvalidProviderToken", at: now)
            let saved = try #require(try await store.credentials(appID: "app_test", provider: .apns))
            let held = try #require(try await store.heldClaim(appID: "app_test", activityID: "watched", owner: "w", now: now))
            #expect(held.credentials == [.apns: CredentialsVersion(updatedAt: saved.updatedAt, healthy: false)])
        }
    }

    @Test("an update that creates its activity leaves nothing to deliver; a phone that registers afterwards is caught up", arguments: StoreKind.available)
    func createdByAnUpdate(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "fresh", contentState: ["n": 1]), at: t0)
            let fresh = try #require(try await store.activity(appID: "app_test", activityID: "fresh"))
            #expect(fresh.sequence == 1 && fresh.dispatchedSequence == 1, "nobody can watch an activity before its row exists")
            #expect(try await store.nextClaimable().next == nil)
            #expect(try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(1), lease: 30, platforms: [.ios]) == nil)

            // A phone registering now gets the state it missed: the activity is pending again, and claimed for it.
            try await watch("fresh", in: store, at: t0.addingTimeInterval(2))
            let claim = try #require(try await store.claimToSend(owner: "w", now: t0.addingTimeInterval(3), lease: 30))
            #expect(claim.activity.activityID == "fresh" && claim.activity.sequence == 1)
            let behind = try await store.pendingInstances(
                appID: "app_test", activityID: "fresh", below: 1, platforms: [.ios], after: nil, limit: 10
            )
            #expect(behind.map(\.deviceID) == ["device-fresh"])
        }
    }

    @Test("one claim looks at a few dozen activities at most; the next one goes on from there", arguments: StoreKind.available)
    func claimLooksAtABoundedNumber(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            let count = SQLStore.claimLooksAt + 6
            for index in 0..<count {
                try await makePending(String(format: "a%03d", index), in: store, at: t0.addingTimeInterval(Double(index)))
            }
            let now = t0.addingTimeInterval(Double(count))
            let first = try #require(try await store.claimPendingActivity(owner: "w", now: now, lease: 30, platforms: [.ios]))
            #expect(first.claim == nil)
            #expect(first.settled.map(\.activityID) == (0..<SQLStore.claimLooksAt).map { String(format: "a%03d", $0) })
            #expect(first.leftPending, "a claim that looked at as many as it may says more may be due")
            let second = try #require(try await store.claimPendingActivity(owner: "w", now: now, lease: 30, platforms: [.ios]))
            #expect(second.settled.map(\.activityID) == (SQLStore.claimLooksAt..<count).map { String(format: "a%03d", $0) })
            #expect(!second.leftPending)
            #expect(try await store.claimPendingActivity(owner: "w", now: now, lease: 30, platforms: [.ios]) == nil)
        }
    }

    @Test("a claim says whether it left activities due for the next claims: one with something to send besides its own", arguments: StoreKind.available)
    func claimSaysWhetherItLeftWork(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await update(["quiet": nil, "a": .ios, "b": .ios], in: store, from: t0)
            let now = t0.addingTimeInterval(10)
            // The first due has nothing behind: the claim looks further, marks it done and leases the next.
            let first = try #require(try await store.claimPendingActivity(owner: "w1", now: now, lease: 30, platforms: [.ios]))
            #expect(first.claim?.activity.activityID == "a")
            #expect(first.settled.map(\.activityID) == ["quiet"])
            #expect(first.leftPending, "b has something to send and is not this claim's")
            let second = try #require(try await store.claimPendingActivity(owner: "w2", now: now, lease: 30, platforms: [.ios]))
            #expect(second.claim?.activity.activityID == "b")
            #expect(second.settled.isEmpty)
            #expect(!second.leftPending, "a is leased, b is this claim's: nothing is left for another worker")
        }
    }

    @Test("a claim leases the first activity due when it has something to send, and looks at no other", arguments: StoreKind.available)
    func claimTakesTheFirstWithWorkAtOnce(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await update(["a": .ios, "b": .ios, "quiet": nil], in: store, from: t0)
            let now = t0.addingTimeInterval(10)
            let first = try #require(try await store.claimPendingActivity(owner: "w1", now: now, lease: 30, platforms: [.ios]))
            #expect(first.claim?.activity.activityID == "a")
            #expect(first.settled.isEmpty, "nothing after the first is looked at")
            #expect(first.leftPending, "b is due after it")
            let quiet = try #require(try await store.activity(appID: "app_test", activityID: "quiet"))
            #expect(quiet.dispatchedSequence < quiet.sequence, "still pending")
            let second = try #require(try await store.claimPendingActivity(owner: "w2", now: now, lease: 30, platforms: [.ios]))
            #expect(second.claim?.activity.activityID == "b")
            #expect(second.settled.isEmpty)
            #expect(second.leftPending, "quiet is due after it")
            // Only "quiet" is due now, with nothing behind: marked done, nothing leased, nothing left.
            let third = try #require(try await store.claimPendingActivity(owner: "w3", now: now, lease: 30, platforms: [.ios]))
            #expect(third.claim == nil)
            #expect(third.settled.map(\.activityID) == ["quiet"])
            #expect(!third.leftPending)
            #expect(try await store.claimPendingActivity(owner: "w", now: now, lease: 30, platforms: [.ios]) == nil)
        }
    }

    /// Posts a state to each of `activities`, one second apart from `t0` in the order given, each watched first by a
    /// phone on its platform (`nil`: by nobody, ``makePending(_:in:at:)``).
    private func update(_ activities: KeyValuePairs<String, Platform?>, in store: SQLStore, from t0: Date) async throws {
        for (index, (activity, platform)) in activities.enumerated() {
            let at = t0.addingTimeInterval(Double(index))
            guard let platform else {
                try await makePending(activity, in: store, at: at)
                continue
            }
            try await watch(activity, in: store, at: t0, platform: platform)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: activity, contentState: ["n": 1]), at: at)
        }
    }

    /// Makes `activity`, which nobody watches, pending at `now`: its first update creates it with nothing to deliver,
    /// the second leaves it pending.
    private func makePending(_ activity: String, in store: SQLStore, at now: Date) async throws {
        for n: Int64 in [1, 2] {
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: activity, contentState: ["n": .integer(n)]), at: now)
        }
    }

    /// Registers a phone (`device-<activity>`) on `activity`, which is created by it if new.
    private func watch(_ activity: String, in store: SQLStore, at now: Date, platform: Platform = .ios) async throws {
        _ = try await store.registerInstance(
            InstanceRegistration(
                appID: "app_test", activityID: activity, deviceID: "device-\(activity)", platform: platform,
                pushToken: platform == .ios ? String(repeating: "ab", count: 32) : "fcm-\(activity)", attributesType: nil, attributes: nil,
                userID: nil
            ),
            at: now
        )
    }

    @Test("the next due is the earliest of the unleased pending activities' dispatch times and the leased ones' later of lease and dispatch time", arguments: StoreKind.available)
    func nextDue(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            let at = { (seconds: Int) in SQLiteData.integer(Int(t0.timeIntervalSince1970 * 1000) + seconds * 1000) }
            for activity in ["unleased-50", "unleased-20", "leased-10-next-70", "leased-30", "done-leased-1", "stateless-1"] {
                try await makePending(activity, in: store, at: t0)
            }
            func set(_ activity: String, _ assignments: String, _ binds: [SQLiteData]) async throws {
                _ = try await store.transaction { db in
                    try db.query(
                        "UPDATE activities SET \(assignments) WHERE app_id = 'app_test' AND activity_id = ?", binds + [.text(activity)]
                    )
                }
            }
            try await set("unleased-50", "next_dispatch_at = ?", [at(50)])
            try await set("unleased-20", "next_dispatch_at = ?", [at(20)])
            try await set("leased-10-next-70", "claim_owner = 'w', claim_expires_at = ?, next_dispatch_at = ?", [at(10), at(70)])
            try await set("leased-30", "claim_owner = 'w', claim_expires_at = ?", [at(30)])
            // Neither counts: one is sent (a lease left on it), the other has no state to send.
            try await set("done-leased-1", "dispatched_sequence = sequence, claim_owner = 'w', claim_expires_at = ?", [at(1)])
            try await set("stateless-1", "content_state = NULL, next_dispatch_at = ?", [at(1)])
            // Each in turn is the next due, then sent.
            for (due, activity) in [(20, "unleased-20"), (30, "leased-30"), (50, "unleased-50"), (70, "leased-10-next-70")] {
                #expect(try await store.nextClaimable().next == t0.addingTimeInterval(Double(due)), "\(activity)")
                try await set(activity, "dispatched_sequence = sequence, claim_owner = NULL, claim_expires_at = NULL", [])
            }
            #expect(try await store.nextClaimable().next == nil)
        }
    }

    @Test("a claim handed back with no retry time (shutdown, a lost pass) leaves the activity pending and claimable at once", arguments: StoreKind.available)
    func releaseUnscheduled(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await addActivityOfOnePhone(to: store, at: t0)
            let claim = try #require(try await store.claimToSend(owner: "w1", now: t0, lease: 30))
            // The instance is still behind: the release keeps the activity pending, due at once (no retry time).
            let done = try await store.releaseClaim(appID: "app_test", activityID: "a", owner: claim.owner, platforms: [.ios, .android], retryAt: nil)
            #expect(!done)
            #expect(try await store.nextClaimable().next.map { $0 <= t0 } == true)
            let again = try await store.claimToSend(owner: "w2", now: t0, lease: 30)
            #expect(again?.activity.activityID == "a")
        }
    }

    @Test("a lease moves its activity's dispatch time to its end, out of the claims' walk; a renewal moves it on; a restart on SQLite makes it due at once", arguments: StoreKind.available)
    func leaseMovesTheDispatchTime(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await addActivityOfOnePhone(to: store, at: t0)
            func dispatchTime() async throws -> Int? {
                try await store.reader.query(
                    "SELECT next_dispatch_at FROM activities WHERE app_id = 'app_test' AND activity_id = 'a'", []
                ).first?.column("next_dispatch_at")?.integer
            }
            let claim = try #require(try await store.claimToSend(owner: "w1", now: t0, lease: 30))
            #expect(try await dispatchTime() == SQLStore.millis(t0.addingTimeInterval(30)))
            // What the claims walk (due by now) leaves it out, as its lease does.
            let picked = try await store.reader.query(SQLStore.pickStatement, [.integer(SQLStore.millis(t0)), .integer(SQLStore.millis(t0))])
            #expect(picked.isEmpty)
            _ = try await store.renewClaim(appID: "app_test", activityID: "a", owner: claim.owner, now: t0.addingTimeInterval(20), lease: 30)
            #expect(try await dispatchTime() == SQLStore.millis(t0.addingTimeInterval(50)))
            #expect(try await store.nextClaimable().next == t0.addingTimeInterval(50))
            // The engine restarting on SQLite (one node) hands every claim back: due at once, not when the lease would
            // have run out. (Several nodes share PostgreSQL: a dead node's claims run out with their leases.)
            guard kind == .sqlite else { return }
            try await store.releaseAllClaims()
            #expect(try await dispatchTime() == nil)
            let again = try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(21), lease: 30)
            #expect(again?.activity.activityID == "a")
        }
    }

    @Test(
        "a release's retry time holds the claimed sequence back, not a newer one accepted during the pass; an accepted update is due at once",
        arguments: StoreKind.available
    )
    func retryTimeHoldsOnlyTheClaimedSequence(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await addActivityOfOnePhone(to: store, at: t0)
            // A pass left its phone for later: due again in 30 s.
            let first = try #require(try await store.claimToSend(owner: "w1", now: t0, lease: 60))
            try await store.releaseClaim(
                appID: "app_test", activityID: "a", owner: "w1", platforms: [.ios], retryAt: t0.addingTimeInterval(30),
                claimedSequence: first.activity.sequence, sendStart: nil, verified: nil
            )
            #expect(try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(1), lease: 60) == nil)
            // An update accepted after that release is due at once.
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 2]), at: t0.addingTimeInterval(2))
            let second = try #require(try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(3), lease: 60))
            #expect(second.activity.sequence == first.activity.sequence + 1)
            // One accepted while the pass runs, before its release: due at once too, the retry time notwithstanding.
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 3]), at: t0.addingTimeInterval(4))
            try await store.releaseClaim(
                appID: "app_test", activityID: "a", owner: "w2", platforms: [.ios], retryAt: t0.addingTimeInterval(35),
                claimedSequence: second.activity.sequence, sendStart: nil, verified: nil
            )
            let third = try #require(try await store.claimToSend(owner: "w3", now: t0.addingTimeInterval(5), lease: 60))
            #expect(third.activity.sequence == second.activity.sequence + 1)
        }
    }

    @Test("an update to a rate-shaped activity is due when the next state may go, not at once", arguments: StoreKind.available)
    func shapedUpdateIsDueWhenAllowed(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await addActivityOfOnePhone(to: store, at: t0)
            _ = try await store.acceptUpdate(
                ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 2], minUpdateInterval: 60), at: t0
            )
            // A pass sends sequence 2 at t0 and leaves the phone for later (its retry time 30 s on).
            let first = try #require(try await store.claimToSend(owner: "w1", now: t0, lease: 60))
            try await store.releaseClaim(
                appID: "app_test", activityID: "a", owner: "w1", platforms: [.ios], retryAt: t0.addingTimeInterval(30),
                claimedSequence: first.activity.sequence, sendStart: SendStart(sequence: first.activity.sequence, at: t0), verified: nil
            )
            // The next update may go 60 s after that send: not claimed before (the engine would only hand it back), then.
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 3]), at: t0.addingTimeInterval(1))
            #expect(try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(2), lease: 60) == nil)
            #expect(try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(59), lease: 60) == nil)
            let shaped = try #require(try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(60), lease: 60))
            #expect(shaped.activity.sequence == first.activity.sequence + 1)
        }
    }

    @Test("a release records the send's start it is given, for the next claim's rate shaping, and keeps the one before without one", arguments: StoreKind.available)
    func releaseRecordsTheSendStart(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await addActivityOfOnePhone(to: store, at: t0)
            let first = try #require(try await store.claimToSend(owner: "w1", now: t0, lease: 30))
            #expect(first.activity.lastSentSequence == nil && first.activity.lastSentAt == nil)
            let started = t0.addingTimeInterval(2)
            try await store.releaseClaim(
                appID: "app_test", activityID: "a", owner: "w1", platforms: [.ios], retryAt: nil,
                sendStart: SendStart(sequence: first.activity.sequence, at: started)
            )
            // The instance is still behind (nothing recorded its delivery): the next claim reads the send's start.
            let second = try #require(try await store.claimToSend(owner: "w2", now: t0.addingTimeInterval(3), lease: 30))
            #expect(second.activity.lastSentSequence == first.activity.sequence && second.activity.lastSentAt == started)
            // A release without one (a catch-up of the state already sent) leaves it as it was.
            try await store.releaseClaim(appID: "app_test", activityID: "a", owner: "w2", platforms: [.ios], retryAt: nil)
            let third = try #require(try await store.claimToSend(owner: "w3", now: t0.addingTimeInterval(4), lease: 30))
            #expect(third.activity.lastSentSequence == first.activity.sequence && third.activity.lastSentAt == started)
            // A release by someone who no longer holds the claim records nothing.
            try await store.releaseClaim(
                appID: "app_test", activityID: "a", owner: "w1", platforms: [.ios], retryAt: nil,
                sendStart: SendStart(sequence: 99, at: t0.addingTimeInterval(5))
            )
            let held = try await store.activityWithoutInstanceCounts(appID: "app_test", activityID: "a")
            #expect(held?.lastSentSequence == first.activity.sequence && held?.lastSentAt == started)
        }
    }
}

/// Activity `a` with a state (sequence 1) and one iPhone (`d1`) behind it.
private func addActivityOfOnePhone(to store: SQLStore, at t0: Date) async throws {
    _ = try await store.registerInstance(
        InstanceRegistration(
            appID: "app_test", activityID: "a", deviceID: "d1", platform: .ios, pushToken: String(repeating: "ab", count: 32),
            attributesType: nil, attributes: nil, userID: nil
        ),
        at: t0
    )
    _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 1]), at: t0)
}

extension DispatchStore {
    /// Claims the pending activity due first for an engine sending to iOS and Android: the claim when it had something to
    /// send; `nil` when nothing was due, or when the claim found nothing to send and marked the activity done.
    func claimToSend(owner: String, now: Date, lease: TimeInterval) async throws -> DispatchClaim? {
        try await claimPendingActivity(owner: owner, now: now, lease: lease, platforms: [.ios, .android])?.claim
    }
}
