import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import MetricsTestKit
import SQLiteNIO
import Testing

/// Updates without an `Idempotency-Key` queued together run on PostgreSQL as one set (``UpdateWrite``): the set's
/// decisions (``UpdateSet``, pure) and the Store's outcome, which must be the updates' own, one after another.
@Suite("Updates as one set")
struct UpdateSetTests {
    private typealias Key = ActivityKey

    private func member(_ activity: String, _ n: Int64, at seconds: TimeInterval = 1_795_000_000) -> UpdateSet.Member {
        UpdateSet.Member(
            update: ActivityUpdate(appID: "app", activityID: activity, contentState: ["n": .integer(n)], priority: 5),
            now: Date(timeIntervalSince1970: seconds)
        )
    }

    private func accepted(_ decision: UpdateSet.Decision) -> AcceptedSequence? {
        if case .done(let sequence) = decision { return sequence }
        return nil
    }

    @Test("each update takes its activity's next sequence, or starts a new one; the second to one activity is left to its body")
    func nextSequences() {
        let now = Date(timeIntervalSince1970: 1_795_000_000)
        let heads: [Key: ActivityHead] = [
            Key(appID: "app", activityID: "running"): ActivityHead(
                state: .active, sequence: 4, timestamp: 1_795_000_000, contentState: nil, staleDate: nil, relevanceScore: nil
            ),
            Key(appID: "app", activityID: "registered"): ActivityHead(
                state: .active, sequence: 0, timestamp: nil, contentState: nil, staleDate: nil, relevanceScore: nil
            ),
        ]
        let set = UpdateSet([member("running", 1), member("registered", 2), member("new", 3), member("running", 4)], heads: heads)
        #expect(set.decisions.compactMap(accepted).map(\.sequence) == [5, 1, 1])
        #expect(set.decisions.compactMap(accepted).map(\.activityID) == ["running", "registered", "new"])
        #expect(accepted(set.decisions[3]) == nil)
        #expect(set.changed.map(\.key.activityID) == ["running", "registered"])
        #expect(set.created.map(\.key.activityID) == ["new"])
        #expect(set.events.map(\.event.type) == [.activityUpdated, .activityStarted, .activityStarted])
        // The row's values are the body's, for the same next state: a timestamp after the head's.
        let next = try? SQLStore.nextState(member("running", 1).update, after: heads[Key(appID: "app", activityID: "running")], at: now)
        #expect(next?.timestamp == 1_795_000_001)
        #expect(set.changed.first?.values == next.map { SQLStore.updatedActivityValues(member("running", 1).update, next: $0, nowMillis: SQLStore.millis(now)) })
    }

    @Test("an update to an ended activity is refused, and writes nothing")
    func endedRefuses() {
        let set = UpdateSet(
            [member("over", 1)],
            heads: [Key(appID: "app", activityID: "over"): ActivityHead(
                state: .ended, sequence: 3, timestamp: 1_795_000_000, contentState: nil, staleDate: nil, relevanceScore: nil
            )]
        )
        guard case .refused(let error) = set.decisions.first else {
            Issue.record("not refused: \(set.decisions)")
            return
        }
        #expect(error == .activityEnded)
        #expect(set.changed.isEmpty && set.created.isEmpty && set.events.isEmpty)
    }

    @Test("array values of a row's columns: text, integers, floats and nulls")
    func columnArrays() {
        #expect(PostgresArray.values([.text("a\"b"), .integer(3), .float(0.25), .null]) == .text(#"{"a\"b",3,0.25,NULL}"#))
    }

