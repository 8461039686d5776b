/// How long a server starting on a PostgreSQL database waits for it, and how often it tries, apart from the I/O.
///
/// Nodes and their database are often started together (a `docker compose up`, a Kubernetes rollout, a machine
/// booting): the server comes up first and finds nothing listening yet, or a PostgreSQL still recovering (`57P03`,
/// "the database system is starting up"). Failing at once there leaves the node to its supervisor's restart policy, or
/// down for good without one. The server tries again instead, each pause twice the one before up to ``maximumPause``,
/// for at most ``limit``; a refusal that trying again cannot mend (a wrong password, a database that does not exist,
/// a bad URL) fails at once, as it does with no wait at all.
public struct DatabaseStartupWait: Sendable, Hashable {
    /// The longest the server waits for its database before it gives up; zero tries once.
    public var limit: Duration
    /// The pause after the first failed try.
    public var firstPause: Duration = .milliseconds(250)
    /// The longest pause between two tries.
    public var maximumPause: Duration = .seconds(5)

    /// What the server waits by default: long enough for a PostgreSQL started beside it to accept connections.
    public static let defaultLimit: Duration = .seconds(60)

    public init(limit: Duration = Self.defaultLimit) {
        self.limit = limit
    }

    /// What to do after a failed try.
    public enum Decision: Hashable, Sendable {
        /// Try again after this pause.
        case tryAgain(after: Duration)
        /// Give up: report the failure.
        case giveUp
    }

    /// The decision after the `attempt`-th try (from 1) failed, `elapsed` after the first began; `mayPass` says
    /// whether the failure may pass by itself (``PostgresFailure/isConnectionLost``: nothing listening, a server
    /// starting up or shutting down, a connection cut).
    public func decision(afterAttempt attempt: Int, elapsed: Duration, mayPass: Bool) -> Decision {
        guard mayPass, elapsed < limit else { return .giveUp }
        var pause = firstPause
        for _ in 1..<max(attempt, 1) {
            pause = pause * 2
            if pause >= maximumPause { break }
        }
        // The last pause ends at the limit, for one more try there.
        return .tryAgain(after: min(pause, maximumPause, limit - elapsed))
    }
}
