import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import SQLiteNIO
import Testing

@Suite("SQLite store: delivery timeline")
struct TimelineTests {
    func attempt(_ activity: String, _ n: Int, at date: Date = t0) -> DeliveryRecord {
        DeliveryRecord(
            appID: "app_test", activityID: activity, deviceID: "d\(n)", platform: n % 2 == 0 ? .ios : .android, sequence: Int64(n),
            event: n == 0 ? .start : .update, priority: n % 3 == 0 ? 5 : 10, status: n % 4 == 0 ? .retrying : .delivered,
            providerID: n % 5 == 0 ? nil : "id-\(n)", reason: n % 4 == 0 ? "TooManyRequests \"quoted\"\n" : nil,
            latencyMilliseconds: n % 7 == 0 ? nil : Double(n) + 0.25, attempt: n % 4 == 0 ? 2 : 1,
            attemptedAt: date.addingTimeInterval(Double(n))
        )
    }

    /// Every page of the timeline, following the cursors.
    func allPages(_ store: SQLStore, activity: String, limit: Int) async throws -> [[DeliveryRecord]] {
        var pages: [[DeliveryRecord]] = []
        var cursor: String?
        repeat {
            let page = try await store.deliveries(appID: "app_test", activityID: activity, cursor: cursor, limit: limit)
            pages.append(page.items)
            cursor = page.nextCursor
        } while cursor != nil
        return pages
    }

    /// The app and `activities`: the timeline keeps attempts only of activities that exist.
    func makeActivities(_ store: SQLStore, _ activities: String...) async throws {
        try await makeApp(store)
        for activity in activities { _ = try await store.registerInstance(registration("setup", activity: activity), at: t0) }
    }

