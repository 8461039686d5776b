import SQLiteNIO

/// The SQL database a ``SQLStore`` keeps its data in.
public enum SQLDialect: Sendable, Hashable {
    /// One SQLite file: one writer, the embedded default.
    case sqlite
    /// A PostgreSQL server, which several Liveline nodes may share.
    case postgres
}

/// One open connection to the Store's database, used by one thread at a time: the Store's logic runs its statements
/// through it, whatever the database.
///
/// The Store's SQL is written once, in SQLite's spelling with `?` placeholders, and runs on both databases: a
/// PostgreSQL connection rewrites what differs (``PostgresDialect``). Values go in and come out as `SQLiteData`
/// (integer, float, text, blob, null), the common ground of both.
protocol SQLConnection: AnyObject {
    /// The database this connection is open on.
    var dialect: SQLDialect { get }

    /// Runs `sql` with `binds` and returns its rows (none for a statement that returns none).
    @discardableResult
    func query(_ sql: String, _ binds: [SQLiteData]) throws -> [StoreRow]
}

extension SQLConnection {
    /// Runs `sql`, which binds nothing, and returns its rows.
    @discardableResult
    func query(_ sql: String) throws -> [StoreRow] {
        try query(sql, [])
    }
}

/// How the Store writes: each write is a closure that runs its statements inside a transaction, and returns once
/// that transaction is committed with the durability asked for.
protocol StoreWriter: Sendable {
    /// Runs `body` inside a write transaction (which may be shared with other writes, or run again after a
    /// serialization failure: `body` must depend only on what it reads through the connection), and returns once it
    /// is committed. Changes `body` made are rolled back when it throws.
    func write<T: Sendable>(durability: Durability, _ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T

    /// Refuses new writes, lets the queued ones finish, and closes the connections.
    func close() async throws
}

/// How the Store reads: each read runs on a connection of its own that sees committed data.
protocol StoreReader: Sendable {
    /// Runs `body` with a free read connection.
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T

    /// Closes every connection once the reads under way are done.
    func close() async throws
}

extension StoreReader {
    /// Runs `sql` with `binds` on a free read connection and returns its rows.
    func query(_ sql: String, _ binds: [SQLiteData] = []) async throws -> [StoreRow] {
        try await read { try $0.query(sql, binds) }
    }
}
