/// When the writer copies what is left of the WAL into the database itself, so that the WAL starts over from its
/// beginning instead of growing while writes keep coming (a pure decision, apart from the I/O: ``SQLiteCheckpointer``
/// keeps one, fed from the writer's thread).
///
/// The checkpointer copies the WAL on a thread of its own, and the writer never waits for it. But SQLite writes the
/// WAL again from its beginning only at a transaction that begins when every frame of it has been copied (and no reader
/// still reads an older frame). Under a steady stream of commits that moment never comes: a checkpoint copies the frames
/// that were there when it began, and by its end the writer has added more. The WAL then grew for as long as the stream
/// lasted, and kept its size on the disk after: `bench fanout`'s 100,000 registrations, in the random order phones
/// register in (each writes a page of its own in the instances' tree and one in their age index), left 136 – 474 MB of
/// WAL beside a 42 MB database, which a restart after a crash reads through again.
///
/// So once the WAL holds ``limit`` pages, the writer, between two transactions, checkpoints what the checkpointer has
/// not copied yet (most of it has been), and its next transaction writes the WAL from its beginning. If that does not
/// happen (a reader still reading an older frame holds the WAL), it tries again after another ``limit`` pages; if the
/// checkpointer is copying at that moment, before the next transaction.
struct WALBound: Sendable {
    /// The WAL's size, in pages, at which the writer checkpoints it: 16 MB of SQLite's 4 KB pages, four times what the
    /// checkpointer starts at (``SQLiteCheckpointer/defaultThreshold``).
    static let defaultLimit = 4000

    /// How one of the writer's checkpoints went.
    enum Outcome: Sendable, Equatable {
        /// The checkpointer was copying: nothing was done.
        case busy
        /// It ran (or failed for a reason of its own, such as the disk): whether the WAL starts over shows in the next
        /// size the writer reports.
        case ran
    }

    /// The WAL's size, in pages, at which the writer checkpoints it.
    let limit: Int
    /// The WAL's size after the last commit.
    private(set) var pages = 0
    /// The size at which the writer next checkpoints.
    private var dueAt: Int

    init(limit: Int = Self.defaultLimit) {
        precondition(limit > 0, "a WAL of at least one page")
        self.limit = limit
        dueAt = limit
    }

    /// After a commit, the WAL holds `pages` pages (SQLite's count, from the WAL's beginning). Fewer than before means
    /// the WAL started over.
    mutating func walGrew(to pages: Int) {
        if pages < self.pages { dueAt = limit }
        self.pages = pages
    }

    /// Whether the writer checkpoints before its next transaction.
    var checkpointDue: Bool { pages >= dueAt }

    /// The writer's checkpoint went as `outcome`.
    mutating func writerCheckpointed(_ outcome: Outcome) {
        switch outcome {
        case .busy: break
        case .ran: dueAt = pages + limit
        }
    }
}
