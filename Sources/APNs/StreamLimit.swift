import NIOCore

/// How many requests one connection keeps on the wire at once, adapted to how long APNs takes to answer them.
///
/// Apple's servers answer in milliseconds; then the server's `SETTINGS_MAX_CONCURRENT_STREAMS` is the only limit that
/// matters, and this one stays out of the way. But when answers slow down because too much is on the wire (a server,
/// or an uplink, that takes a few hundred pushes a second while thousands wait on it), a push whose answer takes
/// longer than the request timeout fails on our side while the server may still deliver it, and the engine sends it
/// again: the phone gets it twice. A request held back on our side instead waits in the connection's queue, where a
/// timeout sends nothing twice. So, in the manner of TCP's congestion window:
///
/// - The limit starts at ``Configuration/initial`` and, while answers come quickly (the smoothed answer time under
///   half the slow mark, or within a quarter of the fastest answer seen: no queue is building up), grows by one with
///   each answer: it doubles every round trip and reaches the server's limit within a few. After a cut it grows by
///   one a round trip (one for every ``value`` answers) until answers are quick again by a wide margin (under an
///   eighth of the slow mark), when it doubles again.
/// - When the smoothed answer time passes the slow mark, the limit halves (never below ``Configuration/minimum``),
///   at most once per smoothed answer time: the answers to streams opened before a cut arrive after it.
/// - The slow mark is ``Configuration/slowAnswer``, or twice the fastest answer seen when that is more, but at most
///   ``Configuration/slowestMark``: a server that always takes seconds is far away or slow, not overloaded, and fewer
///   streams would not make it answer sooner.
/// - A request that waited in the queue goes on the wire only with time left for an answer: ``answerAllowance`` is
///   twice the smoothed answer time, at least ``Configuration/leastTimeLeft`` and at most
///   ``Configuration/mostTimeLeft``, so that a request that has not waited is always sent.
///
/// A pure value: it reads no clock; ``APNsConnectionStateMachine`` feeds it each answer's time.
struct StreamLimit: Sendable {
    /// The limit's tuning.
    struct Configuration: Sendable, Hashable {
        /// The limit before any answer.
        var initial: Int
        /// The limit never goes below this.
        var minimum: Int
        /// A smoothed answer time past this cuts the limit (unless the server was always that slow).
        var slowAnswer: TimeAmount
        /// The slow mark never goes above this, however slow the server always was.
        var slowestMark: TimeAmount
        /// A queued request is written only with at least this much of its time left (or twice the smoothed answer
        /// time, when that is more).
        var leastTimeLeft: TimeAmount
        /// A request with this much of its time left is always written, however slow the answers: the most
        /// ``answerAllowance`` asks.
        var mostTimeLeft: TimeAmount

        init(
            initial: Int, minimum: Int, slowAnswer: TimeAmount, slowestMark: TimeAmount, leastTimeLeft: TimeAmount,
            mostTimeLeft: TimeAmount
        ) {
            self.minimum = max(1, minimum)
            self.initial = max(self.minimum, initial)
            self.slowAnswer = slowAnswer
            self.slowestMark = max(slowAnswer, slowestMark)
            self.leastTimeLeft = leastTimeLeft
            self.mostTimeLeft = max(leastTimeLeft, mostTimeLeft)
        }

        /// For a client whose requests time out after `requestTimeout`: 100 streams at first (what swift-nio-http2
        /// assumes before the server's settings), at least 8; answers are slow past an eighth of the timeout, the
        /// mark stays under half of it, and a queued request is written only with a quarter of it left, so that an
        /// answer twice or three times as slow as the typical one still comes in time; with half of it left, always.
        init(requestTimeout: TimeAmount) {
            self.init(
                initial: 100,
                minimum: 8,
                slowAnswer: .nanoseconds(requestTimeout.nanoseconds / 8),
                slowestMark: .nanoseconds(requestTimeout.nanoseconds / 2),
                leastTimeLeft: .nanoseconds(requestTimeout.nanoseconds / 4),
                mostTimeLeft: .nanoseconds(requestTimeout.nanoseconds / 2)
            )
        }
    }

