import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import SQLiteNIO
import Synchronization

/// One connection to PostgreSQL, used by one thread at a time, that runs the Store's statements and waits for each
/// answer: the Store's logic runs unchanged on it (``PostgresDialect`` rewrites the text, values cross as `SQLiteData`).
///
/// A connection the server closed (a restart, a network cut) is opened again only between transactions
/// (``reconnectIfNeeded()``, which the pool calls before each write or read): a statement never runs on a fresh
/// connection in the middle of a transaction, outside it. A transaction under way when the connection was lost fails.
final class PostgresHandle: SQLConnection {
    var dialect: SQLDialect { .postgres }

    private let url: PostgresDatabaseURL
    private let logger: Logger
    private var connection: PostgresConnection?
    /// Answers still to come of the statements sent with ``execute(_:_:)``, oldest first.
    private var unsettled: [EventLoopFuture<PostgresQueryResult>] = []
    /// The first failure among them in the transaction under way.
    private var transactionFailure: (any Error)?
    private static let ids = Atomic<Int>(0)

    /// Opens a connection to `url`. Call it off the event loops: it waits.
    init(url: PostgresDatabaseURL, logger: Logger) throws {
        self.url = url
        self.logger = logger
        connection = try Self.connect(url, logger: logger)
    }

    private static func connect(_ url: PostgresDatabaseURL, logger: Logger) throws -> PostgresConnection {
        let id = ids.wrappingAdd(1, ordering: .relaxed).newValue
        return try PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: try url.configuration(), id: id, logger: logger
        ).wait()
    }

    @discardableResult
    func query(_ sql: String, _ binds: [SQLiteData]) throws -> [StoreRow] {
        try rows(of: waitFor(openConnection().query(Self.query(sql, binds), logger: logger)))
    }

    func queries(_ statements: [(sql: String, binds: [SQLiteData])]) throws -> [[StoreRow]] {
        let connection = try openConnection()
        let answers = statements.map { connection.query(Self.query($0.sql, $0.binds), logger: logger) }
        return try answers.map { try rows(of: waitFor($0)) }
    }

    /// Waits for one statement's answer.
    private func waitFor(_ answer: EventLoopFuture<PostgresQueryResult>) throws -> PostgresQueryResult {
        do {
            return try answer.wait()
        } catch let error as PSQLError {
            // A statement sent before without waiting may have failed first, aborting the transaction (this one then
            // only says so): that failure is the one to report.
            try settle()
            throw PostgresFailure(error)
        }
    }

    private func rows(of result: PostgresQueryResult) throws -> [StoreRow] {
        guard let first = result.rows.first else { return [] }
        let columns = StoreRow.Columns(names: first.map(\.columnName))
        return try result.rows.map { row in
            var values: [SQLiteData] = []
            values.reserveCapacity(columns.count)
            for cell in row { values.append(try Self.value(of: cell)) }
            return StoreRow(columns: columns, values: values)
        }
    }

    /// Sends the statement without waiting for its answer: the connection runs it after those sent before, and
    /// ``settle()`` (or a failing ``query(_:_:)``) reports its failure.
    func execute(_ sql: String, _ binds: [SQLiteData]) throws {
        unsettled.append(try openConnection().query(Self.query(sql, binds), logger: logger))
    }

    /// Waits for the answers of the statements sent with ``execute(_:_:)`` and throws the first failure among them, or
    /// one found before in the same transaction: such a failure aborted the transaction, so it is thrown again by every
    /// settling until ``endTransaction()`` (a write that swallowed it never passes for committed).
    func settle() throws {
        let pending = unsettled
        unsettled = []
        for answer in pending {
            do {
                _ = try answer.wait()
            } catch {
                if transactionFailure == nil { transactionFailure = (error as? PSQLError).map(PostgresFailure.init) ?? error }
            }
        }
        if let transactionFailure { throw transactionFailure }
    }

    /// Forgets what the ended transaction sent without waiting and how it failed: call it after its COMMIT or ROLLBACK,
    /// or before a new one.
    func endTransaction() {
        _ = try? settle()
        transactionFailure = nil
    }

    private func openConnection() throws -> PostgresConnection {
        guard let connection, !connection.isClosed else {
            throw PostgresFailure(sqlState: nil, message: "the connection to PostgreSQL was lost")
        }
        return connection
    }

    private static func query(_ sql: String, _ binds: [SQLiteData]) -> PostgresQuery {
        var bindings = PostgresBindings(capacity: binds.count)
        for value in binds {
            switch value {
            case .integer(let integer): bindings.append(Int64(integer))
            case .float(let double): bindings.append(double)
            case .text(let text): bindings.append(text)
            case .blob(let buffer): bindings.append(buffer)
            case .null: bindings.appendNull()
            }
        }
        return PostgresQuery(unsafeSQL: PostgresDialect.cachedTranslation(sql), binds: bindings)
    }

    /// Closes the connection. Closing again does nothing.
    func close() {
        guard let connection else { return }
        self.connection = nil
        try? connection.close().wait()
    }

    /// Opens the connection again if the server closed it. Call it only outside a transaction.
    func reconnectIfNeeded() throws {
        if let connection, !connection.isClosed { return }
        endTransaction()
        if let connection { try? connection.close().wait() }
        connection = nil
        connection = try Self.connect(url, logger: logger)
    }

    /// A cell as the Store's common values: integers (and booleans, as 0 or 1), floats, text, bytes.
    static func value(of cell: PostgresCell) throws -> SQLiteData {
        guard cell.bytes != nil else { return .null }
        switch cell.dataType {
        case .int2, .int4, .int8, .oid: return .integer(try cell.decode(Int.self))
        case .bool: return .integer(try cell.decode(Bool.self) ? 1 : 0)
        case .float4, .float8: return .float(try cell.decode(Double.self))
        case .numeric:
            // SUM over integers answers a numeric.
            let decimal = try cell.decode(Decimal.self)
            let integer = NSDecimalNumber(decimal: decimal).int64Value
            return Decimal(integer) == decimal ? .integer(Int(integer)) : .float(NSDecimalNumber(decimal: decimal).doubleValue)
        case .bytea: return .blob(try cell.decode(ByteBuffer.self))
        case .text, .varchar, .name, .bpchar, .json: return .text(try cell.decode(String.self))
        default:
            // A column the Store never reads (such as a transaction id): its text, if it has one.
            return (try? cell.decode(String.self)).map(SQLiteData.text) ?? .null
        }
    }
}

/// An error PostgreSQL reported: its SQLSTATE and message.
public struct PostgresFailure: Error, Sendable, CustomStringConvertible {
    /// The SQLSTATE code, such as `40001` for a serialization failure.
    public var sqlState: String?
    public var message: String

    init(_ error: PSQLError) {
        sqlState = error.serverInfo?[.sqlState]
        message = error.serverInfo?[.message] ?? "\(error.code)"
    }

    init(sqlState: String?, message: String) {
        self.sqlState = sqlState
        self.message = message
    }

    /// Whether running the whole transaction again may succeed: a serialization failure, a deadlock, or a unique key
    /// another transaction inserted first (the next attempt sees it, and the Store's logic answers as it does for a
    /// row that was there before).
    public var isRetryable: Bool {
        ["40001", "40P01", "23505"].contains(sqlState ?? "")
    }

    public var description: String { "PostgreSQL error \(sqlState ?? "?"): \(message)" }
}
