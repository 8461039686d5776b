import FCM
import Foundation
import LivelineCore
import LivelineStore

/// An app's FCM credentials, as the operator gives them: the Firebase service-account JSON key file, and for a
/// local emulator a base URL and the CA certificate to trust.
///
/// The service-account JSON (which holds the private key) is the secret: ``stored(appID:sealer:at:)`` seals it;
/// ``settings`` holds only what may be shown. Neither `description` nor an error ever shows the key.
public struct FCMCredentials: Sendable, CustomStringConvertible {
    /// The service-account JSON key file's text. A secret.
    public var serviceAccountJSON: String
    /// Overrides FCM's host, e.g. `https://127.0.0.1:8444` for the local emulator.
    public var baseURL: String?
    /// A PEM CA certificate to trust for `baseURL` (and the account's token URI).
    public var caCertificatePEM: String?

    /// The provider name credentials are stored under.
    public static let provider = CredentialProvider.fcm

    /// Creates credentials.
    public init(serviceAccountJSON: String, baseURL: String? = nil, caCertificatePEM: String? = nil) {
        self.serviceAccountJSON = serviceAccountJSON
        self.baseURL = baseURL
        self.caCertificatePEM = caCertificatePEM
    }

    /// The parsed service account.
    ///
    /// - Throws: ``CredentialError`` saying what is wrong with the JSON (never showing the key).
    public func serviceAccount() throws -> FCMServiceAccount {
        do {
            return try FCMServiceAccount(json: serviceAccountJSON)
        } catch let error as FCMConfigurationError {
            throw CredentialError(error.description)
        }
    }

    /// Checks the service account (its members and its RSA key, by parsing it), the base URL and the CA certificate.
    public func validate() throws(ValidationError) {
        do {
            _ = try FCMServiceAccount(json: serviceAccountJSON)
        } catch {
            throw ValidationError(code: "invalid_service_account", message: "\(error)", field: "serviceAccount")
        }
        if let baseURL {
            guard let url = URL(string: baseURL), url.scheme == "https", url.host != nil else {
                throw ValidationError(code: "invalid_base_url", message: "baseUrl must be an https:// URL.", field: "baseUrl")
            }
        }
        if let caCertificatePEM, !caCertificatePEM.contains("-----BEGIN CERTIFICATE-----") {
            throw ValidationError(
                code: "invalid_ca_certificate", message: "caCertificate must be a PEM certificate.", field: "caCertificate"
            )
        }
    }

    /// The non-secret settings, as stored and shown: project id, client email, private key id, token URI, base URL,
    /// CA certificate.
    public var settings: JSONValue {
        let account = try? FCMServiceAccount(json: serviceAccountJSON)
        return [
            "projectId": account.map { .string($0.projectID) } ?? .null,
            "clientEmail": account.map { .string($0.clientEmail) } ?? .null,
            "privateKeyId": account.map { .string($0.privateKeyID) } ?? .null,
            "tokenUri": account.map { .string($0.tokenURI) } ?? .null,
            "baseUrl": baseURL.map(JSONValue.string) ?? .null,
            "caCertificate": caCertificatePEM.map(JSONValue.string) ?? .null,
        ]
    }

    /// Seals the service-account JSON for storage under provider `fcm`.
    public func stored(appID: String, sealer: CredentialSealer, at now: Date) throws -> StoredCredentials {
        StoredCredentials(
            appID: appID, provider: Self.provider, settings: settings,
            sealedSecret: try sealer.seal(Array(serviceAccountJSON.utf8), appID: appID, provider: Self.provider), updatedAt: now
        )
    }

    /// Opens stored credentials.
    public init(_ stored: StoredCredentials, sealer: CredentialSealer) throws {
        guard stored.provider == Self.provider else {
            throw CredentialError("The stored credentials of \(stored.appID) are for \(stored.provider), not fcm.")
        }
        let settings = stored.settings.objectValue ?? [:]
        let secret = try sealer.open(stored.sealedSecret, appID: stored.appID, provider: Self.provider)
        self.init(
            serviceAccountJSON: String(decoding: secret, as: UTF8.self), baseURL: settings["baseUrl"]?.stringValue,
            caCertificatePEM: settings["caCertificate"]?.stringValue
        )
    }

    /// The project and client email, never the key.
    public var description: String {
        let account = try? FCMServiceAccount(json: serviceAccountJSON)
        return "FCMCredentials(project: \(account?.projectID ?? "?"), clientEmail: \(account?.clientEmail ?? "?"), baseURL: \(baseURL ?? FCMClient.defaultBaseURL))"
    }
}
