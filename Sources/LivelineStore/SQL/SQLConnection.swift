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

    /// Runs `sql` with `binds` where its rows and its outcome are not needed before the next statement: inside a write,
    /// a statement nothing after it depends on having succeeded (the write fails all the same if it did not).
    ///
    /// SQLite runs it at once, as ``query(_:_:)``. PostgreSQL sends it without waiting for the answer, so that a
    /// transaction's statements follow one another on the connection without a round trip each: a failure is
    /// reported by the next statement that waits (the transaction is aborted then) or at the commit, and the write
    /// fails with it, so nothing is lost or committed half.
    func execute(_ sql: String, _ binds: [SQLiteData]) throws

    /// Runs `statements` one after another and returns the rows of each, in order: for statements whose answers are
    /// all needed but none of which depends on another's. PostgreSQL sends them together and waits once, not once
    /// each.
    func queries(_ statements: [(sql: String, binds: [SQLiteData])]) throws -> [[StoreRow]]

    /// Runs `statements` as ``execute(_:_:)`` runs one: for inserts, updates and deletes inside a write that return
    /// nothing, none of which reads or changes what another writes (each touches rows of its own), so that their order
    /// does not matter.
    ///
    /// SQLite runs them one after another. PostgreSQL runs them as one statement (``PostgresDialect/together(_:)``):
    /// its client sends a statement only once the one before has been answered, so each statement saved is a round
    /// trip saved, on both sides of the connection.
    func executeTogether(_ statements: [(sql: String, binds: [SQLiteData])]) throws

    /// Changes settings of PostgreSQL's for the rest of the write's transaction (as `SET LOCAL` does), such as the
    /// planner's `enable_seqscan` or `synchronous_commit`.
    ///
    /// PostgreSQL sends them before the next statement, all in one (`SELECT set_config(…, true), …`: one round trip),
    /// and none that already has the value asked for (its connection may have been opened with it). SQLite has no such
    /// settings: it does nothing.
    func setLocal(_ settings: [(name: String, value: String)]) throws

    /// Whether every one of `settings` holds on this connection for its whole session: a PostgreSQL connection opened
    /// with them. SQLite has no such settings: never.
    func holds(_ settings: [(name: String, value: String)]) -> Bool
}

extension SQLConnection {
    func execute(_ sql: String, _ binds: [SQLiteData]) throws {
        _ = try query(sql, binds)
    }

    /// Runs the statements of `parts`, in order, one after another.
    func execute(parts: [[(sql: String, binds: [SQLiteData])]]) throws {
        for part in parts {
            for statement in part { try execute(statement.sql, statement.binds) }
        }
    }

    func queries(_ statements: [(sql: String, binds: [SQLiteData])]) throws -> [[StoreRow]] {
        try statements.map { try query($0.sql, $0.binds) }
    }

    func executeTogether(_ statements: [(sql: String, binds: [SQLiteData])]) throws {
        for statement in statements { try execute(statement.sql, statement.binds) }
    }

    func setLocal(_ settings: [(name: String, value: String)]) throws {}

    func holds(_ settings: [(name: String, value: String)]) -> Bool { false }

    /// `clause` (`FOR UPDATE`, `FOR SHARE`) to end a `SELECT` with on PostgreSQL, where a write at
    /// ``WriteIsolation/lockingRows`` locks the rows its decisions rest on; nothing on SQLite, whose one writer runs
    /// writes one after another.
    func rowLock(_ clause: String) -> String {
        dialect == .postgres ? " " + clause : ""
    }

    /// Runs `sql` with `binds` as a read under `settings` (planner settings) and returns its rows: on PostgreSQL in a
    /// read-only transaction of its own, where ``setLocal(_:)`` holds, the statement and its `COMMIT` sent without
    /// waiting between them (PostgresNIO still sends each once the one before is answered); alone, one round trip
    /// instead of four, on a connection where they hold already (``holds(_:)``: one opened with them,
    /// ``StoreReader/read(under:_:)``). SQLite has no such settings and runs the statement as it is.
    func query(_ sql: String, _ binds: [SQLiteData], settings: [(name: String, value: String)]) throws -> [StoreRow] {
        guard dialect == .postgres, !holds(settings) else { return try query(sql, binds) }
        try execute("BEGIN READ ONLY", [])
        try setLocal(settings)
        // A failed statement leaves the transaction aborted: its `COMMIT` then ends it (PostgreSQL answers `ROLLBACK`).
        return try queries([(sql, binds), ("COMMIT", [])])[0]
    }

