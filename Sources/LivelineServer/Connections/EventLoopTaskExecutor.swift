import NIOCore

/// A task executor that runs jobs on one NIO event loop.
///
/// The HTTP API's connections prefer it (``GuardedHTTP1Channel``): a request's handler then runs on its connection's
/// event loop — one of the API's own loops — rather than in Swift's global cooperative pool, where it would queue
/// behind every job of the delivery engine in the middle of a fan-out. The kernel shares the CPU between the threads;
/// an accept no longer waits its turn after thousands of pushes' worth of work.
final class EventLoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    // Unchecked: the event loop is Sendable and never changes.
    let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        eventLoop.execute { job.runSynchronously(on: executor) }
    }
}
