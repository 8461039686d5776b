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
