import Testing

@testable import LivelineDispatch

/// The idle engine's wake-up: waiting never spins, a cancelled wait leaves the others alone.
@Suite("Wake signal")
struct WakeSignalTests {
    /// Returns once `count` waits are waiting on `signal` (a waiter task may start late on a loaded machine; a wake
    /// before it waits would not be for it), or after 60 s.
    static func waitUntil(_ signal: WakeSignal, waiting count: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while signal.waiting < count, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(signal.waiting == count)
    }

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

    @Test("a wake for good lets every waiter go, and every later wait at once")
    func wakeForGood() async {
        let signal = WakeSignal()
        let waiters = (0..<4).map { _ in Task { await signal.wait() } }
        try? await Task.sleep(for: .milliseconds(100))
        signal.wakeForGood()
        for waiter in waiters { #expect(await Self.finishes(within: 5) { await waiter.value }) }
        for _ in 0..<3 { #expect(await Self.finishes(within: 5) { await signal.wait() }, "a later wait returned at once") }
    }

    @Test("one wake lets every waiting worker go")
    func wakesEveryWaiter() async throws {
        let signal = WakeSignal()
        let waiters = (0..<4).map { _ in Task { await signal.wait() } }
        try await Self.waitUntil(signal, waiting: 4)
        signal.wake()
        for waiter in waiters {
            #expect(await Self.finishes(within: 5) { await waiter.value })
        }
    }

    @Test("wakeOne lets the worker waiting longest go, and only it; with nobody waiting, the next wait")
    func wakesOneWaiter() async throws {
        let signal = WakeSignal()
        let woken = WokenOrder()
        let first = Task {
            await signal.wait()
            await woken.add(1)
        }
        try await Self.waitUntil(signal, waiting: 1)
        let second = Task {
            await signal.wait()
            await woken.add(2)
        }
        try await Self.waitUntil(signal, waiting: 2)
        signal.wakeOne()
        await first.value
        try await Task.sleep(for: .milliseconds(200))
        #expect(await woken.order == [1], "one wake, one worker: the one waiting longest")
        signal.beginLook()
        signal.wakeOne()
        await second.value
        #expect(await woken.order == [1, 2])
        signal.beginLook()
        signal.wakeOne()
        #expect(await Self.finishes(within: 5) { await signal.wait() }, "a wake with nobody waiting lets the next wait through")
        #expect(await !Self.finishes(within: 0.2) { await signal.wait() })
    }

    @Test("wakeOne wakes nobody more while the look an earlier one promised has not begun; once it has, the next")
    func wakesOneUntilTheLookBegins() async throws {
        let signal = WakeSignal()
        let woken = WokenOrder()
        let waiters = (1...3).map { index in
            Task {
                await signal.wait()
                await woken.add(index)
            }
        }
        try await Self.waitUntil(signal, waiting: 3)
        // The updates of one shared transaction, each waking the engine.
        for _ in 0..<30 { signal.wakeOne() }
        try await Task.sleep(for: .milliseconds(200))
        #expect(await woken.order.count == 1, "the look promised by the first wake sees the others' work: one worker woken")
        signal.beginLook()
        signal.wakeOne()
        signal.wakeOne()
        try await Task.sleep(for: .milliseconds(200))
        #expect(await woken.order.count == 2, "a wake after the look began wakes another worker, once")
        signal.beginLook()
        signal.wakeOne()
        for waiter in waiters { #expect(await Self.finishes(within: 5) { await waiter.value }) }
        #expect(await woken.order.count == 3)
        // With nobody waiting, the promise stands too: the next wait goes through, and only one.
        signal.beginLook()
        signal.wakeOne()
        signal.wakeOne()
        #expect(await Self.finishes(within: 5) { await signal.wait() })
        #expect(await !Self.finishes(within: 0.2) { await signal.wait() }, "the second wake came before a look began")
    }
}

/// The order in which waiting tasks were woken.
private actor WokenOrder {
    var order: [Int] = []

    func add(_ waiter: Int) {
        order.append(waiter)
    }
}
