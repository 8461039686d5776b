import NIOCore

/// A task executor that runs jobs on NIO event loops: always the same one for an `EventLoop`, the group's next one
/// for a group.
///
/// - The HTTP API's connections prefer their own event loop (``GuardedHTTP1Channel``): a request's handler runs there
///   — on one of the API's own loops — rather than in Swift's global cooperative pool, where it would queue behind
///   every job of the delivery engine in the middle of a fan-out.
/// - `liveline serve` runs the delivery engine on event loops of its own, whose threads (and the push clients') it
///   gives a lower scheduling priority (`liveline.engine.niceness`), so the API is served first when the machine is
///   busy.
public final class EventLoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    // Unchecked: the group is Sendable and never changes.
    private let group: any EventLoopGroup

    /// An executor on `group`'s loops (an `EventLoop` is a group of one).
    public init(_ group: any EventLoopGroup) {
        self.group = group
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        group.next().execute { job.runSynchronously(on: executor) }
    }
}
