import Foundation
import LivelineStore
import LivelineTestSupport
import Testing

@testable import LivelineStore

@Suite("SQLite store: claiming pending activities")
struct ClaimOrderTests {
    @Test("a claim reads the pending activities in index order, and never sorts them all")
    func claimUsesTheIndex() async throws {
        try await withTemporaryStore { store, _ in
            let plan = try await store.reader.query(
                "EXPLAIN QUERY PLAN \(SQLStore.claimStatement)", [.text("o"), .integer(1), .integer(1), .integer(1)]
            ).compactMap { $0.column("detail")?.string }
            #expect(plan.contains { $0.contains("USING INDEX activities_due") }, "\(plan)")
            #expect(!plan.contains { $0.contains("TEMP B-TREE") }, "\(plan)")
        }
    }

    @Test("claims take what is due now, oldest change first, before anything deferred; nothing deferred before it is due", arguments: StoreKind.available)
    func claimOrder(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            for (index, activity) in ["b", "a", "c"].enumerated() {
                _ = try await store.acceptUpdate(
                    ActivityUpdate(appID: "app_test", activityID: activity, contentState: ["n": 1]), at: t0.addingTimeInterval(Double(index))
                )
            }
            // "b" is deferred for a minute: "a" and "c" go first, in the order they changed.
            let first = try #require(try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(5), lease: 30))
            #expect(first.activity.activityID == "b")
            try await store.deferClaim(appID: "app_test", activityID: "b", owner: "w", sequence: 1, until: t0.addingTimeInterval(60))
            let second = try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(5), lease: 30)
            let third = try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(5), lease: 30)
            #expect([second?.activity.activityID, third?.activity.activityID] == ["a", "c"])
            #expect(try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(30), lease: 30) == nil)
            #expect(try await store.nextClaimableAt() == t0.addingTimeInterval(35), "the leases of a and c run out first")
            let due = try await store.claimPendingActivity(owner: "w", now: t0.addingTimeInterval(36), lease: 30)
            #expect(due?.activity.activityID == "a", "a's lease ran out")
        }
    }

    @Test("a claim handed back with no retry time (shutdown, a lost pass) leaves the activity pending and claimable at once", arguments: StoreKind.available)
    func releaseUnscheduled(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            _ = try await store.registerInstance(
                InstanceRegistration(
                    appID: "app_test", activityID: "a", deviceID: "d1", platform: .ios, pushToken: String(repeating: "ab", count: 32),
                    attributesType: nil, attributes: nil, userID: nil
                ),
                at: t0
            )
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 1]), at: t0)
            let claim = try #require(try await store.claimPendingActivity(owner: "w1", now: t0, lease: 30))
            // The instance is still behind: the release keeps the activity pending, due at once (no retry time).
            let done = try await store.releaseClaim(appID: "app_test", activityID: "a", owner: claim.owner, platforms: [.ios, .android], retryAt: nil)
            #expect(!done)
            #expect(try await store.nextClaimableAt().map { $0 <= t0 } == true)
            let again = try await store.claimPendingActivity(owner: "w2", now: t0, lease: 30)
            #expect(again?.activity.activityID == "a")
        }
    }
}
