import NIOCore
import NIOPosix
import Synchronization

/// The start-once, stop-once life of an emulator's listeners, shared by the APNs and FCM emulators.
///
/// ``start(_:)`` is idempotent: concurrent callers wait for the one start, later callers get what it started; a
/// failed start returns to idle. ``stop(_:)`` is idempotent too and waits for a start in progress; once stopped,
/// nothing starts again.
final class ListenerLifecycle<Running: Sendable>: Sendable {
    private enum State: Sendable {
        case idle
        case starting(EventLoopFuture<Running>)
        case running(Running)
        case stopping(EventLoopFuture<Void>)
        case stopped
    }

    private let state = Mutex<State>(.idle)

    private enum StartStep {
        case begin(EventLoopPromise<Running>)
        case wait(EventLoopFuture<Running>)
        case done(Running)
        case refuse
    }

    private enum StopStep {
        case stop(Running, EventLoopPromise<Void>)
        case waitForStart(EventLoopFuture<Running>)
        case wait(EventLoopFuture<Void>)
        case nothing
    }

    /// A start after ``stop(_:)``.
    struct Stopped: Error {}

    /// What is running, if the listeners are up.
    var running: Running? {
        guard case .running(let running) = state.withLock({ $0 }) else { return nil }
        return running
    }

    /// Starts with `listen` unless already started; throws ``Stopped`` after a stop.
    func start(_ listen: () async throws -> Running) async throws -> (running: Running, started: Bool) {
        let step = state.withLock { state -> StartStep in
            switch state {
            case .idle:
                let promise = MultiThreadedEventLoopGroup.singleton.any().makePromise(of: Running.self)
                state = .starting(promise.futureResult)
                return .begin(promise)
            case .starting(let future): return .wait(future)
            case .running(let running): return .done(running)
            case .stopping, .stopped: return .refuse
            }
        }
        switch step {
        case .done(let running):
            return (running, false)
        case .wait(let future):
            return (try await future.get(), false)
        case .refuse:
            throw Stopped()
        case .begin(let promise):
            do {
                let running = try await listen()
                state.withLock { $0 = .running(running) }
                promise.succeed(running)
                return (running, true)
            } catch {
                state.withLock { $0 = .idle }
                promise.fail(error)
                throw error
            }
        }
    }

    /// Stops with `stop` if running (waiting for a start in progress first); returns whether this call stopped it.
    @discardableResult
    func stop(_ stop: (Running) async -> Void) async throws -> Bool {
        while true {
            let step = state.withLock { state -> StopStep in
                switch state {
                case .idle:
                    state = .stopped
                    return .nothing
                case .starting(let future):
                    return .waitForStart(future)
                case .running(let running):
                    let promise = MultiThreadedEventLoopGroup.singleton.any().makePromise(of: Void.self)
                    state = .stopping(promise.futureResult)
                    return .stop(running, promise)
                case .stopping(let future):
                    return .wait(future)
                case .stopped:
                    return .nothing
                }
            }
            switch step {
            case .nothing:
                return false
            case .waitForStart(let future):
                _ = try? await future.get()
                continue
            case .wait(let future):
                try await future.get()
                return false
            case .stop(let running, let promise):
                await stop(running)
                state.withLock { $0 = .stopped }
                promise.succeed()
                return true
            }
        }
    }
}