    @Test("attempts recorded in batches read back newest first, every field intact, across pages that split batches", arguments: StoreKind.available)
    func pagesAcrossSegments(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeActivities(store, "a")
            for range in [0..<5, 5..<8, 8..<15] {
                try await store.recordProgress(
                    DeliveryProgress(appID: "app_test", activityID: "a", attempts: range.map { attempt("a", $0) }), at: t0
                )
            }
            let pages = try await allPages(store, activity: "a", limit: 4)
            #expect(pages.map(\.count) == [4, 4, 4, 3])
            let items = pages.flatMap { $0 }
            #expect(items.map(\.deviceID) == (0..<15).reversed().map { "d\($0)" })
            #expect(zip(items, items.dropFirst()).allSatisfy { $0.id > $1.id })
            for item in items {
                let n = Int(item.deviceID.dropFirst())!
                var expected = attempt("a", n)
                expected.id = item.id
                #expect(item == expected)
            }
        }
    }

    @Test("pruning to the newest attempts trims a batch and keeps the ids of what stays", arguments: StoreKind.available)
    func pruneKeepsIDs(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeActivities(store, "a")
            for range in [0..<6, 6..<12] {
                try await store.recordProgress(
                    DeliveryProgress(appID: "app_test", activityID: "a", attempts: range.map { attempt("a", $0) }), at: t0
                )
            }
            let before = try await store.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 100).items
            try await store.pruneDeliveries(olderThan: t0.addingTimeInterval(-86400), keepPerActivity: 8)
            let after = try await store.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 100).items
            #expect(after == Array(before.prefix(8)))
            try await store.pruneDeliveries(olderThan: t0.addingTimeInterval(-86400), keepPerActivity: 6)
            let fewer = try await store.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 100).items
            #expect(fewer == Array(before.prefix(6)))
        }
    }

    @Test("pruning more segments than one write deletes takes several writes and leaves exactly what it keeps", arguments: StoreKind.available)
    func pruneInSeveralWrites(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeActivities(store, "old", "a")
            let segments = SQLStore.segmentsPerPruneWrite * 2 + 9
            let old = t0.addingTimeInterval(-30 * 86400)
            // "old": one attempt per segment, all past the retention. "a": one per segment, recent, over its limit.
            for n in 0..<segments {
                try await store.recordProgress(DeliveryProgress(appID: "app_test", activityID: "old", attempts: [attempt("old", n, at: old)]), at: old)
            }
            for n in 0..<segments {
                try await store.recordProgress(DeliveryProgress(appID: "app_test", activityID: "a", attempts: [attempt("a", n)]), at: t0)
            }
            try await store.pruneDeliveries(olderThan: t0.addingTimeInterval(-86400), keepPerActivity: 5)
            #expect(try await store.deliveries(appID: "app_test", activityID: "old", cursor: nil, limit: 100).items.isEmpty)
            let kept = try await store.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 100).items
            #expect(kept.map(\.deviceID) == (segments - 5..<segments).reversed().map { "d\($0)" })
            let rows = try await store.reader.query("SELECT COUNT(*) AS n FROM delivery_segments").first?.column("n")?.integer
            #expect(rows == 5)
        }
    }

    @Test("attempts recorded before the timeline was kept in segments are still there after the migration, in order")
    func migrationFromRows() async throws {
        try await withTemporaryStore { store, path in
            try await makeApp(store)
            // Put the database back at schema 8, with attempts in the one-row-per-attempt table.
            for sql in [
                "DROP TABLE delivery_segments",
                """
                CREATE TABLE deliveries (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, app_id TEXT NOT NULL, activity_id TEXT NOT NULL, device_id TEXT NOT NULL,
                    platform TEXT NOT NULL, sequence INTEGER NOT NULL, event TEXT NOT NULL, priority INTEGER NOT NULL,
                    status TEXT NOT NULL, provider_id TEXT, reason TEXT, latency_ms REAL, attempt INTEGER NOT NULL,
                    attempted_at INTEGER NOT NULL
                )
                """,
                // Later steps undone too, so that they apply again.
                "DROP INDEX instances_starting",
                "DROP TABLE start_audiences",
                "ALTER TABLE activities DROP COLUMN start_alert",
                "DROP INDEX activities_due",
                "CREATE INDEX activities_pending ON activities(next_dispatch_at) WHERE dispatched_sequence < sequence",
                "DROP TABLE idempotency_keys",
                "DROP TABLE devices",
                "DROP TABLE device_tags",
                "DROP TABLE push_to_start_tokens",
                "DROP INDEX activities_live_channels",
                "DROP INDEX activities_channels_to_delete",
                "ALTER TABLE activities DROP COLUMN delivery",
                "ALTER TABLE activities DROP COLUMN channel_id",
                "ALTER TABLE activities DROP COLUMN channel_storage_policy",
                "ALTER TABLE activities DROP COLUMN channel_status",
                "ALTER TABLE activities DROP COLUMN channel_created_at",
                "ALTER TABLE activities DROP COLUMN channel_deleted_at",
                "ALTER TABLE activities DROP COLUMN broadcast_sequence",
                "ALTER TABLE instances DROP COLUMN channel_id",
                "ALTER TABLE apps DROP COLUMN default_delivery",
                "ALTER TABLE apps DROP COLUMN default_channel_storage_policy",
                "DROP TABLE events",
                "ALTER TABLE instances DROP COLUMN unconfirmed_reported_at",
                "DROP TABLE webhook_deliveries",
                "DROP TABLE webhooks",
                "DROP TABLE fanout_slices",
                "ALTER TABLE instances DROP COLUMN priority10_tally",
                "DROP INDEX activities_claimed",
                "DROP TABLE store_secrets",
                "ALTER TABLE activities DROP COLUMN broadcast_priority10_tally",
                "ALTER TABLE apps DROP COLUMN audience_from",
                "DROP TABLE delivery_marks",
                "ALTER TABLE activities DROP COLUMN pass_counter",
                "ALTER TABLE activities DROP COLUMN settled_sequence",
                "ALTER TABLE activities DROP COLUMN settled_pass",
                "ALTER TABLE instances DROP COLUMN joined_pass",
                "DELETE FROM schema_migrations WHERE version >= 9",
            ] {
                _ = try await store.write(sql, [])
            }
            let old = (0..<3).map { attempt("a", $0) }
            for record in old {
                _ = try await store.write(
                    """
                    INSERT INTO deliveries (app_id, activity_id, device_id, platform, sequence, event, priority, status, provider_id,
                        reason, latency_ms, attempt, attempted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                    [
                        .text(record.appID), .text(record.activityID), .text(record.deviceID), .text(record.platform.rawValue),
                        .integer(Int(record.sequence)), .text(record.event.rawValue), .integer(record.priority),
                        .text(record.status.rawValue), SQLStore.text(record.providerID), SQLStore.text(record.reason),
                        SQLStore.real(record.latencyMilliseconds), .integer(record.attempt),
                        .integer(SQLStore.millis(record.attemptedAt)),
                    ]
                )
            }
            try await store.close()
            let reopened = try await SQLStore.open(path: path)
            let items = try await reopened.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 10).items
            try await reopened.close()
            #expect(items.map(\.deviceID) == ["d2", "d1", "d0"])
            for item in items {
                var expected = old[Int(item.deviceID.dropFirst())!]
                expected.id = item.id
                #expect(item == expected)
            }
        }
    }
}
