import Crypto
import Foundation
import LivelineTestSupport
import Logging
import ServiceLifecycle
import Testing
import X509

@testable import LivelineEmulator

/// TLS identity, the CA file, and the CLI's signing credentials.
@Suite("Setup")
struct SetupTests {
    func temporaryDirectory() -> String {
        uniqueTemporaryURL(prefix: "liveline-emulator").path
    }

    @Test("The server certificate is trusted through ca.pem for 127.0.0.1 and localhost, and only through it")
    func tls() async throws {
        try await withEmulator { fixture in
            let written = try String(contentsOfFile: fixture.emulator.caCertificatePath, encoding: .utf8)
            #expect(written == fixture.emulator.caCertificatePEM)
            #expect(written.hasPrefix("-----BEGIN CERTIFICATE-----"))

            let byName = try await HTTP2TestConnection.connect(
                port: fixture.apnsPort, caPEM: written, serverHostname: "localhost"
            )
            #expect(try await byName.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 200)
            await byName.close()

            let otherDirectory = temporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: otherDirectory) }
            let stranger = try APNsEmulator(configuration: APNsEmulatorConfiguration(dataDirectory: otherDirectory), logger: Logger(label: "t"))
            await #expect(throws: (any Error).self) {
                let connection = try await HTTP2TestConnection.connect(port: fixture.apnsPort, caPEM: stranger.caCertificatePEM)
                _ = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            }
        }
    }

    @Test("The server certificate is issued by the CA for localhost, 127.0.0.1 and ::1, for server auth")
    func serverCertificate() throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let identity = try EmulatorTLSIdentity.loadOrCreate(in: directory)
        let ca = try Certificate(pemEncoded: identity.caCertificatePEM)
        let server = try Certificate(pemEncoded: identity.serverCertificatePEM)
        #expect(server.issuer == ca.subject)
        #expect(ca.publicKey.isValidSignature(server.signature, for: server))
        #expect(try ca.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: 0))
        #expect(try server.extensions.basicConstraints == .notCertificateAuthority)
        #expect(try server.extensions.extendedKeyUsage?.contains(.serverAuth) == true)
        let names = try #require(try server.extensions.subjectAlternativeNames)
        #expect(names.contains(.dnsName("localhost")))
        #expect(names.contains(.ipAddress(.init(contentBytes: [127, 0, 0, 1]))))
        #expect(names.contains(.ipAddress(.init(contentBytes: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]))))
    }

    @Test("Emulators started at once on one data directory share one CA, the one in ca.pem, which signs every server certificate")
    func caMadeOnceWhenStartedAtOnce() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let identities = try await withThrowingTaskGroup(of: EmulatorTLSIdentity.self) { group in
            for _ in 0..<8 { group.addTask { try EmulatorTLSIdentity.loadOrCreate(in: directory) } }
            return try await group.reduce(into: [EmulatorTLSIdentity]()) { $0.append($1) }
        }
        let written = try String(contentsOfFile: (directory as NSString).appendingPathComponent("ca.pem"), encoding: .utf8)
        let ca = try Certificate(pemEncoded: written)
        #expect(Set(identities.map(\.caCertificatePEM)) == [written])
        for identity in identities {
            let server = try Certificate(pemEncoded: identity.serverCertificatePEM)
            #expect(ca.publicKey.isValidSignature(server.signature, for: server))
        }
    }

    @Test("A restarted emulator keeps its CA, so clients need not be reconfigured")
    func caSurvivesRestart() throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try APNsEmulator(configuration: APNsEmulatorConfiguration(dataDirectory: directory), logger: Logger(label: "t"))
        let second = try APNsEmulator(configuration: APNsEmulatorConfiguration(dataDirectory: directory), logger: Logger(label: "t"))
        #expect(first.caCertificatePEM == second.caCertificatePEM)
        let keyPath = (directory as NSString).appendingPathComponent("ca-key.pem")
        let permissions = try FileManager.default.attributesOfItem(atPath: keyPath)[.posixPermissions] as? Int
        #expect(permissions == 0o600)
    }

    @Test("Generated signing credentials are made once and reused")
    func generatedCredentials() throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory)
        #expect(first.generated)
        #expect(EmulatorSigningCredentials.isAppleIdentifier(first.teamID))
        #expect(EmulatorSigningCredentials.isAppleIdentifier(first.keyID))
        #expect(first.keyFilePath == (directory as NSString).appendingPathComponent("AuthKey_\(first.keyID).p8"))
        let permissions = try FileManager.default.attributesOfItem(atPath: first.keyFilePath)[.posixPermissions] as? Int
        #expect(permissions == 0o600)
        let pem = try String(contentsOfFile: first.keyFilePath, encoding: .utf8)
        #expect(try P256.Signing.PrivateKey(pemRepresentation: pem).publicKey.rawRepresentation == first.publicKey.rawRepresentation)

        let second = try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory)
        #expect(!second.generated)
        #expect(second.teamID == first.teamID)
        #expect(second.keyID == first.keyID)
        #expect(second.publicKey.rawRepresentation == first.publicKey.rawRepresentation)

        let renamed = try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory, teamID: "NEWTEAM001")
        #expect(renamed.teamID == "NEWTEAM001")
        #expect(renamed.keyID == first.keyID)
        #expect(try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory).teamID == "NEWTEAM001")
    }

    @Test("A given .p8 file is trusted with the key id from its name; malformed ids are refused")
    func givenKeyFile() throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let key = P256.Signing.PrivateKey()
        let keyFile = (directory as NSString).appendingPathComponent("AuthKey_ABC123DEF4.p8")
        try key.pemRepresentation.write(toFile: keyFile, atomically: true, encoding: .utf8)
        let credentials = try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory, teamID: "TEAM98765X", keyFile: keyFile)
        #expect(credentials.keyID == "ABC123DEF4")
        #expect(credentials.teamID == "TEAM98765X")
        #expect(credentials.publicKey.rawRepresentation == key.publicKey.rawRepresentation)
        #expect(!credentials.generated)

        #expect(throws: EmulatorSigningCredentials.Problem.self) {
            try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory, teamID: "team")
        }
        let unnamed = (directory as NSString).appendingPathComponent("key.p8")
        try key.pemRepresentation.write(toFile: unnamed, atomically: true, encoding: .utf8)
        #expect(throws: EmulatorSigningCredentials.Problem.self) {
            try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory, keyFile: unnamed)
        }
        #expect(try EmulatorSigningCredentials.loadOrCreate(dataDirectory: directory, keyID: "KEYGIVEN01", keyFile: unnamed).keyID == "KEYGIVEN01")
    }

    @Test("As a Service in a ServiceGroup it runs until graceful shutdown, then closes its listeners")
    func runsAsService() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let emulator = try APNsEmulator(configuration: APNsEmulatorConfiguration(dataDirectory: directory), logger: Logger(label: "t"))
        let services = ServiceGroup(configuration: ServiceGroupConfiguration(services: [emulator], logger: Logger(label: "t")))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await services.run() }
            var ports: (apnsPort: Int, controlPort: Int)?
            for _ in 0..<3000 where ports == nil {  // up to 30 s on a loaded machine
                ports = emulator.boundPorts
                if ports == nil { try await Task.sleep(for: .milliseconds(10)) }
            }
            let bound = try #require(ports)
            #expect(try await controlRequest(port: bound.controlPort, "GET", "/healthz").status == 200)
            await services.triggerGracefulShutdown()
            try await group.waitForAll()
            #expect(emulator.boundPorts == nil)
            await #expect(throws: (any Error).self) { try await controlRequest(port: bound.controlPort, "GET", "/healthz") }
        }
    }
}
