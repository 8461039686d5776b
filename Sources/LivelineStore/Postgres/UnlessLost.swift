import NIOCore
import PostgresNIO
import Synchronization

/// Fails the answers still awaited from a connection once it has closed.
///
/// PostgresNIO writes a statement into its channel without a promise for the write: a statement written after the
/// channel closed (the server ended the connection between a look at `isClosed` and the write) fails at the
/// pipeline's head, and its answer never comes. Waiting for it hung a test that had PostgreSQL end the connections,
/// once in a loaded run of the suite (`PreparedStatementTests.statementAfterTheClose` writes such a statement). Each
/// answer awaited through ``guarding(_:)`` is failed as lost (`ChannelError.ioOnClosedChannel`) when the connection
/// closes without answering it. The statements in flight at the close are failed by PostgresNIO first, with what the
/// server said (its handler hears of the close before the close completes).
///
/// One per connection: it listens for the close once, and keeps only the answers not yet come (an answer registered
/// with the connection's close for every statement would be kept for the connection's whole life).
final class LostAnswers: Sendable {
    private struct State {
        var closed = false
        var nextID = 0
        var waiting: [Int: @Sendable () -> Void] = [:]
    }

    private let state = Mutex(State())

    /// Watches `connection`'s close.
    init(_ connection: PostgresConnection) {
        connection.closeFuture.whenComplete { [self] _ in
            let left = state.withLock { state in
                state.closed = true
                defer { state.waiting = [:] }
                return Array(state.waiting.values)
            }
            for fail in left { fail() }
        }
    }

    /// `answer`, or a lost connection's failure if the connection closes (or has closed) without answering.
    func guarding<Value: Sendable>(_ answer: EventLoopFuture<Value>) -> EventLoopFuture<Value> {
        let promise = answer.eventLoop.makePromise(of: Value.self)
        let fail: @Sendable () -> Void = { promise.fail(ChannelError.ioOnClosedChannel) }
        let id: Int? = state.withLock { state in
            guard !state.closed else { return nil }
            state.nextID += 1
            state.waiting[state.nextID] = fail
            return state.nextID
        }
        answer.whenComplete { [self] result in
            if let id { _ = state.withLock { $0.waiting.removeValue(forKey: id) } }
            promise.completeWith(result)
        }
        // Closed already: whatever PostgresNIO does with it, it is not waited for longer.
        if id == nil { fail() }
        return promise.futureResult
    }
}
