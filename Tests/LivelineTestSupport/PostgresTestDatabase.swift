import Foundation
import Logging
import LivelineStore
import PostgresNIO

/// The PostgreSQL server tests may use: `LIVELINE_TEST_POSTGRES_URL` (what `.ci/postgres start` prints).
public struct PostgresTestServer {
    /// No test server is configured.
    public struct NotConfigured: Error, CustomStringConvertible {
        public var description: String { "LIVELINE_TEST_POSTGRES_URL is not set" }
    }

    /// The server's URL, when the environment names one.
    public static var url: String? {
        ProcessInfo.processInfo.environment["LIVELINE_TEST_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
    }
}

/// Runs `body` with the URL of a new, empty database on the test server, and drops the database afterwards, whether
/// `body` returns or throws.
public func withTemporaryPostgresDatabase<T>(_ body: (_ url: String) async throws -> T) async throws -> T {
    guard let server = PostgresTestServer.url else { throw PostgresTestServer.NotConfigured() }
    let serverURL = try PostgresDatabaseURL(server)
    let name = "liveline_test_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(16)
    try await administer(serverURL, "CREATE DATABASE \(name)")
    do {
        let result = try await body(serverURL.with(database: String(name)).urlString)
        try await administer(serverURL, "DROP DATABASE \(name) WITH (FORCE)")
        return result
    } catch {
        try? await administer(serverURL, "DROP DATABASE \(name) WITH (FORCE)")
        throw error
    }
}

private func administer(_ url: PostgresDatabaseURL, _ sql: String) async throws {
    let connection = try await PostgresConnection.connect(
        configuration: PostgresConnection.Configuration(
            host: url.host, port: url.port, username: url.username, password: url.password, database: url.database, tls: .disable
        ),
        id: 1, logger: Logger(label: "liveline.tests.postgres")
    )
    defer { Task { try? await connection.close() } }
    try await connection.query(PostgresQuery(unsafeSQL: sql), logger: Logger(label: "liveline.tests.postgres"))
}

/// Runs one statement on the database at `url` (a connection of its own, closed afterwards) and returns its rows, each
/// column by name as text (`nil` for NULL). Cast what is not text in the SQL (`count(*)::text`). For tests that look at
/// what the Store wrote, or that the Store keeps to itself (claims, the migrations table).
public func postgresRows(_ url: String, _ sql: String) async throws -> [[String: String?]] {
    let url = try PostgresDatabaseURL(url)
    let logger = Logger(label: "liveline.tests.postgres")
    let connection = try await PostgresConnection.connect(
        configuration: PostgresConnection.Configuration(
            host: url.host, port: url.port, username: url.username, password: url.password, database: url.database, tls: .disable
        ),
        id: 2, logger: logger
    )
    do {
        var result: [[String: String?]] = []
        for try await row in try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger) {
            var values: [String: String?] = [:]
            for cell in row { values[cell.columnName] = try cell.decode(String?.self) }
            result.append(values)
        }
        try await connection.close()
        return result
    } catch {
        try? await connection.close()
        throw error
    }
}
