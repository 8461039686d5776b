import Synchronization
import Testing

@testable import LivelineStore

@Suite("Serial gate")
struct SerialGateTests {
    final class Log: Sendable {
        let entries = Mutex<[String]>([])
    }

    @Test("one holder at a time; each queue in order; waiting tasks and queued work take turns")
    func order() async throws {
        let gate = SerialGate()
        let log = Log()
        // The gate is held: everything below waits.
        gate.enqueue { log.entries.withLock { $0.append("held") } }
        for name in ["work 1", "work 2", "work 3"] {
            gate.enqueue {
                log.entries.withLock { $0.append(name) }
                gate.release()
            }
        }
        var tasks: [Task<Void, any Error>] = []
        for name in ["task A", "task B"] {
            tasks.append(Task { try await gate.withGate { log.entries.withLock { $0.append(name) } } })
            // Until the task waits at the gate, so they queue in this order.
            while gate.waitingTasks < tasks.count { try await Task.sleep(for: .milliseconds(2)) }
        }
        #expect(log.entries.withLock { $0 } == ["held"])
        gate.release()
        for task in tasks { try await task.value }
        try await gate.withGate {}
        #expect(log.entries.withLock { $0 } == ["held", "task A", "work 1", "task B", "work 2", "work 3"])
    }
}
