import Foundation
import LivelineServer
import NIOCore
import NIOPosix
import Testing

@testable import liveline

#if canImport(Glibc)
import Glibc
#endif

@Suite struct EnginePriorityTests {
    /// The niceness of the calling thread (Linux: per thread).
    static func ownNiceness() -> Int32 {
        #if os(Linux)
        errno = 0
        return getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        #else
        return 0
        #endif
    }

    @Test(.enabled(if: FileManager.default.fileExists(atPath: "/proc/self/task"), "needs Linux's per-thread niceness"))
    func theEnginesJobsRunOnItsOwnLoopsAtItsNiceness() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let executor = await LowPriorityEngine.executor(on: group, niceness: 7)
        let seen: [(niceness: Int32, onGroup: Bool, onShared: Bool)] = await withTaskExecutorPreference(executor) {
            await withTaskGroup(of: (niceness: Int32, onGroup: Bool, onShared: Bool).self) { tasks in
                for _ in 0..<8 {
                    tasks.addTask {
                        (
                            Self.ownNiceness(), group.makeIterator().contains { $0.inEventLoop },
                            MultiThreadedEventLoopGroup.singleton.makeIterator().contains { $0.inEventLoop }
                        )
                    }
                }
                return await tasks.reduce(into: []) { $0.append($1) }
            }
        }
        #expect(seen.count == 8)
        #expect(seen.allSatisfy { $0.niceness == 7 && $0.onGroup && !$0.onShared })
        try await group.shutdownGracefully()
    }

    @Test func theEnginesLoopsAreNotThePushClients() {
        #expect(LowPriorityEngine.engineEventLoops !== MultiThreadedEventLoopGroup.singleton)
    }
}
