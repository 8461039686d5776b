/// Exponential backoff with jitter, honouring a service's Retry-After. Pure: the random source is injected.
public struct RetryPolicy: Sendable, Hashable {
    /// Attempts per push within one pass (the first one included).
    public var maximumAttempts: Int
    /// The delay before the second attempt (before jitter).
    public var baseDelay: Duration
    /// The longest delay between attempts.
    public var maximumDelay: Duration
    /// How long an activity whose pushes ran out of attempts waits before the next pass.
    public var passRetryDelay: Duration

    /// Creates a policy.
    public init(
        maximumAttempts: Int = 5, baseDelay: Duration = .milliseconds(200), maximumDelay: Duration = .seconds(30),
        passRetryDelay: Duration = .seconds(30)
    ) {
        self.maximumAttempts = max(1, maximumAttempts)
        self.baseDelay = baseDelay
        self.maximumDelay = maximumDelay
        self.passRetryDelay = passRetryDelay
    }

    /// The wait before attempt `attempt + 1`, after attempt number `attempt` (1-based) failed.
    /// "Full jitter" between half and all of the exponential delay; never less than `retryAfter`.
    public func delay(afterAttempt attempt: Int, retryAfter: Duration?, random: Double) -> Duration {
        let exponent = min(max(attempt - 1, 0), 30)
        let exponential = min(baseDelay * (1 << exponent), maximumDelay)
        let jitter = 0.5 + 0.5 * min(max(random, 0), 1)
        return Self.honouring(retryAfter, exponential * jitter)
    }

    /// The wait before attempt `attempt + 1` for a service that asks for at least `floor` before any retry (FCM:
    /// "retry with exponential backoff", and not at once): the backoff starts at `floor` and doubles with each
    /// attempt, up to `maximumDelay` or eight times `floor`, whichever is longer; the jitter adds up to half of it
    /// again (never takes from it), so pushes refused together are not retried together; never less than
    /// `retryAfter`. A zero `floor` is ``delay(afterAttempt:retryAfter:random:)``.
    public func delay(afterAttempt attempt: Int, retryAfter: Duration?, floor: Duration, random: Double) -> Duration {
        guard floor > .zero else { return delay(afterAttempt: attempt, retryAfter: retryAfter, random: random) }
        let exponent = min(max(attempt - 1, 0), 30)
        let exponential = min(floor * (1 << exponent), max(maximumDelay, floor * 8))
        return Self.honouring(retryAfter, exponential * (1 + 0.5 * min(max(random, 0), 1)))
    }

    /// `delay`, or the service's `Retry-After` when that is longer (at most an hour: a longer one is taken for an hour).
    private static func honouring(_ retryAfter: Duration?, _ delay: Duration) -> Duration {
        guard let retryAfter else { return delay }
        return max(delay, min(retryAfter, .seconds(3600)))
    }
}
