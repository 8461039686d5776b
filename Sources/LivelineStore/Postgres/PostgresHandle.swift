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
/// A statement said again on this connection is prepared the second time (``sendStatement(_:_:)``): from then on PostgreSQL
/// does not parse and analyze it anew for each call; it plans it for the values bound, and runs it.
///
/// Statements sent without waiting (``execute(_:_:)``) spare this thread a wait each, not PostgreSQL a round trip:
/// PostgresNIO sends a statement once the one before it is answered (its `ReadyForQuery`), so each statement of a
/// transaction costs a round trip on the wire, and a statement fewer is a round trip fewer (the grouped writes'
/// connections are opened with their settings for that reason, ``init(url:logger:settings:)``).
///
/// A connection the server closed (a restart, a network cut) is opened again only between transactions
/// (``reconnectIfNeeded()``, which the pool calls before each write or read): a statement never runs on a fresh
/// connection in the middle of a transaction, outside it. A transaction under way when the connection was lost fails
/// with a failure that says so (``PostgresFailure/isConnectionLost``), and the pool runs it again on a new connection.
final class PostgresHandle: SQLConnection {
    var dialect: SQLDialect { .postgres }

    private let url: PostgresDatabaseURL
    private let logger: Logger
    private var connection: PostgresConnection? {
        didSet { lostAnswers = connection.map(LostAnswers.init) }
    }
    /// Fails the answers awaited from `connection` if it closes without them.
    private var lostAnswers: LostAnswers?
    /// Answers still to come of the statements sent with ``execute(_:_:)``, oldest first.
    private var unsettled: [EventLoopFuture<[PostgresRow]>] = []
    /// The first failure among them in the transaction under way.
    private var transactionFailure: (any Error)?
    /// Statements sent since the last transaction ended (``endTransaction()``), its settings' statement among them.
    private(set) var statementsInTransaction = 0
    /// Settings for the transaction under way (``setLocal(_:)``) still to be sent, with the next statement.
    private var pendingSettings: [(name: String, value: String)] = []
    /// The settings the connection was opened with (``sessionSettings``) and those the transaction under way has set
    /// since (by name): a setting asked for again with the value it already has is not sent.
    private let openedWith: [String: String]
    private var transactionSettings: [String: String] = [:]
    /// The statements prepared on this connection.
    private var prepared: [PreparedStatementKey: PreparedQuery] = [:]
    /// Statements sent once, unprepared: one sent again is prepared.
    private var sentOnce: Set<PreparedStatementKey> = []
    /// At most this many statements are prepared on one connection; others are sent unprepared, as the first time.
    /// The Store says a few dozen statements again and again; lists of bound values of every length would grow without
    /// bound.
    static let preparedLimit = 256
    private static let ids = Atomic<Int>(0)

    /// Opens a connection to `url`, with `settings` for its whole session (``sessionSettings(_:)``), and again with
    /// them whenever it is opened anew. Call it off the event loops: it waits.
    init(url: PostgresDatabaseURL, logger: Logger, settings: [(name: String, value: String)] = []) throws {
        self.url = url
        self.logger = logger
        let session = Self.sessionSettings(settings)
        openedWith = Dictionary(session.map { ($0.name, $0.value) }, uniquingKeysWith: { _, last in last })
        let connection = try Self.connect(url, settings: session, logger: logger)
        self.connection = connection
        lostAnswers = LostAnswers(connection)
    }

    /// What a connection opened with `settings` is opened with: the settings every connection has, less those `settings`
    /// names, then `settings`.
    ///
    /// Every connection plans each statement for its values, prepared or not (``plansForValues``): left to choose,
    /// PostgreSQL switches a statement to one generic plan after five calls, made without the values, and activities
    /// differ too much for one plan to fit all: with 100,000 instances on one activity, the generic plan of a claim's
    /// release looked for a pending instance by scanning all of them, 446 ms for an activity with none, where the
    /// plan for its values takes an index and 0.3 ms. Parsing and analysis are saved still. And none compiles
    /// statements to machine code (``withoutJIT``).
    static func sessionSettings(_ settings: [(name: String, value: String)]) -> [(name: String, value: String)] {
        [plansForValues, withoutJIT].filter { base in !settings.contains { $0.name == base.name } } + settings
    }

