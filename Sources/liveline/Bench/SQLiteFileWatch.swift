import Foundation
import NIOConcurrencyHelpers

/// The largest sizes a server's SQLite database file and its WAL reach while a bench runs, from the files' sizes read
/// every ``interval``: the disk a run takes, and whether the WAL keeps starting over (issue 17 named its growth among
/// the suspects of a fan-out's slow-down; it grew to hundreds of megabytes under a steady stream of writes until the
/// writer bounded it).
final class SQLiteFileWatch: Sendable {
    /// How often the sizes are read.
    static let interval = Duration.milliseconds(100)

    /// The largest sizes seen, in bytes.
    struct Largest: Sendable, Equatable {
        var database = 0
        var wal = 0
    }

    private let seen: NIOLockedValueBox<Largest>
    private let watching: Task<Void, Never>

    /// Starts reading the sizes of the database at `databasePath` and of its WAL (`databasePath-wal`); a file that does
    /// not exist counts as empty.
    init(databasePath: String) {
        let seen = NIOLockedValueBox(Largest())
        self.seen = seen
        watching = Task {
            while !Task.isCancelled {
                let database = Self.size(databasePath)
                let wal = Self.size(databasePath + "-wal")
                seen.withLockedValue { largest in
                    largest.database = max(largest.database, database)
                    largest.wal = max(largest.wal, wal)
                }
                try? await Task.sleep(for: Self.interval)
            }
        }
    }

    /// The largest sizes seen so far.
    var largest: Largest { seen.withLockedValue { $0 } }

    /// Stops reading and returns the largest sizes seen.
    func stop() async -> Largest {
        watching.cancel()
        await watching.value
        return largest
    }

    private static func size(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber)?.intValue ?? 0
    }
}