    @Test("updates queued together come out as each alone: next sequences, a new activity, a refusal, every field", arguments: StoreKind.available)
    func queuedUpdatesAsEachAlone(on kind: StoreKind) async throws {
        try await withOneWriter(kind) { store, queued, metrics in
            try await makeApp(store)
            for n in 1...2 {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "running", contentState: ["n": .integer(Int64(n))]), at: t0)
            }
            _ = try await store.registerInstance(registration("d1", activity: "registered"), at: t0)
            _ = try await store.registerInstance(registration("d2", activity: "over"), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "over", contentState: ["n": 1]), at: t0)
            _ = try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "over"), at: t0)

            let later = t0.addingTimeInterval(60)
            let full = ActivityUpdate(
                appID: "app_test", activityID: "registered", contentState: ["eta": "5 min"],
                alert: LiveActivityAlert(title: "Soon", body: "Five minutes", sound: "default"),
                staleDate: Int64(later.timeIntervalSince1970) + 600, relevanceScore: 0.75, priority: 10,
                contentShape: JSONShape(kinds: ["contentState.eta": "string"]), minUpdateInterval: 2.5
            )
            let updates = [
                ActivityUpdate(appID: "app_test", activityID: "running", contentState: ["n": 3]),
                ActivityUpdate(appID: "app_test", activityID: "running", contentState: ["n": 4]),
                full,
                ActivityUpdate(appID: "app_test", activityID: "new", contentState: ["n": 1], priority: 5),
                ActivityUpdate(appID: "app_test", activityID: "over", contentState: ["n": 2]),
            ]
            let outcomes = try await queuedTogether(
                store, queued: queued,
                updates.map { u in { try await store.acceptUpdate(u, at: later, idempotency: nil).performed?.sequence } }
            )
            #expect(Set([try outcomes[0].get(), try outcomes[1].get()]) == [3, 4])
            #expect(try outcomes[2].get() == 1)
            #expect(try outcomes[3].get() == 1)
            #expect(throws: StoreError.activityEnded) { try outcomes[4].get() }

            let running = try #require(try await store.activity(appID: "app_test", activityID: "running"))
            #expect(running.sequence == 4)
            // The update that took sequence 4 wrote the content state.
            let last = try outcomes[0].get() == 4 ? updates[0] : updates[1]
            #expect(running.contentState == last.contentState)
            #expect(running.timestampSeconds == Int64(later.timeIntervalSince1970) + 1)

            let registered = try #require(try await store.activity(appID: "app_test", activityID: "registered"))
            #expect(registered.sequence == 1 && registered.event == .update && registered.sequenceAt == later)
            #expect(registered.contentState == ["eta": "5 min"])
            #expect(registered.alert == full.alert)
            #expect(registered.staleDate == full.staleDate && registered.relevanceScore == 0.75 && registered.priority == 10)
            #expect(registered.contentShape == full.contentShape && registered.minUpdateInterval == 2.5)
            #expect(registered.attributesType == "DeliveryAttributes" && registered.updatedAt == later)

            let new = try #require(try await store.activity(appID: "app_test", activityID: "new"))
            #expect(new.sequence == 1 && new.state == .active && new.createdAt == later && new.priority == 5)
            #expect(new.alert == nil && new.staleDate == nil && new.relevanceScore == nil && new.contentShape == nil)
            // Created by its update, the new one has nothing to deliver; an activity a phone watches is left pending.
            #expect(new.dispatchedSequence == 1)
            #expect(registered.dispatchedSequence == 0)
            #expect(try await store.activity(appID: "app_test", activityID: "over")?.sequence == 2)

            try await store.sequenceEvents()
            let events = try await store.events(appID: "app_test", after: nil, types: [], limit: 100).filter { $0.createdAt == later }
            #expect(events.filter { $0.type == .activityUpdated }.map(\.activityID) == ["running", "running"])
            #expect(events.filter { $0.type == .activityStarted }.compactMap(\.activityID).sorted() == ["new", "registered"])
            #expect(events.count == 4)

            if let metrics {
                // On PostgreSQL the five were one set: four decided by it (three accepted, one refused), one by its body.
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "set")]).totalValue == 4)
                #expect(try metrics.expectCounter(StoreCommitMetrics.setMembersName, [("decided", "body")]).totalValue == 1)
            }
        }
    }
}

extension IdempotentOutcome {
    /// The result of a performed write, nil for a replay.
    fileprivate var performed: Result? {
        if case .performed(let result) = self { return result }
        return nil
    }
}
