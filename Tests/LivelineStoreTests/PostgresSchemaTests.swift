import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import PostgresNIO
import SQLiteNIO
import Testing

/// A schema as the parity test compares it: tables with their columns, and the indexes made with `CREATE INDEX`.
private struct SchemaShape: Sendable, Equatable {
    /// A column's type in SQLite's words (`integer`, `real`, `blob`, `text`), and whether it may hold NULL.
    struct Column: Sendable, Equatable, CustomStringConvertible {
        var type: String
        var notNull: Bool
        var description: String { notNull ? "\(type) not null" : type }
    }

    /// An index's table, its key columns in order (`nil`: an expression), and whether it is partial.
    struct Index: Sendable, Equatable, CustomStringConvertible {
        var table: String
        var columns: [String?]
        var partial: Bool
        var description: String {
            "\(table)(\(columns.map { $0 ?? "<expression>" }.joined(separator: ", ")))\(partial ? " WHERE …" : "")"
        }
    }

    var tables: [String: [String: Column]] = [:]
    var indexes: [String: Index] = [:]
}

/// The final SQLite schema, read from a new store's file.
private func sqliteSchema(_ store: SQLStore) async throws -> SchemaShape {
    try await store.transaction { db in
        var shape = SchemaShape()
        let tables = try db.query(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations'"
        ).compactMap { $0.column("name")?.string }
        for table in tables {
            var columns: [String: SchemaShape.Column] = [:]
            for row in try db.query("SELECT name, type, \"notnull\" AS not_null, pk FROM pragma_table_info(?)", [.text(table)]) {
                guard let name = row.column("name")?.string else { continue }
                // A primary key column holds no NULL on PostgreSQL; SQLite's WITHOUT ROWID tables and rowid aliases
                // refuse it too (its other TEXT primary keys take NULL by an old quirk, which no code relies on).
                let notNull = (row.column("not_null")?.integer ?? 0) != 0 || (row.column("pk")?.integer ?? 0) != 0
                columns[name] = .init(type: (row.column("type")?.string ?? "").lowercased(), notNull: notNull)
            }
            shape.tables[table] = columns
            // origin 'c': made by CREATE INDEX (not a primary key's or a UNIQUE constraint's autoindex).
            for index in try db.query("SELECT name, partial FROM pragma_index_list(?) WHERE origin = 'c'", [.text(table)]) {
                guard let name = index.column("name")?.string else { continue }
                let columns = try db.query("SELECT name FROM pragma_index_info(?) ORDER BY seqno", [.text(name)])
                    .map { $0.column("name")?.string }
                shape.indexes[name] = .init(table: table, columns: columns, partial: (index.column("partial")?.integer ?? 0) != 0)
            }
        }
        return shape
    }
}

/// Runs every PostgreSQL migration's statements on `connection`, in one transaction (as the Store applies them, without
/// its bookkeeping).
private func applyAllMigrations(on connection: PostgresConnection) async throws {
    let logger = PostgresTestServer.logger
    try await connection.withTransaction(logger: logger) { connection in
        for migration in PostgresMigrations.all {
            for statement in migration.statements {
                try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
            }
        }
    }
}

/// The schema of the database `connection` is connected to (schema `public`), in SQLite's words.
private func postgresSchema(_ connection: PostgresConnection) async throws -> SchemaShape {
    let logger = PostgresTestServer.logger
    var shape = SchemaShape()
    let tables = try await connection.query(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
        logger: logger
    )
    for try await table in tables.decode(String.self) { shape.tables[table] = [:] }
    let columns = try await connection.query(
        """
        SELECT c.table_name::text, c.column_name::text, c.data_type::text, c.collation_name::text, c.is_nullable = 'NO'
        FROM information_schema.columns c JOIN information_schema.tables t
          ON t.table_schema = c.table_schema AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE'
        WHERE c.table_schema = 'public'
        """,
        logger: logger
    )
    for try await (table, column, dataType, collation, notNull) in columns.decode((String, String, String, String?, Bool).self) {
        let type: String
        switch dataType {
        case "bigint": type = "integer"
        case "double precision": type = "real"
        case "bytea": type = "blob"
        // Text compares bytewise, as in SQLite, only with the C collation.
        case "text": type = collation == "C" ? "text" : "text collate \(collation ?? "default")"
        default: type = dataType
        }
        shape.tables[table, default: [:]][column] = .init(type: type, notNull: notNull)
    }
    // Indexes not made for a constraint (primary key, UNIQUE): those SQLite has by CREATE INDEX.
    let indexes = try await connection.query(
        """
        SELECT i.relname::text, t.relname::text, x.indpred IS NOT NULL, k.n, a.attname::text
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class t ON t.oid = x.indrelid
        JOIN pg_namespace ns ON ns.oid = t.relnamespace
        CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
        LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum AND k.attnum > 0
        WHERE ns.nspname = 'public' AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
        ORDER BY 1, 4
        """,
        logger: logger
    )
    for try await (name, table, partial, _, column) in indexes.decode((String, String, Bool, Int64, String?).self) {
        shape.indexes[name, default: .init(table: table, columns: [], partial: partial)].columns.append(column)
    }
    return shape
}

@Suite("PostgreSQL schema")
struct PostgresSchemaTests {
    static let isCI = ProcessInfo.processInfo.environment["CI"] == "true"

