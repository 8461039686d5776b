#if canImport(Glibc)
import Glibc
#endif
import Crypto
import Foundation

/// The push service a stored credential is for.
public enum CredentialProvider: String, Sendable, Hashable, CaseIterable {
    /// Apple Push Notification service: a .p8 signing key with its team and key ids.
    case apns
    /// Firebase Cloud Messaging: a service account.
    case fcm
}

/// Seals provider secrets (APNs .p8 keys, FCM service accounts) at rest with AES-GCM under the master key.
/// The app id and provider are authenticated with the ciphertext, so a sealed secret cannot be moved to another app.
public struct CredentialSealer: Sendable {
    private let key: SymmetricKey

    /// A sealer over a 256-bit master key.
    public init(masterKey: [UInt8]) throws {
        guard masterKey.count == 32 else { throw CredentialError("The master key must be 32 bytes (base64 of 32 random bytes).") }
        self.key = SymmetricKey(data: masterKey)
    }

    /// Seals `secret` for one app and provider.
    public func seal(_ secret: [UInt8], appID: String, provider: CredentialProvider) throws -> [UInt8] {
        try seal(secret, context: "\(appID)/\(provider.rawValue)")
    }

    /// Opens what ``seal(_:appID:provider:)`` sealed. Throws when the master key or the app differs.
    public func open(_ sealed: [UInt8], appID: String, provider: CredentialProvider) throws -> [UInt8] {
        try open(sealed, context: "\(appID)/\(provider.rawValue)")
    }

    /// Seals a webhook endpoint's signing secret: bound to its app and webhook.
    public func seal(_ secret: [UInt8], appID: String, webhookID: String) throws -> [UInt8] {
        try seal(secret, context: "\(appID)/webhook/\(webhookID)")
    }

    /// Opens what ``seal(_:appID:webhookID:)`` sealed.
    public func open(_ sealed: [UInt8], appID: String, webhookID: String) throws -> [UInt8] {
        try open(sealed, context: "\(appID)/webhook/\(webhookID)")
    }

    /// A value only this master key opens (``opensCheck(_:)``), which the database keeps: a server or command given
    /// another key than the one its secrets were sealed with finds out before it seals anything with it.
    public func sealCheck() throws -> [UInt8] {
        try seal(Array(Self.checkText.utf8), context: Self.checkContext)
    }

    /// Whether `sealed`, made by ``sealCheck()``, was made with this master key.
    public func opensCheck(_ sealed: [UInt8]) -> Bool {
        (try? open(sealed, context: Self.checkContext)) == Array(Self.checkText.utf8)
    }

    private static let checkText = "liveline master key"
    private static let checkContext = "master-key-check"

    /// Seals `secret`, authenticating `context` with it: opened only with the same context.
    private func seal(_ secret: [UInt8], context: String) throws -> [UInt8] {
        let box = try AES.GCM.seal(secret, using: key, authenticating: Data(context.utf8))
        guard let combined = box.combined else { throw CredentialError("Sealing failed.") }
        return Array(combined)
    }

    private func open(_ sealed: [UInt8], context: String) throws -> [UInt8] {
        do {
            let box = try AES.GCM.SealedBox(combined: sealed)
            return Array(try AES.GCM.open(box, using: key, authenticating: Data(context.utf8)))
        } catch {
            throw CredentialError("The stored secret cannot be opened with this master key.")
        }
    }

    /// Reads the master key from `path`, creating it (32 random bytes, base64, mode 0600) when missing.
    public static func loadOrCreateMasterKey(at path: String) throws -> [UInt8] {
        if FileManager.default.fileExists(atPath: path) {
            let text = try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            guard let data = Data(base64Encoded: text), data.count == 32 else {
                throw CredentialError("\(path) does not hold a base64 256-bit key.")
            }
            return Array(data)
        }
        let key = newMasterKey()
        // Written whole to a file of its own, readable by the owner alone from its creation (0600 at `open`, not a
        // `chmod` after the rename: a crash between the two left the key readable by every local user), synced, then
        // linked to `path`: `link` refuses an existing `path`, so of two processes creating the key at once, one's
        // key wins and the other reads it, never sealing with a key that is then overwritten.
        let temporary = path + ".new-\(getpid())-\(UUID().uuidString)"
        let bytes = Array(Data(key).base64EncodedString().utf8)
        let descriptor = Glibc.open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw CredentialError("Cannot write the master key to \(path): \(String(cString: strerror(errno))).") }
        defer { unlink(temporary) }
        let written = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor) == 0
        Glibc.close(descriptor)
        guard written == bytes.count, synced else { throw CredentialError("Cannot write the master key to \(path).") }
        guard link(temporary, path) == 0 else {
            if errno == EEXIST { return try loadOrCreateMasterKey(at: path) }
            throw CredentialError("Cannot write the master key to \(path): \(String(cString: strerror(errno))).")
        }
        return key
    }

    /// 32 fresh random bytes from the system's secure generator.
    public static func newMasterKey() -> [UInt8] {
        SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
    }

    /// Parses a base64 master key from configuration.
    public static func masterKey(base64: String) throws -> [UInt8] {
        guard let data = Data(base64Encoded: base64.trimmingCharacters(in: .whitespacesAndNewlines)), data.count == 32 else {
            throw CredentialError("The master key must be base64 of 32 bytes.")
        }
        return Array(data)
    }
}

/// A credentials problem, said in words that never include the secret.
public struct CredentialError: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Where an app's Live Activity pushes go.
