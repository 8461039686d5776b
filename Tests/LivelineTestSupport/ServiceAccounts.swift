import Foundation
import _CryptoExtras

/// The run's service-account key. All test targets run in one process, and generating a 2048-bit RSA key takes long
/// in a debug build, so every test that needs one shares this one.
public let fcmTestKey: _RSA.Signing.PrivateKey = try! _RSA.Signing.PrivateKey(keySize: .bits2048)

/// A second RSA key that no service account in the tests is registered with.
public let fcmStrangerKey: _RSA.Signing.PrivateKey = try! _RSA.Signing.PrivateKey(keySize: .bits2048)

/// A service-account key file's JSON, as the Firebase console downloads it; `omitting` leaves fields out.
public func serviceAccountJSON(
    projectID: String = "demo-project", clientEmail: String = "sender@demo-project.iam.gserviceaccount.com",
    privateKeyID: String = "0123456789abcdef", tokenURI: String = "https://oauth2.googleapis.com/token",
    privateKeyPEM: String = fcmTestKey.pkcs8PEMRepresentation, omitting: Set<String> = [], type: String = "service_account"
) -> String {
    var object: [String: String] = [
        "type": type, "project_id": projectID, "private_key_id": privateKeyID, "private_key": privateKeyPEM,
        "client_email": clientEmail, "client_id": "123456789012345678901", "token_uri": tokenURI,
    ]
    for key in omitting { object.removeValue(forKey: key) }
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    return String(decoding: data, as: UTF8.self)
}
