import Foundation
import LivelineStore
import Logging
import PostgresNIO

/// The PostgreSQL server the tests may use, if any: the one `LIVELINE_TEST_POSTGRES_URL` names (as
/// `.ci/postgres start` prints it, `postgres://liveline@127.0.0.1:25432/liveline`). Tests that need it are enabled
/// only when it is set (`.enabled(if: PostgresTestServer.url != nil)`), and make databases of their own on it with
/// ``withTemporaryPostgresDatabase(_:)``.
public struct PostgresTestServer {
    /// The environment variable that names the server.
    public static let environmentVariable = "LIVELINE_TEST_POSTGRES_URL"

    /// The server's URL, from `LIVELINE_TEST_POSTGRES_URL`; `nil` when that is unset or empty.
    public static var url: String? {
        guard let url = ProcessInfo.processInfo.environment[environmentVariable], !url.isEmpty else { return nil }
        return url
    }

    /// How to connect to the server at `url`, a `postgres://` (or `postgresql://`) URL as `--database-url` reads it
    /// (``PostgresDatabaseURL``), to `database` instead of the URL's when given.
    public static func configuration(url: String, database: String?) throws -> PostgresConnection.Configuration {
        let parsed = try PostgresDatabaseURL(url)
        return try (database.map(parsed.with(database:)) ?? parsed).configuration()
    }

    /// Runs `body` with a new connection to the server at `url` (to `database`, or the URL's own), and closes the
    /// connection afterwards, whether `body` returns or throws.
    public static func withConnection<T>(
        url: String, database: String? = nil, _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        let connection = try await PostgresConnection.connect(
            configuration: configuration(url: url, database: database), id: nextConnectionID(), logger: logger
        )
        do {
            let result = try await body(connection)
            try await connection.close()
            return result
        } catch {
            try? await connection.close()
            throw error
        }
    }

    /// The logger of the tests' connections: PostgresNIO logs at debug and trace, so this says nothing unless the
    /// level is lowered.
    public static var logger: Logger { Logger(label: "liveline.test.postgres") }

    private static func nextConnectionID() -> Int { Int.random(in: 1...Int(Int32.max)) }
}

/// A malformed `LIVELINE_TEST_POSTGRES_URL`, or none where one is needed.
public struct PostgresTestServerError: Error, CustomStringConvertible {
    public var description: String
}

/// Runs `body` with the URL of a new, empty database on the test server (``PostgresTestServer/url``): the same
/// server, user and password, the database `liveline_test_<random hex>`. Drops the database afterwards
/// (`DROP DATABASE … WITH (FORCE)`, which ends connections `body` left open), whether `body` returns or throws.
///
/// Throws ``PostgresTestServerError`` when `LIVELINE_TEST_POSTGRES_URL` is not set: enable the test only when it is.
public func withTemporaryPostgresDatabase<T>(_ body: (_ url: String) async throws -> T) async throws -> T {
    try await withTemporaryPostgresDatabase(prefix: "liveline_test", body)
}

/// ``withTemporaryPostgresDatabase(_:)`` with a database named `<prefix>_<random hex>` (`prefix`: lowercase letters,
/// digits and underscores, so that the name needs no quoting).
public func withTemporaryPostgresDatabase<T>(prefix: String, _ body: (_ url: String) async throws -> T) async throws -> T {
    guard let serverURL = PostgresTestServer.url else {
        throw PostgresTestServerError(description: "\(PostgresTestServer.environmentVariable) is not set: no PostgreSQL server to test with")
    }
    guard !prefix.isEmpty, prefix.allSatisfy({ $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "_") }) else {
        throw PostgresTestServerError(description: "database name prefix \(prefix.debugDescription): lowercase letters, digits and underscores")
    }
    // Tests run side by side; a few databases at a time keep their connections under the server's limit.
    await temporaryDatabases.acquire()
    defer { Task { await temporaryDatabases.release() } }
    let name = "\(prefix)_\(UInt64.random(in: 0...UInt64.max).hexPadded)"
    let databaseURL = try PostgresDatabaseURL(serverURL).with(database: name).urlString
    _ = try await PostgresTestServer.withConnection(url: serverURL) { connection in
        try await connection.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"), logger: PostgresTestServer.logger)
    }
    let result: T
    do {
        result = try await body(databaseURL)
    } catch {
        try? await dropDatabase(name, serverURL: serverURL)
        throw error
    }
    try await dropDatabase(name, serverURL: serverURL)
    return result
}

/// At most this many temporary databases at once.
private let temporaryDatabases = AsyncGate(limit: 12)

/// A counting semaphore for tasks: `acquire` waits while `limit` holders are in.
private actor AsyncGate {
    private let limit: Int
    private var holders = 0
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(limit: Int) { self.limit = limit }

    func acquire() async {
        if holders < limit {
            holders += 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    func release() {
        if waiting.isEmpty {
            holders -= 1
        } else {
            waiting.removeFirst().resume()
        }
    }
}

private func dropDatabase(_ name: String, serverURL: String) async throws {
    _ = try await PostgresTestServer.withConnection(url: serverURL) { connection in
        try await connection.query(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(name) WITH (FORCE)"), logger: PostgresTestServer.logger)
    }
}

extension UInt64 {
    fileprivate var hexPadded: String {
        let hex = String(self, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

/// Runs one statement on the database at `url` (a connection of its own, closed afterwards) and returns its rows, each
/// column by name as text (`nil` for NULL). Cast what is not text in the SQL (`count(*)::text`). For tests that look at
/// what the Store wrote, or that the Store keeps to itself (claims, the migrations table).
public func postgresRows(_ url: String, _ sql: String) async throws -> [[String: String?]] {
    try await PostgresTestServer.withConnection(url: url) { connection in
        var result: [[String: String?]] = []
        for try await row in try await connection.query(PostgresQuery(unsafeSQL: sql), logger: PostgresTestServer.logger) {
            var values: [String: String?] = [:]
            for cell in row { values[cell.columnName] = try cell.decode(String?.self) }
            result.append(values)
        }
        return result
    }
}
