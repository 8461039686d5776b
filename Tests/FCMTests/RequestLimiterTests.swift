import Foundation
import Synchronization
import Testing

@testable import FCM

@Suite("The FCM client's request limit")
struct RequestLimiterTests {
    /// A value tasks share.
    final class Shared<Value: Sendable>: Sendable {
        private let value: Mutex<Value>
        init(_ value: Value) { self.value = Mutex(value) }
        func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { value.withLock { body(&$0) } }
    }

    /// Polls `condition` for up to 10 s.
    private func eventually(_ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while !condition() {
            try #require(ContinuousClock.now < deadline, "condition not met within 10 s")
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    @Test("at most the limit are let through; the others get in first come, first served as places are given back")
    func limitAndOrder() async throws {
        let limiter = RequestLimiter(limit: 2)
        try await limiter.acquire()
        try await limiter.acquire()
        let entered = Shared([Int]())
        var waiters: [Task<Void, any Error>] = []
        for index in 0..<5 {
            waiters.append(Task {
                try await limiter.acquire()
                entered.withLock { $0.append(index) }
            })
            // Each one waits in the queue before the next arrives.
            try await eventually { limiter.waiting == index + 1 }
        }
        #expect(entered.withLock { $0 }.isEmpty)
        for released in 1...5 {
            limiter.release()
            try await eventually { entered.withLock { $0.count } == released }
        }
        #expect(entered.withLock { $0 } == [0, 1, 2, 3, 4])
        for waiter in waiters { try await waiter.value }
    }

    @Test("a caller cancelled while it waits leaves at once, holds no place, and the next one gets in")
    func cancelledWaiter() async throws {
        let limiter = RequestLimiter(limit: 1)
        try await limiter.acquire()
        let outcomes = Shared([String: String]())
        let first = Task {
            do {
                try await limiter.acquire()
                outcomes.withLock { $0["first"] = "entered" }
            } catch {
                outcomes.withLock { $0["first"] = error is CancellationError ? "cancelled" : "\(error)" }
            }
        }
        try await Task.sleep(for: .milliseconds(20))
        let second = Task {
            try await limiter.acquire()
            outcomes.withLock { $0["second"] = "entered" }
        }
        try await Task.sleep(for: .milliseconds(20))
        first.cancel()
        try await eventually { outcomes.withLock { $0["first"] } != nil }
        #expect(outcomes.withLock { $0["first"] } == "cancelled")
        #expect(outcomes.withLock { $0["second"] } == nil)

        limiter.release()
        try await second.value
        #expect(outcomes.withLock { $0["second"] } == "entered")
        // The cancelled caller took nothing: after the second gives its place back, it is free at once.
        limiter.release()
        try await limiter.acquire()
    }

    @Test("a caller already cancelled when it arrives at a full limiter does not wait")
    func alreadyCancelled() async throws {
        let limiter = RequestLimiter(limit: 1)
        try await limiter.acquire()
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await limiter.acquire()
        }
        await #expect(throws: CancellationError.self) { try await task.value }
    }

    @Test("an FCM that cannot be reached is said in the log at most once a minute")
    func unreachableWarnings() {
        let start = ContinuousClock.now
        #expect(FCMClient.warns(lastWarning: nil, now: start), "the first failure is said")
        #expect(!FCMClient.warns(lastWarning: start, now: start + .seconds(59)))
        #expect(FCMClient.warns(lastWarning: start, now: start + .seconds(60)))
    }
}
