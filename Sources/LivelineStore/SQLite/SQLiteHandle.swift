import CSQLiteSettings
import NIOCore
import SQLiteNIO
import VaporCSQLite

/// One open SQLite connection, used by one thread at a time, with its statements prepared once and kept.
///
/// The Store's SQL is a small, fixed set of statements run again and again (a claim, a fan-out's page, an accepted
/// update), so each is compiled the first time it runs and reused after: no SQL is parsed on the hot paths. A handle is
/// not thread-safe: the ``SQLiteWriter`` uses its handle only on its own thread, and the ``SQLiteReaders`` lend each of
/// theirs to one read at a time.
final class SQLiteHandle: SQLConnection {
    var dialect: SQLDialect { .sqlite }

    private var raw: OpaquePointer?
    /// Prepared statements by their SQL, and their columns.
    private var statements: [String: PreparedStatement] = [:]
    /// The file this connection is open on.
    let path: String
    /// The checkpointer SQLite tells this connection's WAL size (``checkpoint(with:)``), kept alive as long as it may.
    private var checkpointer: SQLiteCheckpointer?

    /// More distinct statements than the Store ever has (only lists of bound values vary in length): past it, the
    /// cache is emptied rather than grown.
    static let statementCacheLimit = 256

    /// How much of a statement journal SQLite keeps in memory before it spills it to a file: 4 MB, where its default is
    /// 64 KB.
    ///
    /// Inside a transaction of several statements, SQLite journals each statement that changes several rows, so that
    /// it can undo that statement alone if it fails. A fan-out's progress (a part of up to
    /// ``SQLStore/progressRowsPerPart`` instances, a few dozen pages) went past 64 KB: for every part the writer opened a
    /// temporary file, wrote the journal to it and closed it (`strace` of a 100,000-instance fan-out: 36 files and 292
    /// writes in 2 s; in profiles, the writer's share of the server's CPU went from 17.9 to 16.2 % without them). Kept in
    /// memory, a part's journal costs a few hundred KB while its statement runs; larger ones (an app's deletion) still
    /// spill.
    static let statementJournalSpillBytes: Int32 = 4 << 20

    /// SQLite's answer to ``statementJournalSpillBytes``, set once for the process before its first connection opens
    /// (`SQLITE_OK`; SQLite refuses it once it is in use, and keeps its default).
    static let statementJournalSpill: Int32 = liveline_sqlite_set_statement_journal_spill(statementJournalSpillBytes)

    /// Opens (creating if needed) the database at `path`.
    init(path: String) throws(SQLiteFailure) {
        self.path = path
        // A process-wide setting, before SQLite's first use in the process: every connection is opened here.
        _ = Self.statementJournalSpill
        var handle: OpaquePointer?
        // No mutex of SQLite's own: a handle is only ever used by one thread at a time.
        let flags = SQLITE_OPEN_CREATE | SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
        let code = sqlite_nio_sqlite3_open_v2(path, &handle, flags, nil)
        guard code == SQLITE_OK, let handle else {
            let message = handle.flatMap { sqlite_nio_sqlite3_errmsg($0).map { String(cString: $0) } } ?? "cannot open"
            sqlite_nio_sqlite3_close(handle)
            throw SQLiteFailure(code: code, message: "\(message) (\(path))")
        }
        raw = handle
        sqlite_nio_sqlite3_busy_timeout(handle, 10_000)
        // Statements are prepared once and kept (see `statement(for:)`): their plans must not depend on bound values, or
        // SQLite compiles them again at each run.
        let stability = liveline_sqlite_enable_query_planner_stability(UnsafeMutableRawPointer(handle))
        guard stability == SQLITE_OK else {
            sqlite_nio_sqlite3_close(handle)
            raw = nil
            throw SQLiteFailure(code: stability, message: "could not turn on the query planner stability guarantee (\(path))")
        }
    }

    deinit {
        close()
    }

    /// Whether a transaction is open (SQLite rolls one back by itself on some errors, such as a full disk).
    var isInTransaction: Bool {
        guard let raw else { return false }
        return sqlite_nio_sqlite3_get_autocommit(raw) == 0
    }

