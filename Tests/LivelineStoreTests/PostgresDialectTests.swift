import Foundation
import Logging
@testable import LivelineStore
import LivelineTestSupport
import MetricsTestKit
import PostgresNIO
import Testing

@Suite("PostgreSQL dialect: the Store's SQL as PostgreSQL reads it")
struct PostgresDialectTests {
    @Test("a memo of statement texts computes each once, keeps a refusal (nil) as an answer, and starts again past its limit")
    func textMemo() {
        let memo = TextMemo<String, String?>(limit: 2)
        var computed: [String] = []
        func value(_ text: String) -> String? {
            memo.value(for: text) { text in
                computed.append(text)
                return text.hasPrefix("SELECT") ? nil : text.lowercased()
            }
        }
        #expect(value("INSERT A") == "insert a")
        #expect(value("INSERT A") == "insert a")
        #expect(value("SELECT 1") == nil)
        #expect(value("SELECT 1") == nil)
        #expect(computed == ["INSERT A", "SELECT 1"])
        // A third text past the limit of two: the memo starts again, and what it held is computed anew.
        #expect(value("DELETE B") == "delete b")
        #expect(value("INSERT A") == "insert a")
        #expect(computed == ["INSERT A", "SELECT 1", "DELETE B", "INSERT A"])
    }

    @Test("placeholders are numbered in order, not inside quoted text, identifiers or comments")
    func placeholders() {
        #expect(PostgresDialect.translate("SELECT * FROM t WHERE a = ? AND b IN (?, ?)") == "SELECT * FROM t WHERE a = $1 AND b IN ($2, $3)")
        #expect(PostgresDialect.translate("SELECT '?', \"x?\" FROM t WHERE a = ?") == "SELECT '?', \"x?\" FROM t WHERE a = $1")
        #expect(PostgresDialect.translate("SELECT 1 -- why?\nWHERE a = ?") == "SELECT 1 -- why?\nWHERE a = $1")
        #expect(PostgresDialect.translate("SELECT 'it''s ?' WHERE a = ?") == "SELECT 'it''s ?' WHERE a = $1")
    }

