import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import MetricsTestKit
import Testing

@Suite("Concurrent registrations on PostgreSQL")
struct ConcurrentRegistrationTests {
    @Test(
        "phones joining an activity that has a state, all at once on several connections, take turns: no deadlock, none run again",
        .enabled(if: StoreKind.available.contains(.postgres))
    )
    func joiningALiveActivity() async throws {
        try await withTemporaryPostgresDatabase { url in
            let metrics = TestMetrics()
            let writer = try await PostgresPool(
                url: try PostgresDatabaseURL(url), count: 4, logger: PostgresTestServer.logger, metrics: StoreCommitMetrics(factory: metrics)
            )
            let reader = try await PostgresPool(url: try PostgresDatabaseURL(url), count: 2, logger: PostgresTestServer.logger)
            let store = SQLStore(dialect: .postgres, location: url, writer: writer, reader: reader)
            do {
                try await store.migrate(logger: PostgresTestServer.logger)
                try await makeApp(store)
                // The activity has an accepted state: each registration makes it pending again, so its new phone is
                // caught up. Before, each read the activity's row under a share lock and then updated it: two such
                // transactions at once each waited for the other's share lock, and PostgreSQL broke the deadlock by
                // failing one, over and over.
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "live", contentState: ["n": 1]), at: t0)
                let phones = 64
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 0..<phones {
                        group.addTask {
                            _ = try await store.registerInstance(registration("phone-\(index)", activity: "live"), at: t0.addingTimeInterval(1))
                        }
                    }
                    try await group.waitForAll()
                }
                let instances = try await store.instances(appID: "app_test", activityID: "live", cursor: nil, limit: 100).items
                #expect(instances.count == phones)
                let deadlocks = metrics.counters.filter {
                    $0.label == StoreCommitMetrics.writeRetriesName && $0.dimensions.contains { $0 == ("sqlstate", "40P01") }
                }
                #expect(deadlocks.reduce(0) { $0 + $1.totalValue } == 0, "transactions run again after a deadlock")
                let activity = try #require(try await store.activity(appID: "app_test", activityID: "live"))
                #expect(activity.dispatchedSequence < activity.sequence, "the activity is pending, for its new phones")
            } catch {
                try? await store.close()
                throw error
            }
            try await store.close()
        }
    }
}