    /// Runs `sql`, which binds nothing, and returns its rows.
    @discardableResult
    func query(_ sql: String) throws -> [StoreRow] {
        try query(sql, [])
    }
}

/// How a write is kept apart from the writes running beside it on PostgreSQL. (SQLite's one writer runs writes one
/// after another, whatever the choice.)
enum WriteIsolation: Sendable, Hashable {
    /// As if the writes had run one after another (`SERIALIZABLE`): the Store's default.
    case serializable
    /// `READ COMMITTED`, once the transaction-scoped advisory lock `lock` is taken: the writes that take the same lock
    /// run one after another (on every node), each reading what the one before committed, and take no predicate
    /// locks, so they never fail the serializable writes beside them. Only for work whose sole conflict is with
    /// itself, such as giving events their feed positions.
    case exclusive(lock: Int64)
    /// `READ COMMITTED`, for a write whose body first locks the rows its decisions rest on (an activity's row, `FOR
    /// SHARE` or `FOR UPDATE`): the writes that touch the same rows wait for one another and read what the one before
    /// committed, and writes that touch other rows never fail each other, as serializable writes do when their index
    /// entries share a page. A unique key two such writes insert at once still fails one of them, which runs again.
    case lockingRows
    /// `REPEATABLE READ`: the write reads one snapshot, and updating a row that another transaction changed since that
    /// snapshot is a serialization failure (the write runs again, reading afresh). Unlike ``serializable`` it takes no
    /// predicate locks, so it never fails because its reads and another write's rows share an index page. Only for a
    /// write whose decision rests on rows that every write able to change that decision also changes: the release of
    /// an engine's claim, which decides whether anything is behind on an activity, and every write that puts something
    /// behind (an update, a registration, a start, a rotated token) writes the activity's row.
    ///
    /// For a write that is one statement: on a connection whose transactions are `REPEATABLE READ` by default
    /// (``PostgresPool``'s bookkeeping connections), the statement is sent alone, in PostgreSQL's own transaction,
    /// without `BEGIN` and `COMMIT`; elsewhere in a `REPEATABLE READ` transaction of its own. A body that sends more
    /// than one statement there is a programming error (each would commit on its own).
    case snapshotStatement
    /// `READ COMMITTED`, for a write that is one statement and locks the rows its decisions rest on itself, first (a
    /// `FOR UPDATE SKIP LOCKED` read in its `WITH`): the engine's claim of the activity due first. On a connection whose
    /// transactions are `READ COMMITTED` by default (``PostgresPool``'s claim connections) the statement is sent alone,
    /// without `BEGIN` and `COMMIT`, which PostgreSQL's client sends one at a time, a round trip each; elsewhere in a
    /// `READ COMMITTED` transaction of its own. As for ``snapshotStatement``, a body that sends more than one statement
    /// there is a programming error.
    case lockingStatement
    /// As ``lockingRows``, for a short write acknowledged to a client (``Durability/full``) whose body locks only rows
    /// under `key` (its activity's row first, then that activity's instance of one device), and which may therefore
    /// share one transaction and one commit with other such writes (group commit). `key` orders the writes of a shared
    /// transaction, so that every transaction takes its locks in one order and none waits for another in a cycle:
    /// build it with ``groupKey(_:)``, coarsest part first (an activity's writes before its instances'). Its statements
    /// read and write rows by key only: on PostgreSQL they run with cached plans that keep to keys
    /// (``PostgresHandle/groupedWriteSettings``).
    case grouped(key: String)

    /// A key for ``grouped(key:)``: the parts joined by NUL, so that a key sorts before every key it is a prefix of and
    /// the parts compare one by one (`app`, `activity` before `app`, `activity`, `device`, and before `app`,
    /// `activity2`).
    static func groupKey(_ parts: String...) -> String {
        parts.joined(separator: "\u{0}")
    }
}