    @Test("CI runs the PostgreSQL tests: when CI is true, LIVELINE_TEST_POSTGRES_URL is set")
    func ciHasPostgres() {
        if Self.isCI {
            #expect(
                PostgresTestServer.url != nil,
                "CI must set LIVELINE_TEST_POSTGRES_URL (export LIVELINE_TEST_POSTGRES_URL=\"$(.ci/postgres start)\")"
            )
        }
    }

    @Test(
        "PostgreSQL's steps make SQLite's final schema: the same tables, columns, types and indexes, and the housekeeping lease",
        .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set")
    )
    func parityWithSQLite() async throws {
        let postgres = try await withTemporaryPostgresDatabase(prefix: "liveline_schema") { url in
            try await PostgresTestServer.withConnection(url: url) { connection in
                try await applyAllMigrations(on: connection)
                return try await postgresSchema(connection)
            }
        }
        var expected = try await withTemporaryStore { store, _ in try await sqliteSchema(store) }
        #expect(expected.tables.count >= 15, "the SQLite schema was not read: \(expected.tables.keys.sorted())")

        // What PostgreSQL has on purpose and SQLite has not: the event feed's insertion order, and `id` empty until
        // the sequencer gives the event its position (see PostgresMigrations).
        expected.tables["events"]?["seq"] = .init(type: "integer", notNull: true)
        expected.tables["events"]?["id"]?.notNull = false
        expected.indexes["events_unsequenced"] = .init(table: "events", columns: ["seq"], partial: true)
        // The feed's positions, unique (step 4): SQLite's `id` is the rowid, which needs no index.
        expected.indexes["events_position"] = .init(table: "events", columns: ["id"], partial: true)
        // The node that does the housekeeping when several share the database (step 2).
        expected.tables["housekeeping_lease"] = [
            "id": .init(type: "integer", notNull: true), "owner": .init(type: "text", notNull: true),
            "expires_at": .init(type: "integer", notNull: true),
        ]
        // The highest feed position pruned (step 11): SQLite's AUTOINCREMENT keeps it in `sqlite_sequence`.
        expected.tables["event_feed"] = [
            "id": .init(type: "integer", notNull: true), "pruned_through": .init(type: "integer", notNull: true),
        ]

        #expect(postgres.tables.keys.sorted() == expected.tables.keys.sorted())
        for (table, columns) in expected.tables.sorted(by: { $0.key < $1.key }) {
            let actual = postgres.tables[table] ?? [:]
            #expect(actual.keys.sorted() == columns.keys.sorted(), "columns of \(table)")
            for (name, column) in columns.sorted(by: { $0.key < $1.key }) {
                if let other = actual[name] { #expect(other == column, "\(table).\(name)") }
            }
        }
        #expect(postgres.indexes.keys.sorted() == expected.indexes.keys.sorted())
        for (name, index) in expected.indexes.sorted(by: { $0.key < $1.key }) {
            if let other = postgres.indexes[name] { #expect(other == index, "index \(name)") }
        }
    }

    @Test(
        "the timeline's attempts are compressed with lz4 where the server has it, and a segment reads back as written",
        .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set")
    )
    func timelineCompression() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            let (hasLZ4, compression) = try await store.transaction { db in
                let hasLZ4 = try db.query(
                    "SELECT 1 AS yes FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
                ).isEmpty == false
                let compression = try db.query(
                    """
                    SELECT CAST(attcompression AS text) AS method FROM pg_attribute
                    WHERE attrelid = CAST('delivery_segments' AS regclass) AND attname = 'attempts'
                    """
                ).first?.column("method")?.string
                return (hasLZ4, compression)
            }
            // Debian's PostgreSQL (CI's) is built with lz4; a server without it keeps its default (no method set).
            #expect(compression == (hasLZ4 ? "l" : ""))

            // Attempts large enough to be compressed when stored, read back whole.
            try await makeApp(store)
            let now = Date(timeIntervalSince1970: 1_764_000_000)
            let attempts = (0..<250).map { index in
                DeliveryRecord(
                    id: 0, appID: "app_test", activityID: "a", deviceID: "device-\(index)", platform: .ios, sequence: 2, event: .update,
                    priority: 10, status: .delivered, providerID: "apns-\(index)", reason: nil, latencyMilliseconds: 1.5, attempt: 1,
                    attemptedAt: now
                )
            }
            try await store.transaction { db in
                _ = try db.query(
                    "INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at) VALUES ('app_test', 'a', 'active', 2, 0, 0)"
                )
                for statement in SQLStore.timelineStatements(appID: "app_test", activityID: "a", attempts: attempts) {
                    _ = try db.query(statement.sql, statement.binds)
                }
            }
            let page = try await store.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 300)
            #expect(page.items.count == 250)
            #expect(page.items.map(\.deviceID) == attempts.reversed().map(\.deviceID))
        }
    }
}

/// Runs `sql`, which binds nothing, as a write of its own on `store`.
private func run(_ sql: String, in store: SQLStore) async throws {
    _ = try await store.transaction { db in try db.query(sql, []) }
}

