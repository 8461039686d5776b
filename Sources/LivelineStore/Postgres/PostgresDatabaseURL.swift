import Foundation
import NIOSSL
import PostgresNIO

/// Where a PostgreSQL database is, from a URL such as `postgres://user:secret@db.example.com:5432/liveline`.
///
/// `sslmode` in the query picks the transport: `disable` (the default for a server on the loopback), `prefer`, or
/// `require` (the default for any other host; the server's certificate is checked against the system's roots). The
/// password is never shown: ``description`` leaves it out.
public struct PostgresDatabaseURL: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    /// The transport the URL asks for.
    public var sslMode: SSLMode

    /// `sslmode` values Liveline understands.
    public enum SSLMode: String, Sendable, Hashable {
        case disable, prefer, require
    }

    /// Why a URL was refused.
    public struct Invalid: Error, CustomStringConvertible {
        public var description: String
    }

    /// Parses `string`. Throws ``Invalid`` with the reason.
    public init(_ string: String) throws {
        guard let components = URLComponents(string: string), let scheme = components.scheme,
            ["postgres", "postgresql"].contains(scheme.lowercased())
        else { throw Invalid(description: "a database URL starts with postgres:// (got \(Self.redacting(string)))") }
        guard var host = components.host, !host.isEmpty else { throw Invalid(description: "the database URL names no host") }
        // An IPv6 address comes in brackets; a connection wants it without.
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard let username = components.user, !username.isEmpty else { throw Invalid(description: "the database URL names no user") }
        let database = String(components.path.drop(while: { $0 == "/" }))
        guard !database.isEmpty else { throw Invalid(description: "the database URL names no database") }
        self.host = host
        self.port = components.port ?? 5432
        self.username = username.removingPercentEncoding ?? username
        self.password = components.password.map { $0.removingPercentEncoding ?? $0 }
        self.database = database.removingPercentEncoding ?? database
        let loopback = ["127.0.0.1", "localhost", "::1"].contains(host)
        if let mode = components.queryItems?.first(where: { $0.name == "sslmode" })?.value {
            guard let parsed = SSLMode(rawValue: mode) else {
                throw Invalid(description: "sslmode must be disable, prefer or require (got \(mode))")
            }
            sslMode = parsed
        } else {
            sslMode = loopback ? .disable : .require
        }
    }

    /// The same server with another database.
    public func with(database: String) -> PostgresDatabaseURL {
        var copy = self
        copy.database = database
        return copy
    }

    /// The URL, without its password.
    public var description: String {
        "postgres://\(username)@\(hostInURL):\(port)/\(database)" + (sslMode == (isLoopback ? .disable : .require) ? "" : "?sslmode=\(sslMode.rawValue)")
    }

    /// The whole URL, password included: for a child process's environment, never for a log.
    public var urlString: String {
        var components = URLComponents()
        components.scheme = "postgres"
        components.host = hostInURL
        components.port = port
        components.user = username
        components.password = password
        components.path = "/" + database
        if sslMode != (isLoopback ? .disable : .require) { components.queryItems = [URLQueryItem(name: "sslmode", value: sslMode.rawValue)] }
        return components.string ?? description
    }

    /// The host as a URL writes it: an IPv6 address in brackets.
    private var hostInURL: String { host.contains(":") ? "[\(host)]" : host }

    /// Whether the server is on this machine's loopback (`127.0.0.1`, `localhost` or `::1`).
    public var isLoopback: Bool { ["127.0.0.1", "localhost", "::1"].contains(host) }

    /// How PostgresNIO connects to this database (TLS as ``sslMode`` asks, a 10-second connect timeout).
    public func configuration() throws -> PostgresConnection.Configuration {
        let tls: PostgresConnection.Configuration.TLS
        switch sslMode {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        var configuration = PostgresConnection.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: tls
        )
        configuration.options.connectTimeout = .seconds(10)
        return configuration
    }

    private static func redacting(_ string: String) -> String {
        guard var components = URLComponents(string: string) else { return "an unreadable URL" }
        if components.password != nil { components.password = "***" }
        return components.string ?? "an unreadable URL"
    }
}
