import Crypto
import FCM
import Foundation
import Synchronization
import _CryptoExtras

/// A clock the tests move by hand.
final class TestClock: Sendable {
    private let current: Mutex<Date>

    init(_ start: Date = Date(timeIntervalSince1970: 1_800_000_000)) {
        current = Mutex(start)
    }

    var now: Date { current.withLock { $0 } }

    func advance(by seconds: TimeInterval) {
        current.withLock { $0 += seconds }
    }
}

/// One RSA key for the whole test run: generating 2048-bit keys is slow in debug builds.
let testPrivateKey: _RSA.Signing.PrivateKey = try! _RSA.Signing.PrivateKey(keySize: .bits2048)

/// A service-account key file's JSON, as the Firebase console downloads it.
func serviceAccountJSON(
    projectID: String = "demo-project", clientEmail: String = "sender@demo-project.iam.gserviceaccount.com",
    privateKeyID: String = "0123456789abcdef", tokenURI: String = "https://oauth2.googleapis.com/token",
    privateKeyPEM: String = testPrivateKey.pkcs8PEMRepresentation, omitting: Set<String> = [], type: String = "service_account"
) -> String {
    var object: [String: String] = [
        "type": type, "project_id": projectID, "private_key_id": privateKeyID, "private_key": privateKeyPEM,
        "client_email": clientEmail, "client_id": "123456789012345678901", "token_uri": tokenURI,
    ]
    for key in omitting { object.removeValue(forKey: key) }
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    return String(decoding: data, as: UTF8.self)
}

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

/// Base64url without padding, decoded; written here from RFC 4648 independently of the module's encoder.
func base64URLDecode(_ text: Substring) -> [UInt8]? {
    var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while base64.utf8.count % 4 != 0 { base64.append("=") }
    return Data(base64Encoded: base64).map(Array.init)
}

struct UnreadableJWTPart: Error {}

/// A JWT part decoded into a JSON object.
func jsonObject(_ part: Substring) throws -> [String: Any] {
    guard let bytes = base64URLDecode(part), let object = try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] else {
        throw UnreadableJWTPart()
    }
    return object
}