/// Inserts iOS instances `d-<n>` for `n` in `range` on `activity` of `app_test`, each active and delivered sequence 1.
private func addDeliveredInstances(to activity: String, _ range: ClosedRange<Int>, in store: SQLStore) async throws {
    try await run(
        """
        INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, state, delivered_sequence, created_at,
            updated_at, priority10_tally)
        SELECT 'app_test', '\(activity)', 'd-' || n, 'ios', 't-' || n, 'active', 1, 0, 0, 0
        FROM generate_series(\(range.lowerBound), \(range.upperBound)) AS n
        """,
        in: store
    )
}

/// `binds` written as SQL literals, separated by commas, for an `EXECUTE` of a statement prepared with their types:
/// texts quoted, integers as they are, anything else `NULL`.
private func sqlLiterals(_ binds: [SQLiteData]) -> String {
    binds.map { value -> String in
        switch value {
        case .text(let text): "'" + text.replacingOccurrences(of: "'", with: "''") + "'"
        case .integer(let number): "\(number)"
        default: "NULL"
        }
    }.joined(separator: ", ")
}

@Suite("PostgreSQL plans", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct PostgresPlanTests {
    @Test("an activity is read by key through the primary key, also for an app the statistics do not know yet")
    func activityByKeyForANewApp() async throws {
        try await withTemporaryPostgresDatabase(prefix: "liveline_plans") { url in
            try await PostgresTestServer.withConnection(url: url) { connection in
                let logger = PostgresTestServer.logger
                try await applyAllMigrations(on: connection)
                func addApp(_ id: String, activities: Int) async throws {
                    try await connection.query(
                        PostgresQuery(unsafeSQL: "INSERT INTO apps (id, name, bundle_id, created_at) VALUES ('\(id)', '\(id)', 'com.example', 0)"),
                        logger: logger
                    )
                    try await connection.query(
                        PostgresQuery(
                            unsafeSQL: """
                                INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at)
                                SELECT '\(id)', 'activity-' || n, 'active', 1, n, n FROM generate_series(1, \(activities)) AS n
                                """
                        ),
                        logger: logger
                    )
                }
                // Statistics that know three apps; then a fourth, with as many activities, that they do not know.
                for app in ["app_a", "app_b", "app_c"] { try await addApp(app, activities: 20_000) }
                try await connection.query("ANALYZE activities", logger: logger)
                try await addApp("app_new", activities: 20_000)

                for app in ["app_a", "app_new"] {
                    var plan: [String] = []
                    let rows = try await connection.query(
                        PostgresQuery(unsafeSQL: "EXPLAIN SELECT * FROM activities WHERE app_id = '\(app)' AND activity_id = 'activity-4321'"),
                        logger: logger
                    )
                    for try await line in rows.decode(String.self) { plan.append(line) }
                    #expect(plan.joined(separator: "\n").contains("activities_pkey"), "\(app): \(plan.joined(separator: "\n"))")
                }
            }
        }
    }

    @Test("a write of progress looks each instance up by key, also with statistics from when its activity had a handful")
    func progressByKeyWithStaleStatistics() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            // The instances of an earlier activity, purged; statistics taken while activity `a` had five instances;
            // then 50,000 more, not analyzed, as when a burst of registrations comes between two automatic ANALYZEs.
            // The statistics then put a few rows in the whole table.
            try await run("ALTER TABLE instances SET (autovacuum_enabled = false)", in: store)
            for activity in ["old", "a"] {
                try await run(
                    "INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at) VALUES ('app_test', '\(activity)', 'active', 1, 0, 0)",
                    in: store
                )
            }
            func addInstances(to activity: String, _ range: ClosedRange<Int>) async throws {
                try await run(
                    """
                    INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, state, created_at, updated_at, priority10_tally)
                    SELECT 'app_test', '\(activity)', 'd-' || n, 'ios', 't-' || n, 'active', 0, 0, 0
                    FROM generate_series(\(range.lowerBound), \(range.upperBound)) AS n
                    """,
                    in: store
                )
            }
            try await addInstances(to: "old", 1...50_000)
            try await run("DELETE FROM instances WHERE activity_id = 'old'", in: store)
            try await addInstances(to: "a", 1...5)
            try await run("ANALYZE instances", in: store)
            try await addInstances(to: "a", 6...50_005)

            let progress = DeliveryProgress(
                appID: "app_test", activityID: "a",
                delivered: (1_000..<1_256).map { PushedInstance(deviceID: "d-\($0)", token: "t-\($0)", sequence: 1) }
            )
            let write = try #require(SQLStore.progressStatements(progress, at: Date()).first)
            func plan(settings: [(name: String, value: String)]) async throws -> String {
                try await store.transaction { db in
                    try db.setLocal(settings)
                    return try db.query("EXPLAIN " + write.sql, write.binds).compactMap { $0.column("QUERY PLAN")?.string }
                        .joined(separator: "\n")
                }
            }
            // The trap is set: left to choose, PostgreSQL reads every instance and matches each row of the list to them.
            let unguided = try await plan(settings: [])
            #expect(unguided.contains("Seq Scan on instances"), "\(unguided)")
            let guided = try await plan(settings: SQLStore.engineSettings)
            // The plan the write keeps, made once without the values (under those statistics too).
            let kept = try await store.transaction { db in
                try db.setLocal(SQLStore.engineSettings)
                let types = write.binds.map(PostgresParameterType.init)
                try db.query("PREPARE progress_probe AS " + PostgresDialect.translate(write.sql, parameterTypes: types), [])
                return try db.query("EXPLAIN EXECUTE progress_probe(" + sqlLiterals(write.binds) + ")", [])
                    .compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
            }
            for plan in [guided, kept] {
                #expect(plan.contains("instances_pkey"), "\(plan)")
                for slow in ["Seq Scan on instances", "Hash Join", "Merge Join"] {
                    #expect(!plan.contains(slow), "\(plan)")
                }
            }
        }
    }

    @Test("the claim's one statement keeps to its indexes in the plan it made on empty tables: the due walk, and lookups by key")
    func leaseFirstDueKeepsItsLookups() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            let claim = SQLStore.leaseFirstDueStatement(platforms: [.ios, .android])
            let binds: [SQLiteData] = [.integer(10), .integer(10), .text("w"), .integer(40), .integer(40)] + claim.binds
            let plan = try await store.transaction { db in
                // As the engine's claim connections keep it: a generic plan, made at the first call, on empty tables.
                try db.setLocal(SQLStore.engineSettings)
                try db.query("PREPARE claim_probe AS " + PostgresDialect.translate(claim.sql), [])
                try db.query("EXECUTE claim_probe(" + sqlLiterals(binds) + ")", [])
                // Then 20,000 activities with an instance behind each.
                try db.query(
                    """
                    INSERT INTO activities (app_id, activity_id, state, sequence, content_state, created_at, updated_at)
                    SELECT 'app_test', 'a-' || n, 'active', 1, '{}', 0, n FROM generate_series(0, 19999) AS n
                    """,
                    []
                )
                try db.query(
                    """
                    INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, state, created_at, updated_at, priority10_tally)
                    SELECT 'app_test', 'a-' || n, 'd-' || n, 'ios', 't-' || n, 'active', 0, 0, 0 FROM generate_series(0, 19999) AS n
                    """,
                    []
                )
                return try db.query("EXPLAIN EXECUTE claim_probe(" + sqlLiterals(binds) + ")", [])
                    .compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
            }
            #expect(plan.contains("Index Scan using activities_due"), "\(plan)")
            #expect(plan.contains("instances_pkey"), "\(plan)")
            // A subquery run as one hashed read of its whole table, or a scan of one, reads every row at every claim.
            for slow in ["hashed SubPlan", "Seq Scan", "Bitmap Heap Scan on instances", "Hash Join", "Merge Join"] {
                #expect(!plan.contains(slow), "\(plan)")
            }
        }
    }

    @Test("the claim's settle keeps the primary key in the plan it keeps, for an activity of 50,000 instances none behind and stale statistics")
    func settleGenericPlanByKey() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            // Statistics taken while the activity had five instances; then 50,000 more, all delivered, not analyzed.
            try await run("ALTER TABLE instances SET (autovacuum_enabled = false)", in: store)
            try await run(
                "INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at) VALUES ('app_test', 'a', 'active', 1, 0, 0)",
                in: store
            )
            try await addDeliveredInstances(to: "a", 1...5, in: store)
            try await run("ANALYZE instances", in: store)
            try await addDeliveredInstances(to: "a", 6...50_005, in: store)

            // The plan PostgreSQL keeps for the settle (a generic one, made without the values), in the engine's settings.
            let settle = SQLStore.settleStatement([ActivityKey(appID: "app_test", activityID: "a")], platforms: [.ios, .android])
            let plan = try await store.transaction { db in
                try db.setLocal(SQLStore.engineSettings)
                try db.query("PREPARE settle_probe AS " + PostgresDialect.translate(settle.sql), [])
                return try db.query("EXPLAIN EXECUTE settle_probe(" + sqlLiterals(settle.binds) + ")", [])
                    .compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
            }
            #expect(plan.contains("instances_pkey"), "\(plan)")
            for slow in ["Seq Scan on instances", "Hash Join", "Merge Join"] {
                #expect(!plan.contains(slow), "\(plan)")
            }
        }
    }

    @Test(
        "a claim's release, with the record of a send's start, keeps the primary keys in the plan it keeps, for a small activity beside one of 50,000 instances, and for that one with stale statistics",
        arguments: [true, false]
    )
    func releaseGenericPlanByKey(statisticsKnowTheLargeActivity: Bool) async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            try await run("ALTER TABLE instances SET (autovacuum_enabled = false)", in: store)
            for activity in ["small", "large"] {
                try await run(
                    """
                    INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at, claim_owner, claim_expires_at)
                    VALUES ('app_test', '\(activity)', 'active', 1, 0, 0, 'w', 5)
                    """,
                    in: store
                )
            }
            // Every instance delivered: nothing behind, the release's search finds none.
            try await addDeliveredInstances(to: "small", 1...3, in: store)
            try await addDeliveredInstances(to: "large", 1...5, in: store)
            if statisticsKnowTheLargeActivity {
                try await addDeliveredInstances(to: "large", 6...50_005, in: store)
                try await run("ANALYZE instances", in: store)
            } else {
                try await run("ANALYZE instances", in: store)
                try await addDeliveredInstances(to: "large", 6...50_005, in: store)
            }
            for activity in ["small", "large"] {
                // The plan PostgreSQL keeps for the release (a generic one, made without the values), in the engine's settings.
                let sendStart = SendStart(sequence: 1, at: Date(timeIntervalSince1970: 7))
                let release = SQLStore.releaseStatement(
                    appID: "app_test", activityID: activity, owner: "w", platforms: [.ios, .android], retryAt: nil, sendStart: sendStart
                )
                let plan = try await store.transaction { db in
                    try db.setLocal(SQLStore.engineSettings)
                    try db.query("PREPARE release_probe_\(activity) AS " + PostgresDialect.translate(release.sql), [])
                    return try db.query("EXPLAIN EXECUTE release_probe_\(activity)(" + sqlLiterals(release.binds) + ")", [])
                        .compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
                }
                #expect(plan.contains("instances_pkey") && plan.contains("activities_pkey"), "\(plan)")
                for slow in ["Seq Scan", "Hash Join", "Merge Join", "instances_by_age"] {
                    #expect(!plan.contains(slow), "\(plan)")
                }
                // And it releases: nothing behind, so the activity is done and its claim let go, the send's start kept.
                let done = try await store.releaseClaim(
                    appID: "app_test", activityID: activity, owner: "w", platforms: [.ios, .android], retryAt: nil, sendStart: sendStart
                )
                #expect(done)
                let released = try await store.activityWithoutInstanceCounts(appID: "app_test", activityID: activity)
                #expect(released?.lastSentSequence == 1 && released?.lastSentAt == Date(timeIntervalSince1970: 7))
            }
        }
    }

    @Test("a release that waits for a registration's lock on its activity reads afresh: the new instance keeps the activity pending")
    func releaseSeesARegistrationCommittedWhileItWaited() async throws {
        try await withTemporaryStore(.postgres) { store, url in
            try await makeApp(store)
            try await run(
                """
                INSERT INTO activities (app_id, activity_id, state, sequence, content_state, created_at, updated_at, claim_owner,
                    claim_expires_at)
                VALUES ('app_test', 'a', 'active', 1, '{}', 0, 0, 'w', 9999999999999)
                """,
                in: store
            )
            // The phone the pass sent to: delivered, nothing behind.
            try await addDeliveredInstances(to: "a", 1...1, in: store)
            // A registration of a second phone, as the Store writes one: the activity's row first (pending again), then
            // the instance; left open while the release starts.
            let configuration = try PostgresTestServer.configuration(url: url, database: nil)
            let registration = try await PostgresConnection.connect(configuration: configuration, id: 7, logger: PostgresTestServer.logger)
            try await registration.query("BEGIN", logger: PostgresTestServer.logger)
            try await registration.query(
                "UPDATE activities SET dispatched_sequence = 0, next_dispatch_at = NULL WHERE app_id = 'app_test' AND activity_id = 'a'",
                logger: PostgresTestServer.logger
            )
            try await registration.query(
                """
                INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, state, delivered_sequence, created_at,
                    updated_at, priority10_tally)
                VALUES ('app_test', 'a', 'd-2', 'ios', 't-2', 'active', 0, 0, 0, 0)
                """,
                logger: PostgresTestServer.logger
            )
            let release = Task {
                try await store.releaseClaim(appID: "app_test", activityID: "a", owner: "w", platforms: [.ios], retryAt: nil)
            }
            // The release reaches the row and waits for the registration's lock (its snapshot taken before the commit).
            try await Task.sleep(for: .milliseconds(300))
            try await registration.query("COMMIT", logger: PostgresTestServer.logger)
            try await registration.close()
            // Read on its first snapshot, it would find nothing behind and mark the activity done: the new phone would
            // never be sent the state. The row changed since that snapshot, so it runs again and finds the phone.
            #expect(try await release.value == false)
            let behind = try await store.pendingInstances(
                appID: "app_test", activityID: "a", below: 1, platforms: [.ios], after: nil, limit: 10
            )
            #expect(behind.map(\.deviceID) == ["d-2"])
            #expect(try await store.nextClaimable().next != nil, "the activity is pending")
        }
    }

    @Test("an app's deletion removes the events of a registration that committed while the deletion waited for it (events have no key to the app)")
    func deletionRemovesEventsCommittedWhileItWaited() async throws {
        try await withTemporaryStore(.postgres) { store, url in
            try await makeApp(store)
            try await run(
                "INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at) VALUES ('app_test', 'a', 'active', 0, 0, 0)",
                in: store
            )
            // A registration as the Store writes one: the instance (its key locks the activity's row against deletion) and
            // its event, left open while the deletion starts.
            let configuration = try PostgresTestServer.configuration(url: url, database: nil)
            let registration = try await PostgresConnection.connect(configuration: configuration, id: 8, logger: PostgresTestServer.logger)
            try await registration.query("BEGIN", logger: PostgresTestServer.logger)
            try await registration.query(
                """
                INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, state, delivered_sequence, created_at,
                    updated_at, priority10_tally)
                VALUES ('app_test', 'a', 'd-1', 'ios', 't-1', 'active', 0, 0, 0, 0)
                """,
                logger: PostgresTestServer.logger
            )
            try await registration.query(
                """
                INSERT INTO events (app_id, type, activity_id, device_id, data, created_at)
                VALUES ('app_test', 'instance.registered', 'a', 'd-1', '{}', 0)
                """,
                logger: PostgresTestServer.logger
            )
            let deletion = Task { try await store.deleteApp(id: "app_test", leavingChannels: true) }
            // The deletion's cascade reaches the activity's row and waits for the registration; the registration's
            // commit fails the (serializable) deletion, which runs again and finds the event.
            try await Task.sleep(for: .milliseconds(300))
            try await registration.query("COMMIT", logger: PostgresTestServer.logger)
            try await registration.close()
            #expect(try await deletion.value?.activities == 1)
            let left = try await store.reader.query("SELECT COUNT(*) AS n FROM events WHERE app_id = 'app_test'")
            #expect(left.first?.column("n")?.integer == 0)
        }
    }

    @Test("the engine's question of when its next activity is due keeps to its indexes in the plan it made on empty tables")
    func dueStatementKeepsItsIndexes() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            let plan = try await store.transaction { db in
                // As ``SQLStore/nextClaimable()`` runs it; kept from the first call, made while the tables are empty.
                try db.setLocal(SQLStore.dueSettings)
                try db.query("PREPARE due AS " + PostgresDialect.translate(SQLStore.dueStatement), [])
                try db.query("EXECUTE due", [])
                // Then 20,000 pending activities, two of them leased.
                try db.query(
                    """
                    INSERT INTO activities (app_id, activity_id, state, sequence, content_state, created_at, updated_at)
                    SELECT 'app_test', 'a-' || n, 'active', 1, '{}', 0, n FROM generate_series(0, 19999) AS n
                    """,
                    []
                )
                try db.query("UPDATE activities SET claim_owner = 'w', claim_expires_at = 5 WHERE activity_id IN ('a-7', 'a-700')", [])
                return try db.query("EXPLAIN EXECUTE due", []).compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
            }
            // The first unleased pending activity in the order of `activities_due`, the leased ones from `activities_claimed`.
            #expect(plan.contains("Index Scan using activities_due") && plan.contains("on activities_claimed"), "\(plan)")
            #expect(!plan.contains("Bitmap Index Scan on activities_due"), "\(plan)")
            #expect(!plan.contains("Seq Scan on activities"), "\(plan)")
        }
    }

    @Test("the reads of activities by key run on the readers' connection opened for them, and keep one plan, by key")
    func activityReadsKeepTheirPlan() async throws {
        // The engine's question of when its next activity is due shares the connection: it holds that question's settings.
        #expect(SQLStore.dueSettings.allSatisfy { due in SQLStore.keyedReadSettings.contains { $0 == due } })
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            for n in 0..<8 {
                if n == 2 {
                    // The plan is made at the first call prepared, the second, while the table is empty; then it grows.
                    try await store.transaction { db in
                        _ = try db.query(
                            """
                            INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at)
                            SELECT 'app_test', 'a-' || n, 'active', 1, 0, 0 FROM generate_series(0, 19999) AS n
                            """,
                            []
                        )
                    }
                }
                let keys = [ActivityKey(appID: "app_test", activityID: "a-\(n)"), ActivityKey(appID: "app_test", activityID: "none")]
                let found: [ActivityKey: ActivityRecord] = try await SQLStore.activities(keys, on: store.reader)
                #expect(Array(found.keys) == (n < 2 ? [] : [keys[0]]))
            }
            // Sent unprepared once, then prepared and run seven times, each time with the plan made first.
            let (plans, plan) = try await preparedKeyedRead(
                on: store, in: .requests, join: "JOIN activities a ON", arguments: "'{app_test}', '{a-1}'"
            )
            #expect(plans == [7, 0], "generic, custom: \(plans)")
            #expect(plan.contains("activities_pkey"), "\(plan)")
            for slow in ["Seq Scan", "Hash Join", "Merge Join"] {
                #expect(!plan.contains(slow), "\(plan)")
            }
        }
    }

    @Test("the reads of schemas by key run on the readers' connection opened for them, and keep one plan, by key")
    func schemaReadsKeepTheirPlan() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            let schema = JSONValue.object(["type": "object"])
            for n in 0..<8 {
                if n == 2 {
                    // The plan is made at the first call prepared, the second, while the table is empty; then it grows.
                    try await store.transaction { db in
                        _ = try db.query(
                            """
                            INSERT INTO attributes_type_schemas (app_id, attributes_type, schema, created_at, updated_at)
                            SELECT 'app_test', 'T' || n, '{"type":"object"}', 0, 0 FROM generate_series(0, 19999) AS n
                            """,
                            []
                        )
                    }
                }
                let keys = [SchemaKey(appID: "app_test", attributesType: "T\(n)"), SchemaKey(appID: "app_test", attributesType: "none")]
                let found = try await SQLStore.schemas(keys, on: store.reader)
                #expect(Array(found.keys) == (n < 2 ? [] : [keys[0]]))
                #expect(found[keys[0]]?.schema == (n < 2 ? JSONValue?.none : .some(schema)))
            }
            let (plans, plan) = try await preparedKeyedRead(
                on: store, in: .requests, join: "JOIN attributes_type_schemas s ON", arguments: "'{app_test}', '{T1}'"
            )
            // Sent unprepared once, then prepared and run seven times, each time with the plan made first.
            #expect(plans == [7, 0], "generic, custom: \(plans)")
            #expect(plan.contains("attributes_type_schemas_pkey"), "\(plan)")
            for slow in ["Seq Scan", "Hash Join", "Merge Join"] {
                #expect(!plan.contains(slow), "\(plan)")
            }
            // Through the Store's own read, as the API asks: one found, one not.
            #expect(try await store.schema(appID: "app_test", attributesType: "T7")?.schema == schema)
            #expect(try await store.schema(appID: "app_test", attributesType: "none") == nil)
        }
    }

    @Test("the engine's reads of an activity's rows (pending instances of one platform or two, the look for slices, credentials) keep one plan, by primary key, on the readers' connection opened for them")
    func engineReadsKeepTheirPlan() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            try await run(
                """
                INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at)
                VALUES ('app_test', 'small', 'active', 2, 0, 0), ('app_test', 'large', 'active', 2, 0, 0)
                """,
                in: store
            )
            // Made first while the table is empty, then asked again beside an activity of 50,000 instances (analyzed):
            // the plan made first is the one kept.
            for round in 0..<4 {
                if round == 2 {
                    try await addDeliveredInstances(to: "small", 1...3, in: store)
                    try await addDeliveredInstances(to: "large", 1...50_000, in: store)
                    try await run("ANALYZE instances", in: store)
                }
                for activity in ["small", "large"] {
                    // One platform's page, and the first page of a pass read for both platforms at once.
                    for platforms: [Platform] in [[.ios], [.ios, .android]] {
                        let page = try await store.pendingInstances(
                            appID: "app_test", activityID: activity, below: 2, platforms: platforms, after: nil, through: nil, limit: 2
                        )
                        // By device id, as text: the large one's second is `d-10`.
                        #expect(page.map(\.deviceID) == (round < 2 ? [] : activity == "small" ? ["d-1", "d-2"] : ["d-1", "d-10"]))
                    }
                    // Slices are planned only for more pending instances than one slice holds: the large one has.
                    let slices = try await store.planSlices(
                        appID: "app_test", activityID: activity, owner: "nobody", below: 2, platforms: [.ios], size: 10, now: t0,
                        consultingMarks: false
                    )
                    #expect(slices == 0, "no claim held, so nothing is planned")
                }
                #expect(try await store.credentials(appID: "app_test", provider: .apns) == nil)
            }
            for (text, arguments, index) in [
                ("platform IN ($11::text) ORDER BY", "'app_test', 'large', 2, 'app_test', 'large', 'app_test', 'large', 2, 2, 2, 'ios'", "instances_pkey"),
                ("platform IN ($11::text,$12::text)", "'app_test', 'large', 2, 'app_test', 'large', 'app_test', 'large', 2, 2, 2, 'ios', 'android'", "instances_pkey"),
                ("SELECT 1 AS found FROM fanout_slices", "'app_test', 'large', 'app_test', 'large', 2, 'app_test', 'large', 'app_test', 'large', 2, 'ios'", "instances_pkey"),
                ("SELECT * FROM app_credentials", "'app_test', 'apns'", "app_credentials_pkey"),
            ] {
                let (plans, plan) = try await preparedKeyedRead(on: store, in: .delivery, join: text, arguments: arguments)
                // Sent unprepared once, then prepared: every later call ran the one plan made first, on empty tables.
                #expect(plans.count == 2 && plans[0] > 0 && plans[1] == 0, "\(text): generic, custom: \(plans)")
                #expect(plan.contains(index), "\(plan)")
                for slow in ["Seq Scan", "Hash Join", "Merge Join", "Sort", "Bitmap", "instances_by_age"] {
                    #expect(!plan.contains(slow), "\(plan)")
                }
            }
        }
    }

    /// The generic and custom plans counted for the one read prepared on the readers' connection opened in `lane` for
    /// the reads by key whose text holds `join`, and the plan it would now run with `arguments`.
    private func preparedKeyedRead(
        on store: SQLStore, in lane: ReadLane, join: String, arguments: String
    ) async throws -> (plans: [Int], plan: String) {
        try await store.reader.read(under: SQLStore.keyedReadSettings, in: lane) { (db: any SQLConnection) throws -> ([Int], String) in
            let statements = try db.query(
                """
                SELECT name, generic_plans, custom_plans FROM pg_prepared_statements
                WHERE statement LIKE '%\(join)%' AND statement NOT LIKE '%pg_prepared_statements%'
                """,
                []
            )
            guard statements.count == 1, let name = statements[0].column("name")?.string else { return ([], "") }
            let plan = try db.query("EXPLAIN EXECUTE \"\(name)\"(\(arguments))", [])
                .compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
            let counts: [Int?] = [statements[0].column("generic_plans")?.integer, statements[0].column("custom_plans")?.integer]
            return (counts.compactMap { $0 }, plan)
        }
    }

    @Test("the sets' reads keep the plans by key they made on empty tables once the tables have grown")
    func setReadsKeepKeysFromEmptyTables() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            let reads = [
                ("instances_read", RegistrationWrite.instancesRead, "'{app_test}', '{a-7}', '{d-700}'", ["instances_pkey"]),
                ("activities_read", RegistrationWrite.activitiesRead, "'{app_test}', '{a-7}'", ["activities_pkey"]),
                (
                    "set_read", RegistrationWrite.setRead, "'{app_test}', '{a-7}', '{app_test}', '{a-7}', '{d-700}'",
                    ["activities_pkey", "instances_pkey"]
                ),
                ("heads_read", UpdateWrite.headsRead, "'{app_test}', '{a-7}'", ["activities_pkey"]),
            ]
            let plans = try await store.transaction { db in
                // A grouped write's settings, with the plan kept from the first call rather than from the sixth.
                try db.setLocal(
                    PostgresHandle.groupedWriteSettings.filter { $0.name != "plan_cache_mode" } + [("plan_cache_mode", "force_generic_plan")]
                )
                // Planned and kept while the tables are empty, as on a fresh database.
                for (name, sql, arguments, _) in reads {
                    try db.query("PREPARE \(name) AS " + PostgresDialect.translate(sql), [])
                    try db.query("EXECUTE \(name)(\(arguments))", [])
                }
                // Then 200 activities of 100 instances each.
                try db.query(
                    """
                    INSERT INTO activities (app_id, activity_id, state, sequence, created_at, updated_at)
                    SELECT 'app_test', 'a-' || n, 'active', 0, 0, 0 FROM generate_series(0, 199) AS n
                    """,
                    []
                )
                try db.query(
                    """
                    INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, state, created_at, updated_at,
                        priority10_tally)
                    SELECT 'app_test', 'a-' || (n / 100), 'd-' || n, 'ios', 't-' || n, 'active', 0, 0, 0
                    FROM generate_series(0, 19999) AS n
                    """,
                    []
                )
                return try reads.map { name, _, arguments, _ in
                    try db.query("EXPLAIN EXECUTE \(name)(\(arguments))", [])
                        .compactMap { $0.column("QUERY PLAN")?.string }.joined(separator: "\n")
                }
            }
            for ((_, _, _, keys), plan) in zip(reads, plans) {
                for key in keys { #expect(plan.contains(key), "\(plan)") }
                for slow in ["Seq Scan", "Hash Join", "Merge Join"] {
                    #expect(!plan.contains(slow), "\(plan)")
                }
            }
        }
    }
}