    /// Runs `sql` with `binds` and returns its rows (none for a statement that returns none).
    @discardableResult
    func query(_ sql: String, _ binds: [SQLiteData]) throws(SQLiteFailure) -> [StoreRow] {
        let prepared = try statement(for: sql)
        // The text values, end to end in one buffer that SQLite reads in place (`SQLITE_STATIC`), where it would copy
        // each into an allocation of its own: a write of progress binds a thousand. The buffer outlives the run: the
        // bindings are cleared before `withUnsafeBufferPointer` returns.
        var texts: [UInt8] = []
        texts.reserveCapacity(binds.reduce(0) { total, value in
            if case .text(let text) = value { total + text.utf8.count } else { total }
        })
        for case .text(let text) in binds { texts.append(contentsOf: text.utf8) }
        return try texts.withUnsafeBufferPointer { (texts) throws(SQLiteFailure) -> [StoreRow] in
            try run(prepared, binds, texts: texts)
        }
    }

    /// Binds `binds` (their text from `texts`, ``query(_:_:)``'s buffer, in order) to `prepared`, runs it, and leaves it
    /// reset with no bindings.
    private func run(_ prepared: PreparedStatement, _ binds: [SQLiteData], texts: UnsafeBufferPointer<UInt8>) throws(SQLiteFailure) -> [StoreRow] {
        let statement = prepared.statement
        defer {
            sqlite_nio_sqlite3_reset(statement)
            sqlite_nio_sqlite3_clear_bindings(statement)
        }
        var textOffset = 0
        for (offset, value) in binds.enumerated() {
            let index = Int32(offset + 1)
            guard case .text(let text) = value, let base = texts.baseAddress, !text.isEmpty else {
                // An empty text goes the copying way: a null pointer would bind NULL.
                try bind(value, at: index, of: statement)
                continue
            }
            let count = text.utf8.count
            let start = UnsafeRawPointer(base + textOffset).assumingMemoryBound(to: CChar.self)
            textOffset += count
            let code = sqlite_nio_sqlite3_bind_text64(statement, index, start, UInt64(count), nil, UInt8(SQLITE_UTF8))
            guard code == SQLITE_OK else { throw failure(code) }
        }
        var rows: [StoreRow] = []
        while true {
            let code = sqlite_nio_sqlite3_step(statement)
            if code == SQLITE_DONE { return rows }
            guard code == SQLITE_ROW else { throw failure(code) }
            let columns = prepared.columns(of: statement)
            var values: [SQLiteData] = []
            values.reserveCapacity(columns.count)
            for index in 0..<Int32(columns.count) {
                values.append(Self.value(of: statement, at: index))
            }
            rows.append(StoreRow(columns: columns, values: values))
        }
    }

    /// How many times SQLite compiled the kept statement for `sql` again since it was first prepared (0 for a statement
    /// not prepared yet): what the query planner stability guarantee keeps at 0.
    func recompilations(of sql: String) -> Int {
        guard let prepared = statements[sql] else { return 0 }
        return Int(sqlite_nio_sqlite3_stmt_status(prepared.statement, SQLITE_STMTSTATUS_REPREPARE, 0))
    }

    /// Has SQLite tell `checkpointer` the WAL's size after each commit on this connection, instead of checkpointing
    /// here itself at the commit that fills it.
    func checkpoint(with checkpointer: SQLiteCheckpointer) {
        guard let raw else { return }
        self.checkpointer = checkpointer
        sqlite_nio_sqlite3_wal_autocheckpoint(raw, 0)
        // Registered after the line above, which would otherwise remove it: both are the connection's one WAL callback.
        _ = sqlite_nio_sqlite3_wal_hook(
            raw,
            { context, _, _, pages in
                guard let context else { return SQLITE_OK }
                Unmanaged<SQLiteCheckpointer>.fromOpaque(context).takeUnretainedValue().walGrew(to: Int(pages))
                return SQLITE_OK
            },
            Unmanaged.passUnretained(checkpointer).toOpaque()
        )
    }

    /// Closes the connection, finalizing its statements. Closing again does nothing.
    func close() {
        guard let raw else { return }
        for prepared in statements.values { sqlite_nio_sqlite3_finalize(prepared.statement) }
        statements = [:]
        sqlite_nio_sqlite3_close_v2(raw)
        self.raw = nil
    }

    // MARK: Statements

