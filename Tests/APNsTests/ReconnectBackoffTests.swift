import NIOCore
import NIOPosix
import Testing

@testable import APNs

@Suite("Reconnect backoff")
struct ReconnectBackoffTests {
    private let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test("the first attempt, and the first after a connection was ready, go at once")
    func firstAttemptAtOnce() {
        var backoff = ReconnectBackoff(initialDelay: .milliseconds(250), maximumDelay: .seconds(15))
        #expect(backoff.decision(at: start) == .connect)
        backoff.failed(at: start, random: 0)
        backoff.opened()
        #expect(backoff.failures == 0)
        #expect(backoff.decision(at: start) == .connect)
    }

    @Test("each failure in a row doubles the wait, up to the maximum; the random draw takes up to half off")
    func doublesUpToMaximum() {
        var backoff = ReconnectBackoff(initialDelay: .milliseconds(250), maximumDelay: .seconds(15))
        let waits = (0..<10).map { _ in backoff.failed(at: start, random: 0) }
        #expect(
            waits.map { $0.nanoseconds / 1_000_000 } == [250, 500, 1_000, 2_000, 4_000, 8_000, 15_000, 15_000, 15_000, 15_000]
        )
        #expect(backoff.failures == 10)

        var halved = ReconnectBackoff(initialDelay: .milliseconds(250), maximumDelay: .seconds(15))
        #expect(halved.failed(at: start, random: 1) == .milliseconds(125))
        #expect(halved.failed(at: start, random: 0.5) == .milliseconds(375))
        // Out of range draws are clamped: never more than the full wait, never less than half of it.
        #expect(halved.failed(at: start, random: -3) == .seconds(1))
        #expect(halved.failed(at: start, random: 7) == .seconds(1))
    }

    @Test("after a failure, an attempt waits until the wait is over, and goes from then on")
    func waitsUntilOver() {
        var backoff = ReconnectBackoff(initialDelay: .milliseconds(250), maximumDelay: .seconds(15))
        let wait = backoff.failed(at: start, random: 0)
        #expect(backoff.decision(at: start) == .wait(until: start + wait))
        #expect(backoff.decision(at: start + .milliseconds(249)) == .wait(until: start + wait))
        #expect(backoff.decision(at: start + .milliseconds(250)) == .connect)
        #expect(backoff.decision(at: start + .seconds(60)) == .connect)
    }

    @Test("many failures neither overflow nor pass the maximum")
    func manyFailures() {
        var backoff = ReconnectBackoff(initialDelay: .seconds(1), maximumDelay: .seconds(3600))
        for _ in 0..<200 { backoff.failed(at: start, random: 0) }
        #expect(backoff.failed(at: start, random: 0) == .seconds(3600))
        let zero = ReconnectBackoff(initialDelay: .zero, maximumDelay: .zero)
        var retried = zero
        #expect(retried.failed(at: start, random: 0) == .zero)
        #expect(retried.decision(at: start) == .connect)
    }

    @Test("a server that drops every connection is not asked again at once: attempts wait, and sends wait for them")
    func slotBacksOff() async throws {
        let counter = Counter()
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { child in
                _ = counter.next()
                return child.close()
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(listener.localAddress?.port)
        let client = try APNsClient(
            endpoint: APNsEndpoint(host: "127.0.0.1", port: port),
            tokens: APNsProviderTokens(signingKey: makeSigningKey()),
            configuration: .init(connections: 1, reconnectDelay: .milliseconds(400), maximumReconnectDelay: .milliseconds(400))
        )
        // Four sends one after another, each failing with the attempt it waited for. Without the backoff each opened
        // a connection of its own at once (902 in a second and a half with the wait set to zero); with it, each attempt
        // after the first waits at least 200 ms (400 less up to half of it), and a send waits for the next one.
        let clock = ContinuousClock()
        let began = clock.now
        for _ in 0..<4 {
            await #expect(throws: APNsTransportError.self) {
                _ = try await within(.seconds(30)) { try await client.send(makeNotification()) }
            }
        }
        let elapsed = clock.now - began
        // Nothing waits, so nothing is attempted: the slot does not keep trying on its own.
        try await Task.sleep(for: .seconds(1))
        await client.shutdown()
        try await listener.close()
        let attempts = counter.next()
        #expect(attempts == 4, "each send waited for an attempt of its own, and failed with it; no other was made")
        #expect(elapsed >= .milliseconds(600), "three waits of at least 200 ms between the four attempts: \(elapsed)")
    }
}
