import CoreMetrics

/// The Store writers' metrics, through swift-metrics (the process's factory, as bootstrapped when the Store opens):
///
/// - `liveline_store_commit_duration_seconds{durability}`: how long each COMMIT took (for `full`, the sync to disk);
/// - `liveline_store_commits_total{durability}`: transactions committed (fewer than the writes where they share
///   commits: on SQLite, and PostgreSQL's registrations and updates);
/// - `liveline_store_write_retries_total{sqlstate}` (PostgreSQL): write transactions run again after a serialization
///   failure (`40001`), a deadlock (`40P01`) or a concurrent insert of the same key (`23505`).
///
/// `durability` is `full` (what the API acknowledges) or `bookkeeping` (delivery progress).
struct StoreCommitMetrics: Sendable {
    static let commitDurationName = "liveline_store_commit_duration_seconds"
    static let commitsName = "liveline_store_commits_total"
    static let writeRetriesName = "liveline_store_write_retries_total"

    private let fullTimer: CoreMetrics.Timer
    private let bookkeepingTimer: CoreMetrics.Timer
    private let fullCommits: Counter
    private let bookkeepingCommits: Counter
    private let factory: any MetricsFactory

    init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        fullTimer = CoreMetrics.Timer(label: Self.commitDurationName, dimensions: [("durability", "full")], factory: factory)
        bookkeepingTimer = CoreMetrics.Timer(label: Self.commitDurationName, dimensions: [("durability", "bookkeeping")], factory: factory)
        fullCommits = Counter(label: Self.commitsName, dimensions: [("durability", "full")], factory: factory)
        bookkeepingCommits = Counter(label: Self.commitsName, dimensions: [("durability", "bookkeeping")], factory: factory)
    }

    /// Records one commit of `durability` that took `duration`.
    func committed(_ durability: Durability, took duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let nanoseconds = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        switch durability {
        case .full:
            fullTimer.recordNanoseconds(nanoseconds)
            fullCommits.increment()
        case .bookkeeping:
            bookkeepingTimer.recordNanoseconds(nanoseconds)
            bookkeepingCommits.increment()
        }
    }

    /// Records that a write transaction is run again after PostgreSQL refused it with `sqlState`.
    func retried(sqlState: String) {
        Counter(label: Self.writeRetriesName, dimensions: [("sqlstate", sqlState)], factory: factory).increment()
    }
}
