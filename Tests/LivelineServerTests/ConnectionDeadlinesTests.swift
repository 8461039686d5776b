import NIOCore
import Testing

@testable import LivelineServer

/// The connection deadline state machine, without a socket: events in, timer actions out.
@Suite("Connection deadlines")
struct ConnectionDeadlinesTests {
    let limits = ConnectionLimits(headerTimeout: .seconds(10), bodyTimeout: .seconds(30), idleTimeout: .seconds(60), maximumConnections: 5)
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    func at(_ seconds: Double) -> NIODeadline { start + .nanoseconds(Int64(seconds * 1_000_000_000)) }

    @Test("an opened connection that sends nothing is closed after the idle timeout")
    func idleFromOpen() {
        var machine = ConnectionDeadlines(limits: limits)
        #expect(machine.opened(at: at(0)) == .arm(at(60)))
        #expect(machine.opened(at: at(1)) == .keep, "a second report of the opening counts once")
        #expect(machine.timerFired(at: at(59.9)) == .rearm(at(60)))
        #expect(machine.timerFired(at: at(60)) == .close(.idle))
        #expect(machine.timerFired(at: at(61)) == .nothing, "closed once")
    }

    @Test("a header block trickled a byte a second is cut off at the header deadline, counted from its first byte")
    func slowHeaders() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        #expect(machine.bytesReceived(at: at(5)) == .arm(at(15)))
        for second in 6...14 {
            #expect(machine.bytesReceived(at: at(Double(second))) == .keep, "more bytes do not move a deadline")
        }
        #expect(machine.timerFired(at: at(15)) == .close(.header))
    }

    @Test("a body trickled a byte a second is answered 408 at the body deadline, counted from the complete headers")
    func slowBody() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        #expect(machine.bytesReceived(at: at(1)) == .arm(at(11)))
        #expect(machine.requestHeadReceived(at: at(2)) == .keep, "a later deadline: the timer fires early")
        for second in 3...31 {
            #expect(machine.bytesReceived(at: at(Double(second))) == .keep)
            if second == 11 { #expect(machine.timerFired(at: at(11)) == .rearm(at(32))) }
        }
        #expect(machine.timerFired(at: at(32)) == .answerTimeoutAndClose)
    }

    @Test("a body still arriving after its answer was written is cut off without a second answer")
    func bodyAfterAnswer() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        _ = machine.requestHeadReceived(at: at(1))
        #expect(machine.responseHeadWritten(at: at(2)) == .keep)
        #expect(machine.responseEndWritten(at: at(2)) == .keep, "the body deadline still runs")
        #expect(machine.timerFired(at: at(31)) == .close(.body))
    }

    @Test("a body whose answer has begun is closed, not answered twice")
    func bodyWithAnswerBegun() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        _ = machine.requestHeadReceived(at: at(1))
        _ = machine.responseHeadWritten(at: at(2))
        #expect(machine.timerFired(at: at(31)) == .close(.body))
    }

    @Test("a pipelined request's slow body behind an unanswered one is closed, not answered out of order")
    func pipelinedBody() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        #expect(machine.requestHeadReceived(at: at(1)) == .arm(at(31)))
        #expect(machine.requestEndReceived(at: at(1)) == .keep, "the answer is being worked on: no deadline, the timer finds none")
        #expect(machine.deadline == nil)
        #expect(machine.requestHeadReceived(at: at(2)) == .keep)
        #expect(machine.timerFired(at: at(31)) == .rearm(at(32)))
        #expect(machine.timerFired(at: at(32)) == .close(.body))
    }

    @Test("no deadline runs while an answer is worked on; the idle one starts when it ends")
    func answerInProgress() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        _ = machine.bytesReceived(at: at(1))
        _ = machine.requestHeadReceived(at: at(1))
        #expect(machine.requestEndReceived(at: at(1)) == .keep)
        #expect(machine.deadline == nil)
        #expect(machine.timerFired(at: at(11)) == .nothing)
        _ = machine.responseHeadWritten(at: at(500))
        #expect(machine.responseEndWritten(at: at(600)) == .arm(at(660)))
        #expect(machine.timerFired(at: at(660)) == .close(.idle))
    }

    @Test("a keep-alive connection's requests set no timer each: it fires at the first deadline and follows the one running")
    func keepAlive() {
        var machine = ConnectionDeadlines(limits: limits)
        #expect(machine.opened(at: at(0)) == .arm(at(60)))
        #expect(machine.bytesReceived(at: at(1)) == .arm(at(11)), "an earlier deadline sets the timer again")
        for round in 0..<10 {
            let t = 1 + Double(round) / 2
            #expect(machine.bytesReceived(at: at(t)) == .keep)
            #expect(machine.requestHeadReceived(at: at(t)) == .keep)
            #expect(machine.requestEndReceived(at: at(t)) == .keep)
            #expect(machine.responseHeadWritten(at: at(t)) == .keep)
            #expect(machine.responseEndWritten(at: at(t)) == .keep)
        }
        // The last answer ended at 5.5: the idle deadline counts from it.
        #expect(machine.timerFired(at: at(11)) == .rearm(at(65.5)))
        #expect(machine.bytesReceived(at: at(20)) == .arm(at(30)), "a request's header deadline before it")
        #expect(machine.timerFired(at: at(30)) == .close(.header))
    }

    @Test("bytes of the next request that came during an answer start its header deadline when the answer ends")
    func headerDuringAnswer() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        _ = machine.requestHeadReceived(at: at(1))
        _ = machine.requestEndReceived(at: at(1))
        #expect(machine.bytesReceived(at: at(2)) == .keep, "no deadline while the answer is worked on")
        #expect(machine.timerFired(at: at(31)) == .nothing)
        _ = machine.responseHeadWritten(at: at(40))
        #expect(machine.responseEndWritten(at: at(40)) == .arm(at(50)))
        #expect(machine.timerFired(at: at(50)) == .close(.header))
    }

    @Test("two pipelined requests: the idle deadline waits for the second answer")
    func pipelining() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        _ = machine.bytesReceived(at: at(1))
        _ = machine.requestHeadReceived(at: at(1))
        _ = machine.requestEndReceived(at: at(1))
        _ = machine.requestHeadReceived(at: at(1))
        #expect(machine.requestEndReceived(at: at(1)) == .keep)
        _ = machine.responseHeadWritten(at: at(2))
        #expect(machine.responseEndWritten(at: at(2)) == .keep, "one answer still to write")
        _ = machine.responseHeadWritten(at: at(3))
        #expect(machine.responseEndWritten(at: at(3)) == .keep)
        #expect(machine.timerFired(at: at(11)) == .rearm(at(63)), "the idle deadline counts from the second answer")
    }

    @Test("a closed connection cancels its timer and takes no more decisions")
    func closedConnection() {
        var machine = ConnectionDeadlines(limits: limits)
        _ = machine.opened(at: at(0))
        #expect(machine.closed() == .disarm)
        #expect(machine.bytesReceived(at: at(1)) == .keep)
        #expect(machine.timerFired(at: at(100)) == .nothing)
    }
}

