import Foundation
import Testing

@testable import LivelineDispatch

/// How long an idle worker rests, without a clock or a database.
@Suite("An idle worker's rest")
struct IdleRestTests {
    let now = Date(timeIntervalSince1970: 1_795_000_000)

    @Test("nothing pending: the longest rest; a wake-up is what starts new work")
    func nothingPending() {
        #expect(Dispatcher.rest(untilDue: nil, now: now, longest: .seconds(5)) == .seconds(5))
    }

    @Test("work due later: rest until it is due, rounded up to the millisecond, never beyond the longest rest")
    func dueLater() {
        #expect(Dispatcher.rest(untilDue: now.addingTimeInterval(1.2344), now: now, longest: .seconds(5)) == .milliseconds(1235))
        #expect(Dispatcher.rest(untilDue: now.addingTimeInterval(3600), now: now, longest: .seconds(5)) == .seconds(5))
    }

    @Test("work due already but not claimed by this worker: a short rest, never none")
    func dueAlready() {
        #expect(Dispatcher.rest(untilDue: now, now: now, longest: .seconds(5)) == .milliseconds(50))
        #expect(Dispatcher.rest(untilDue: now.addingTimeInterval(-10), now: now, longest: .seconds(5)) == .milliseconds(50))
        #expect(Dispatcher.rest(untilDue: now.addingTimeInterval(-10), now: now, longest: .milliseconds(10)) == .milliseconds(10))
    }
}
