import Foundation
import SQLiteNIO
import Testing

@testable import LivelineStore

@Suite("SQLite statements are compiled once")
struct StatementReuseTests {
    /// Without the query planner stability guarantee, SQLite 3.54 compiles a statement with an `ORDER BY` (or a join
    /// against `VALUES`) again each time a new value is bound: the fan-out's page read and its progress write were
    /// compiled at every run.
    @Test("a statement with ORDER BY, and one joined against VALUES, run with new values are not compiled again")
    func keptStatementsAreNotRecompiled() throws {
        try withTemporaryHandle { handle in try checkKeptStatements(on: handle) }
    }

    private func checkKeptStatements(on handle: SQLiteHandle) throws {
        try handle.query("CREATE TABLE rows (app TEXT NOT NULL, id TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (app, id)) WITHOUT ROWID", [])
        for index in 0..<20 {
            try handle.query("INSERT INTO rows (app, id, n) VALUES (?, ?, ?)", [.text("a\(index % 2)"), .text("id-\(index)"), .integer(index)])
        }
        let page = "SELECT * FROM rows WHERE app = ? AND n < ? AND id > ? ORDER BY id LIMIT 3"
        let progress = """
            UPDATE rows SET n = v.column2 FROM (VALUES (?, ?), (?, ?)) AS v WHERE rows.app = ? AND rows.id = v.column1
            """
        var read = 0
        for run in 0..<5 {
            read += try handle.query(page, [.text("a\(run % 2)"), .integer(100 + run), .text("id-\(run)")]).count
            try handle.query(progress, [.text("id-\(run)"), .integer(run), .text("id-\(run + 2)"), .integer(run), .text("a\(run % 2)")])
        }
        #expect(read > 0)
        #expect(handle.recompilations(of: page) == 0)
        #expect(handle.recompilations(of: progress) == 0)
    }

    /// Text values are bound in place from one buffer a statement (`SQLITE_STATIC`): each must reach SQLite whole and in
    /// its own place, an empty text as text (not NULL), and the next run of the kept statement must see its own values.
    @Test("text values bound in place keep their places, their bytes and their type, run after run")
    func textBoundInPlace() throws {
        try withTemporaryHandle { handle in try checkTextBoundInPlace(on: handle) }
    }

    private func checkTextBoundInPlace(on handle: SQLiteHandle) throws {
        let sql = "SELECT ? AS a, ? AS b, typeof(?) AS c, ? AS d, ? AS e, ? AS f, typeof(?) AS g"
        for run in 0..<3 {
            let long = String(repeating: "z\(run)", count: 2_000)
            let row = try #require(
                try handle.query(
                    sql,
                    [.text("héllo-\(run)"), .integer(run), .text(""), .text(long), .null, .text("🙂\(run)"), .null]
                ).first
            )
            #expect(row.column("a")?.string == "héllo-\(run)")
            #expect(row.column("b")?.integer == run)
            #expect(row.column("c")?.string == "text")
            #expect(row.column("d")?.string == long)
            #expect(row.column("e") == .null)
            #expect(row.column("f")?.string == "🙂\(run)")
            #expect(row.column("g")?.string == "null")
        }
        // Written and read back: the row holds the values, not pointers into a buffer gone since.
        try handle.query("CREATE TABLE kept (k TEXT NOT NULL, v TEXT NOT NULL)", [])
        for index in 0..<50 { try handle.query("INSERT INTO kept (k, v) VALUES (?, ?)", [.text("key-\(index)"), .text("value-\(index)")]) }
        let rows = try handle.query("SELECT k, v FROM kept ORDER BY rowid", [])
        #expect(rows.map { $0.column("k")?.string } == (0..<50).map { "key-\($0)" })
        #expect(rows.map { $0.column("v")?.string } == (0..<50).map { "value-\($0)" })
    }

    /// A statement that changes many rows inside a larger transaction is journaled so that it can be undone alone. The
    /// journal of a fan-out's progress part (a few dozen pages) stays in memory: SQLite used to write it to a temporary
    /// file it opened and closed for each part.
    @Test(
        "a statement's journal of a few hundred KB stays in memory, with no temporary file opened for it",
        .enabled(if: FileManager.default.fileExists(atPath: "/proc/self/fd"), "the open files are read from /proc (Linux)")
    )
    func statementJournalInMemory() throws {
        try withTemporaryHandle { handle in
            #expect(SQLiteHandle.statementJournalSpill == 0, "SQLite refused the setting (SQLITE_OK is 0)")
            try handle.query("CREATE TABLE rows (id TEXT NOT NULL PRIMARY KEY, n INTEGER NOT NULL, padding TEXT NOT NULL) WITHOUT ROWID", [])
            try handle.query("BEGIN", [])
            for index in 0..<2_000 {
                try handle.query("INSERT INTO rows (id, n, padding) VALUES (?, 0, ?)", [.text("id-\(index)"), .text(String(repeating: "p", count: 200))])
            }
            try handle.query("COMMIT", [])
            // A statement journal is needed inside a transaction of several statements, for a statement that may fail
            // half-way (here: NOT NULL). Spilled, it is a file deleted at once and kept open until the transaction ends.
            try handle.query("BEGIN", [])
            try handle.query("UPDATE rows SET n = 1 WHERE id < 'id-3'", [])
            let before = Self.openDeletedFiles()
            // Every row, on about 100 pages: some 400 KB of journal.
            try handle.query("UPDATE rows SET n = n + 1", [])
            let after = Self.openDeletedFiles()
            try handle.query("COMMIT", [])
            #expect(after.subtracting(before).isEmpty, "SQLite opened \(after.subtracting(before)) for the statement's journal")
            #expect(try handle.query("SELECT SUM(n) AS total FROM rows", []).first?.column("total")?.integer == 2_000 + (0..<2_000).filter { "id-\($0)" < "id-3" }.count)
        }
    }

    /// The open file descriptors of this process that name SQLite's deleted temporary files (`/proc/self/fd`), as
    /// "descriptor → target": opened with `O_TMPFILE` they read `<directory>/#<inode> (deleted)`, otherwise
    /// `<directory>/etilqs_<random> (deleted)`. Other deleted files (those of tests running alongside) are not counted.
    private static func openDeletedFiles() -> Set<String> {
        let directory = "/proc/self/fd"
        guard let descriptors = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return [] }
        var found: Set<String> = []
        for descriptor in descriptors {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "\(directory)/\(descriptor)") else { continue }
            let name = target.split(separator: "/").last ?? ""
            if target.hasSuffix(" (deleted)"), name.hasPrefix("#") || name.hasPrefix("etilqs_") {
                found.insert("\(descriptor) → \(target)")
            }
        }
        return found
    }

    /// Runs `body` with a handle on a new database file in a directory of its own, removed afterwards.
    private func withTemporaryHandle(_ body: (SQLiteHandle) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("liveline-statements-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let handle = try SQLiteHandle(path: directory.appendingPathComponent("statements.sqlite").path)
        defer { handle.close() }
        try body(handle)
    }
}
