import LivelineStore
import Synchronization

/// API keys recently read from the Store, so that authenticating a request does not go to the database each time.
///
/// Only keys found are kept, each for ``lifetime``; a key this process revokes (``forget(appID:)``, called when an
/// app's keys are rotated) is forgotten at once. A key revoked by another process on the same database — `liveline
/// keys rotate` beside a running server — still works on this one for at most ``lifetime``. Verification still hashes
/// the presented key and compares it with the stored hash in constant time: the cache holds records, never keys.
final class APIKeyCache: Sendable {
    /// How long a key read from the Store is trusted without reading it again.
    static let lifetime: Duration = .seconds(5)
    /// At most this many keys are kept; past it the cache starts over.
    static let capacity = 10_000

    private struct Entry {
        var record: APIKeyRecord
        var readAt: ContinuousClock.Instant
    }

    private let store: any AppStore
    private let now: @Sendable () -> ContinuousClock.Instant
    private let entries = Mutex<[String: Entry]>([:])

    init(store: any AppStore, now: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }) {
        self.store = store
        self.now = now
    }

    /// The unrevoked key record with lookup id `lookup`, from the cache while it is fresh, else from the Store.
    func record(lookup: String) async throws -> APIKeyRecord? {
        let at = now()
        if let entry = entries.withLock({ $0[lookup] }), at - entry.readAt < Self.lifetime { return entry.record }
        guard let record = try await store.apiKey(id: lookup) else {
            entries.withLock { _ = $0.removeValue(forKey: lookup) }
            return nil
        }
        entries.withLock { entries in
            if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
            entries[lookup] = Entry(record: record, readAt: at)
        }
        return record
    }

    /// Forgets every key of `appID` (its keys were just revoked).
    func forget(appID: String) {
        entries.withLock { entries in entries = entries.filter { $0.value.record.appID != appID } }
    }
}
