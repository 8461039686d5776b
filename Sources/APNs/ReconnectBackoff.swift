import NIOCore

/// When a ``ConnectionSlot`` may try again to open a connection after attempts that failed (refused, timed out, TLS
/// or HTTP/2 setup that did not complete).
///
/// Apple: "If your provider server opens and closes its connection to APNs repeatedly, APNs may treat it as a
/// denial-of-service attack and temporarily block your server from connecting." A slot used to open its next
/// connection as soon as a request came after a failed one, and during a fan-out a request comes at once: the
/// engine's retries, a few hundred milliseconds apart, each brought a new attempt. Now the first attempt after a
/// connection was lost goes at once, and each that follows a failed attempt waits: ``initialDelay`` after the first
/// failure, twice as long after each further one, up to ``maximumDelay``, less up to half of it at random so that a
/// server's slots (and servers restarted together) do not all try at the same moment. Requests meanwhile wait in the
/// slot, up to their deadlines. A connection that becomes ready ends the backoff.
///
/// Pure: it keeps no clock and no timer; time and the random draw come in with the events.
struct ReconnectBackoff: Sendable, Hashable {
    /// The wait after the first failed attempt.
    var initialDelay: TimeAmount
    /// The longest wait between two attempts.
    var maximumDelay: TimeAmount
    /// Attempts that failed since a connection was last ready.
    private(set) var failures = 0
    /// The earliest time of the next attempt, while one must wait.
    private(set) var notBefore: NIODeadline?

    /// What the slot does when it needs a connection.
    enum Decision: Sendable, Hashable {
        /// Open one now.
        case connect
        /// Open one at this time, not before.
        case wait(until: NIODeadline)
    }

    /// A backoff that waits `initialDelay` after the first failure, doubling up to `maximumDelay`.
    init(initialDelay: TimeAmount = .milliseconds(250), maximumDelay: TimeAmount = .seconds(15)) {
        self.initialDelay = max(initialDelay, .zero)
        self.maximumDelay = max(maximumDelay, self.initialDelay)
    }

    /// Whether a connection may be opened at `now`.
    func decision(at now: NIODeadline) -> Decision {
        guard let notBefore, now < notBefore else { return .connect }
        return .wait(until: notBefore)
    }

    /// An attempt failed at `now`: the next waits, longer with each failure in a row. `random` (0 to 1) takes up to
    /// half of the wait off. Returns the wait.
    @discardableResult
    mutating func failed(at now: NIODeadline, random: Double) -> TimeAmount {
        failures += 1
        let doublings = min(failures - 1, 30)
        var delay = maximumDelay
        if initialDelay.nanoseconds <= maximumDelay.nanoseconds >> Int64(doublings) {
            delay = .nanoseconds(initialDelay.nanoseconds << Int64(doublings))
        }
        let kept = 1 - 0.5 * min(max(random, 0), 1)
        let wait = TimeAmount.nanoseconds(Int64(Double(delay.nanoseconds) * kept))
        notBefore = now + wait
        return wait
    }

    /// A connection became ready: the next attempt, whenever one is needed, goes at once.
    mutating func opened() {
        failures = 0
        notBefore = nil
    }
}