    @Test("placeholders of a prepared statement carry the types of their values; a NULL's is left to PostgreSQL")
    func typedPlaceholders() {
        #expect(
            PostgresDialect.translate("SELECT '?' WHERE a = ? AND b = ? AND c = ? AND d = ? AND e = ?", parameterTypes: [.int8, .text, .float8, .bytea, .unspecified])
                == "SELECT '?' WHERE a = $1::int8 AND b = $2::text AND c = $3::float8 AND d = $4::bytea AND e = $5"
        )
        #expect(
            PostgresDialect.translate("x IN (SELECT value FROM json_each(?)) AND y = MAX(?, 0)", parameterTypes: [.text, .int8])
                == "x IN (SELECT value FROM json_array_elements_text(CAST($1::text AS json))) AND y = GREATEST($2::int8, 0)"
        )
    }

    @Test("inserts, updates and deletes run together as one statement, their binds in order; anything else is not joined")
    func together() {
        let joined = PostgresDialect.together([
            ("INSERT INTO a (x) VALUES (?)", [.integer(1)]),
            ("\n  UPDATE b SET y = ? WHERE k = ?", [.text("y"), .text("k")]),
            ("DELETE FROM c WHERE k = ?", [.integer(3)]),
        ])
        #expect(joined?.sql == "WITH s1 AS (INSERT INTO a (x) VALUES (?)), s2 AS (UPDATE b SET y = ? WHERE k = ?) DELETE FROM c WHERE k = ?")
        #expect(joined?.binds == [.integer(1), .text("y"), .text("k"), .integer(3)])
        let translated = PostgresDialect.translate(joined.map(\.sql) ?? "")
        #expect(translated.hasSuffix("WHERE k = $3) DELETE FROM c WHERE k = $4"))
        // One statement needs no joining; a read, a statement with its own WITH or one that returns rows is not joined.
        #expect(PostgresDialect.together([("INSERT INTO a (x) VALUES (?)", [.integer(1)])]) == nil)
        #expect(PostgresDialect.together([("INSERT INTO a (x) VALUES (1)", []), ("SELECT 1", [])]) == nil)
        #expect(PostgresDialect.together([("WITH w AS (SELECT 1) INSERT INTO a SELECT * FROM w", []), ("DELETE FROM a", [])]) == nil)
        #expect(PostgresDialect.together([("INSERT INTO a (x) VALUES (1) RETURNING x", []), ("DELETE FROM b", [])]) == nil)
        // Said again (the joining is kept), with other values: the same text with these values; a refusal again.
        let again = PostgresDialect.together([
            ("INSERT INTO a (x) VALUES (?)", [.integer(5)]),
            ("\n  UPDATE b SET y = ? WHERE k = ?", [.text("z"), .text("q")]),
            ("DELETE FROM c WHERE k = ?", [.integer(6)]),
        ])
        #expect(again?.sql == joined?.sql)
        #expect(again?.binds == [.integer(5), .text("z"), .text("q"), .integer(6)])
        #expect(PostgresDialect.together([("INSERT INTO a (x) VALUES (1)", []), ("SELECT 1", [])]) == nil)
    }

    @Test(
        "statements run together on PostgreSQL all take effect, and one failing fails the write, leaving nothing",
        .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set")
    )
    func togetherOnPostgres() async throws {
        try await withTemporaryPostgresPool(count: 1) { pool, _ in
            try await pool.write(durability: .full) { db in
                try db.query("CREATE TABLE a (k BIGINT PRIMARY KEY, v TEXT NOT NULL)")
                try db.query("CREATE TABLE b (k BIGINT PRIMARY KEY, v TEXT NOT NULL)")
                try db.query("INSERT INTO b (k, v) VALUES (1, 'old')")
            }
            try await pool.write(durability: .full) { db in
                try db.executeTogether([
                    ("INSERT INTO a (k, v) VALUES (?, ?)", [.integer(1), .text("one")]),
                    ("UPDATE b SET v = ? WHERE k = ?", [.text("new"), .integer(1)]),
                    ("INSERT INTO a (k, v) VALUES (?, ?)", [.integer(2), .text("two")]),
                ])
            }
            let rows = try await pool.read { db in
                try db.query("SELECT (SELECT string_agg(v, ',' ORDER BY k) FROM a) AS a, (SELECT v FROM b WHERE k = 1) AS b")
            }
            #expect(rows.first?.column("a")?.string == "one,two")
            #expect(rows.first?.column("b")?.string == "new")
            // A duplicate key among them fails the write: neither the update beside it nor the insert is kept.
            await #expect(throws: (any Error).self) {
                try await pool.write(durability: .full) { db in
                    try db.executeTogether([
                        ("UPDATE b SET v = ? WHERE k = ?", [.text("lost"), .integer(1)]),
                        ("INSERT INTO a (k, v) VALUES (?, ?)", [.integer(1), .text("again")]),
                    ])
                }
            }
            let after = try await pool.read { db in try db.query("SELECT v FROM b WHERE k = 1") }
            #expect(after.first?.column("v")?.string == "new")
        }
    }

    @Test("two-argument MAX and MIN become GREATEST and LEAST; the aggregates stay")
    func extremes() {
        #expect(PostgresDialect.translate("SET d = MAX(d, COALESCE(v.column3, d))") == "SET d = GREATEST(d, COALESCE(v.column3, d))")
        #expect(PostgresDialect.translate("SELECT MAX(id) + 1, MIN(x) FROM t") == "SELECT MAX(id) + 1, MIN(x) FROM t")
        #expect(
            PostgresDialect.translate("SELECT MIN(MAX(COALESCE(a, 0), COALESCE(b, 0))) FROM t")
                == "SELECT MIN(GREATEST(COALESCE(a, 0), COALESCE(b, 0))) FROM t"
        )
        #expect(PostgresDialect.translate("AND MIN(COALESCE(x * 1000, e + ?), e + ?) <= ?") == "AND LEAST(COALESCE(x * 1000, e + $1), e + $2) <= $3")
        // A name that merely ends so is left alone.
        #expect(PostgresDialect.translate("SELECT XMAX(a, b)") == "SELECT XMAX(a, b)")
    }

    @Test("SQLite's json_each and planner hints become PostgreSQL's")
    func sqliteOnly() {
        #expect(
            PostgresDialect.translate("d.device_id IN (SELECT value FROM json_each(?))")
                == "d.device_id IN (SELECT value FROM json_array_elements_text(CAST($1 AS json)))"
        )
        #expect(
            PostgresDialect.translate("SELECT d.* FROM devices AS d INDEXED BY devices_by_user WHERE d.app_id = ?")
                == "SELECT d.* FROM devices AS d WHERE d.app_id = $1"
        )
        #expect(
            PostgresDialect.translate("FROM device_tags AS t CROSS JOIN devices AS d ON d.app_id = t.app_id")
                == "FROM device_tags AS t JOIN devices AS d ON d.app_id = t.app_id"
        )
    }

    @Test("a lost connection: the write runs again before its COMMIT while runs are left, and fails as perhaps committed after it")
    func afterLostConnection() {
        let lost = PostgresFailure(sqlState: "57P01", message: "terminating connection", isConnectionLost: true)
        func decision(commitSent: Bool, attempt: Int) -> PostgresFailure? {
            switch PostgresPool.afterLostConnection(lost, commitSent: commitSent, attempt: attempt) {
            case .runAgain: nil
            case .fail(let failure): failure
            }
        }
        #expect(decision(commitSent: false, attempt: 1) == nil)
        #expect(decision(commitSent: false, attempt: PostgresPool.attempts - 1) == nil)
        let spent = decision(commitSent: false, attempt: PostgresPool.attempts)
        #expect(spent?.isConnectionLost == true && spent?.isCommitUnknown == false && spent?.sqlState == "57P01")
        for attempt in [1, PostgresPool.attempts] {
            let atCommit = decision(commitSent: true, attempt: attempt)
            #expect(atCommit?.isCommitUnknown == true && atCommit?.isConnectionLost == true, "attempt \(attempt)")
        }
    }

    @Test("a server nothing answers at: the error names it, never the password, and says why")
    func nothingListening() async throws {
        // Port 1 on the loopback: nothing listens there, and the system refuses at once.
        let url = try PostgresDatabaseURL("postgres://liveline:s3cret@127.0.0.1:1/liveline")
        do {
            _ = try await PostgresPool(url: url, count: 2, logger: Logger(label: "test"))
            Issue.record("a pool opened where nothing listens")
        } catch let failure as PostgresFailure {
            #expect(failure.isConnectionLost && failure.sqlState == nil)
            #expect(failure.description == "PostgreSQL error: could not connect to postgres://liveline@127.0.0.1:1/liveline: Connection refused")
            #expect(!failure.description.contains("s3cret"))
        }
    }

    @Test("a database URL: parts, TLS by host, the password never in its description")
    func databaseURL() throws {
        let local = try PostgresDatabaseURL("postgres://liveline:s3cret@127.0.0.1:55432/liveline")
        #expect(local.host == "127.0.0.1" && local.port == 55432 && local.username == "liveline" && local.database == "liveline")
        #expect(local.password == "s3cret" && local.sslMode == .disable)
        #expect(!local.description.contains("s3cret"))
        #expect(try PostgresDatabaseURL(local.urlString) == local)
        let remote = try PostgresDatabaseURL("postgresql://u@db.example.com/app")
        #expect(remote.port == 5432 && remote.sslMode == .require)
        #expect(try PostgresDatabaseURL("postgres://u@db.example.com/app?sslmode=disable").sslMode == .disable)
        let ipv6 = try PostgresDatabaseURL("postgres://u@[::1]:6543/app")
        #expect(ipv6.host == "::1")
        #expect(try PostgresDatabaseURL(ipv6.urlString) == ipv6)
        for bad in ["mysql://u@h/db", "postgres://h/db", "postgres://u@h", "postgres://u@h/db?sslmode=maybe"] {
            #expect(throws: PostgresDatabaseURL.Invalid.self) { try PostgresDatabaseURL(bad) }
        }
    }
}

