import Foundation
import LivelineStore
import LivelineTestSupport
import Synchronization
import Testing

@testable import LivelineServer

@Suite("The server's cache of API keys")
struct APIKeyCacheTests {
    /// A clock the test moves by hand.
    final class ManualClock: Sendable {
        private let start = ContinuousClock.now
        private let offset = Mutex(Duration.zero)
        func advance(by duration: Duration) { offset.withLock { $0 += duration } }
        func now() -> ContinuousClock.Instant { start + offset.withLock { $0 } }
    }

    @Test("a key is read from the Store once per lifetime; a rotation here is seen at once, one elsewhere after the lifetime", arguments: StoreKind.available)
    func lifetimeAndRevocation(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            let administration = AppAdministration(store: store, sealer: try CredentialSealer(masterKey: CredentialSealer.newMasterKey()))
            let app = try await administration.createApp(name: "Cache", bundleID: "com.example.cache", androidPackage: nil)
            let lookup = try #require(APIKeys.parse(app.secretKey)).lookup
            let clock = ManualClock()
            let cache = APIKeyCache(store: store, now: clock.now)
            #expect(try await cache.record(lookup: lookup)?.appID == app.app.id)

            // Rotated by another process (here: without telling the cache): trusted until the lifetime runs out.
            _ = try await administration.rotateKeys(appID: app.app.id)
            clock.advance(by: .seconds(4))
            #expect(try await cache.record(lookup: lookup) != nil)
            clock.advance(by: .seconds(2))
            #expect(try await cache.record(lookup: lookup) == nil)

            // Rotated by this process: forgotten at once.
            let rotated = try await administration.rotateKeys(appID: app.app.id)
            let newLookup = try #require(APIKeys.parse(rotated.secretKey)).lookup
            #expect(try await cache.record(lookup: newLookup) != nil)
            let telling = AppAdministration(
                store: store, sealer: try CredentialSealer(masterKey: CredentialSealer.newMasterKey()), keysRevoked: { cache.forget(appID: $0) }
            )
            _ = try await telling.rotateKeys(appID: app.app.id)
            #expect(try await cache.record(lookup: newLookup) == nil)
        }
    }
}
