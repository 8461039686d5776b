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
/// A fan-out keeps every core busy; an accept must not wait for it. The engine's jobs run on NIO event loops instead of
/// Swift's cooperative pool, and those threads, with the push clients' event loops (NIO's shared group, where the APNs
/// and FCM connections live), get a niceness (Linux: per thread, `setpriority`): the kernel then serves the API's event
/// loops and the Store's writer first (SQLite's writer thread; PostgreSQL's connections, on event loops of their own).
/// Niceness 0 leaves everything as it was: the engine on Swift's cooperative pool, at the API's priority.
///
/// Where the jobs run (``Placement``): on SQLite, on event loops of their own (``engineEventLoops``); on PostgreSQL, on
/// the push clients' loops. With the jobs on the push clients' loops, the connections' reads and writes and the
/// engine's own work (reading pages of instances, turning results into progress) shared two threads on this 2-core
/// machine, each of which waited on a run queue about a third of the time while the cores were 13 – 16 % idle. On
/// threads of their own, on SQLite (`bench fanout --instances 100000`, runs taken in turn): 3 – 6 % idle, about a fifth
/// more pushes a second, the side accepts' p99 no worse. On PostgreSQL the rounds were no faster, and the side accepts
/// waited longer (p99 159 and 175 ms against 49 and 85): the engine's extra work at once went to the same database
/// processes as the accepts.
struct LowPriorityEngine: Service {
    let dispatcher: Dispatcher
    let niceness: Int
    let placement: Placement

    /// Where the engine's jobs run when it runs at a niceness.
    enum Placement {
        /// On ``engineEventLoops``, apart from the push clients' (SQLite).
        case ownEventLoops
        /// On the push clients' event loops, NIO's shared group (PostgreSQL).
        case pushClientsEventLoops
    }

    /// The event loops the engine's jobs run on with ``Placement/ownEventLoops``: created when the engine first runs so,
    /// for the process's lifetime (as NIO's shared group is: a job of the engine's enqueued after a shutdown would never
    /// run).
    ///
    /// Half as many as the cores: the engine's jobs take about a fifth of the server's CPU during a fan-out, and a pass's
    /// jobs (its page reads, sends and progress) on fewer threads hand each other less work across them (the likely
    /// reason; not measured apart). On one loop instead of two on this 2-core machine (`bench fanout --instances 100000
    /// --rounds 5`, six pairs of runs taken in turn): 56,002 pushes/s against 54,340, more in each pair, 26.4 µs of CPU
    /// a push against 27.4; side accepts' p99 8.3 – 9.8 ms against 8.1 – 9.4.
    static let engineEventLoops = MultiThreadedEventLoopGroup._makePerpetualGroup(
        threadNamePrefix: threadNamePrefix, numberOfThreads: max(1, System.coreCount / 2)
    )

    /// The prefix of the names of ``engineEventLoops``' threads (`ll-engine-3-#0`), as Linux shows them.
    static let threadNamePrefix = "ll-engine-"

    func run() async throws {
        guard niceness > 0 else { return try await dispatcher.run() }
        let pushClients = MultiThreadedEventLoopGroup.singleton
        await Self.lowerPriority(of: pushClients, to: niceness)
        let executor =
            switch placement {
            case .ownEventLoops: await Self.executor(on: Self.engineEventLoops, niceness: niceness)
            case .pushClientsEventLoops: EventLoopTaskExecutor(pushClients)
            }
        try await withTaskExecutorPreference(executor) {
            try await dispatcher.run()
        }
    }

    /// An executor for jobs on `group`'s loops, once their threads have the niceness `niceness`.
    static func executor(on group: MultiThreadedEventLoopGroup, niceness: Int) async -> EventLoopTaskExecutor {
        await lowerPriority(of: group, to: niceness)
        return EventLoopTaskExecutor(group)
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
