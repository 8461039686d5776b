import CoreMetrics

/// The Store writers' metrics, through swift-metrics (the process's factory, as bootstrapped when the Store opens):
///
/// - `liveline_store_commit_duration_seconds{durability}`: how long each COMMIT took (for `full`, the sync to disk);
/// - `liveline_store_write_duration_seconds{durability}`: how long each write took from its call until its caller had
///   its outcome: its wait for the writer (the queue, or a connection), its statements, the COMMIT it shared and the
///   caller's resumption. Against the commits' time it tells an operator where an acknowledged write waits;
/// - `liveline_store_commits_total{durability}`: transactions committed (fewer than the writes where they share
///   commits: on SQLite, and PostgreSQL's registrations and updates);
/// - `liveline_store_write_retries_total{sqlstate}` (PostgreSQL): write transactions run again after a serialization
///   failure (`40001`), a deadlock (`40P01`) or a concurrent insert of the same key (`23505`);
/// - `liveline_store_set_members_total{decided}` (PostgreSQL): committed writes that shared their transaction with
///   others of their kind as one set (``SetWrite``): `decided="set"` the set wrote or refused, `decided="body"` it left
///   to their own bodies.
///
/// `durability` is `full` (what the API acknowledges) or `bookkeeping` (delivery progress).
struct StoreCommitMetrics: Sendable {
    static let commitDurationName = "liveline_store_commit_duration_seconds"
    static let writeDurationName = "liveline_store_write_duration_seconds"
    static let commitsName = "liveline_store_commits_total"
    static let writeRetriesName = "liveline_store_write_retries_total"
    static let setMembersName = "liveline_store_set_members_total"

    private let fullTimer: CoreMetrics.Timer
    private let bookkeepingTimer: CoreMetrics.Timer
    private let fullWriteTimer: CoreMetrics.Timer
    private let bookkeepingWriteTimer: CoreMetrics.Timer
    private let fullCommits: Counter
    private let bookkeepingCommits: Counter
    private let membersDecidedBySet: Counter
    private let membersDecidedByBody: Counter
    private let factory: any MetricsFactory

    init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        fullTimer = CoreMetrics.Timer(label: Self.commitDurationName, dimensions: [("durability", "full")], factory: factory)
        bookkeepingTimer = CoreMetrics.Timer(label: Self.commitDurationName, dimensions: [("durability", "bookkeeping")], factory: factory)
        fullWriteTimer = CoreMetrics.Timer(label: Self.writeDurationName, dimensions: [("durability", "full")], factory: factory)
        bookkeepingWriteTimer = CoreMetrics.Timer(label: Self.writeDurationName, dimensions: [("durability", "bookkeeping")], factory: factory)
        fullCommits = Counter(label: Self.commitsName, dimensions: [("durability", "full")], factory: factory)
        bookkeepingCommits = Counter(label: Self.commitsName, dimensions: [("durability", "bookkeeping")], factory: factory)
        membersDecidedBySet = Counter(label: Self.setMembersName, dimensions: [("decided", "set")], factory: factory)
        membersDecidedByBody = Counter(label: Self.setMembersName, dimensions: [("decided", "body")], factory: factory)
    }

    /// Records one commit of `durability` that took `duration`.
    func committed(_ durability: Durability, took duration: Duration) {
        switch durability {
        case .full:
            fullTimer.recordNanoseconds(Self.nanoseconds(duration))
            fullCommits.increment()
        case .bookkeeping:
            bookkeepingTimer.recordNanoseconds(Self.nanoseconds(duration))
            bookkeepingCommits.increment()
        }
    }

    /// Records one write of `durability`, called at `started`, whose caller has its outcome now (committed or failed).
    func wrote(_ durability: Durability, since started: ContinuousClock.Instant) {
        let nanoseconds = Self.nanoseconds(ContinuousClock.now - started)
        switch durability {
        case .full: fullWriteTimer.recordNanoseconds(nanoseconds)
        case .bookkeeping: bookkeepingWriteTimer.recordNanoseconds(nanoseconds)
        }
    }

    private static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// Records the members of a committed set: `bySet` decided by the set, `byBody` by their own bodies.
    func setCommitted(bySet: Int, byBody: Int) {
        if bySet > 0 { membersDecidedBySet.increment(by: bySet) }
        if byBody > 0 { membersDecidedByBody.increment(by: byBody) }
    }

    /// Records that a write transaction is run again after PostgreSQL refused it with `sqlState`.
    func retried(sqlState: String) {
        Counter(label: Self.writeRetriesName, dimensions: [("sqlstate", sqlState)], factory: factory).increment()
    }
}