    /// Opens a connection, or throws a ``PostgresFailure`` that names the server (never the password) and says why not.
    private static func connect(
        _ url: PostgresDatabaseURL, settings: [(name: String, value: String)], logger: Logger
    ) throws -> PostgresConnection {
        do {
            return try open(url, settings: settings, logger: logger)
        } catch {
            throw PostgresFailure(connectingTo: url, error)
        }
    }

    private static func open(
        _ url: PostgresDatabaseURL, settings: [(name: String, value: String)], logger: Logger
    ) throws -> PostgresConnection {
        let id = ids.wrappingAdd(1, ordering: .relaxed).newValue
        var configuration = try url.configuration()
        configuration.options.additionalStartupParameters.append(contentsOf: settings)
        return try PostgresConnection.connect(on: eventLoops.any(), configuration: configuration, id: id, logger: logger).wait()
    }

    /// The connections' plan setting: every statement planned for the values bound (see ``sessionSettings(_:)``).
    static let plansForValues = (name: "plan_cache_mode", value: "force_custom_plan")

    /// No compiling of statements to machine code (JIT): PostgreSQL compiles a statement whose estimated cost passes
    /// `jit_above_cost`, which pays for reports over millions of rows, never for the Store's statements of a few rows.
    /// And where a statement runs with sequential scans off (``groupedWriteSettings``, the engine's claim and its
    /// question of when the next activity is due), a table it can only scan costs 10,000,000,000 in the estimate: the
    /// due question, which reads `fanout_slices` so, was compiled at every call, 0.46 s of compiling to run 0.3 ms.
    static let withoutJIT = (name: "jit", value: "off")

    /// The plan setting of the grouped writes (``WriteIsolation/grouped(key:)``: registrations and updates, alone, in
    /// a shared transaction or as a set), PostgreSQL's own: a statement keeps one generic plan after five calls when it
    /// costs no more than those planned for their values.
    ///
    /// The setting also rules the statements PostgreSQL runs inside a statement to check its foreign keys: each row a
    /// registration or an update inserts (an instance, an activity, an event) looks its parent row up (`SELECT 1 FROM
    /// ONLY activities x WHERE … FOR KEY SHARE OF x`). For values, that lookup was planned anew for every row: with
    /// `log_planner_stats`, 3,000 registrations and 1,000 updates through the API planned it 8,032 times, and in `perf`
    /// those plans took about a quarter of PostgreSQL's CPU. The grouped writes' own statements read and write rows by
    /// key, one or many (`unnest` of arrays), and their generic plans are the same (`EXPLAIN EXECUTE` under
    /// `force_generic_plan`: a lookup, or a nested loop, over the primary key).
    static let cachedPlans = (name: "plan_cache_mode", value: "auto")

    /// Every statement keeps the one plan it made first, made without the values: for statements that have one plan
    /// whatever their values. The engine's claim (``SQLStore/claimPendingActivity(owner:now:lease:platforms:)``) turns
    /// sorts and sequential scans off, which leaves each of its steps one plan (`PostgresPlanTests` holds the settle's).
    static let keptPlans = (name: "plan_cache_mode", value: "force_generic_plan")

    /// The settings of the grouped writes: cached plans (``cachedPlans``), and no sequential scans, hash joins or merge
    /// joins, so that the one plan each of their statements keeps is the lookup by key it was written for.
    ///
    /// A plan is kept for as long as the connection lives, and PostgreSQL makes it for the table as it is then. Made
    /// on a fresh database, the registration set's read of existing instances (a join of up to 64 keys with
    /// `instances`) kept a hash join over a sequential scan of the table: right for the empty table it was planned on,
    /// and from then on a read of every instance for each set. Over 20,000 registrations through the API on a fresh
    /// database (`pg_stat_statements`), 1,365 such reads took 4.0 s, 2.9 ms each and growing with the table, against
    /// 1.4 s for all the sets' inserts; `instances` was scanned 942 times, 8.4 million rows read. With these off, the
    /// plan made on the empty table is the nested loop over the primary key (0.1 ms at 20,000 instances, against 4.9).
    static let groupedWriteSettings: [(name: String, value: String)] = [
        cachedPlans, ("enable_seqscan", "off"), ("enable_hashjoin", "off"), ("enable_mergejoin", "off"),
    ]

