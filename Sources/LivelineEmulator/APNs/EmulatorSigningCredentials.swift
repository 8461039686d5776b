import Crypto
import Foundation
import LivelineCore

/// The signing key an emulator trusts, as `liveline emulator apns` sets it up: either a .p8 file
/// the operator names, or one generated once into the data directory (`AuthKey_<KEYID>.p8`) with
/// its team id and key id kept in `<dataDirectory>/emulator.json`, so restarts reuse them.
public struct EmulatorSigningCredentials: Sendable {
    /// The team id (the provider token's `iss`).
    public var teamID: String
    /// The key id (the provider token's `kid`).
    public var keyID: String
    /// The .p8 file holding the private key.
    public var keyFilePath: String
    /// The public key the emulator verifies with.
    public var publicKey: P256.Signing.PublicKey
    /// Whether this call generated the key file.
    public var generated: Bool

    /// Why credentials could not be set up.
    public struct Problem: Error, CustomStringConvertible {
        /// A sentence for the operator.
        public var description: String
    }

    static let stateFileName = "emulator.json"

    /// Whether `value` has the form of Apple's team and key ids: 10 uppercase letters or digits.
    public static func isAppleIdentifier(_ value: String) -> Bool {
        value.utf8.count == 10 && value.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) }
    }

    /// A random 10-character identifier of uppercase letters and digits.
    public static func randomIdentifier() -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        return String((0..<10).map { _ in alphabet.randomElement()! })
    }

    /// Sets up the credentials for an emulator whose files live in `dataDirectory`.
    ///
    /// - Parameters:
    ///   - teamID: the team id to use; otherwise the saved one, otherwise a new random one.
    ///   - keyID: the key id to use; with `keyFile` it defaults to the id in an `AuthKey_<ID>.p8`
    ///     file name; without, to the saved one, otherwise a new random one.
    ///   - keyFile: a .p8 file whose key to trust; when `nil` a key is generated once.
    public static func loadOrCreate(
        dataDirectory: String, teamID: String? = nil, keyID: String? = nil, keyFile: String? = nil
    ) throws -> EmulatorSigningCredentials {
        for (name, value) in [("team id", teamID), ("key id", keyID)] {
            if let value, !isAppleIdentifier(value) {
                throw Problem(description: "The \(name) '\(value)' is not 10 uppercase letters or digits, as Apple's are.")
            }
        }
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        let statePath = (dataDirectory as NSString).appendingPathComponent(stateFileName)
        var saved = readState(statePath)
        let team = teamID ?? saved["teamId"]?.stringValue ?? randomIdentifier()
        saved["teamId"] = .string(team)

        let credentials: EmulatorSigningCredentials
        if let keyFile {
            let name = ((keyFile as NSString).lastPathComponent as NSString).deletingPathExtension
            let fromName = name.hasPrefix("AuthKey_") ? String(name.dropFirst("AuthKey_".count)) : nil
            guard let key = keyID ?? fromName.flatMap({ isAppleIdentifier($0) ? $0 : nil }) else {
                throw Problem(description: "Give --key-id: the key file's name does not say it (AuthKey_<KEYID>.p8).")
            }
            let privateKey = try readPrivateKey(keyFile)
            credentials = EmulatorSigningCredentials(
                teamID: team, keyID: key, keyFilePath: keyFile, publicKey: privateKey.publicKey, generated: false
            )
        } else {
            let key = keyID ?? saved["keyId"]?.stringValue ?? randomIdentifier()
            saved["keyId"] = .string(key)
            let path = (dataDirectory as NSString).appendingPathComponent("AuthKey_\(key).p8")
            if FileManager.default.fileExists(atPath: path) {
                credentials = EmulatorSigningCredentials(
                    teamID: team, keyID: key, keyFilePath: path, publicKey: try readPrivateKey(path).publicKey, generated: false
                )
            } else {
                let privateKey = P256.Signing.PrivateKey()
                try EmulatorTLSIdentity.writeFile(privateKey.pemRepresentation + "\n", to: path, permissions: 0o600)
                credentials = EmulatorSigningCredentials(
                    teamID: team, keyID: key, keyFilePath: path, publicKey: privateKey.publicKey, generated: true
                )
            }
        }
        try EmulatorTLSIdentity.writeFile(JSONValue.object(saved).encodedString + "\n", to: statePath, permissions: 0o644)
        return credentials
    }

    private static func readState(_ path: String) -> [String: JSONValue] {
        guard let data = FileManager.default.contents(atPath: path), let value = try? JSONValue(parsing: Array(data)) else {
            return [:]
        }
        return value.objectValue ?? [:]
    }

    private static func readPrivateKey(_ path: String) throws -> P256.Signing.PrivateKey {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw Problem(description: "Cannot read the key file \(path).")
        }
        do {
            return try P256.Signing.PrivateKey(pemRepresentation: String(decoding: data, as: UTF8.self))
        } catch {
            throw Problem(description: "\(path) is not a P-256 private key in PEM form (an APNs .p8 file).")
        }
    }
}