    private func statement(for sql: String) throws(SQLiteFailure) -> PreparedStatement {
        if let prepared = statements[sql] { return prepared }
        guard let raw else { throw SQLiteFailure(code: SQLITE_MISUSE, message: "the connection is closed") }
        if statements.count >= Self.statementCacheLimit {
            for prepared in statements.values { sqlite_nio_sqlite3_finalize(prepared.statement) }
            statements = [:]
        }
        var statement: OpaquePointer?
        let code = sqlite_nio_sqlite3_prepare_v3(raw, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else { throw failure(code) }
        let prepared = PreparedStatement(statement: statement)
        statements[sql] = prepared
        return prepared
    }

    private func bind(_ value: SQLiteData, at index: Int32, of statement: OpaquePointer) throws(SQLiteFailure) {
        let code: Int32
        switch value {
        case .integer(let integer): code = sqlite_nio_sqlite3_bind_int64(statement, index, Int64(integer))
        case .float(let double): code = sqlite_nio_sqlite3_bind_double(statement, index, double)
        case .text(let text):
            var text = text
            code = text.withUTF8 { utf8 in
                sqlite_nio_sqlite3_bind_text64(statement, index, utf8.baseAddress, UInt64(utf8.count), Self.transient, UInt8(SQLITE_UTF8))
            }
        case .blob(let buffer):
            code = buffer.withUnsafeReadableBytes { bytes in
                sqlite_nio_sqlite3_bind_blob64(statement, index, bytes.baseAddress, UInt64(bytes.count), Self.transient)
            }
        case .null: code = sqlite_nio_sqlite3_bind_null(statement, index)
        }
        guard code == SQLITE_OK else { throw failure(code) }
    }

    private static func value(of statement: OpaquePointer, at index: Int32) -> SQLiteData {
        switch sqlite_nio_sqlite3_column_type(statement, index) {
        case SQLITE_INTEGER: return .integer(SQLiteInt64(sqlite_nio_sqlite3_column_int64(statement, index)))
        case SQLITE_FLOAT: return .float(sqlite_nio_sqlite3_column_double(statement, index))
        case SQLITE_TEXT:
            guard let text = sqlite_nio_sqlite3_column_text(statement, index) else { return .text("") }
            let count = Int(sqlite_nio_sqlite3_column_bytes(statement, index))
            return .text(String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self))
        case SQLITE_BLOB:
            let count = Int(sqlite_nio_sqlite3_column_bytes(statement, index))
            guard let bytes = sqlite_nio_sqlite3_column_blob(statement, index), count > 0 else { return .blob(ByteBuffer()) }
            return .blob(ByteBuffer(bytes: UnsafeRawBufferPointer(start: bytes, count: count)))
        default: return .null
        }
    }

    /// SQLite copies a bound value before the bind returns.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    private func failure(_ code: Int32) -> SQLiteFailure {
        let message = raw.flatMap { sqlite_nio_sqlite3_errmsg($0).map { String(cString: $0) } } ?? "error \(code)"
        return SQLiteFailure(code: code, message: message)
    }
}

/// A statement compiled once, and the names of its result columns (read at its first row).
private final class PreparedStatement {
    let statement: OpaquePointer
    private var cachedColumns: StoreRow.Columns?

    init(statement: OpaquePointer) {
        self.statement = statement
    }

    func columns(of statement: OpaquePointer) -> StoreRow.Columns {
        if let cachedColumns { return cachedColumns }
        let count = sqlite_nio_sqlite3_column_count(statement)
        let names = (0..<count).map { index in sqlite_nio_sqlite3_column_name(statement, index).map { String(cString: $0) } ?? "" }
        let columns = StoreRow.Columns(names: names)
        cachedColumns = columns
        return columns
    }
}

/// An error SQLite reported: its (extended) result code and message.
public struct SQLiteFailure: Error, Sendable, CustomStringConvertible {
    /// SQLite's extended result code.
    public var code: Int32
    /// SQLite's message.
    public var message: String

    public var description: String { "SQLite error \(code): \(message)" }
}

/// One row a statement returned: its values, found by column name.
struct StoreRow: Sendable {
    /// The names of a statement's columns, shared by all its rows.
    final class Columns: Sendable {
        let names: [String]
        let indexes: [String: Int]

        init(names: [String]) {
            self.names = names
            // The first of two columns with one name wins, as in SQLite's own lookups.
            var indexes: [String: Int] = [:]
            for (index, name) in names.enumerated() where indexes[name] == nil { indexes[name] = index }
            self.indexes = indexes
        }

        var count: Int { names.count }

        /// The position of the column named `name` in the rows (the first, if two have that name).
        func index(of name: String) -> Int? { indexes[name] }
    }

    let columns: Columns
    let values: [SQLiteData]

    /// The value of the column named `name`, or `nil` when the row has no such column.
    func column(_ name: String) -> SQLiteData? {
        column(at: columns.index(of: name))
    }

    /// The value of the column at `index` (found once for all the rows of an answer with ``Columns/index(of:)``), or
    /// `nil` when there is no such column.
    func column(at index: Int?) -> SQLiteData? {
        index.map { values[$0] }
    }
}
