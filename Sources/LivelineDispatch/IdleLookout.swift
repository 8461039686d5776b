import Foundation
import LivelineCore

/// When the delivery engine next looks at the Store by itself, with no wake-up: one time for all its idle workers.
///
/// Accepted work wakes a worker at once (``WakeSignal``); work that falls due later (a retry's delay, a dead node's
/// lease) is found by looking when it is due, and a missed wake-up by looking every ``longest`` at the latest. Each
/// idle worker used to keep that time itself, each with a timer: 128 workers looking every 5 s were 25 looks a second
/// at rest, 60 % of an idle server's CPU (0.43 % of a core against 0.17 % with 4 workers) and most of its wake-ups (177 a
/// second against 43). Now each look reports when the next pending activity falls due (``looked(due:now:)``), idle
/// workers wait for a wake-up alone, and one timer, the lookout's, wakes one of them at the earliest time reported
/// (``fire(now:)``); that one wakes another when its look found more than it could take.
struct IdleLookout: Sendable {
    /// The longest the engine goes without a look: ``Dispatcher/Configuration/idlePollInterval``.
    let longest: Duration
    /// When the lookout wakes a worker next.
    private(set) var next: Date

    init(longest: Duration, now: Date) {
        self.longest = longest
        next = now.addingTimeInterval(longest.seconds)
    }

    /// A look found the next pending activity due at `due` (nil: none is pending): a worker looks again when
    /// ``Dispatcher/rest(untilDue:now:longest:)`` says (50 ms on when one is due already but held by another worker),
    /// or sooner if one was to anyway. True when that brings the lookout's time forward (its timer is to be set again).
    mutating func looked(due: Date?, now: Date) -> Bool {
        let then = now.addingTimeInterval(Dispatcher.rest(untilDue: due, now: now, longest: longest).seconds)
        guard then < next else { return false }
        next = then
        return true
    }

    /// How long the lookout waits from `now` until its time.
    func wait(now: Date) -> Duration {
        .milliseconds(Int64((max(0, next.timeIntervalSince(now)) * 1000).rounded(.up)))
    }

    /// The lookout's timer ran out at `now` (its time, as set when the timer was, not brought forward since): it wakes a
    /// worker, and looks again ``longest`` later unless that worker's look reports a sooner time.
    mutating func fire(now: Date) {
        next = now.addingTimeInterval(longest.seconds)
    }
}
