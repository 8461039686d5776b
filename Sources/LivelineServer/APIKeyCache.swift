import LivelineStore
import Synchronization

/// API keys recently read from the Store, so that authenticating a request does not go to the database each time.
///
/// Only keys found are kept, each for ``lifetime``; a key this process revokes (``forget(appID:)``, called when an
/// app's keys are rotated or the app is deleted) is forgotten at once. So is a key another node sharing a PostgreSQL
/// database revokes, once this node hears the Store's ``AppNotice`` (`liveline serve` forwards it here). Otherwise —
/// `liveline keys rotate` beside a running server on SQLite, or notices missed while a node's connection was lost — a
/// revoked key still works on this process for at most ``lifetime``. Verification still hashes the presented key and
/// compares it with the stored hash in constant time: the cache holds records, never keys.
public final class APIKeyCache: Sendable {
    /// How long a key read from the Store is trusted without reading it again.
    static let lifetime: Duration = .seconds(5)
    /// At most this many keys are kept; past it the cache starts over.
    static let capacity = 10_000

    private struct Entry {
        var record: APIKeyRecord
        var readAt: ContinuousClock.Instant
    }

    private struct Entries {
        var byLookup: [String: Entry] = [:]
        /// Counts forgettings: a record read from the Store before one is not kept after it (it may be a revoked key's,
        /// read just before the revocation was committed and heard).
        var forgettings = 0
    }

    private let store: any AppStore
    private let now: @Sendable () -> ContinuousClock.Instant
    private let entries = Mutex(Entries())

    /// A cache of the keys in `store`, timed by `now`.
    public init(store: any AppStore, now: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }) {
        self.store = store
        self.now = now
    }

    /// The unrevoked key record with lookup id `lookup`, from the cache while it is fresh, else from the Store.
    func record(lookup: String) async throws -> APIKeyRecord? {
        let at = now()
        let (cached, forgettings) = entries.withLock { ($0.byLookup[lookup], $0.forgettings) }
        if let cached, at - cached.readAt < Self.lifetime { return cached.record }
        guard let record = try await store.apiKey(id: lookup) else {
            entries.withLock { _ = $0.byLookup.removeValue(forKey: lookup) }
            return nil
        }
        entries.withLock { entries in
            guard entries.forgettings == forgettings else { return }
            if entries.byLookup.count >= Self.capacity { entries.byLookup.removeAll(keepingCapacity: true) }
            entries.byLookup[lookup] = Entry(record: record, readAt: at)
        }
        return record
    }

    /// Forgets every key of `appID` (its keys were just revoked, or it was deleted).
    public func forget(appID: String) {
        entries.withLock { entries in
            entries.forgettings += 1
            entries.byLookup = entries.byLookup.filter { $0.value.record.appID != appID }
        }
    }

    /// Forgets every key: revocations may have been missed.
    public func forgetAll() {
        entries.withLock { entries in
            entries.forgettings += 1
            entries.byLookup.removeAll()
        }
    }
}
