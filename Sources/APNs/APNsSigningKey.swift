import Crypto
import Foundation

/// A team's APNs authentication key (the `.p8` file from the developer account), used to sign provider tokens.
public struct APNsSigningKey: Sendable {
    /// The 10-character team identifier, used as the token's `iss` claim.
    public let teamID: String
    /// The 10-character key identifier, used as the token's `kid` header.
    public let keyID: String
    /// The P-256 private key.
    public let privateKey: P256.Signing.PrivateKey

    /// Reads the contents of an `AuthKey_XXXXXXXXXX.p8` file: a PEM `BEGIN PRIVATE KEY` block holding a PKCS#8
    /// P-256 key. Literal `\n` sequences (as in a key pasted into an environment variable) are accepted as line
    /// breaks.
    ///
    /// Throws ``APNsConfigurationError`` when the team or key id is not 10 letters or digits, when the text is not
    /// a PEM `PRIVATE KEY` block, or when the block does not hold a P-256 key.
    public init(teamID: String, keyID: String, p8PEM: String) throws {
        try Self.checkIdentifier(teamID, name: "team id")
        try Self.checkIdentifier(keyID, name: "key id")

        var text = p8PEM.replacingOccurrences(of: "\r\n", with: "\n")
        if text.range(of: "\n") == nil, text.range(of: "\\n") != nil {
            text = text.replacingOccurrences(of: "\\n", with: "\n")
        }
        text = text.trimmingCharacters(in: .whitespacesAndNewlines)

        let begin = "-----BEGIN PRIVATE KEY-----"
        let end = "-----END PRIVATE KEY-----"
        guard text.hasPrefix(begin), text.hasSuffix(end) else {
            if text.hasPrefix("-----BEGIN ") {
                let label = text.dropFirst("-----BEGIN ".count).prefix { $0 != "-" }
                throw APNsConfigurationError(
                    "The APNs key must be the .p8 file's PEM \"BEGIN PRIVATE KEY\" block (PKCS#8); got a \"\(label)\" block."
                )
            }
            throw APNsConfigurationError(
                "The APNs key must be the contents of the AuthKey_\(keyID).p8 file: a PEM block starting with \"\(begin)\"."
            )
        }
        let key: P256.Signing.PrivateKey
        do {
            key = try P256.Signing.PrivateKey(pemRepresentation: text)
        } catch {
            throw APNsConfigurationError(
                "The APNs key's PEM block is not a PKCS#8 P-256 (ES256) private key: \(error)."
            )
        }
        self.init(teamID: teamID, keyID: keyID, privateKey: key)
    }

    /// Wraps an already-loaded private key. The ids are used as given.
    public init(teamID: String, keyID: String, privateKey: P256.Signing.PrivateKey) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKey = privateKey
    }

    private static func checkIdentifier(_ value: String, name: String) throws {
        let valid = value.utf8.count == 10
            && value.utf8.allSatisfy { byte in
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                    || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
            }
        guard valid else {
            throw APNsConfigurationError("The APNs \(name) \"\(value)\" must be exactly 10 letters or digits.")
        }
    }
}
