import Crypto
import FCM
import Foundation
import LivelineTestSupport
import Synchronization
import _CryptoExtras

/// A token exchange the tests control: counts calls, hands out numbered tokens, and can hold every exchange until
/// released or make it fail.
final class ScriptedExchange: FCMTokenExchange {
    struct Call: Sendable {
        var assertion: String
        var tokenURI: String
    }

    private struct State {
        var calls: [Call] = []
        var held = false
        var waiting: [CheckedContinuation<Void, Never>] = []
        var failure: (any Error & Sendable)?
    }

    private let state = Mutex(State())
    let expiresIn: TimeInterval

    init(expiresIn: TimeInterval = 3600) { self.expiresIn = expiresIn }

    var calls: [Call] { state.withLock { $0.calls } }

    /// Later exchanges wait until ``release()``.
    func hold() { state.withLock { $0.held = true } }

    /// Lets held exchanges finish.
    func release() {
        let waiting = state.withLock { state in
            state.held = false
            defer { state.waiting.removeAll() }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }

    /// Later exchanges throw `error` (or succeed again when `nil`).
    func fail(with error: (any Error & Sendable)?) { state.withLock { $0.failure = error } }

    func exchange(assertion: String, tokenURI: String) async throws -> FCMAccessToken {
        let number = state.withLock { state in
            state.calls.append(Call(assertion: assertion, tokenURI: tokenURI))
            return state.calls.count
        }
        await withCheckedContinuation { continuation in
            let proceed = state.withLock { state -> Bool in
                guard state.held else { return true }
                state.waiting.append(continuation)
                return false
            }
            if proceed { continuation.resume() }
        }
        if let failure = state.withLock({ $0.failure }) { throw failure }
        return FCMAccessToken(value: "access-token-\(number)", expiresIn: expiresIn)
    }
}

struct UnreadableJWTPart: Error {}

/// A JWT part decoded into a JSON object.
func jsonObject(_ part: Substring) throws -> [String: Any] {
    guard let bytes = base64URLDecode(part), let object = try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] else {
        throw UnreadableJWTPart()
    }
    return object
}
