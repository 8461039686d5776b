import Foundation
import LivelineCore
import LivelineTestSupport
import Testing

@testable import LivelineStore

@Suite("Priority-10 pushes in the instances table")
struct Priority10TimesTests {
    @Test("the list of times written before the tally is still read, padded or not")
    func legacyText() {
        #expect(Priority10Times.decode("1700000000,1700000100") == [1_700_000_000, 1_700_000_100])
        #expect(Priority10Times.decode("1700000000,1700000100" + String(repeating: " ", count: 75)) == [1_700_000_000, 1_700_000_100])
        #expect(Priority10Times.decode(nil) == [])
        #expect(Priority10Times.decode("") == [])
    }

    @Test("a row written before the tally counts its list of times; its first progress writes the tally", arguments: StoreKind.available)
    func rowFromBeforeTheTally(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("d1", token: "aa1"), at: t0)
            let now = Int64(t0.timeIntervalSince1970)
            // As the row was before the tally: its times in the text column, no tally.
            _ = try await store.write(
                "UPDATE instances SET priority10_tally = NULL, priority10_sent = ? WHERE device_id = 'd1'",
                [.text("\(now - 4000),\(now - 600),\(now - 60)" + String(repeating: " ", count: 60))]
            )
            let before = try #require(try await instance("d1", in: store))
            #expect(before.priority10.used(at: now) == 2, "the push of 4,000 s ago is out of the window")
            #expect(try await store.priority10Usage(appID: "app_test", activityID: "order-1").map { $0.tally.used(at: now) } == [2])

            var progress = DeliveryProgress(
                appID: "app_test", activityID: "order-1", delivered: [PushedInstance(deviceID: "d1", token: "aa1", sequence: 1)]
            )
            progress.priority10Tallies = [(PushedInstance(deviceID: "d1", token: "aa1", sequence: 1), before.priority10.recording(at: now))]
            try await store.recordProgress(progress, at: t0)
            let after = try #require(try await instance("d1", in: store))
            #expect(after.priority10.used(at: now) == 3)
            let written = try await store.write("SELECT priority10_tally FROM instances WHERE device_id = 'd1'", [])
            #expect(written.first?.column("priority10_tally")?.integer == Int(after.priority10.packed))
        }
    }

    @Test("a new iPhone's tally is written at once, an Android phone's not at all", arguments: StoreKind.available)
    func newInstances(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("d1", token: "aa1"), at: t0)
            var android = registration("d2", token: "fcm-token-2")
            android.platform = .android
            _ = try await store.registerInstance(android, at: t0)
            let rows = try await store.write("SELECT device_id, priority10_tally FROM instances ORDER BY device_id", [])
            #expect(rows.map { $0.column("priority10_tally")?.integer } == [
                Int(Priority10Tally.empty(at: Int64(t0.timeIntervalSince1970)).packed), nil,
            ])
            let iPhone = try #require(try await instance("d1", in: store))
            #expect(iPhone.priority10 == Priority10Tally(packed: 0), "no push counted")
        }
    }

    private func instance(_ deviceID: String, in store: SQLStore) async throws -> InstanceRecord? {
        try await store.instances(appID: "app_test", activityID: "order-1", cursor: nil, limit: 10).items.first { $0.deviceID == deviceID }
    }
}
