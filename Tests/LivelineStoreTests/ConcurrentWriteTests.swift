import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

/// On PostgreSQL, registrations and updates run at READ COMMITTED and lock their activity's row first
/// (``WriteIsolation/lockingRows``): concurrent writes to one activity must still come out as if one after another.
@Suite("Concurrent writes to one activity")
struct ConcurrentWriteTests {
    @Test("concurrent updates to one activity take every sequence once, and the activity ends at the last", arguments: StoreKind.available)
    func concurrentUpdatesTakeEverySequenceOnce(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "match", contentState: ["n": 0]), at: t0)
            let sequences = try await withThrowingTaskGroup(of: Int64.self) { group in
                for n in 1...24 {
                    group.addTask {
                        try await store.acceptUpdate(
                            ActivityUpdate(appID: "app_test", activityID: "match", contentState: ["n": .integer(Int64(n))]),
                            at: t0.addingTimeInterval(Double(n))
                        ).sequence
                    }
                }
                return try await group.reduce(into: [Int64]()) { $0.append($1) }
            }
            #expect(sequences.sorted() == Array(2...25))
            #expect(try await store.activity(appID: "app_test", activityID: "match")?.sequence == 25)
        }
    }

    @Test("concurrent registrations to one activity, beside updates of it, are all kept", arguments: StoreKind.available)
    func concurrentRegistrationsAreAllKept(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for n in 0..<40 {
                    group.addTask {
                        _ = try await store.registerInstance(
                            InstanceRegistration(
                                appID: "app_test", activityID: "match", deviceID: String(format: "device-%03d", n), platform: .ios,
                                pushToken: String(repeating: "a", count: 63) + String(n % 10), attributesType: "MatchAttributes",
                                attributes: ["home": "A"], userID: nil
                            ),
                            at: t0
                        )
                    }
                }
                for n in 1...8 {
                    group.addTask {
                        _ = try await store.acceptUpdate(
                            ActivityUpdate(appID: "app_test", activityID: "match", contentState: ["n": .integer(Int64(n))]), at: t0
                        )
                    }
                }
                try await group.waitForAll()
            }
            let instances = try await store.instances(appID: "app_test", activityID: "match", cursor: nil, limit: 100).items
            #expect(instances.count == 40)
            #expect(Set(instances.map(\.deviceID)).count == 40)
            #expect(try await store.activity(appID: "app_test", activityID: "match")?.sequence == 8)
        }
    }

    @Test("one device registering the same new token many times at once rotates it once", arguments: StoreKind.available)
    func sameTokenAtOnceRotatesOnce(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let t0 = Date(timeIntervalSince1970: 1_795_000_000)
            func registration(_ token: String) -> InstanceRegistration {
                InstanceRegistration(
                    appID: "app_test", activityID: "match", deviceID: "device-1", platform: .ios, pushToken: token,
                    attributesType: "MatchAttributes", attributes: ["home": "A"], userID: nil
                )
            }
            _ = try await store.registerInstance(registration(String(repeating: "1", count: 64)), at: t0)
            let changes = try await withThrowingTaskGroup(of: RegistrationChange.self) { group in
                for _ in 0..<12 {
                    group.addTask { try await store.registerInstance(registration(String(repeating: "2", count: 64)), at: t0).change }
                }
                return try await group.reduce(into: [RegistrationChange]()) { $0.append($1) }
            }
            #expect(changes.filter { $0 == .updated }.count == 1)
            #expect(changes.filter { $0 == .unchanged }.count == 11)
            let rotations = try await store.events(appID: "app_test", after: nil, types: [.instanceTokenRotated], limit: 100)
            #expect(rotations.count == 1)
        }
    }
}
