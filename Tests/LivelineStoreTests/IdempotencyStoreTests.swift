import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

/// A claim whose request is told apart by `request` and whose response names the accepted sequence.
private func claim(_ key: String, request: UInt8 = 1) -> IdempotencyClaim<AcceptedSequence> {
    IdempotencyClaim(key: key, fingerprint: Array(repeating: request, count: 32)) { accepted in
        StoredResponse(status: 202, body: Array("\(accepted.event.rawValue) \(accepted.sequence)".utf8))
    }
}

private func update(_ n: Int64, app: String = "app_test", activity: String = "order-1") -> ActivityUpdate {
    ActivityUpdate(appID: app, activityID: activity, contentState: ["n": .integer(n)])
}

@Suite("SQLite store: idempotency keys")
struct IdempotencyStoreTests {
    @Test("the same key and request again: the first response, and the activity's sequence does not advance", arguments: StoreKind.available)
    func replay(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let first = try await store.acceptUpdate(update(1), at: t0, idempotency: claim("k"))
            guard case .performed(let accepted) = first else { Issue.record("not performed: \(first)"); return }
            #expect(accepted.sequence == 1)

            let again = try await store.acceptUpdate(update(1), at: t0.addingTimeInterval(5), idempotency: claim("k"))
            guard case .replayed(let response) = again else { Issue.record("not replayed: \(again)"); return }
            #expect(response == StoredResponse(status: 202, body: Array("update 1".utf8)))
            let activity = try #require(try await store.activity(appID: "app_test", activityID: "order-1"))
            #expect(activity.sequence == 1, "a replay accepts nothing: the delivery engine has nothing new to send")
            #expect(activity.updatedAt == t0)
        }
    }

    @Test("the same key with another request is refused, and nothing is accepted", arguments: StoreKind.available)
    func reuse(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.acceptUpdate(update(1), at: t0, idempotency: claim("k"))
            await #expect(throws: StoreError.idempotencyKeyReused) {
                try await store.acceptUpdate(update(2), at: t0.addingTimeInterval(1), idempotency: claim("k", request: 2))
            }
            await #expect(throws: StoreError.idempotencyKeyReused) {
                try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "order-1"), at: t0, idempotency: claim("k", request: 3))
            }
            let activity = try #require(try await store.activity(appID: "app_test", activityID: "order-1"))
            #expect(activity.sequence == 1)
            #expect(activity.state == .active)
        }
    }

    @Test("keys are per app: app B's k is not app A's k", arguments: StoreKind.available)
    func perApp(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store, id: "app_a")
            try await makeApp(store, id: "app_b")
            let a = try await store.acceptUpdate(update(1, app: "app_a"), at: t0, idempotency: claim("k"))
            let b = try await store.acceptUpdate(update(1, app: "app_b"), at: t0, idempotency: claim("k", request: 2))
            guard case .performed = a, case .performed = b else { Issue.record("\(a), \(b)"); return }
            #expect(try await store.idempotencyRecord(appID: "app_a", key: "k")?.fingerprint == Array(repeating: 1, count: 32))
            #expect(try await store.idempotencyRecord(appID: "app_b", key: "k")?.fingerprint == Array(repeating: 2, count: 32))
            #expect(try await store.idempotencyRecord(appID: "app_test", key: "k") == nil)
        }
    }

    @Test("a key remembered 24 hours or more ago is free again: the request is accepted afresh and remembered anew", arguments: StoreKind.available)
    func afterRetention(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.acceptUpdate(update(1), at: t0, idempotency: claim("k"))
            let later = t0.addingTimeInterval(IdempotencyKey.retention)
            let fresh = try await store.acceptUpdate(update(2), at: later, idempotency: claim("k", request: 2))
            guard case .performed(let accepted) = fresh else { Issue.record("not performed: \(fresh)"); return }
            #expect(accepted.sequence == 2)
            let record = try #require(try await store.idempotencyRecord(appID: "app_test", key: "k"))
            #expect(record.fingerprint == Array(repeating: 2, count: 32))
            #expect(record.response.body == Array("update 2".utf8))
            #expect(record.acceptedAt == later)
        }
    }

    @Test("a write that fails leaves no record: only accepted requests are remembered", arguments: StoreKind.available)
    func failureNotRemembered(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            await #expect(throws: StoreError.activityNotFound) {
                try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "nope"), at: t0, idempotency: claim("k"))
            }
            #expect(try await store.idempotencyRecord(appID: "app_test", key: "k") == nil)
            let outcome = try await store.acceptUpdate(update(1), at: t0, idempotency: claim("k", request: 2))
            guard case .performed = outcome else { Issue.record("not performed: \(outcome)"); return }
        }
    }

    @Test("an end retried after it ended the activity is replayed, not refused as ended", arguments: StoreKind.available)
    func endReplay(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.acceptUpdate(update(1), at: t0)
            let end = ActivityEnd(appID: "app_test", activityID: "order-1")
            _ = try await store.endActivity(end, at: t0, idempotency: claim("end-1"))
            let again = try await store.endActivity(end, at: t0.addingTimeInterval(2), idempotency: claim("end-1"))
            guard case .replayed(let response) = again else { Issue.record("not replayed: \(again)"); return }
            #expect(response.body == Array("end 2".utf8))
            #expect(try await store.activity(appID: "app_test", activityID: "order-1")?.sequence == 2)
        }
    }

    @Test("two requests with one new key at once: one is accepted, the other replays it", arguments: StoreKind.available)
    func concurrent(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            async let one = store.acceptUpdate(update(1), at: t0, idempotency: claim("k"))
            async let two = store.acceptUpdate(update(1), at: t0, idempotency: claim("k"))
            let outcomes = try await [one, two]
            let performed = outcomes.filter { if case .performed = $0 { true } else { false } }
            #expect(performed.count == 1)
            #expect(try await store.activity(appID: "app_test", activityID: "order-1")?.sequence == 1)
        }
    }

    @Test("instance events under a key: replayed with the first instance, reuse refused", arguments: StoreKind.available)
    func instanceEvents(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("device-1"), at: t0)
            let respond: @Sendable (InstanceRecord) -> StoredResponse = { StoredResponse(status: 200, body: Array($0.state.rawValue.utf8)) }
            let dismissed = IdempotencyClaim(key: "e", fingerprint: [1], respond: respond)
            let first = try await store.recordInstanceEvent(
                appID: "app_test", activityID: "order-1", deviceID: "device-1", event: .dismissedOnDevice, at: t0, idempotency: dismissed
            )
            guard case .performed(let instance) = first else { Issue.record("not performed: \(first)"); return }
            #expect(instance.state == .dismissed)
            let again = try await store.recordInstanceEvent(
                appID: "app_test", activityID: "order-1", deviceID: "device-1", event: .dismissedOnDevice, at: t0, idempotency: dismissed
            )
            guard case .replayed(let response) = again else { Issue.record("not replayed: \(again)"); return }
            #expect(response == StoredResponse(status: 200, body: Array("dismissed".utf8)))
            await #expect(throws: StoreError.idempotencyKeyReused) {
                try await store.setFrequentPushes(
                    appID: "app_test", activityID: "order-1", deviceID: "device-1", enabled: true, at: t0,
                    idempotency: IdempotencyClaim(key: "e", fingerprint: [2], respond: respond)
                )
            }
        }
    }

    @Test("pruning forgets the keys remembered before the cutoff, and only those", arguments: StoreKind.available)
    func prune(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.acceptUpdate(update(1), at: t0, idempotency: claim("old"))
            _ = try await store.acceptUpdate(update(2), at: t0.addingTimeInterval(3600), idempotency: claim("young"))
            #expect(try await store.pruneIdempotencyKeys(olderThan: t0.addingTimeInterval(1800)) == 1)
            #expect(try await store.idempotencyRecord(appID: "app_test", key: "old") == nil)
            #expect(try await store.idempotencyRecord(appID: "app_test", key: "young") != nil)
            #expect(try await store.pruneIdempotencyKeys(olderThan: t0.addingTimeInterval(1800)) == 0)
        }
    }
}
