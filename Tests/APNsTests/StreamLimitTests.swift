import NIOCore
import Testing

@testable import APNs

/// When the first answer came; every other time is relative to it.
private let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

private func at(_ offset: Duration) -> NIODeadline {
    start + TimeAmount(offset)
}

/// A limit marking answers slow past 1 s (the mark at most 2 s), from `initial`, never below `minimum`.
private func makeLimit(initial: Int = 100, minimum: Int = 8) -> StreamLimit {
    StreamLimit(.init(initial: initial, minimum: minimum, slowAnswer: .seconds(1), slowestMark: .seconds(2), leastTimeLeft: .seconds(1), mostTimeLeft: .seconds(60)))
}

@Suite("APNs stream limit (answer times → streams on the wire)")
struct StreamLimitTests {
    @Test("the default follows the request timeout: slow past an eighth of it, the mark at most half of it, a quarter left to send")
    func defaults() {
        var limit = StreamLimit(.init(requestTimeout: .seconds(30)))
        #expect(limit.value == 100)
        #expect(limit.configuration.minimum == 8)
        #expect(limit.configuration.slowAnswer == .milliseconds(3_750))
        #expect(limit.configuration.slowestMark == .seconds(15))
        #expect(limit.slowMark == .milliseconds(3_750))
        #expect(limit.answerAllowance == .milliseconds(7_500), "before any answer")
        _ = limit.answered(after: .seconds(5), at: start, serverLimit: 1000)
        #expect(limit.answerAllowance == .seconds(10), "twice the smoothed answer time, when that is more")
    }

    @Test("quick answers: one more stream an answer, up to the server's limit and no further")
    func growsWhileQuick() {
        var limit = makeLimit(initial: 10)
        for index in 0..<5 {
            #expect(limit.answered(after: .milliseconds(10), at: at(.milliseconds(index)), serverLimit: 1000) == nil)
        }
        #expect(limit.value == 15)

        var capped = makeLimit(initial: 10)
        for index in 0..<5 {
            _ = capped.answered(after: .milliseconds(10), at: at(.milliseconds(index)), serverLimit: 12)
        }
        #expect(capped.value == 12, "no growth past what the server allows")

        // APNs starts a connection at one stream; the limit is not pulled down to it, and does not grow past it.
        var aboveServer = makeLimit(initial: 100)
        _ = aboveServer.answered(after: .milliseconds(10), at: start, serverLimit: 1)
        #expect(aboveServer.value == 100)
    }

    @Test("slow answers halve the limit, at most once per smoothed answer time, never below the minimum")
    func cutsWhenSlow() throws {
        var limit = makeLimit(initial: 100, minimum: 8)
        _ = limit.answered(after: .milliseconds(10), at: start, serverLimit: 1000)
        #expect(limit.value == 101)
        #expect(limit.slowMark == .seconds(1))

        // Answers of 5 s: the smoothed time passes 1 s at the second one.
        #expect(limit.answered(after: .seconds(5), at: at(.seconds(5)), serverLimit: 1000) == nil)
        let second = limit.answered(after: .seconds(5), at: at(.seconds(5)), serverLimit: 1000)
        let cut = try #require(second)
        #expect(cut.from == 101)
        #expect(cut.to == 50)
        #expect(cut.slowMark == .seconds(1))
        #expect(cut.smoothedAnswer > .seconds(1))
        #expect(limit.value == 50)

        // The answers to streams opened before the cut come after it: no second cut for them.
        for _ in 0..<20 {
            #expect(limit.answered(after: .seconds(5), at: at(.seconds(5)), serverLimit: 1000) == nil)
        }
        #expect(limit.value == 50)

        // A smoothed answer time later, still slow: halved again; and so on down to the minimum.
        var now = at(.seconds(5))
        var values: [Int] = []
        for _ in 0..<6 {
            now = now + .seconds(5)  // past the smoothed answer time, which approaches 5 s from below
            _ = limit.answered(after: .seconds(5), at: now, serverLimit: 1000)
            values.append(limit.value)
        }
        #expect(values == [25, 12, 8, 8, 8, 8])
    }

