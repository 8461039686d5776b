import Foundation
import Testing

@testable import liveline

@Suite struct IdleBenchTests {
    @Test func aThreadsSwitchesAreItsVoluntaryAndInvoluntaryOnesAddedUp() {
        let status = """
            Name:\tNIO-ELT-0-#0
            State:\tS (sleeping)
            Tgid:\t4242
            voluntary_ctxt_switches:\t1520
            nonvoluntary_ctxt_switches:\t37
            """
        #expect(Bench.ThreadSwitches.count(inStatus: status) == 1557)
        #expect(Bench.ThreadSwitches.count(inStatus: "Name:\tx\nvoluntary_ctxt_switches:\t9\n") == 9)
        #expect(Bench.ThreadSwitches.count(inStatus: "Name:\tx\nState:\tS (sleeping)\n") == nil)
        #expect(Bench.ThreadSwitches.count(inStatus: "voluntary_ctxt_switches:\tmany\n") == nil)
    }

    @Test func thisProcessHasThreadsThatSwitched() throws {
        let switches = try #require(Bench.ThreadSwitches.read(getpid()))
        #expect(switches > 0)
    }

    @Test func restIsTheShareOfOneCoreAndTheSwitchesASecond() {
        let rest = Bench.AtRest(cpuSeconds: 0.25, seconds: 60, contextSwitches: 792)
        #expect(abs(rest.shareOfACore - 0.25 / 60) < 1e-12)
        #expect(rest.text == "0.42 % of a core (0.25 s of CPU in 60.0 s), its threads switched in 13.2 times a second")
        #expect(Bench.AtRest(cpuSeconds: 0.6, seconds: 60, contextSwitches: nil).text == "1.00 % of a core (0.60 s of CPU in 60.0 s)")
    }
}
