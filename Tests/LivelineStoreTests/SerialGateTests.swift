import Foundation
import NIOCore
import SQLiteNIO
import Synchronization
import Testing

@testable import LivelineStore

@Suite("The writer's gate")
struct SerialGateTests {
    /// Who holds the gate, and the order holders entered it.
    final class Log: Sendable {
        let state = Mutex((holding: 0, most: 0, order: [Int]()))

        func enter(_ holder: Int) {
            state.withLock { state in
                state.holding += 1
                state.most = max(state.most, state.holding)
                state.order.append(holder)
            }
        }

        func leave() { state.withLock { $0.holding -= 1 } }
    }

    @Test("holders, as future chains or async bodies, take the gate one at a time; chains in the order they came, failures included")
    func fifo() async throws {
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let gate = SerialGate(eventLoop: eventLoop)
        let log = Log()
        struct Refused: Error {}

        // Even holders are future chains (every third one failing), queued in order; odd ones are async bodies.
        var futures: [EventLoopFuture<Int>] = []
        var tasks: [Task<Int, any Error>] = []
        for holder in 0..<60 {
            if holder.isMultiple(of: 2) {
                futures.append(gate.run {
                    log.enter(holder)
                    return eventLoop.scheduleTask(in: .milliseconds(1)) {
                        log.leave()
                        if holder.isMultiple(of: 3) { throw Refused() }
                        return holder
                    }.futureResult
                })
            } else {
                tasks.append(Task {
                    try await gate.withGate {
                        log.enter(holder)
                        try await Task.sleep(for: .milliseconds(1))
                        log.leave()
                        return holder
                    }
                })
            }
        }
        for (index, future) in futures.enumerated() {
            let holder = index * 2
            if holder.isMultiple(of: 3) {
                do {
                    _ = try await future.get()
                    Issue.record("holder \(holder) should have failed")
                } catch {
                    #expect(error is Refused)
                }
            } else {
                #expect(try await future.get() == holder)
            }
        }
        for (index, task) in tasks.enumerated() {
            #expect(try await task.value == index * 2 + 1)
        }
        let (holding, most, order) = log.state.withLock { ($0.holding, $0.most, $0.order) }
        #expect(holding == 0)
        #expect(most == 1, "two holders held the gate at once")
        #expect(order.count == 60)
        // Future holders, queued synchronously, keep their order among themselves.
        let futureHolders = order.filter { $0.isMultiple(of: 2) }
        #expect(futureHolders == futureHolders.sorted())
    }
}