@Suite("Connection configuration")
struct ConnectionConfigurationTests {
    @Test("the connection keys are read from the environment, with defaults of 10, 30 and 60 s and 10,000 connections")
    func keys() async throws {
        let defaults = try LivelineConfiguration(reader: await LivelineConfiguration.reader(flags: [:], file: nil, environment: [:]))
        #expect(defaults.connections == ConnectionLimits())
        #expect(defaults.connections.headerTimeout == .seconds(10))
        #expect(defaults.connections.bodyTimeout == .seconds(30))
        #expect(defaults.connections.idleTimeout == .seconds(60))
        #expect(defaults.connections.maximumConnections == 10_000)
        let environment = [
            "LIVELINE_CONNECTIONS_HEADER_TIMEOUT": "5", "LIVELINE_CONNECTIONS_BODY_TIMEOUT": "7",
            "LIVELINE_CONNECTIONS_IDLE_TIMEOUT": "9", "LIVELINE_CONNECTIONS_MAXIMUM": "300",
        ]
        let configured = try LivelineConfiguration(reader: await LivelineConfiguration.reader(flags: [:], file: nil, environment: environment))
        #expect(configured.connections == ConnectionLimits(headerTimeout: .seconds(5), bodyTimeout: .seconds(7), idleTimeout: .seconds(9), maximumConnections: 300))
    }

    @Test("a timeout of 0 or a cap of 0 is refused", arguments: [
        "LIVELINE_CONNECTIONS_HEADER_TIMEOUT", "LIVELINE_CONNECTIONS_BODY_TIMEOUT", "LIVELINE_CONNECTIONS_IDLE_TIMEOUT", "LIVELINE_CONNECTIONS_MAXIMUM",
    ])
    func refused(key: String) async throws {
        let reader = try await LivelineConfiguration.reader(flags: [:], file: nil, environment: [key: "0"])
        #expect(throws: ConfigurationError.self) { try LivelineConfiguration(reader: reader) }
    }
}