    /// The event loops of the Store's connections to PostgreSQL: a group of their own, not NIO's shared one, whose
    /// threads run the delivery engine at a lower priority (`liveline serve` gives them a niceness). There, every read
    /// and write of the API waited for its answers behind the engine's work: during a fan-out of 100,000 pushes,
    /// updates to other activities were accepted in 19 – 29 ms (p50, p99 166 – 264 ms), against about 2 ms on SQLite,
    /// whose writer has a thread of its own; here, 7 – 8 ms (p99 44 – 111 ms). Half the cores, one at least: a
    /// connection's event loop only moves its messages, and on two cores a second thread cost the API's updates up to
    /// a fifth of their rate.
    private static let eventLoops = MultiThreadedEventLoopGroup._makePerpetualGroup(
        threadNamePrefix: StoreThreadNames.postgresEventLoops, numberOfThreads: max(1, System.coreCount / 2)
    )

    @discardableResult
    func query(_ sql: String, _ binds: [SQLiteData]) throws -> [StoreRow] {
        try rows(of: waitFor(send(sql, binds)))
    }

    func queries(_ statements: [(sql: String, binds: [SQLiteData])]) throws -> [[StoreRow]] {
        let answers = try statements.map { try send($0.sql, $0.binds) }
        return try answers.map { try rows(of: waitFor($0)) }
    }

    /// Keeps `settings` for the transaction under way, to be sent with its next statement as one `set_config` each (the
    /// `true` keeps each to the transaction, as `SET LOCAL` does), all in one statement. A setting that already has the
    /// value asked for, in this transaction or since the connection opened (``init(url:logger:settings:)``), is not
    /// sent: when none is left, the transaction saves that statement and its round trip.
    func setLocal(_ settings: [(name: String, value: String)]) throws {
        for setting in settings where (transactionSettings[setting.name] ?? openedWith[setting.name]) != setting.value {
            pendingSettings.append(setting)
            transactionSettings[setting.name] = setting.value
        }
    }

    /// Asks what the connection was opened with: ``transactionSettings`` may still hold an ended transaction's (a read
    /// under settings ends its own with a `COMMIT` sent as a statement), so a value there only ever says no.
    func holds(_ settings: [(name: String, value: String)]) -> Bool {
        settings.allSatisfy { openedWith[$0.name] == $0.value && (transactionSettings[$0.name] ?? $0.value) == $0.value }
    }

    /// Sends one statement and returns its answer to come, after the settings kept by ``setLocal(_:)``, if any.
    private func send(_ sql: String, _ binds: [SQLiteData]) throws -> EventLoopFuture<[PostgresRow]> {
        // A new transaction starts with the session's settings, whatever the one before it set (and however it ended:
        // a read under settings ends its own with a COMMIT sent as a statement, ``SQLConnection/query(_:_:settings:)``).
        if sql.hasPrefix("BEGIN") { transactionSettings = [:] }
        if !pendingSettings.isEmpty {
            let settings = pendingSettings
            pendingSettings = []
            // Its answer is settled with the others sent without waiting: a setting PostgreSQL refuses fails the write.
            // The settings are the Store's own words, written into the text: without values to plan for, the statement
            // is prepared once and keeps its plan (bound, it was planned at every transaction: 140 ms over 5,483 calls
            // in a run of 20,000 registrations and 10,000 updates through the API).
            func literal(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }
            unsettled.append(
                try sendStatement(
                    "SELECT " + settings.map { "set_config(\(literal($0.name)), \(literal($0.value)), true)" }.joined(separator: ", "), []
                )
            )
        }
        return try sendStatement(sql, binds)
    }

