import Synchronization

/// A lock with two queues: one holder at a time.
///
/// SQLite allows one writer per database. All statements of one transaction must run on one
/// connection without another transaction's statements in between; the gate keeps them apart.
///
/// Two kinds of holder queue at it:
/// - a task that awaits its turn (``withGate(_:)``): a request's write, someone waits for it;
/// - work that is only queued (``enqueue(_:)``) and starts, without any task, when its turn comes: background
///   bookkeeping such as delivery progress.
///
/// Each queue is first come, first served. When both have waiters they take turns, so a request's write waits for the
/// holder and at most one queued work item, however much background work is queued; and work is not starved by a
/// steady stream of requests. Taking a free gate and handing it on never waits for the task pool.
final class SerialGate: Sendable {
    private enum Waiter {
        case task(CheckedContinuation<Void, Never>)
        case work(@Sendable () -> Void)
    }

    private struct State {
        var isHeld = false
        var tasks: [CheckedContinuation<Void, Never>] = []
        var work: [@Sendable () -> Void] = []
        /// Whom the gate went to last when both queues had waiters.
        var lastTurnWasTask = false
    }

    private let state = Mutex(State())

    /// Runs `body` while holding the gate.
    func withGate<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    /// Queues `start` behind the holder, the waiting tasks and the work queued so far, and returns at once. `start` runs when its turn comes (on
    /// the thread that hands the gate on) and holds the gate until it calls ``release()`` — exactly once, when the
    /// work it starts is done.
    func enqueue(_ start: @escaping @Sendable () -> Void) {
        let now = state.withLock { state in
            if state.isHeld {
                state.work.append(start)
                return false
            }
            state.isHeld = true
            return true
        }
        if now { start() }
    }

    /// How many tasks wait for the gate (for tests).
    var waitingTasks: Int { state.withLock { $0.tasks.count } }

    /// Hands the gate to the next waiter, or frees it.
    func release() {
        let next = state.withLock { state -> Waiter? in
            switch (state.tasks.isEmpty, state.work.isEmpty) {
            case (true, true):
                state.isHeld = false
                return nil
            case (false, true):
                return .task(state.tasks.removeFirst())
            case (true, false):
                return .work(state.work.removeFirst())
            case (false, false):
                state.lastTurnWasTask.toggle()
                return state.lastTurnWasTask ? .task(state.tasks.removeFirst()) : .work(state.work.removeFirst())
            }
        }
        switch next {
        case .task(let continuation): continuation.resume()
        case .work(let start): start()
        case nil: break
        }
    }

    private func acquire() async {
        let free = state.withLock { state in
            if state.isHeld { return false }
            state.isHeld = true
            return true
        }
        if free { return }
        await withCheckedContinuation { continuation in
            let now = state.withLock { state in
                if state.isHeld {
                    state.tasks.append(continuation)
                    return false
                }
                state.isHeld = true
                return true
            }
            if now { continuation.resume() }
        }
    }
}