@Suite("PostgreSQL test server helpers")
struct PostgresTestServerTests {
    @Test("a URL gives user, password, host, port and database; `database` overrides the URL's")
    func configurationFromURL() throws {
        let full = try PostgresTestServer.configuration(url: "postgresql://li%40ve:p%3Aw%2Fd@[::1]:6543/main?sslmode=disable", database: nil)
        #expect(full.username == "li@ve")
        #expect(full.password == "p:w/d")
        #expect(full.host == "::1")
        #expect(full.port == 6543)
        #expect(full.database == "main")

        let plain = try PostgresTestServer.configuration(url: "postgres://liveline@127.0.0.1/liveline", database: "other")
        #expect(plain.username == "liveline")
        #expect(plain.password == nil)
        #expect(plain.host == "127.0.0.1")
        #expect(plain.port == 5432)
        #expect(plain.database == "other")

        // The URL is read as `--database-url` reads it.
        #expect(throws: PostgresDatabaseURL.Invalid.self) { try PostgresTestServer.configuration(url: "postgres://liveline@localhost:5433", database: nil) }
        #expect(throws: PostgresDatabaseURL.Invalid.self) { try PostgresTestServer.configuration(url: "http://liveline@localhost/x", database: nil) }
        #expect(throws: PostgresDatabaseURL.Invalid.self) { try PostgresTestServer.configuration(url: "postgres://localhost/x", database: nil) }
    }