@Suite("PostgreSQL connections", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct PostgresConnectionTests {
    @Test("connections the server closed are opened again before the next write or read; nothing half-done is committed")
    func reconnect() async throws {
        try await withTemporaryStore(.postgres) { store, url in
            try await makeApp(store)
            // The server ends every connection of this database but the one asking (a restart, an operator's kill).
            let database = try PostgresDatabaseURL(url).database
            _ = try await PostgresTestServer.withConnection(url: url) { connection in
                try await connection.query(
                    PostgresQuery(unsafeSQL: "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(database)' AND pid <> pg_backend_pid()"),
                    logger: PostgresTestServer.logger
                )
            }
            // At once: a connection whose end is not yet seen is used, fails as lost, and the write runs again.
            let update = ActivityUpdate(appID: "app_test", activityID: "after-restart", contentState: ["n": 1])
            #expect(try await store.acceptUpdate(update, at: Date()).sequence == 1)
            #expect(try await store.activity(appID: "app_test", activityID: "after-restart")?.sequence == 1)
            #expect(try await store.apps().map(\.id) == ["app_test"])
        }
    }

    @Test("concurrent writes to one activity are serialized: every update gets its own sequence")
    func serializableWrites() async throws {
        try await withTemporaryStore(.postgres) { store, _ in
            try await makeApp(store)
            let sequences = try await withThrowingTaskGroup(of: Int64.self) { group in
                for index in 0..<40 {
                    group.addTask {
                        try await store.acceptUpdate(
                            ActivityUpdate(appID: "app_test", activityID: "busy", contentState: ["n": .integer(Int64(index))]), at: Date()
                        ).sequence
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(sequences.sorted() == Array(1...40))
            #expect(try await store.activity(appID: "app_test", activityID: "busy")?.sequence == 40)
        }
    }

    @Test("a write PostgreSQL refuses as a serialization failure is run again, and counted; each commit is counted")
    func retriesCounted() async throws {
        try await withTemporaryPostgresPool(count: 4) { pool, metrics in
            try await pool.write(durability: .full) { db in
                try db.query("CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)")
                try db.query("INSERT INTO counter (id, n) VALUES (1, 0)")
            }
            // Read, pause, write back: concurrent serializable transactions collide, and only their retries make
            // every increment count.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<12 {
                    group.addTask {
                        try await pool.write(durability: .full) { db in
                            let n = try db.query("SELECT n FROM counter WHERE id = 1").first?.column("n")?.integer ?? -1
                            try db.query("SELECT pg_sleep(0.005)")
                            try db.query("UPDATE counter SET n = ? WHERE id = 1", [.integer(n + 1)])
                        }
                    }
                }
                try await group.waitForAll()
            }
            let n = try await pool.read { db in try db.query("SELECT n FROM counter WHERE id = 1").first?.column("n")?.integer }
            #expect(n == 12)
            let retries = metrics.counters(label: StoreCommitMetrics.writeRetriesName, dimensions: [("sqlstate", "40001")])
            #expect(retries.map(\.totalValue).reduce(0, +) > 0, "the collisions were run again")
            let commits = try metrics.expectCounter(StoreCommitMetrics.commitsName, [("durability", "full")])
            #expect(commits.totalValue == 13)
        }
    }
}
