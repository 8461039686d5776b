/// A first-come, first-served async lock: one holder at a time, waiters resumed in order.
///
/// SQLite allows one writer per database. All statements of one transaction must run on one
/// connection without another task's statements in between; the gate keeps them apart.
actor SerialGate {
    private var isHeld = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    /// Runs `body` while holding the gate.
    nonisolated func withGate<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        await acquire()
        do {
            let result = try await body()
            await release()
            return result
        } catch {
            await release()
            throw error
        }
    }

    private func acquire() async {
        if !isHeld {
            isHeld = true
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    private func release() {
        if waiters.isEmpty {
            isHeld = false
        } else {
            waiters.removeFirst().resume()
        }
    }
}
