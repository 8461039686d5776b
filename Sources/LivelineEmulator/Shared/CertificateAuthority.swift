import Crypto
import Foundation
import X509

/// The emulator's TLS identity: a local certificate authority (kept in the data directory so a
/// restarted emulator is still trusted) and a fresh server certificate it signs for
/// `127.0.0.1`, `::1` and `localhost`. Any local stand-in (the benchmark's nginx sink, for one) can serve it.
public struct EmulatorTLSIdentity: Sendable {
    /// The local CA's certificate: what clients trust.
    public var caCertificatePEM: String
    /// The server certificate, for `127.0.0.1`, `::1` and `localhost`.
    public var serverCertificatePEM: String
    /// The server certificate's private key.
    public var serverPrivateKeyPEM: String

    static let caFileName = "ca.pem"
    static let caKeyFileName = "ca-key.pem"

    static let caLockFileName = "ca.lock"

    /// Loads the CA from `directory` (or creates and writes it) and issues a server certificate.
    ///
    /// Emulators started at once on one data directory (the APNs and the FCM emulator, say) share one CA: the CA is
    /// read or made under an exclusive lock on `ca.lock` there, so the second waits for the first and reads the CA it
    /// wrote, instead of writing its own over it (and then serving a certificate that `ca.pem` does not sign).
    public static func loadOrCreate(in directory: String, now: Date = Date()) throws -> EmulatorTLSIdentity {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let caPath = (directory as NSString).appendingPathComponent(caFileName)
        let caKeyPath = (directory as NSString).appendingPathComponent(caKeyFileName)
        let (caCertificate, caKey) = try withExclusiveLock(on: (directory as NSString).appendingPathComponent(caLockFileName)) {
            try loadCA(certificatePath: caPath, keyPath: caKeyPath, now: now)
                ?? createCA(certificatePath: caPath, keyPath: caKeyPath, now: now)
        }

        let serverKey = P256.Signing.PrivateKey()
        let serverName = try DistinguishedName {
            OrganizationName("Liveline")
            CommonName("Liveline emulator")
        }
        let serverCertificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(serverKey.publicKey),
            notValidBefore: now - 3600,
            notValidAfter: now + 365 * 86400,
            issuer: caCertificate.subject,
            subject: serverName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([
                    .dnsName("localhost"),
                    .ipAddress(.init(contentBytes: [127, 0, 0, 1])),
                    .ipAddress(.init(contentBytes: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])),
                ])
                AuthorityKeyIdentifier(keyIdentifier: keyIdentifier(caKey.publicKey))
                SubjectKeyIdentifier(keyIdentifier: keyIdentifier(serverKey.publicKey))
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey)
        )
        return EmulatorTLSIdentity(
            caCertificatePEM: try caCertificate.serializeAsPEM().pemString,
            serverCertificatePEM: try serverCertificate.serializeAsPEM().pemString,
            serverPrivateKeyPEM: serverKey.pemRepresentation
        )
    }

    private static func loadCA(certificatePath: String, keyPath: String, now: Date) throws -> (Certificate, P256.Signing.PrivateKey)? {
        guard FileManager.default.fileExists(atPath: certificatePath), FileManager.default.fileExists(atPath: keyPath) else {
            return nil
        }
        guard let certificate = try? Certificate(pemEncoded: String(contentsOfFile: certificatePath, encoding: .utf8)),
            let key = try? P256.Signing.PrivateKey(pemRepresentation: String(contentsOfFile: keyPath, encoding: .utf8)),
            certificate.publicKey == Certificate.PublicKey(key.publicKey),
            certificate.notValidAfter > now + 86400
        else { return nil }
        return (certificate, key)
    }

    private static func createCA(certificatePath: String, keyPath: String, now: Date) throws -> (Certificate, P256.Signing.PrivateKey) {
        let key = P256.Signing.PrivateKey()
        let name = try DistinguishedName {
            OrganizationName("Liveline")
            CommonName("Liveline emulator CA")
        }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: now - 3600,
            notValidAfter: now + 10 * 365 * 86400,
            issuer: name,
            subject: name,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(keyIdentifier: keyIdentifier(key.publicKey))
            },
            issuerPrivateKey: Certificate.PrivateKey(key)
        )
        // The key first, readable by its owner only; the certificate is what clients are given.
        try writeFile(key.pemRepresentation, to: keyPath, permissions: 0o600)
        try writeFile(try certificate.serializeAsPEM().pemString, to: certificatePath, permissions: 0o644)
        return (certificate, key)
    }

    /// Runs `body` holding an exclusive `flock` on the file at `path` (created if missing), which every process and every
    /// open of it in this one respects.
    private static func withExclusiveLock<T>(on path: String, _ body: () throws -> T) throws -> T {
        let descriptor = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path]) }
        defer { close(descriptor) }
        while flock(descriptor, LOCK_EX) != 0 {
            guard errno == EINTR else { throw CocoaError(.fileLocking, userInfo: [NSFilePathErrorKey: path]) }
        }
        defer { flock(descriptor, LOCK_UN) }
        return try body()
    }

    /// Writes `text` to `path` (replacing it), created with `permissions`.
    static func writeFile(_ text: String, to path: String, permissions: Int) throws {
        if FileManager.default.fileExists(atPath: path) { try FileManager.default.removeItem(atPath: path) }
        guard FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: permissions])
        else { throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path]) }
    }

    private static func keyIdentifier(_ key: P256.Signing.PublicKey) -> ArraySlice<UInt8> {
        ArraySlice(Insecure.SHA1.hash(data: key.derRepresentation))
    }
}