    /// Sends one statement and returns its answer to come.
    ///
    /// A statement with bound values, or one PostgreSQL plans (``isPlanned(_:)``), is prepared the second time this
    /// connection says it (``preparedLimit`` at most): the first time waits for PostgreSQL to parse it and describe its
    /// parameters and rows, which it then keeps; every later call binds, plans and runs it (for its values, see
    /// ``sessionSettings(_:)``; a grouped write's, see ``cachedPlans``; the engine's claim's, ``keptPlans``; without values,
    /// once). Its placeholders carry their values' types (``PostgresDialect/translate(_:parameterTypes:)``), as the
    /// types sent with an unprepared statement do, so both read the statement alike. A statement that cannot be
    /// prepared (in a transaction a failure has aborted, say) is sent unprepared, and fails there if it must.
    private func sendStatement(_ sql: String, _ binds: [SQLiteData]) throws -> EventLoopFuture<[PostgresRow]> {
        let (connection, answers) = try openConnection()
        statementsInTransaction += 1
        guard !binds.isEmpty || Self.isPlanned(sql) else {
            return answers.guarding(connection.query(Self.query(sql, binds), logger: logger).map(\.rows))
        }
        let key = PreparedStatementKey(sql: sql, parameterTypes: binds.map(PostgresParameterType.init))
        if let statement = prepared[key] { return answers.guarding(statement.execute(binds.map(Self.data))) }
        if sentOnce.contains(key), prepared.count < Self.preparedLimit {
            let text = PostgresDialect.translate(sql, parameterTypes: key.parameterTypes)
            if let statement = try? answers.guarding(connection.prepare(query: text)).wait() {
                prepared[key] = statement
                sentOnce.remove(key)
                return answers.guarding(statement.execute(binds.map(Self.data)))
            }
        } else {
            if sentOnce.count >= 4 * Self.preparedLimit { sentOnce.removeAll(keepingCapacity: true) }
            sentOnce.insert(key)
        }
        return answers.guarding(connection.query(Self.query(sql, binds), logger: logger).map(\.rows))
    }

    /// Whether PostgreSQL plans `sql`: a query or a change of rows (`SELECT`, `WITH`, `INSERT`, `UPDATE`, `DELETE`), not
    /// a command such as `BEGIN`, `COMMIT` or `CREATE`.
    ///
    /// Such a statement is prepared even without bound values: unprepared, PostgreSQL parses and plans it at every
    /// call, and a prepared statement without parameters keeps its one plan, whatever `plan_cache_mode` says (there
    /// are no values to plan for). The engine asks when its next activity is due (`SELECT MIN(due) …`, no values) after
    /// every wake-up: `pg_stat_statements` over 3,000 updates from 4 connections counted 1,363 calls, 125 ms running
    /// them and 2,034 ms planning them.
    static func isPlanned(_ sql: String) -> Bool {
        let keyword = sql.utf8.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") || $0 == UInt8(ascii: "\t") }
            .prefix { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\n") && $0 != UInt8(ascii: "(") }
        return plannedKeywords.contains(String(decoding: keyword, as: UTF8.self).uppercased())
    }

    private static let plannedKeywords: Set = ["SELECT", "WITH", "INSERT", "UPDATE", "DELETE"]

    /// Waits for one statement's answer.
    private func waitFor(_ answer: EventLoopFuture<[PostgresRow]>) throws -> [PostgresRow] {
        do {
            return try answer.wait()
        } catch {
            guard let failure = PostgresFailure(reported: error) else { throw error }
            // A statement sent before without waiting may have failed first, aborting the transaction (this one then
            // only says so): that failure is the one to report.
            try settle()
            throw failure
        }
    }

    private func rows(of result: [PostgresRow]) throws -> [StoreRow] {
        guard let first = result.first else { return [] }
        let columns = StoreRow.Columns(names: first.map(\.columnName))
        return try result.map { row in
            var values: [SQLiteData] = []
            values.reserveCapacity(columns.count)
            for var cell in row {
                // Rows always come in binary: PostgresNIO asks so in every Bind. For a prepared statement it keeps the
                // row description PostgreSQL gave when preparing, which says text (a statement's results have no
                // format before a Bind asks one), so its cells say text too.
                cell.format = .binary
                values.append(try Self.value(of: cell))
            }
            return StoreRow(columns: columns, values: values)
        }
    }

    /// Sends `statements` as one (``PostgresDialect/together(_:)``) without waiting for its answer, or one by one
    /// when they cannot be joined.
    func executeTogether(_ statements: [(sql: String, binds: [SQLiteData])]) throws {
        if let joined = PostgresDialect.together(statements) {
            try execute(joined.sql, joined.binds)
        } else {
            for statement in statements { try execute(statement.sql, statement.binds) }
        }
    }

    /// Sends the statement without waiting for its answer: the connection runs it after those sent before, and
    /// ``settle()`` (or a failing ``query(_:_:)``) reports its failure.
    func execute(_ sql: String, _ binds: [SQLiteData]) throws {
        unsettled.append(try send(sql, binds))
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
                if transactionFailure == nil { transactionFailure = PostgresFailure(reported: error) ?? error }
            }
        }
        if let transactionFailure { throw transactionFailure }
    }

