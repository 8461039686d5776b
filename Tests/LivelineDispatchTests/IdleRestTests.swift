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

/// When the engine's idle workers next look by themselves: one time for all of them, without a clock or a database.
@Suite("The idle workers' lookout")
struct IdleLookoutTests {
    let now = Date(timeIntervalSince1970: 1_795_000_000)

    @Test("it starts the longest rest away; a look that finds nothing pending leaves it there")
    func nothingPending() {
        var lookout = IdleLookout(longest: .seconds(5), now: now)
        #expect(lookout.next == now.addingTimeInterval(5))
        #expect(lookout.wait(now: now) == .seconds(5))
        let forward = lookout.looked(due: nil, now: now.addingTimeInterval(1))
        #expect(!forward)
        #expect(lookout.next == now.addingTimeInterval(5), "a look's own longest rest would end later: the first time stays")
    }

    @Test("a look that finds work due sooner brings it forward to that time; one due later does not push it back")
    func dueSooner() {
        var lookout = IdleLookout(longest: .seconds(5), now: now)
        let forward = lookout.looked(due: now.addingTimeInterval(1.25), now: now)
        #expect(forward)
        #expect(lookout.next == now.addingTimeInterval(1.25))
        #expect(lookout.wait(now: now.addingTimeInterval(0.25)) == .seconds(1))
        let forwardAgain = lookout.looked(due: now.addingTimeInterval(3), now: now.addingTimeInterval(0.5))
        #expect(!forwardAgain)
        #expect(lookout.next == now.addingTimeInterval(1.25))
    }

    @Test("work due already but not claimed brings it to 50 ms on, never to now")
    func dueAlready() {
        var lookout = IdleLookout(longest: .seconds(5), now: now)
        let forward = lookout.looked(due: now.addingTimeInterval(-10), now: now)
        #expect(forward)
        #expect(lookout.next == now.addingTimeInterval(0.05))
        #expect(lookout.wait(now: now) == .milliseconds(50))
    }

    @Test("once its time comes it wakes a worker and is set the longest rest on, which that worker's look may bring forward")
    func fires() {
        var lookout = IdleLookout(longest: .seconds(5), now: now)
        _ = lookout.looked(due: now.addingTimeInterval(1), now: now)
        let then = now.addingTimeInterval(1.001)
        #expect(lookout.wait(now: then) == .zero, "past its time: no wait")
        lookout.fire(now: then)
        #expect(lookout.next == then.addingTimeInterval(5))
        let forward = lookout.looked(due: then.addingTimeInterval(2), now: then)
        #expect(forward)
        #expect(lookout.next == then.addingTimeInterval(2))
    }
}
