import Foundation
import LivelineCore
import _CryptoExtras

/// The service account an ``FCMEmulator`` trusts out of the box: generated once into the data directory
/// (`fcm-service-account.json`, mode 0600) in the form of a Firebase service-account key file, with its `token_uri`
/// pointing at the emulator's `/token`, so `liveline serve --dev` (or any FCM sender) can use it as is.
public struct FCMDemoServiceAccount: Sendable {
    /// The file's name in the data directory.
    public static let fileName = "fcm-service-account.json"

    /// Where the service-account JSON is.
    public var path: String
    /// The service-account JSON text, private key included. A secret of the local emulator only.
    public var json: String
    /// `project_id`.
    public var projectID: String
    /// `client_email`.
    public var clientEmail: String
    /// `private_key_id`.
    public var privateKeyID: String
    /// `token_uri`: the emulator's token endpoint.
    public var tokenURI: String
    /// Whether this call generated the key.
    public var generated: Bool

    /// Why the demo account could not be set up.
    public struct Problem: Error, CustomStringConvertible {
        /// A sentence for the operator (never the key).
        public var description: String
    }

    /// Loads the account from `directory` (or generates it), sets its `token_uri` to `tokenURI` (rewriting the file when
    /// it changed), and returns it with the public key to register.
    static func loadOrCreate(
        in directory: String, tokenURI: String, projectID: String
    ) throws -> (account: FCMDemoServiceAccount, registration: RegisteredServiceAccount) {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = (directory as NSString).appendingPathComponent(fileName)
        var members: [String: JSONValue]
        let privateKey: _RSA.Signing.PrivateKey
        var generated = false
        if let data = FileManager.default.contents(atPath: path) {
            guard let object = (try? JSONValue(parsing: Array(data)))?.objectValue,
                let pem = object["private_key"]?.stringValue, let key = try? _RSA.Signing.PrivateKey(pemRepresentation: pem),
                object["client_email"]?.stringValue != nil, object["project_id"]?.stringValue != nil,
                object["private_key_id"]?.stringValue != nil
            else {
                throw Problem(description: "\(path) is not a service-account key file with an RSA private_key; remove it to have a new one generated.")
            }
            members = object
            privateKey = key
        } else {
            privateKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            generated = true
            let email = "firebase-adminsdk-demo@\(projectID).iam.gserviceaccount.com"
            members = [
                "type": "service_account",
                "project_id": .string(projectID),
                "private_key_id": .string(FCMEmulatorCore.randomHex(count: 40)),
                "private_key": .string(privateKey.pkcs8PEMRepresentation + "\n"),
                "client_email": .string(email),
                "client_id": .string(String((0..<21).map { _ in "0123456789".randomElement()! })),
                "auth_uri": "https://accounts.google.com/o/oauth2/auth",
                "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
                "universe_domain": "googleapis.com",
            ]
        }
        let changed = members["token_uri"]?.stringValue != tokenURI
        members["token_uri"] = .string(tokenURI)
        let json = JSONValue.object(members).encodedString + "\n"
        if generated || changed {
            try EmulatorTLSIdentity.writeFile(json, to: path, permissions: 0o600)
        }
        let account = FCMDemoServiceAccount(
            path: path, json: json, projectID: members["project_id"]!.stringValue!, clientEmail: members["client_email"]!.stringValue!,
            privateKeyID: members["private_key_id"]!.stringValue!, tokenURI: tokenURI, generated: generated
        )
        let registration = RegisteredServiceAccount(
            clientEmail: account.clientEmail, projectID: account.projectID, publicKey: privateKey.publicKey,
            privateKeyID: account.privateKeyID
        )
        return (account, registration)
    }
}
