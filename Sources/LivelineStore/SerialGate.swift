import NIOCore
import Synchronization

/// A first-come, first-served lock for the writer connection: one holder at a time, in the order they came.
///
/// SQLite allows one writer per database. All statements of one transaction must run on one
/// connection without another transaction's statements in between; the gate keeps them apart.
///
/// Holders are chained as futures on the writer's event loop. Handing the gate on never waits for Swift's task pool,
/// and a holder written as a future chain (``run(_:)``) runs its statements back to back without a task hop between
/// them, so a busy process does not stretch how long the writer is held.
final class SerialGate: Sendable {
    private let eventLoop: any EventLoop
    /// Succeeds (never fails) once the last holder queued so far is done.
    private let tail: Mutex<EventLoopFuture<Void>>

    /// A gate whose holders start on `eventLoop` (the writer connection's).
    init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
        self.tail = Mutex(eventLoop.makeSucceededVoidFuture())
    }

    /// Starts `work` once every earlier holder is done, and holds the gate until the future it returns completes.
    func run<T: Sendable>(_ work: @escaping @Sendable () -> EventLoopFuture<T>) -> EventLoopFuture<T> {
        // Take a place in the queue under the lock; chain outside it, so no callback ever runs while it is held.
        let released = eventLoop.makePromise(of: Void.self)
        let previous = tail.withLock { tail in
            defer { tail = released.futureResult }
            return tail
        }
        let result = previous.flatMap { work() }
        result.whenComplete { _ in released.succeed() }
        return result
    }

    /// Runs `body` while holding the gate.
    ///
    /// Waiting for the turn is not cancellable: a holder that gave up its place would never hand the gate on.
    func withGate<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        let turn = eventLoop.makePromise(of: Void.self)
        let done = eventLoop.makePromise(of: Void.self)
        _ = run {
            turn.succeed()
            return done.futureResult
        }
        try? await turn.futureResult.get()
        defer { done.succeed() }
        return try await body()
    }
}
