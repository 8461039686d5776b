import APNs
import Crypto
import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import NIOCore
import Testing

@testable import LivelineDispatch

/// A directory over `store`, where app `appID` has stored APNs credentials (for an APNs that is not there).
private func directoryWithCredentials(_ store: SQLStore, appID: String) async throws -> APNsTransportDirectory {
    try await store.createApp(AppRecord(id: appID, name: appID, bundleID: "com.example.\(appID)", androidPackage: nil, createdAt: Date()), keys: [])
    let sealer = try CredentialSealer(masterKey: Array(repeating: 9, count: 32))
    let credentials = APNsCredentials(
        teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: P256.Signing.PrivateKey().pemRepresentation, environment: .sandbox,
        baseURL: "https://127.0.0.1:9"
    )
    try await store.saveCredentials(try credentials.stored(appID: appID, sealer: sealer, at: Date()))
    return APNsTransportDirectory(store: store, sealer: sealer)
}

@Suite("APNs transport directory")
struct APNsTransportDirectoryTests {
    @Test("APNs credentials never show their private key: printed, reflected or dumped")
    func credentialsRedacted() {
        let pem = P256.Signing.PrivateKey().pemRepresentation
        let keyBody = String(pem.split(separator: "\n")[1])
        let credentials = APNsCredentials(teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: pem, environment: .production)
        for text in [credentials.description, credentials.debugDescription, "\(credentials)", String(reflecting: credentials)] {
            #expect(!text.contains(keyBody))
            #expect(text.contains("redacted") && text.contains("KEY1234567"), "\(text)")
        }
        var dumped = ""
        dump(credentials, to: &dumped)
        #expect(!dumped.contains(keyBody))
        #expect(dumped.contains("TEAM123456"))
    }

    @Test("one app's passes asking for its transport at once share one APNs client: none is replaced, and shut down, under another's pushes")
    func concurrentAsksShareOneClient() async throws {
        try await withTemporaryStore { store, _ in
            let directory = try await directoryWithCredentials(store, appID: "app_c")
            // Sixteen passes starting together, as a shared fan-out's slices do: each asks while the others wait for the
            // Store.
            let clients = try await withThrowingTaskGroup(of: ObjectIdentifier?.self) { group in
                for _ in 0..<16 {
                    group.addTask {
                        (try await directory.transport(appID: "app_c", platform: .ios) as? APNsPushTransport).map { ObjectIdentifier($0.client) }
                    }
                }
                var clients: [ObjectIdentifier?] = []
                for try await client in group { clients.append(client) }
                return clients
            }
            #expect(clients.count == 16 && clients.allSatisfy { $0 != nil })
            #expect(Set(clients).count == 1, "every pass got the one client")
            await directory.shutdown()
        }
    }

