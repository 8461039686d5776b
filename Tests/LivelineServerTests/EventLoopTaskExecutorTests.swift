import LivelineServer
import NIOCore
import NIOPosix
import Testing

@Suite("Event-loop task executor")
struct EventLoopTaskExecutorTests {
    @Test("work preferring one event loop runs on it, after every suspension and in child tasks")
    func runsOnItsLoop() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let loop = group.next()
        let executor = EventLoopTaskExecutor(loop)
        let observed = try await withTaskExecutorPreference(executor) {
            var seen = [loop.inEventLoop]
            try await Task.sleep(for: .milliseconds(5))
            seen.append(loop.inEventLoop)
            await Task.yield()
            seen.append(loop.inEventLoop)
            seen += await withTaskGroup(of: Bool.self) { children in
                for _ in 0..<8 { children.addTask { loop.inEventLoop } }
                return await children.reduce(into: [Bool]()) { $0.append($1) }
            }
            return seen
        }
        #expect(observed.count == 11)
        #expect(observed.allSatisfy { $0 }, "\(observed)")
        // Outside the preference, the same code runs in Swift's own pool, on none of the group's threads.
        #expect(group.makeIterator().allSatisfy { !$0.inEventLoop })
        try await group.shutdownGracefully()
    }

    @Test("work preferring a group runs on the group's loops, spread over them")
    func runsOnItsGroup() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let loops = Array(group.makeIterator())
        let executor = EventLoopTaskExecutor(group)
        let observed = await withTaskExecutorPreference(executor) {
            await withTaskGroup(of: Int?.self) { children in
                for _ in 0..<32 {
                    children.addTask {
                        await Task.yield()
                        return loops.firstIndex { $0.inEventLoop }
                    }
                }
                return await children.reduce(into: [Int?]()) { $0.append($1) }
            }
        }
        #expect(observed.count == 32)
        #expect(observed.allSatisfy { $0 != nil }, "every job ran on one of the group's loops: \(observed)")
        #expect(Set(observed.compactMap { $0 }).count == 2, "both loops took jobs: \(observed)")
        try await group.shutdownGracefully()
    }
}
