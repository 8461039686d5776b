import Foundation
import _CryptoExtras

/// A mistake in how the FCM client was set up: a service-account file, a base URL, a CA certificate.
/// Its text never includes a private key.
public struct FCMConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What is wrong, and what was expected instead.
    public var description: String

    /// Creates an error with the given explanation.
    public init(_ description: String) { self.description = description }
}

/// A Google service account, as its JSON key file (downloaded from the Firebase console) describes it:
/// who signs the OAuth assertion, with which key, and where the assertion is exchanged for access tokens.
///
/// Its `description` and `debugDescription` never show the private key, so it can be logged and printed.
public struct FCMServiceAccount: Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// `type`: always `service_account`.
    public var type: String
    /// `project_id`: the Firebase project messages are sent for.
    public var projectID: String
    /// `private_key_id`: the key's id, sent as the assertion's `kid`.
    public var privateKeyID: String
    /// `client_email`: the service account's address, the assertion's `iss`.
    public var clientEmail: String
    /// `token_uri`: where the assertion is exchanged for an access token, and the assertion's `aud`.
    public var tokenURI: String
    /// The RSA key that signs assertions (from `private_key`).
    public let privateKey: _RSA.Signing.PrivateKey
    /// The JSON text the account was read from, private key included; kept so it can be stored (sealed) again.
    public let jsonText: String

    /// Reads a service-account JSON key file's text.
    ///
    /// - Throws: ``FCMConfigurationError`` naming the first member that is missing, of the wrong type or invalid:
    ///   `type` must be `service_account`; `project_id`, `private_key_id`, `client_email` non-empty strings;
    ///   `token_uri` an `https` URL (or `http` to a loopback host, for tests); `private_key` an RSA private key of at
    ///   least 2048 bits in PEM form. The error never includes the key.
    public init(json text: String) throws {
        let object: [String: Any]
        do {
            guard let parsed = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
                throw FCMConfigurationError("The service account is not a JSON object.")
            }
            object = parsed
        } catch let error as FCMConfigurationError {
            throw error
        } catch {
            throw FCMConfigurationError("The service account is not valid JSON.")
        }
        func string(_ key: String) throws -> String {
            guard let value = object[key] else {
                throw FCMConfigurationError("The service account has no \(key).")
            }
            guard let text = value as? String, !text.isEmpty else {
                throw FCMConfigurationError("The service account's \(key) must be a non-empty string.")
            }
            return text
        }
        let type = try string("type")
        guard type == "service_account" else {
            throw FCMConfigurationError("The service account's type is \"\(type)\"; a service-account key file says \"service_account\".")
        }
        let projectID = try string("project_id")
        let privateKeyID = try string("private_key_id")
        let clientEmail = try string("client_email")
        guard clientEmail.contains("@") else {
            throw FCMConfigurationError("The service account's client_email \"\(clientEmail)\" is not an email address.")
        }
        let tokenURI = try string("token_uri")
        guard Self.isAcceptableTokenURI(tokenURI) else {
            throw FCMConfigurationError(
                "The service account's token_uri \"\(tokenURI)\" must be an https URL (Google's is https://oauth2.googleapis.com/token)."
            )
        }
        let pem = try string("private_key")
        let privateKey: _RSA.Signing.PrivateKey
        do {
            privateKey = try _RSA.Signing.PrivateKey(pemRepresentation: pem)
        } catch {
            throw FCMConfigurationError("The service account's private_key is not an RSA private key of 2048 bits or more in PEM form.")
        }
        self.type = type
        self.projectID = projectID
        self.privateKeyID = privateKeyID
        self.clientEmail = clientEmail
        self.tokenURI = tokenURI
        self.privateKey = privateKey
        self.jsonText = text
    }

    /// `https://…`, or `http://` to `127.0.0.1`, `[::1]` or `localhost` (a local test server).
    static func isAcceptableTokenURI(_ text: String) -> Bool {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), let host = url.host, !host.isEmpty else {
            return false
        }
        if scheme == "https" { return true }
        return scheme == "http" && ["127.0.0.1", "::1", "[::1]", "localhost"].contains(host.lowercased())
    }

    /// The account without its key: project, client email, key id and token URI.
    public var description: String {
        "FCMServiceAccount(project: \(projectID), clientEmail: \(clientEmail), privateKeyID: \(privateKeyID), tokenURI: \(tokenURI), privateKey: <redacted>)"
    }

    /// The same as ``description``: the private key is never shown.
    public var debugDescription: String { description }
}

extension FCMServiceAccount: CustomReflectable {
    /// The non-secret members only, so `dump` and debuggers never show the key.
    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "type": type, "projectID": projectID, "privateKeyID": privateKeyID, "clientEmail": clientEmail,
                "tokenURI": tokenURI, "privateKey": "<redacted>",
            ],
            displayStyle: .struct
        )
    }
}
