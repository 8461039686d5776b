import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import PostgresNIO
import Testing

/// The event feed on PostgreSQL, where writers on many connections and nodes commit in any order: the sequencer gives
/// positions to what has committed, and waits for nothing still running.
@Suite("PostgreSQL event feed", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct PostgresEventFeedTests {
    @Test("a transaction left open in another database on the same server holds none of the feed back")
    func otherDatabasesTransactionHoldsNothingBack() async throws {
        try await withTemporaryPostgresDatabase(prefix: "liveline_other") { otherURL in
            try await PostgresTestServer.withConnection(url: otherURL) { other in
                // A transaction with an id of its own (`pg_current_xact_id()` assigns one), older than every write
                // below, left open until they are read: the server's oldest running transaction.
                try await other.query("BEGIN", logger: PostgresTestServer.logger)
                try await other.query("SELECT pg_current_xact_id()", logger: PostgresTestServer.logger)
                try await withTemporaryStore(.postgres) { store, _ in
                    try await makeApp(store)
                    _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "match", contentState: ["n": 1]), at: t0)
                    let events = try await store.events(appID: "app_test", after: nil, types: [], limit: 100)
                    #expect(events.map(\.type) == [.activityStarted])
                    #expect(events.first?.position == 1)
                }
                try await other.query("ROLLBACK", logger: PostgresTestServer.logger)
            }
        }
    }

    @Test("an event committed beside a writer still running has its position at once; the writer's follows, above it, when it commits")
    func committedEventPassesAWriterStillRunning() async throws {
        try await withTemporaryStore(.postgres) { store, url in
            try await makeApp(store)
            try await PostgresTestServer.withConnection(url: url) { writer in
                // A writer that recorded its event first (the lower `seq`) and has not committed.
                try await writer.query("BEGIN", logger: PostgresTestServer.logger)
                try await writer.query(
                    """
                    INSERT INTO events (app_id, type, activity_id, data, created_at)
                    VALUES ('app_test', 'activity.updated', 'slow', '{}', 0)
                    """,
                    logger: PostgresTestServer.logger
                )
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "quick", contentState: ["n": 1]), at: t0)
                let first = try await store.events(appID: "app_test", after: nil, types: [], limit: 100)
                #expect(first.map(\.activityID) == ["quick"])
                #expect(first.map(\.position) == [1])

                try await writer.query("COMMIT", logger: PostgresTestServer.logger)
                let next = try await store.events(appID: "app_test", after: first.last?.position, types: [], limit: 100)
                #expect(next.map(\.activityID) == ["slow"])
                #expect(next.map(\.position) == [2])
                #expect(try await store.events(appID: "app_test", after: nil, types: [], limit: 100).map(\.activityID) == ["quick", "slow"])
            }
        }
    }

    @Test("a backlog larger than one pass is positioned whole before a read, in the order it was written")
    func backlogOfSeveralPasses() async throws {
        try await withTemporaryStore(.postgres) { store, url in
            try await makeApp(store)
            let count = SQLStore.sequencerPassLimit * 2 + 3
            _ = try await postgresRows(
                url,
                """
                INSERT INTO events (app_id, type, activity_id, data, created_at)
                SELECT 'app_test', 'activity.updated', 'a' || n, '{}', n FROM generate_series(1, \(count)) AS n
                """
            )
            let last = try await store.events(appID: "app_test", after: Int64(count - 1), types: [], limit: 10)
            #expect(last.map(\.activityID) == ["a\(count)"])
            #expect(last.map(\.position) == [Int64(count)])
            let waiting = try await postgresRows(url, "SELECT count(*)::text AS n FROM events WHERE id IS NULL")
            #expect(waiting.first?["n"] == "0")
        }
    }
}