    /// Forgets what the ended transaction sent without waiting and how it failed: call it after its COMMIT or ROLLBACK,
    /// or before a new one.
    func endTransaction() {
        _ = try? settle()
        statementsInTransaction = 0
        transactionFailure = nil
        pendingSettings = []
        transactionSettings = [:]
    }

    private func openConnection() throws -> (PostgresConnection, LostAnswers) {
        guard let connection, let lostAnswers, !connection.isClosed else {
            throw PostgresFailure(sqlState: nil, message: "the connection to PostgreSQL was lost", isConnectionLost: true)
        }
        return (connection, lostAnswers)
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

    /// A value bound to a prepared statement, of the type its placeholder was given.
    private static func data(_ value: SQLiteData) -> PostgresData {
        switch value {
        case .integer(let integer): PostgresData(int64: Int64(integer))
        case .float(let double): PostgresData(double: double)
        case .text(let text): PostgresData(string: text)
        case .blob(let buffer): PostgresData(type: .bytea, formatCode: .binary, value: buffer)
        case .null: PostgresData(type: .null, formatCode: .binary, value: nil)
        }
    }

    /// Closes the connection. Closing again does nothing.
    func close() {
        guard let connection else { return }
        self.connection = nil
        try? connection.close().wait()
    }

    /// Closes the connection after a failure that said it was lost (the server may say so before the connection is seen
    /// closed) and forgets the transaction under way: the next ``reconnectIfNeeded()`` opens a new one.
    func dropConnection() {
        endTransaction()
        if let connection {
            self.connection = nil
            try? connection.close().wait()
        }
        prepared = [:]
        sentOnce = []
    }

    /// Whether the connection has been lost (or was never made): the next ``reconnectIfNeeded()`` opens a new one.
    var isConnectionLost: Bool { connection?.isClosed ?? true }

    /// Opens the connection again if the server closed it. Call it only outside a transaction.
    func reconnectIfNeeded() throws {
        if let connection, !connection.isClosed { return }
        endTransaction()
        if let connection { try? connection.close().wait() }
        connection = nil
        // What was prepared went with the old connection.
        prepared = [:]
        sentOnce = []
        connection = try Self.connect(url, settings: openedWith.map { (name: $0.key, value: $0.value) }, logger: logger)
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
    /// Whether the connection the failure came on was lost: closed by the server (a restart, an operator ending it, a
    /// network cut) or by the client. What it had not committed, the server rolled back.
    public var isConnectionLost: Bool
    /// Whether the connection was lost once the write's COMMIT was sent, so that PostgreSQL may or may not have
    /// committed it; the Store does not run such a write again.
    public var isCommitUnknown = false

    /// The SQLSTATE of a lost connection (`connection_failure`), for a loss the server did not report itself.
    static let connectionFailure = "08006"

    init(_ error: PSQLError) {
        let sqlState = error.serverInfo?[.sqlState]
        self.sqlState = sqlState
        message = error.serverInfo?[.message] ?? "\(error.code)"
        isConnectionLost =
            [.clientClosedConnection, .serverClosedConnection, .connectionError, .uncleanShutdown].contains(error.code)
            || Self.endsTheConnection(sqlState)
    }

    /// Whether PostgreSQL ends the connection with this SQLSTATE: a connection exception (class 08), or the backend shut
    /// down by an administrator, a crash or a server starting (`57P01` – `57P03`).
    static func endsTheConnection(_ sqlState: String?) -> Bool {
        guard let sqlState else { return false }
        return sqlState.hasPrefix("08") || ["57P01", "57P02", "57P03"].contains(sqlState)
    }

    /// A write whose connection was lost once its COMMIT was sent: PostgreSQL may or may not have committed it.
    static func commitUnknown(_ failure: PostgresFailure) -> PostgresFailure {
        var unknown = PostgresFailure(
            sqlState: failure.sqlState ?? connectionFailure,
            message: "the connection to PostgreSQL was lost at the commit, so whether the write was committed is not known: \(failure.message)",
            isConnectionLost: true
        )
        unknown.isCommitUnknown = true
        return unknown
    }

    /// A failure PostgresNIO reported, in either of its forms (prepared statements report the older one), or the
    /// connection's own (its socket or channel failed, which PostgresNIO may pass on bare); `nil` for any other error.
    init?(reported error: any Error) {
        switch error {
        case let error as PSQLError:
            self.init(error)
        case PostgresError.server(let server):
            let sqlState = server.fields[.sqlState]
            self.init(
                sqlState: sqlState, message: server.fields[.message] ?? "\(server)", isConnectionLost: Self.endsTheConnection(sqlState)
            )
        case PostgresError.connectionClosed:
            self.init(sqlState: nil, message: "the connection to PostgreSQL was lost", isConnectionLost: true)
        case PostgresError.protocol(let message):
            self.init(sqlState: nil, message: message)
        case let error as IOError:
            // The socket failed under PostgresNIO (a reset when the server went away), passed on as the system reported it.
            self.init(
                sqlState: nil, message: "the connection to PostgreSQL was lost: \(String(cString: strerror(error.errnoCode)))", isConnectionLost: true
            )
        case let error as ChannelError:
            switch error {
            case .ioOnClosedChannel, .alreadyClosed, .eof, .inputClosed, .outputClosed:
                self.init(sqlState: nil, message: "the connection to PostgreSQL was lost (\(error))", isConnectionLost: true)
            default:
                return nil
            }
        default:
            return nil
        }
    }

    /// A connection to `url` that could not be opened: the server's refusal (a wrong password, a database that does not
    /// exist) or the network's (nothing listening, no route), with the server named and the password left out.
    init(connectingTo url: PostgresDatabaseURL, _ error: any Error) {
        let reason: String
        switch error {
        case let error as PSQLError:
            if let message = error.serverInfo?[.message] {
                reason = message
            } else if let refused = (error.underlying as? NIOConnectionError)?.connectionErrors.first?.error as? IOError {
                // Nothing listening, no route: the system's words for it, without NIO's wrapping.
                reason = String(cString: strerror(refused.errnoCode))
            } else {
                reason = error.underlying.map { "\($0)" } ?? "\(error.code)"
            }
        default:
            reason = "\(error)"
        }
        let reported = PostgresFailure(reported: error)
        // A server that refused the connection itself (authentication, no such database) is not a lost connection:
        // trying again does not help. Nothing listening, or a server shutting down, is.
        self.init(
            sqlState: reported?.sqlState, message: "could not connect to \(url): \(reason)",
            isConnectionLost: reported?.isConnectionLost ?? true
        )
    }

    init(sqlState: String?, message: String, isConnectionLost: Bool = false) {
        self.sqlState = sqlState
        self.message = message
        self.isConnectionLost = isConnectionLost
    }

    /// Whether running the whole transaction again may succeed: a serialization failure, a deadlock, or a unique key
    /// another transaction inserted first (the next attempt sees it, and the Store's logic answers as it does for a
    /// row that was there before).
    public var isRetryable: Bool {
        ["40001", "40P01", "23505"].contains(sqlState ?? "")
    }

    public var description: String { "PostgreSQL error" + (sqlState.map { " \($0)" } ?? "") + ": \(message)" }
}

/// The type a placeholder is given, from the value bound to it: the types an unprepared statement's values carry.
enum PostgresParameterType: UInt8, Hashable, Sendable {
    case int8, float8, text, bytea
    /// A NULL fits any type: its placeholder takes the one PostgreSQL infers.
    case unspecified

    init(_ value: SQLiteData) {
        switch value {
        case .integer: self = .int8
        case .float: self = .float8
        case .text: self = .text
        case .blob: self = .bytea
        case .null: self = .unspecified
        }
    }

    /// The cast that gives a placeholder this type, or `nil` for none.
    var cast: String? {
        switch self {
        case .int8: "int8"
        case .float8: "float8"
        case .text: "text"
        case .bytea: "bytea"
        case .unspecified: nil
        }
    }
}

/// A prepared statement's identity on a connection: the Store's text and its values' types (one text bound to an
/// integer and, another time, to text are two statements).
struct PreparedStatementKey: Hashable, Sendable {
    var sql: String
    var parameterTypes: [PostgresParameterType]
}
