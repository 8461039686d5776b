import APNs
import Crypto
import Foundation
import LivelineCore
import LivelineStore

public enum APNsEnvironmentName: String, Sendable, CaseIterable {
    case sandbox
    case production
}

/// An app's APNs token-auth credentials, as the operator gives them.
///
/// Its `description`, `debugDescription` and mirror never show the private key, so it can be logged, printed and
/// dumped (an error's `String(reflecting:)` included).
public struct APNsCredentials: Sendable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var teamID: String
    public var keyID: String
    /// The contents of `AuthKey_<keyID>.p8`.
    public var privateKeyPEM: String
    public var environment: APNsEnvironmentName
    /// Overrides the environment's host, e.g. `https://127.0.0.1:8443` for the local emulator.
    public var baseURL: String?
    /// A PEM CA certificate to trust for `baseURL` (and `channelManagementBaseURL`, `broadcastBaseURL`).
    public var caCertificatePEM: String?
    /// Overrides the environment's channel management host (`api-manage-broadcast…`), e.g. the local emulator's.
    public var channelManagementBaseURL: String?
    /// Where broadcasts (iOS 18 channels) are published, when not on the push host (`baseURL`, or the environment's):
    /// Apple's prose names the push hosts, while its examples use `api-broadcast…`, so the host is the operator's to
    /// choose. `nil`: the push host, over the push connections.
    public var broadcastBaseURL: String?

    public init(
        teamID: String, keyID: String, privateKeyPEM: String, environment: APNsEnvironmentName, baseURL: String? = nil,
        caCertificatePEM: String? = nil, channelManagementBaseURL: String? = nil, broadcastBaseURL: String? = nil
    ) {
        self.channelManagementBaseURL = channelManagementBaseURL
        self.broadcastBaseURL = broadcastBaseURL
        self.teamID = teamID
        self.keyID = keyID
        self.privateKeyPEM = privateKeyPEM
        self.environment = environment
        self.baseURL = baseURL
        self.caCertificatePEM = caCertificatePEM
    }

    /// The credentials without the private key.
    public var description: String {
        "APNsCredentials(teamID: \(teamID), keyID: \(keyID), environment: \(environment.rawValue), "
            + "baseURL: \(baseURL ?? "nil"), privateKey: <redacted>)"
    }

    /// The same as ``description``: the private key is never shown.
    public var debugDescription: String { description }

    /// The members but the private key, so `dump` and debuggers never show it.
    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "teamID": teamID, "keyID": keyID, "privateKeyPEM": "<redacted>", "environment": environment.rawValue,
                "baseURL": baseURL as Any, "caCertificatePEM": caCertificatePEM as Any,
                "channelManagementBaseURL": channelManagementBaseURL as Any, "broadcastBaseURL": broadcastBaseURL as Any,
            ],
            displayStyle: .struct
        )
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
        // Each override as the client reads it: https://host[:port], nothing more (the client refuses a path or a query).
        for (url, field) in [(baseURL, "baseUrl"), (channelManagementBaseURL, "channelManagementBaseUrl"), (broadcastBaseURL, "broadcastBaseUrl")] {
            guard let url else { continue }
            guard (try? APNsEndpoint(baseURL: url)) != nil else {
                throw ValidationError(code: "invalid_base_url", message: "\(field) must be an https:// URL: https://host[:port].", field: field)
            }
        }
    }

    /// The non-secret settings, as stored and shown.
    public var settings: JSONValue {
        [
            "teamId": .string(teamID), "keyId": .string(keyID), "environment": .string(environment.rawValue),
            "baseUrl": baseURL.map(JSONValue.string) ?? .null, "caCertificate": caCertificatePEM.map(JSONValue.string) ?? .null,
            "channelManagementBaseUrl": channelManagementBaseURL.map(JSONValue.string) ?? .null,
            "broadcastBaseUrl": broadcastBaseURL.map(JSONValue.string) ?? .null,
        ]
    }

    /// Seals the credentials for storage.
    public func stored(appID: String, sealer: CredentialSealer, at now: Date) throws -> StoredCredentials {
        StoredCredentials(
            appID: appID, provider: .apns, settings: settings,
            sealedSecret: try sealer.seal(Array(privateKeyPEM.utf8), appID: appID, provider: .apns), updatedAt: now
        )
    }

    /// Opens stored credentials.
    public init(_ stored: StoredCredentials, sealer: CredentialSealer) throws {
        let settings = stored.settings.objectValue ?? [:]
        guard let teamID = settings["teamId"]?.stringValue, let keyID = settings["keyId"]?.stringValue,
            let environment = settings["environment"]?.stringValue.flatMap(APNsEnvironmentName.init(rawValue:))
        else { throw CredentialError("The stored APNs settings of \(stored.appID) are incomplete.") }
        let secret = try sealer.open(stored.sealedSecret, appID: stored.appID, provider: .apns)
        self.init(
            teamID: teamID, keyID: keyID, privateKeyPEM: String(decoding: secret, as: UTF8.self), environment: environment,
            baseURL: settings["baseUrl"]?.stringValue, caCertificatePEM: settings["caCertificate"]?.stringValue,
            channelManagementBaseURL: settings["channelManagementBaseUrl"]?.stringValue,
            broadcastBaseURL: settings["broadcastBaseUrl"]?.stringValue
        )
    }
}
