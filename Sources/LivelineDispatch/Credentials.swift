import Crypto
import Foundation
import LivelineCore
import LivelineStore

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
    public func seal(_ secret: [UInt8], appID: String, provider: String) throws -> [UInt8] {
        let box = try AES.GCM.seal(secret, using: key, authenticating: Data("\(appID)/\(provider)".utf8))
        guard let combined = box.combined else { throw CredentialError("Sealing failed.") }
        return Array(combined)
    }

    /// Opens what ``seal(_:appID:provider:)`` sealed. Throws when the master key or the app differs.
    public func open(_ sealed: [UInt8], appID: String, provider: String) throws -> [UInt8] {
        do {
            let box = try AES.GCM.SealedBox(combined: sealed)
            return Array(try AES.GCM.open(box, using: key, authenticating: Data("\(appID)/\(provider)".utf8)))
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
        let created = FileManager.default.createFile(
            atPath: path, contents: Data(Data(key).base64EncodedString().utf8), attributes: [.posixPermissions: 0o600]
        )
        guard created else { throw CredentialError("Cannot write the master key to \(path).") }
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
public enum APNsEnvironmentName: String, Sendable, CaseIterable {
    case sandbox
    case production
}

/// An app's APNs token-auth credentials, as the operator gives them.
public struct APNsCredentials: Sendable {
    public var teamID: String
    public var keyID: String
    /// The contents of `AuthKey_<keyID>.p8`.
    public var privateKeyPEM: String
    public var environment: APNsEnvironmentName
    /// Overrides the environment's host, e.g. `https://127.0.0.1:8443` for the local emulator.
    public var baseURL: String?
    /// A PEM CA certificate to trust for `baseURL`.
    public var caCertificatePEM: String?

    public init(
        teamID: String, keyID: String, privateKeyPEM: String, environment: APNsEnvironmentName, baseURL: String? = nil,
        caCertificatePEM: String? = nil
    ) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKeyPEM = privateKeyPEM
        self.environment = environment
        self.baseURL = baseURL
        self.caCertificatePEM = caCertificatePEM
    }

    /// Checks ids and the key's form; the key itself is checked by parsing it.
    public func validate() throws(ValidationError) {
        func isTenAlphanumerics(_ value: String) -> Bool {
            value.utf8.count == 10 && value.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 65 && $0 <= 90) }
        }
        guard isTenAlphanumerics(teamID) else {
            throw ValidationError(code: "invalid_team_id", message: "teamId must be Apple's 10-character team id (A-Z, 0-9).", field: "teamId")
        }
        guard isTenAlphanumerics(keyID) else {
            throw ValidationError(code: "invalid_key_id", message: "keyId must be the 10-character id of the .p8 key (A-Z, 0-9).", field: "keyId")
        }
        guard (try? P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM)) != nil else {
            throw ValidationError(
                code: "invalid_private_key", message: "privateKey must be the contents of an APNs AuthKey_XXXXXXXXXX.p8 file.",
                field: "privateKey"
            )
        }
        if let baseURL {
            guard let url = URL(string: baseURL), url.scheme == "https", url.host != nil else {
                throw ValidationError(code: "invalid_base_url", message: "baseUrl must be an https:// URL.", field: "baseUrl")
            }
        }
    }

    /// The non-secret settings, as stored and shown.
    public var settings: JSONValue {
        [
            "teamId": .string(teamID), "keyId": .string(keyID), "environment": .string(environment.rawValue),
            "baseUrl": baseURL.map(JSONValue.string) ?? .null, "caCertificate": caCertificatePEM.map(JSONValue.string) ?? .null,
        ]
    }

    /// Seals the credentials for storage.
    public func stored(appID: String, sealer: CredentialSealer, at now: Date) throws -> StoredCredentials {
        StoredCredentials(
            appID: appID, provider: "apns", settings: settings,
            sealedSecret: try sealer.seal(Array(privateKeyPEM.utf8), appID: appID, provider: "apns"), updatedAt: now
        )
    }

    /// Opens stored credentials.
    public init(_ stored: StoredCredentials, sealer: CredentialSealer) throws {
        let settings = stored.settings.objectValue ?? [:]
        guard let teamID = settings["teamId"]?.stringValue, let keyID = settings["keyId"]?.stringValue,
            let environment = settings["environment"]?.stringValue.flatMap(APNsEnvironmentName.init(rawValue:))
        else { throw CredentialError("The stored APNs settings of \(stored.appID) are incomplete.") }
        let secret = try sealer.open(stored.sealedSecret, appID: stored.appID, provider: "apns")
        self.init(
            teamID: teamID, keyID: keyID, privateKeyPEM: String(decoding: secret, as: UTF8.self), environment: environment,
            baseURL: settings["baseUrl"]?.stringValue, caCertificatePEM: settings["caCertificate"]?.stringValue
        )
    }
}