    /// A cut of the limit, for the log.
    struct Cut: Sendable, Hashable {
        /// The limit in effect before the cut (the server's, when that was lower).
        var from: Int
        /// The limit after it.
        var to: Int
        /// The smoothed answer time that caused it.
        var smoothedAnswer: TimeAmount
        /// The slow mark it passed.
        var slowMark: TimeAmount
    }

    let configuration: Configuration
    /// The limit now; the connection keeps `min(value, server's limit)` streams at most.
    private(set) var value: Int
    /// The answer time, smoothed over about the last eight answers; nil before the first.
    private(set) var smoothedAnswer: TimeAmount?
    /// The fastest answer seen.
    private(set) var fastestAnswer: TimeAmount?
    /// When the limit was last cut.
    private var lastCut: NIODeadline?
    /// Growing one a round trip (after a cut) rather than one an answer.
    private(set) var isAvoiding = false
    /// Answers since the limit last grew, while ``isAvoiding``.
    private var answersSinceGrowth = 0

    init(_ configuration: Configuration) {
        self.configuration = configuration
        self.value = configuration.initial
    }

    /// Answers slower than this, smoothed, cut the limit.
    var slowMark: TimeAmount {
        let twiceFastest = TimeAmount.nanoseconds((fastestAnswer?.nanoseconds ?? 0) * 2)
        return min(max(configuration.slowAnswer, twiceFastest), configuration.slowestMark)
    }

    /// How much time a queued request needs left to be worth sending: twice the smoothed answer time, at least
    /// ``Configuration/leastTimeLeft``. One with less would likely time out on the wire, and be sent again after the
    /// server delivered it.
    ///
    /// At most ``Configuration/mostTimeLeft`` (half the request timeout), whatever the answers took: past half the
    /// timeout every request would be refused unsent, also one that had not waited at all, and the connection would
    /// send nothing until a smoothed answer time it no longer measured came down. (Under a 4 s timeout, answers of
    /// 1.5 s on a loaded machine refused a request that had waited a little over one second.) A server that slow is
    /// served at the least streams (``Configuration/minimum``), each request sent with at least half its time left.
    var answerAllowance: TimeAmount {
        min(max(.nanoseconds((smoothedAnswer?.nanoseconds ?? 0) * 2), configuration.leastTimeLeft), configuration.mostTimeLeft)
    }

    /// A request was answered `answerTime` after it was written, at `now`, while the server allowed `serverLimit`
    /// streams. Answers the cut, when this answer caused one. A request that timed out on the wire counts as
    /// answered at its timeout.
    mutating func answered(after answerTime: TimeAmount, at now: NIODeadline, serverLimit: Int) -> Cut? {
        let sample = max(answerTime, .nanoseconds(0))
        if let fastest = fastestAnswer {
            if sample < fastest { fastestAnswer = sample }
        } else {
            fastestAnswer = sample
        }
        let smoothed: TimeAmount
        if let previous = smoothedAnswer {
            smoothed = previous + .nanoseconds((sample.nanoseconds - previous.nanoseconds) / 8)
        } else {
            smoothed = sample
        }
        smoothedAnswer = smoothed

        let mark = slowMark
        if smoothed > mark {
            if let lastCut, now - lastCut < smoothed { return nil }
            let from = min(value, serverLimit)
            let to = max(configuration.minimum, from / 2)
            lastCut = now
            isAvoiding = true
            answersSinceGrowth = 0
            guard to < value else { return nil }
            value = to
            return Cut(from: from, to: to, smoothedAnswer: smoothed, slowMark: mark)
        }
        if isAvoiding, smoothed.nanoseconds < mark.nanoseconds / 8 {
            isAvoiding = false
        }
        let quick = smoothed.nanoseconds < mark.nanoseconds / 2
            || smoothed.nanoseconds * 4 < (fastestAnswer?.nanoseconds ?? 0) * 5
        guard quick, value < serverLimit else { return nil }
        if isAvoiding {
            answersSinceGrowth += 1
            guard answersSinceGrowth >= value else { return nil }
            answersSinceGrowth = 0
        }
        value += 1
        return nil
    }
}
