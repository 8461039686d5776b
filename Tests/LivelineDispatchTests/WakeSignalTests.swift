import Testing

@testable import LivelineDispatch

/// The idle engine's wake-up: waiting never spins, a cancelled wait leaves the others alone.
@Suite("Wake signal")
struct WakeSignalTests {
    /// Whether `body` finishes within `seconds`.
    static func finishes(within seconds: Double, _ body: @escaping @Sendable () async -> Void) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await body()
                return true
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(seconds))
                return false
            }
            let first = await group.next()!
            group.cancelAll()
            return first
        }
    }

    @Test("a wait returns after a wake, and only then")
    func waitsForWake() async {
        let signal = WakeSignal()
        #expect(await !Self.finishes(within: 0.2) { await signal.wait() }, "a wait without a wake must not return (it returns on cancellation only)")
        let woken = Task { await signal.wait() }
        try? await Task.sleep(for: .milliseconds(50))
        signal.wake()
        #expect(await Self.finishes(within: 5) { await woken.value })
    }

    @Test("a wake with nobody waiting lets the next wait through once")
    func pendingWake() async {
        let signal = WakeSignal()
        signal.wake()
        #expect(await Self.finishes(within: 5) { await signal.wait() })
        #expect(await !Self.finishes(within: 0.2) { await signal.wait() }, "the pending wake was used up")
    }

    @Test("cancelling one wait (as the poll interval does, again and again) never makes later waits return at once")
    func cancelledWaitsLeaveTheSignalWorking() async {
        let signal = WakeSignal()
        for _ in 0..<20 {
            #expect(await !Self.finishes(within: 0.01) { await signal.wait() })
        }
        #expect(await !Self.finishes(within: 0.2) { await signal.wait() })
        let woken = Task { await signal.wait() }
        try? await Task.sleep(for: .milliseconds(50))
        signal.wake()
        #expect(await Self.finishes(within: 5) { await woken.value })
    }

    @Test("one wake lets every waiting worker go")
    func wakesEveryWaiter() async {
        let signal = WakeSignal()
        let waiters = (0..<4).map { _ in Task { await signal.wait() } }
        try? await Task.sleep(for: .milliseconds(100))
        signal.wake()
        for waiter in waiters {
            #expect(await Self.finishes(within: 5) { await waiter.value })
        }
    }
}
