import Foundation
import LivelineCore
import LivelineServer
import LivelineStore
import Testing

@Suite("The master key is checked against the database before it seals anything")
struct MasterKeyCheckTests {
    static let first = try! CredentialSealer(masterKey: Array(repeating: 1, count: 32))
    static let second = try! CredentialSealer(masterKey: Array(repeating: 2, count: 32))

    @Test("the first key to come is kept; another is refused, and leaves the database as it was")
    func firstKeyDecides() async throws {
        try await withLiveline { _, store in
            #expect(try await store.storedMasterKeyCheck() == nil)
            try await LivelineApplication.checkMasterKey(store: store, sealer: Self.first)
            let kept = try #require(try await store.storedMasterKeyCheck())
            try await LivelineApplication.checkMasterKey(store: store, sealer: Self.first)
            await #expect(throws: ConfigurationError.self) { try await LivelineApplication.checkMasterKey(store: store, sealer: Self.second) }
            #expect(try await store.storedMasterKeyCheck() == kept)
            try await LivelineApplication.checkMasterKey(store: store, sealer: Self.first)
        }
    }

    @Test("a database from before the check: its sealed credentials must open with the key before the key is kept")
    func credentialsSealedBefore() async throws {
        try await withLiveline { _, store in
            let app = try await createApp(store)
            try await store.saveCredentials(
                StoredCredentials(
                    appID: app.id, provider: .apns, settings: ["teamId": "ABCDE12345"],
                    sealedSecret: try Self.first.seal(Array("-----BEGIN PRIVATE KEY-----".utf8), appID: app.id, provider: .apns),
                    updatedAt: Date()
                )
            )
            await #expect(throws: ConfigurationError.self) { try await LivelineApplication.checkMasterKey(store: store, sealer: Self.second) }
            #expect(try await store.storedMasterKeyCheck() == nil, "the wrong key left no check behind")
            try await LivelineApplication.checkMasterKey(store: store, sealer: Self.first)
            #expect(try await store.storedMasterKeyCheck() != nil)
            await #expect(throws: ConfigurationError.self) { try await LivelineApplication.checkMasterKey(store: store, sealer: Self.second) }
        }
    }

    @Test("a check value opens only with the key that made it")
    func sealerCheck() throws {
        let check = try Self.first.sealCheck()
        #expect(Self.first.opensCheck(check))
        #expect(!Self.second.opensCheck(check))
        #expect(!Self.first.opensCheck(Array(check.dropLast())))
        #expect(try Self.first.sealCheck() != check, "a fresh nonce each time")
    }
}
