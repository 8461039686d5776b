import Foundation
import LivelineTestSupport
import Testing

@testable import liveline

@Suite("The bench's watch of the server's SQLite files")
struct SQLiteFileWatchTests {
    /// Waits until `watch` has seen `expected` (a minute at most).
    private func waitUntil(_ watch: SQLiteFileWatch, has expected: SQLiteFileWatch.Largest) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while watch.largest != expected, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(watch.largest == expected)
    }

    @Test("keeps the largest sizes the database and its WAL reached, not their last ones; a missing file counts as empty")
    func largestSizes() async throws {
        try await withTemporaryDirectory(prefix: "liveline-file-watch") { directory in
            let database = directory.appendingPathComponent("liveline.sqlite").path
            let wal = database + "-wal"
            #expect(FileManager.default.createFile(atPath: database, contents: Data(count: 4096)))
            let watch = SQLiteFileWatch(databasePath: database)
            try await waitUntil(watch, has: SQLiteFileWatch.Largest(database: 4096, wal: 0))
            #expect(FileManager.default.createFile(atPath: wal, contents: Data(count: 300_000)))
            try await waitUntil(watch, has: SQLiteFileWatch.Largest(database: 4096, wal: 300_000))
            // The WAL starts over, cut back (as `journal_size_limit` does), and the database grows.
            let handle = try #require(FileHandle(forWritingAtPath: wal))
            try handle.truncate(atOffset: 1000)
            try handle.close()
            #expect(FileManager.default.createFile(atPath: database, contents: Data(count: 8192)))
            try await waitUntil(watch, has: SQLiteFileWatch.Largest(database: 8192, wal: 300_000))
            #expect(await watch.stop() == SQLiteFileWatch.Largest(database: 8192, wal: 300_000))
        }
    }
}