    struct Planned: Error {}

    /// The names of the databases on the test server.
    func databases() async throws -> Set<String> {
        try await PostgresTestServer.withConnection(url: PostgresTestServer.url!) { connection in
            var names: Set<String> = []
            let rows = try await connection.query("SELECT datname::text FROM pg_database", logger: PostgresTestServer.logger)
            for try await name in rows.decode(String.self) { names.insert(name) }
            return names
        }
    }

    @Test(
        "a temporary database is new, on the same server, and dropped whether the body returns or throws",
        .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set")
    )
    func temporaryDatabase() async throws {
        let server = try PostgresTestServer.configuration(url: PostgresTestServer.url!, database: nil)
        // A connection left open does not keep the database from being dropped (closed afterwards: PostgresNIO wants
        // every connection closed).
        var open: PostgresConnection?
        let name = try await withTemporaryPostgresDatabase { url in
            let configuration = try PostgresTestServer.configuration(url: url, database: nil)
            #expect(configuration.host == server.host && configuration.port == server.port && configuration.username == server.username)
            let name = try #require(configuration.database)
            #expect(name.hasPrefix("liveline_test_") && name != server.database)
            let connection = try await PostgresConnection.connect(configuration: configuration, id: 1, logger: PostgresTestServer.logger)
            open = connection
            try await connection.query("CREATE TABLE t (x BIGINT)", logger: PostgresTestServer.logger)
            #expect(try await databases().contains(name))
            return name
        }
        try? await open?.close()
        #expect(try await !databases().contains(name))

        let thrownFrom = LockedName()
        await #expect(throws: Planned.self) {
            try await withTemporaryPostgresDatabase { url in
                thrownFrom.set(try PostgresTestServer.configuration(url: url, database: nil).database)
                throw Planned()
            }
        }
        let thrownName = try #require(thrownFrom.get())
        #expect(try await !databases().contains(thrownName))
    }
}

/// A name set inside a closure and read after it.
private final class LockedName: @unchecked Sendable {
    private let lock = NSLock()
    private var name: String?
    func set(_ name: String?) { lock.withLock { self.name = name } }
    func get() -> String? { lock.withLock { name } }
}
