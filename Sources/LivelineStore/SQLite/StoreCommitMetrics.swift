import CoreMetrics

/// The SQLite writer's metrics, through swift-metrics (the process's factory, as bootstrapped when the Store opens):
///
/// - `liveline_store_commit_duration_seconds{durability}`: how long each COMMIT took (for `full`, the sync to disk);
/// - `liveline_store_commits_total{durability}`: transactions committed (fewer than the writes: they share commits).
///
/// `durability` is `full` (what the API acknowledges) or `bookkeeping` (delivery progress).
struct StoreCommitMetrics: Sendable {
    static let commitDurationName = "liveline_store_commit_duration_seconds"
    static let commitsName = "liveline_store_commits_total"

    private let fullTimer: CoreMetrics.Timer
    private let bookkeepingTimer: CoreMetrics.Timer
    private let fullCommits: Counter
    private let bookkeepingCommits: Counter

    init(factory: any MetricsFactory = MetricsSystem.factory) {
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
}
