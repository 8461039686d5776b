import NIOConcurrencyHelpers

/// A gate that opens once and stays open: ``wait()`` returns once ``open()`` was called (at once when it was), or when
/// the waiting task is cancelled.
final class Latch: Sendable {
    private struct State {
        var isOpen = false
        var nextID: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = NIOLockedValueBox(State())

    /// Whether ``open()`` was called.
    var isOpen: Bool { state.withLockedValue { $0.isOpen } }

    /// Opens the gate: every waiter goes on, and every later ``wait()`` returns at once.
    func open() {
        let waiters = state.withLockedValue { state in
            state.isOpen = true
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns when the gate is open, or when the task is cancelled.
    func wait() async {
        let id = state.withLockedValue { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLockedValue { state in
                    if state.isOpen || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLockedValue { $0.waiters.removeValue(forKey: id) }
            waiter?.resume()
        }
    }
}