/// How the Store writes: each write is a closure that runs its statements inside a transaction, and returns once
/// that transaction is committed with the durability asked for.
protocol StoreWriter: Sendable {
    /// Runs `body` inside a write transaction (which may be shared with other writes, or run again after a
    /// serialization failure: `body` must depend only on what it reads through the connection), and returns once it
    /// is committed. Changes `body` made are rolled back when it throws.
    func write<T: Sendable>(
        durability: Durability, isolation: WriteIsolation, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T

    /// Runs `body` as ``write(durability:isolation:_:)`` does, except that a writer with group commit may instead run the
    /// write as one of a set: `member` together with the other writes of its type queued beside it, in one set of
    /// statements for all of them (``SetWrite``). Either way the outcome is the one `body` would have had.
    func write<W: SetWrite>(
        durability: Durability, isolation: WriteIsolation, member: W, _ body: @escaping @Sendable (any SQLConnection) throws -> W.Outcome
    ) async throws -> W.Outcome

    /// Runs `body` as ``write(durability:isolation:_:)`` does, with `settings` for its transaction
    /// (``SQLConnection/setLocal(_:)``) before `body` runs. A writer may keep connections opened with some settings,
    /// where such a transaction sends none (``PostgresPool``: the delivery engine's bookkeeping).
    func write<T: Sendable>(
        durability: Durability, isolation: WriteIsolation, under settings: [(name: String, value: String)],
        _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T

    /// Runs the statements of `parts` in order, with `settings` for their transaction (``SQLConnection/setLocal(_:)``),
    /// as a write (``write(durability:isolation:_:)``). A writer may commit a ``Durability/bookkeeping`` write part by
    /// part, so that acknowledged writes need not wait for all of it (SQLite's one writer does): each part must be
    /// whole on its own, whatever becomes of the parts after it.
    func writeStatements(
        parts: [[(sql: String, binds: [SQLiteData])]], durability: Durability, isolation: WriteIsolation,
        settings: [(name: String, value: String)]
    ) async throws

    /// Refuses new writes, lets the queued ones finish, and closes the connections.
    func close() async throws
}

extension StoreWriter {
    /// One transaction (``writeInOneTransaction(parts:durability:isolation:settings:)``).
    func writeStatements(
        parts: [[(sql: String, binds: [SQLiteData])]], durability: Durability, isolation: WriteIsolation,
        settings: [(name: String, value: String)]
    ) async throws {
        try await writeInOneTransaction(parts: parts, durability: durability, isolation: isolation, settings: settings)
    }

    /// Runs the statements of `parts` in order, with `settings`, as one write transaction.
    func writeInOneTransaction(
        parts: [[(sql: String, binds: [SQLiteData])]], durability: Durability, isolation: WriteIsolation,
        settings: [(name: String, value: String)]
    ) async throws {
        try await write(durability: durability, isolation: isolation, under: settings) { db in
            try db.execute(parts: parts)
        }
    }

    /// Any connection, the settings set in the transaction.
    func write<T: Sendable>(
        durability: Durability, isolation: WriteIsolation, under settings: [(name: String, value: String)],
        _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        try await write(durability: durability, isolation: isolation) { db in
            try db.setLocal(settings)
            return try body(db)
        }
    }

    /// Runs `body` alone: a writer whose statements cost little each (SQLite, in the process) gains nothing from sets.
    func write<W: SetWrite>(
        durability: Durability, isolation: WriteIsolation, member: W, _ body: @escaping @Sendable (any SQLConnection) throws -> W.Outcome
    ) async throws -> W.Outcome {
        try await write(durability: durability, isolation: isolation, body)
    }

    /// A serializable write.
    func write<T: Sendable>(durability: Durability, _ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await write(durability: durability, isolation: .serializable, body)
    }
}

/// How the Store reads: each read runs on a connection of its own that sees committed data.
protocol StoreReader: Sendable {
    /// Runs `body` with a free read connection.
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T

    /// Runs `body`, whose statements read under `settings` (``SQLConnection/query(_:_:settings:)``), with a free read
    /// connection: one opened with those settings, where the reader keeps one for them in `lane`, so that its reads
    /// need no transaction to set them, and wait only behind reads of the same lane.
    func read<T: Sendable>(
        under settings: [(name: String, value: String)], in lane: ReadLane, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T

    /// Closes every connection once the reads under way are done.
    func close() async throws
}

/// Whose reads by key under settings a read is (``StoreReader/read(under:in:_:)``): a reader that keeps connections
/// opened with those settings keeps one for each lane, so that the API's reads never queue behind the delivery
/// engine's.
///
/// On PostgreSQL both lanes' reads shared one connection: during a fan-out of 100,000 instances the engine's reads of
/// pages of instances (4.6 ms each, up to 43) and counts of what is pending (up to 42 ms) sat in front of the updates'
/// reads of their activities, and updates to other activities at 100 a second were accepted in 11 – 16 ms (p50) and
/// waited up to 352 ms (p99 138 – 323 ms a round; `bench fanout --instances 100000 --database-url …`), where
/// PostgreSQL ran each of their own statements in under 17 ms. A lane each: p50 5 – 12 ms, p99 38 – 198 ms a round.
enum ReadLane: Sendable, Hashable, CaseIterable {
    /// Reads a request of the HTTP API waits for: activities and schemas by key (every update and end reads both).
    case requests
    /// The delivery engine's: its pages of pending instances and their counts, its look for slices, its apps'
    /// credentials and its question of when the next activity is due.
    case delivery
}

extension StoreReader {
    /// Any free read connection: a reader without connections set apart for settings.
    func read<T: Sendable>(
        under settings: [(name: String, value: String)], in lane: ReadLane, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        try await read(body)
    }

    /// Runs `sql` with `binds` on a free read connection and returns its rows.
    func query(_ sql: String, _ binds: [SQLiteData] = []) async throws -> [StoreRow] {
        try await read { try $0.query(sql, binds) }
    }
}

/// A grouped write (``WriteIsolation/grouped(key:)``) that can also run as one of a set: when several writes of one
/// such type share a transaction, one call writes them all with a few statements, instead of a few statements each.
///
/// On PostgreSQL each statement is a round trip and is parsed, planned and run on its own: writes that arrive together
/// (registrations of many devices) cost far less as one multi-row insert than as one insert each. The set gives each
/// member the outcome its own body would have given, had the members run one after another in the order given; a
/// member it cannot decide for (an uncommon case the set leaves out) runs its own body afterwards, in the same
/// transaction.
protocol SetWrite: Sendable {
    /// What one member's write returns.
    associatedtype Outcome: Sendable

    /// Writes `members` (in the shared transaction's order: by key) and returns each one's outcome, in the same order.
    /// Locks the rows its decisions rest on first, as each body would. Throws only when the database fails; a refusal
    /// of one member's own logic is that member's outcome, and nothing of it is written.
    static func runTogether(_ members: [Self], on db: any SQLConnection) throws -> [SetWriteOutcome<Outcome>]
}

/// What a set (``SetWrite``) decided for one of its members. The sets' planners (``RegistrationSet``, ``UpdateSet``)
/// decide in these terms too: pure, and comparable in tests.
enum SetWriteOutcome<Outcome: Sendable>: Sendable {
    /// Written: the member's result, final once the transaction commits.
    case done(Outcome)
    /// Refused by the member's own logic (its activity ended, say); nothing of it was written.
    case refused(StoreError)
    /// Not decided by the set: the member runs its own body, after the set, in the same transaction.
    case alone

    /// The same decision, its result made another type by `transform` (a planner's result made the body's own).
    func map<Other>(_ transform: (Outcome) -> Other) -> SetWriteOutcome<Other> {
        switch self {
        case .done(let outcome): .done(transform(outcome))
        case .refused(let error): .refused(error)
        case .alone: .alone
        }
    }
}

extension SetWriteOutcome: Equatable where Outcome: Equatable {}
extension SetWriteOutcome: Hashable where Outcome: Hashable {}