    @Test("the server's lower limit is what a cut halves")
    func cutsFromTheServersLimit() throws {
        var limit = makeLimit(initial: 100)
        _ = limit.answered(after: .milliseconds(10), at: start, serverLimit: 40)
        var found: StreamLimit.Cut?
        for _ in 0..<3 where found == nil {
            found = limit.answered(after: .seconds(5), at: at(.seconds(5)), serverLimit: 40)
        }
        let cut = try #require(found)
        #expect(cut.from == 40)
        #expect(cut.to == 20)
        #expect(limit.value == 20)
    }

    @Test("however slow the answers, a request with half its time left is sent: the allowance stops at the most time left")
    func allowanceStopsAtHalfTheTimeout() {
        var limit = StreamLimit(.init(requestTimeout: .seconds(4)))
        #expect(limit.answerAllowance == .seconds(1), "a quarter of the timeout before any answer")
        for index in 0..<40 {
            _ = limit.answered(after: .milliseconds(1_500), at: at(.seconds(Int64(index))), serverLimit: 1000)
        }
        #expect(limit.smoothedAnswer == .milliseconds(1_500))
        #expect(limit.answerAllowance == .seconds(2), "half the timeout, not twice 1.5 s: a request that waited a second is still sent")
    }

    @Test("a server that always takes seconds is slow, not overloaded: the mark is twice its fastest answer, at most the slowest mark")
    func alwaysSlowServer() throws {
        var limit = makeLimit(initial: 100)
        for index in 0..<50 {
            #expect(limit.answered(after: .milliseconds(1_500), at: at(.seconds(Int64(index))), serverLimit: 1000) == nil)
        }
        #expect(limit.slowMark == .seconds(2), "twice 1.5 s, capped at 2 s")
        #expect(limit.value == 150, "answers no slower than the fastest: no queue builds up, one more stream an answer")
        #expect(limit.answerAllowance == .seconds(3))

        // Slower than the capped mark: cut, however slow the server always was.
        var found: StreamLimit.Cut?
        for index in 0..<20 where found == nil {
            found = limit.answered(after: .seconds(3), at: at(.seconds(Int64(60 + index))), serverLimit: 1000)
        }
        let cut = try #require(found)
        #expect(cut.from >= 150)
        #expect(cut.to == cut.from / 2)
        #expect(cut.slowMark == .seconds(2))
    }

    @Test("after a cut: one more stream a round trip; quick again by a wide margin, one an answer")
    func growsAfterACut() throws {
        var limit = makeLimit(initial: 100)
        _ = limit.answered(after: .milliseconds(10), at: start, serverLimit: 1000)
        var cut: StreamLimit.Cut?
        for _ in 0..<3 where cut == nil {
            cut = limit.answered(after: .seconds(5), at: at(.seconds(5)), serverLimit: 1000)
        }
        #expect(cut?.to == 50)
        #expect(limit.isAvoiding)

        // Answers of 300 ms: under half the mark once smoothed, over an eighth of it. 50 answers a stream.
        for index in 0..<300 {
            _ = limit.answered(after: .milliseconds(300), at: at(.milliseconds(6_000 + Int64(index))), serverLimit: 1000)
        }
        #expect(limit.isAvoiding)
        #expect((53...56).contains(limit.value), "one a round trip of about 50 answers: \(limit.value)")

        // Answers of 1 ms: once the smoothed time is under an eighth of the mark, one a stream an answer again.
        let before = limit.value
        for index in 0..<100 {
            _ = limit.answered(after: .milliseconds(1), at: at(.milliseconds(7_000 + Int64(index))), serverLimit: 1000)
        }
        #expect(!limit.isAvoiding)
        #expect(limit.value > before + 80, "\(before) → \(limit.value)")
    }
}