    @Test("told which credentials the claim found stored, the directory sends with the client built from them without reading them; told of newer ones, it builds a new client")
    func claimedVersionServesWithoutARead() async throws {
        try await withTemporaryStore { store, _ in
            let directory = try await directoryWithCredentials(store, appID: "app_v")
            let first = try #require(try await directory.transport(appID: "app_v", platform: .ios) as? APNsPushTransport)
            let built = try #require(try await store.credentials(appID: "app_v", provider: .apns))
            // Newer credentials stored since (another node's change): a read would find them and build a new client.
            let sealer = try CredentialSealer(masterKey: Array(repeating: 9, count: 32))
            let newer = APNsCredentials(
                teamID: "TEAM123456", keyID: "KEY7654321", privateKeyPEM: P256.Signing.PrivateKey().pemRepresentation, environment: .sandbox,
                baseURL: "https://127.0.0.1:9"
            )
            try await store.saveCredentials(try newer.stored(appID: "app_v", sealer: sealer, at: built.updatedAt.addingTimeInterval(60)))
            let claimedBefore = try #require(
                try await directory.transport(
                    appID: "app_v", platform: .ios, stored: [.apns: CredentialsVersion(updatedAt: built.updatedAt, healthy: true)]
                ) as? APNsPushTransport
            )
            #expect(ObjectIdentifier(claimedBefore.client) == ObjectIdentifier(first.client), "the claim's version is the client's: no read")
            let stored = try #require(try await store.credentials(appID: "app_v", provider: .apns))
            let claimedAfter = try #require(
                try await directory.transport(
                    appID: "app_v", platform: .ios, stored: [.apns: CredentialsVersion(updatedAt: stored.updatedAt, healthy: true)]
                ) as? APNsPushTransport
            )
            #expect(ObjectIdentifier(claimedAfter.client) != ObjectIdentifier(first.client), "newer credentials: a new client")
            let asked = try #require(try await directory.transport(appID: "app_v", platform: .ios) as? APNsPushTransport)
            #expect(ObjectIdentifier(asked.client) == ObjectIdentifier(claimedAfter.client))
            await directory.shutdown()
        }
    }

    @Test("forgetting a deleted app closes its client, and a later ask builds a new one")
    func forgetClosesTheClient() async throws {
        try await withTemporaryStore { store, _ in
            let directory = try await directoryWithCredentials(store, appID: "app_f")
            let kept = try await directoryWithCredentials(store, appID: "app_k")
            let first = try #require(try await directory.transport(appID: "app_f", platform: .ios) as? APNsPushTransport)
            let other = try #require(try await directory.transport(appID: "app_k", platform: .ios) as? APNsPushTransport)
            await directory.forget(appID: "app_f")
            let push = APNsNotification(deviceToken: String(repeating: "ab", count: 32), topic: "com.example.app_f.push-type.liveactivity", priority: 10, payload: ByteBuffer(string: "{}"))
            await #expect(throws: APNsTransportError.self) { try await first.client.send(push) }
            let next = try #require(try await directory.transport(appID: "app_f", platform: .ios) as? APNsPushTransport)
            #expect(ObjectIdentifier(next.client) != ObjectIdentifier(first.client))
            // Another app's client is not touched.
            let again = try #require(try await directory.transport(appID: "app_k", platform: .ios) as? APNsPushTransport)
            #expect(ObjectIdentifier(again.client) == ObjectIdentifier(other.client))
            await directory.shutdown()
            await kept.shutdown()
        }
    }

    @Test("after notices may have been missed, the clients of apps gone from the Store are closed, and only those")
    func forgetDeletedApps() async throws {
        try await withTemporaryStore { store, _ in
            let directory = try await directoryWithCredentials(store, appID: "app_gone")
            let kept = try await directoryWithCredentials(store, appID: "app_kept")
            let gone = try #require(try await directory.transport(appID: "app_gone", platform: .ios) as? APNsPushTransport)
            let other = try #require(try await directory.transport(appID: "app_kept", platform: .ios) as? APNsPushTransport)
            await directory.forgetDeletedApps()
            #expect(ObjectIdentifier(try #require(try await directory.transport(appID: "app_gone", platform: .ios) as? APNsPushTransport).client)
                == ObjectIdentifier(gone.client), "an app still in the Store was forgotten")
            // Deleted by another node (whose notice this one missed).
            #expect(try await store.deleteApp(id: "app_gone", leavingChannels: false) != nil)
            await directory.forgetDeletedApps()
            let push = APNsNotification(deviceToken: String(repeating: "ab", count: 32), topic: "com.example.app_gone.push-type.liveactivity", priority: 10, payload: ByteBuffer(string: "{}"))
            await #expect(throws: APNsTransportError.self) { try await gone.client.send(push) }
            let again = try #require(try await directory.transport(appID: "app_kept", platform: .ios) as? APNsPushTransport)
            #expect(ObjectIdentifier(again.client) == ObjectIdentifier(other.client))
            await directory.shutdown()
            await kept.shutdown()
        }
    }

    @Test("credentials marked refused are healthy again once a push goes through, and the client stays the same throughout")
    func healthRecovers() async throws {
        try await withTemporaryStore { store, _ in
            let directory = try await directoryWithCredentials(store, appID: "app_h")
            let first = try await directory.transport(appID: "app_h", platform: .ios) as? APNsPushTransport
            await directory.credentialsHealth(appID: "app_h", platform: .ios, healthy: false, reason: "InvalidProviderToken")
            #expect(try await store.credentials(appID: "app_h", provider: .apns)?.healthy == false)
            let again = try await directory.transport(appID: "app_h", platform: .ios) as? APNsPushTransport
            #expect(again.map { ObjectIdentifier($0.client) } == first.map { ObjectIdentifier($0.client) }, "a change of health rebuilt the client")
            await directory.credentialsHealth(appID: "app_h", platform: .ios, healthy: true, reason: nil)
            let recovered = try await store.credentials(appID: "app_h", provider: .apns)
            #expect(recovered?.healthy == true)
            #expect(recovered?.healthReason == nil)
            await directory.shutdown()
        }
    }

    @Test("each host is the credentials' override for it, else the environment's; broadcasts follow the push host unless named")
    func hosts() throws {
        let key = P256.Signing.PrivateKey().pemRepresentation
        for environment in APNsEnvironmentName.allCases {
            let apple = APNsCredentials(teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: key, environment: environment)
            let push: APNsEndpoint = environment == .production ? .production : .sandbox
            #expect(try apple.endpoint(.push) == push)
            #expect(try apple.endpoint(.broadcast) == push)
            #expect(try apple.endpoint(.channelManagement) == (environment == .production ? .channelManagementProduction : .channelManagementSandbox))

            var overridden = apple
            overridden.baseURL = "https://127.0.0.1:8443"
            #expect(try overridden.endpoint(.push) == APNsEndpoint(host: "127.0.0.1", port: 8443))
            #expect(try overridden.endpoint(.broadcast) == APNsEndpoint(host: "127.0.0.1", port: 8443), "broadcasts follow the push host")
            overridden.broadcastBaseURL = "https://broadcast.example:2197"
            overridden.channelManagementBaseURL = "https://manage.example"
            #expect(try overridden.endpoint(.push) == APNsEndpoint(host: "127.0.0.1", port: 8443))
            #expect(try overridden.endpoint(.broadcast) == APNsEndpoint(host: "broadcast.example", port: 2197))
            #expect(try overridden.endpoint(.channelManagement) == APNsEndpoint(host: "manage.example", port: 443))
        }
    }

    @Test("a cached client serves the credentials it was built from and older ones, never newer ones")
    func cachedVersions() {
        let t0 = Date(timeIntervalSince1970: 1_795_000_000)
        #expect(APNsTransportDirectory.serves(nil, nil))
        #expect(APNsTransportDirectory.serves(t0, t0))
        #expect(APNsTransportDirectory.serves(t0.addingTimeInterval(1), t0))
        #expect(!APNsTransportDirectory.serves(t0, t0.addingTimeInterval(1)))
        #expect(!APNsTransportDirectory.serves(nil, t0), "the emulator's client does not serve stored credentials")
        #expect(!APNsTransportDirectory.serves(t0, nil))
    }
}
