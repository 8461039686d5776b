/// Which of the writer's commits the WAL's syncs have made durable, and whether the callers of a commit that has just
/// ended wait for a sync (``WALSyncer``): the syncer's decisions, without the disk.
///
/// A commit that wrote no frame to the WAL (a write that found nothing to change: a phone registering the token it
/// already has, an idle delivery engine's look for work) changed nothing on disk. What it answered was read from the
/// commits before it, so it is durable once they are: its callers wait for the next sync only while one of those is not
/// synced yet, and not at all otherwise. Every such write used to cost a sync of its own: an idle server synced its WAL
/// about four times a second for its delivery workers' looks (119 syncs in 30 s), and each app launch that registered
/// its token again waited for the disk.
///
/// Commits of bookkeeping writes count too (``bookkeepingCommitted(wroteFrames:)``): their frames are synced only by the
/// next full commit's sync, and a write that read them and changed nothing waits for that sync as well.
struct SyncLedger: Sendable, Equatable {
    /// Commits so far that wrote frames to the WAL, full or bookkeeping.
    private(set) var written = 0
    /// How many of them the syncs that succeeded cover (the first ones: syncs cover every frame written before them).
    private(set) var synced = 0

    /// When the callers of a full write's commit resume.
    enum Resume: Equatable, Sendable {
        /// At once: the commit wrote nothing, and every commit before it is synced.
        case now
        /// Once a sync that begins after the commit has ended.
        case afterNextSync
    }

    /// A full write's commit has just ended; `wroteFrames` says whether it wrote frames to the WAL.
    mutating func fullCommitted(wroteFrames: Bool) -> Resume {
        if wroteFrames {
            written += 1
            return .afterNextSync
        }
        return synced == written ? .now : .afterNextSync
    }

    /// A bookkeeping write's commit has just ended (its callers wait for no sync).
    mutating func bookkeepingCommitted(wroteFrames: Bool) {
        if wroteFrames { written += 1 }
    }

    /// A sync begins: it will cover every commit recorded so far. The mark to hand to ``succeeded(through:)``.
    var syncMark: Int { written }

    /// The sync that began at `mark` (``syncMark``) succeeded. A sync that failed records nothing: every commit after the
    /// last good one stays unsynced, and the writes that wait for them fail with that failure.
    mutating func succeeded(through mark: Int) {
        synced = max(synced, mark)
    }
}
