import Synchronization

/// Lets at most `limit` requests through at once; the others wait, first come, first served.
///
/// The FCM client puts one in front of AsyncHTTPClient. A request it has handed to AsyncHTTPClient runs to its end even
/// when its caller is cancelled (see ``FCMClient``), so without a limit a stopped delivery engine could leave thousands
/// of requests queued in the connection pool, which removes each timed-out one with a linear search. Here a caller that
/// is cancelled while it waits leaves the queue at once and never reaches the pool; leaving costs O(1).
final class RequestLimiter: Sendable {
    private struct State {
        var available: Int
        var nextTicket: UInt64 = 0
        /// Waiting callers by ticket; a cancelled one is removed from here only.
        var waiters: [UInt64: CheckedContinuation<Void, any Error>] = [:]
        /// Tickets in arrival order from `head` on, including those of callers that have left since.
        var order: [UInt64] = []
        var head = 0

        /// Takes a place if one is free and nobody waits for it.
        mutating func admitIfFree() -> Bool {
            guard available > 0, waiters.isEmpty else { return false }
            available -= 1
            return true
        }

        /// Drops the consumed front of `order` once it is most of the array.
        mutating func compactOrder() {
            if head > 64, head * 2 > order.count {
                order.removeFirst(head)
                head = 0
            }
        }
    }

    private let state: Mutex<State>

    /// How many callers wait for a place now (for tests).
    var waiting: Int { state.withLock { $0.waiters.count } }

    /// A limiter letting `limit` (at least 1) requests through at once.
    init(limit: Int) {
        state = Mutex(State(available: max(1, limit)))
    }

    /// Waits for a place; every successful call must be paired with one ``release()``.
    ///
    /// - Throws: `CancellationError` when the calling task is cancelled before it gets a place (it then holds none).
    func acquire() async throws {
        let ticket = state.withLock { state -> UInt64? in
            if state.admitIfFree() { return nil }
            state.nextTicket += 1
            return state.nextTicket
        }
        guard let ticket else { return }
        enum Outcome { case admitted, queued, cancelled }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let outcome = state.withLock { state -> Outcome in
                    // Cancelled before queueing: the handler below found nothing to remove.
                    if Task.isCancelled { return .cancelled }
                    // A place may have been given back since the first look.
                    if state.admitIfFree() { return .admitted }
                    state.waiters[ticket] = continuation
                    state.order.append(ticket)
                    return .queued
                }
                switch outcome {
                case .admitted: continuation.resume()
                case .cancelled: continuation.resume(throwing: CancellationError())
                case .queued: break
                }
            }
        } onCancel: {
            let continuation = state.withLock { $0.waiters.removeValue(forKey: ticket) }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Gives a place back: to the longest-waiting caller, if any.
    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, any Error>? in
            while state.head < state.order.count {
                let ticket = state.order[state.head]
                state.head += 1
                if let continuation = state.waiters.removeValue(forKey: ticket) {
                    state.compactOrder()
                    return continuation
                }
            }
            state.compactOrder()
            state.available += 1
            return nil
        }
        next?.resume()
    }
}
