import Foundation
import LivelineDispatch
import LivelineServer
import NIOCore
import NIOPosix
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

/// The delivery engine, run at a lower scheduling priority than the HTTP API.
///
/// A fan-out keeps every core busy; an accept must not wait for it. The engine's jobs run on the push clients' event
/// loops (NIO's shared group, where the APNs and FCM connections already live) instead of Swift's cooperative pool,
/// and those threads get a niceness (Linux: per thread, `setpriority`): the kernel then serves the API's event
/// loops and the Store's writer first (SQLite's writer thread; PostgreSQL's connections, on event loops of their own).
/// Niceness 0 leaves everything as it was.
struct LowPriorityEngine: Service {
    let dispatcher: Dispatcher
    let niceness: Int

    func run() async throws {
        guard niceness > 0 else { return try await dispatcher.run() }
        let group = MultiThreadedEventLoopGroup.singleton
        await Self.lowerPriority(of: group, to: niceness)
        try await withTaskExecutorPreference(EventLoopTaskExecutor(group)) {
            try await dispatcher.run()
        }
    }

    /// Gives each thread of `group` the niceness `niceness` (where the platform can).
    static func lowerPriority(of group: MultiThreadedEventLoopGroup, to niceness: Int) async {
        for loop in group.makeIterator() {
            try? await loop.submit {
                #if os(Linux)
                // On Linux the niceness is per thread: `who` 0 is the calling thread.
                _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, Int32(niceness))
                #endif
            }.get()
        }
    }
}
