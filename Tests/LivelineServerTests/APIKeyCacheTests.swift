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

    /// A Store whose key reads, once `hold` is set, stop after reading until the test lets them go on: a read in flight
    /// while a revocation is committed and heard.
    final class HeldReads: AppStore {
        let store: any AppStore
        let hold = Mutex(false)
        private let reads: AsyncStream<Void>.Continuation
        let readsWaiting: AsyncStream<Void>
        private let releases: AsyncStream<Void>
        let release: AsyncStream<Void>.Continuation

        init(_ store: any AppStore) {
            self.store = store
            (readsWaiting, reads) = AsyncStream.makeStream(of: Void.self)
            (releases, release) = AsyncStream.makeStream(of: Void.self)
        }

        func apiKey(id: String) async throws -> APIKeyRecord? {
            let record = try await store.apiKey(id: id)
            if hold.withLock({ $0 }) {
                reads.yield()
                var iterator = releases.makeAsyncIterator()
                _ = await iterator.next()
            }
            return record
        }

        func createApp(_ app: AppRecord, keys: [APIKeyRecord]) async throws { try await store.createApp(app, keys: keys) }
        func apps() async throws -> [AppRecord] { try await store.apps() }
        func app(id: String) async throws -> AppRecord? { try await store.app(id: id) }
        func replaceKeys(appID: String, with keys: [APIKeyRecord]) async throws { try await store.replaceKeys(appID: appID, with: keys) }
        func setBudget(appID: String, _ budget: BudgetOverride) async throws { try await store.setBudget(appID: appID, budget) }
        func setAudienceFrom(appID: String, _ source: AudienceSource) async throws { try await store.setAudienceFrom(appID: appID, source) }
        func deleteApp(id: String, leavingChannels: Bool) async throws -> AppDeletion? {
            try await store.deleteApp(id: id, leavingChannels: leavingChannels)
        }
    }

    @Test("a key read before its app's keys are forgotten is not kept after: the next request reads the Store again")
    func readInFlightDuringForgetting() async throws {
        try await withTemporaryStore { store, _ in
            let administration = AppAdministration(store: store, sealer: try CredentialSealer(masterKey: CredentialSealer.newMasterKey()))
            let app = try await administration.createApp(name: "Race", bundleID: "com.example.race", androidPackage: nil)
            let lookup = try #require(APIKeys.parse(app.secretKey)).lookup
            let held = HeldReads(store)
            let cache = APIKeyCache(store: held)
            held.hold.withLock { $0 = true }
            // The read finds the key live, and stops before keeping it.
            let reading = Task { try await cache.record(lookup: lookup) }
            var waiting = held.readsWaiting.makeAsyncIterator()
            _ = await waiting.next()
            // Meanwhile the keys are rotated (elsewhere) and the cache is told.
            _ = try await administration.rotateKeys(appID: app.app.id)
            cache.forget(appID: app.app.id)
            held.hold.withLock { $0 = false }
            held.release.yield()
            #expect(try await reading.value != nil, "the request that read it before the revocation goes through")
            #expect(try await cache.record(lookup: lookup) == nil, "a revoked key was kept from a read made before it was forgotten")
        }
    }

    @Test("forgetting every key (notices may have been missed) reads each again from the Store")
    func forgetAll() async throws {
        try await withTemporaryStore { store, _ in
            let administration = AppAdministration(store: store, sealer: try CredentialSealer(masterKey: CredentialSealer.newMasterKey()))
            let app = try await administration.createApp(name: "All", bundleID: "com.example.all", androidPackage: nil)
            let lookup = try #require(APIKeys.parse(app.secretKey)).lookup
            let cache = APIKeyCache(store: store, now: ManualClock().now)
            #expect(try await cache.record(lookup: lookup) != nil)
            _ = try await administration.rotateKeys(appID: app.app.id)
            #expect(try await cache.record(lookup: lookup) != nil, "still trusted: nothing said")
            cache.forgetAll()
            #expect(try await cache.record(lookup: lookup) == nil)
        }
    }
}
