import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

private func iPhone(
    _ device: String, app: String = "app_test", userID: FieldUpdate<String> = .keep, tags: [String: String]? = nil,
    tokens: [String: String?] = [:]
) -> DeviceRegistration {
    DeviceRegistration(appID: app, deviceID: device, platform: .ios, userID: userID, tags: tags, pushToStartTokens: tokens)
}

@Suite("Devices in the SQLite store")
struct DeviceStoreTests {
    @Test("a registration creates the device once; the same registration again changes nothing", arguments: StoreKind.available)
    func idempotentUpsert(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            var registration = iPhone("phone-1", userID: .set("user-1"), tags: ["team": "red"], tokens: ["MatchAttributes": "aabb"])
            registration.osVersion = .set("17.2")
            registration.locale = .set("en-US")
            let first = try await store.putDevice(registration, at: t0)
            #expect(first.created)
            #expect(first.device.userID == "user-1")
            #expect(first.device.tags == ["team": "red"])
            #expect(first.device.pushToStartTokens == [PushToStartToken(attributesType: "MatchAttributes", token: "aabb", updatedAt: t0)])
            #expect(first.device.osVersion == "17.2" && first.device.locale == "en-US")
            let again = try await store.putDevice(registration, at: t0.addingTimeInterval(5))
            #expect(!again.created)
            #expect(again.device == first.device, "nothing changed, not even updatedAt")
            #expect(try await store.device(appID: "app_test", deviceID: "phone-1") == first.device)

            // Absent fields keep, null clears, a value replaces.
            let kept = try await store.putDevice(iPhone("phone-1"), at: t0.addingTimeInterval(6))
            #expect(kept.device == first.device)
            var change = iPhone("phone-1", userID: .clear)
            change.locale = .set("de-DE")
            let changed = try await store.putDevice(change, at: t0.addingTimeInterval(7))
            #expect(changed.device.userID == nil)
            #expect(changed.device.locale == "de-DE")
            #expect(changed.device.osVersion == "17.2")
            #expect(changed.device.updatedAt == t0.addingTimeInterval(7))
            #expect(changed.device.createdAt == t0)
        }
    }

    @Test("push-to-start tokens merge per attributes type; null removes one; a new token clears its drop", arguments: StoreKind.available)
    func pushToStartTokens(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.putDevice(iPhone("phone-1", tokens: ["MatchAttributes": "aa01", "OrderAttributes": "bb01"]), at: t0)
            let merged = try await store.putDevice(iPhone("phone-1", tokens: ["OrderAttributes": "bb02"]), at: t0.addingTimeInterval(1))
            #expect(merged.device.pushToStartTokens.map(\.token) == ["aa01", "bb02"])
            #expect(merged.device.pushToStartToken(for: "OrderAttributes")?.updatedAt == t0.addingTimeInterval(1))
            #expect(merged.device.pushToStartToken(for: "MatchAttributes")?.updatedAt == t0)

            let removed = try await store.putDevice(
                iPhone("phone-1", tokens: ["MatchAttributes": nil, "Unknown": nil] as [String: String?]), at: t0.addingTimeInterval(2)
            )
            #expect(removed.device.pushToStartTokens.map(\.attributesType) == ["OrderAttributes"])

            try await store.dropDeviceToken(appID: "app_test", deviceID: "phone-1", token: "bb02", reason: "BadDeviceToken", at: t0.addingTimeInterval(3))
            let dropped = try #require(try await store.device(appID: "app_test", deviceID: "phone-1")?.pushToStartToken(for: "OrderAttributes"))
            #expect(!dropped.isUsable)
            #expect(dropped.dropReason == "BadDeviceToken" && dropped.droppedAt == t0.addingTimeInterval(3))

            // The phone registers the same token again: usable again (it re-registered, so it vouches for it).
            let again = try await store.putDevice(iPhone("phone-1", tokens: ["OrderAttributes": "bb02"]), at: t0.addingTimeInterval(4))
            #expect(again.device.pushToStartToken(for: "OrderAttributes")?.isUsable == true)
            try await store.dropDeviceToken(appID: "app_test", deviceID: "phone-1", token: "bb02", reason: "Unregistered", at: t0.addingTimeInterval(5))
            // A rotated token replaces the dropped one and is usable.
            let rotated = try await store.putDevice(iPhone("phone-1", tokens: ["OrderAttributes": "bb03"]), at: t0.addingTimeInterval(6))
            let token = try #require(rotated.device.pushToStartToken(for: "OrderAttributes"))
            #expect(token == PushToStartToken(attributesType: "OrderAttributes", token: "bb03", updatedAt: t0.addingTimeInterval(6)))
            #expect(try await store.device(appID: "app_test", deviceID: "phone-1")?.pushToStartTokens == [token])
        }
    }

    @Test("a drop marks only the token that still matches, push-to-start or FCM, and keeps its first time", arguments: StoreKind.available)
    func dropByToken(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.putDevice(iPhone("phone-1", tokens: ["A": "aa01", "B": "bb01"]), at: t0)
            _ = try await store.putDevice(iPhone("phone-1", tokens: ["A": "aa02"]), at: t0.addingTimeInterval(1))
            // The stale token (rotated since) is left alone.
            try await store.dropDeviceToken(appID: "app_test", deviceID: "phone-1", token: "aa01", reason: "BadDeviceToken", at: t0.addingTimeInterval(2))
            #expect(try await store.device(appID: "app_test", deviceID: "phone-1")?.pushToStartTokens.allSatisfy(\.isUsable) == true)
            try await store.dropDeviceToken(appID: "app_test", deviceID: "phone-1", token: "bb01", reason: "BadDeviceToken", at: t0.addingTimeInterval(3))
            try await store.dropDeviceToken(appID: "app_test", deviceID: "phone-1", token: "bb01", reason: "Unregistered", at: t0.addingTimeInterval(4))
            let device = try #require(try await store.device(appID: "app_test", deviceID: "phone-1"))
            #expect(device.pushToStartToken(for: "A")?.isUsable == true)
            #expect(device.pushToStartToken(for: "B")?.droppedAt == t0.addingTimeInterval(3))
            #expect(device.pushToStartToken(for: "B")?.dropReason == "BadDeviceToken")

            let android = DeviceRegistration(appID: "app_test", deviceID: "pixel-1", platform: .android, fcmToken: .set("fcm:one"))
            _ = try await store.putDevice(android, at: t0)
            try await store.dropDeviceToken(appID: "app_test", deviceID: "pixel-1", token: "fcm:old", reason: "UNREGISTERED", at: t0.addingTimeInterval(1))
            #expect(try await store.device(appID: "app_test", deviceID: "pixel-1")?.fcmTokenDroppedAt == nil)
            try await store.dropDeviceToken(appID: "app_test", deviceID: "pixel-1", token: "fcm:one", reason: "UNREGISTERED", at: t0.addingTimeInterval(2))
            let dropped = try #require(try await store.device(appID: "app_test", deviceID: "pixel-1"))
            #expect(dropped.fcmToken == "fcm:one")
            #expect(dropped.fcmTokenDroppedAt == t0.addingTimeInterval(2) && dropped.fcmTokenDropReason == "UNREGISTERED")
            // A new FCM token clears the drop.
            var rotated = android
            rotated.fcmToken = .set("fcm:two")
            let fresh = try await store.putDevice(rotated, at: t0.addingTimeInterval(3)).device
            #expect(fresh.fcmToken == "fcm:two" && fresh.fcmTokenDroppedAt == nil && fresh.fcmTokenDropReason == nil)
        }
    }

    @Test("tags replace the whole set; listings filter by user and by several tags, paged by device id", arguments: StoreKind.available)
    func tagsFiltersAndPaging(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.putDevice(iPhone("d1", userID: .set("u1"), tags: ["team": "red", "tier": "gold"]), at: t0)
            _ = try await store.putDevice(iPhone("d2", userID: .set("u1"), tags: ["team": "red"]), at: t0)
            _ = try await store.putDevice(iPhone("d3", userID: .set("u2"), tags: ["team": "red", "tier": "gold"]), at: t0)
            _ = try await store.putDevice(iPhone("d4", tags: ["team": "blue", "tier": "gold"]), at: t0)

            let replaced = try await store.putDevice(iPhone("d2", tags: ["tier": "gold"]), at: t0.addingTimeInterval(1))
            #expect(replaced.device.tags == ["tier": "gold"])

            func ids(_ filter: DeviceFilter) async throws -> [String] {
                try await store.devices(appID: "app_test", filter: filter, cursor: nil, limit: 50).items.map(\.deviceID)
            }
            #expect(try await ids(DeviceFilter()) == ["d1", "d2", "d3", "d4"])
            #expect(try await ids(DeviceFilter(userID: "u1")) == ["d1", "d2"])
            #expect(try await ids(DeviceFilter(tags: [DeviceTag(key: "team", value: "red")])) == ["d1", "d3"])
            let redGold = [DeviceTag(key: "team", value: "red"), DeviceTag(key: "tier", value: "gold")]
            #expect(try await ids(DeviceFilter(tags: redGold)) == ["d1", "d3"])
            #expect(try await ids(DeviceFilter(userID: "u1", tags: redGold)) == ["d1"])
            #expect(try await ids(DeviceFilter(tags: [DeviceTag(key: "tier", value: "gold")])) == ["d1", "d2", "d3", "d4"])
            #expect(try await ids(DeviceFilter(tags: [DeviceTag(key: "team", value: "red"), DeviceTag(key: "team", value: "blue")])) == [])

            // Tags cleared with an empty set leave the tag index too.
            _ = try await store.putDevice(iPhone("d1", tags: [:]), at: t0.addingTimeInterval(2))
            #expect(try await ids(DeviceFilter(tags: redGold)) == ["d3"])

            let gold = DeviceFilter(tags: [DeviceTag(key: "tier", value: "gold")])
            let first = try await store.devices(appID: "app_test", filter: gold, cursor: nil, limit: 2)
            #expect(first.items.map(\.deviceID) == ["d2", "d3"])
            let cursor = try #require(first.nextCursor)
            let second = try await store.devices(appID: "app_test", filter: gold, cursor: cursor, limit: 2)
            #expect(second.items.map(\.deviceID) == ["d4"])
            #expect(second.nextCursor == nil)
            let all = try await store.devices(appID: "app_test", filter: DeviceFilter(), cursor: nil, limit: 3)
            #expect(all.items.map(\.deviceID) == ["d1", "d2", "d3"])
            let rest = try await store.devices(appID: "app_test", filter: DeviceFilter(), cursor: all.nextCursor, limit: 3)
            #expect(rest.items.map(\.deviceID) == ["d4"] && rest.nextCursor == nil)
            await #expect(throws: StoreError.invalidCursor) {
                try await store.devices(appID: "app_test", filter: DeviceFilter(), cursor: "!!", limit: 3)
            }
        }
    }

    @Test("a device's tokens come with it in listings", arguments: StoreKind.available)
    func tokensInListings(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.putDevice(iPhone("d1", tokens: ["A": "aa01"]), at: t0)
            _ = try await store.putDevice(iPhone("d2", tokens: ["A": "aa02", "B": "bb02"]), at: t0)
            let page = try await store.devices(appID: "app_test", filter: DeviceFilter(), cursor: nil, limit: 10)
            #expect(page.items.map { $0.pushToStartTokens.map(\.token) } == [["aa01"], ["aa02", "bb02"]])
        }
    }

    @Test("delete removes the device, its tags and tokens; a second delete finds nothing", arguments: StoreKind.available)
    func delete(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.putDevice(iPhone("d1", tags: ["team": "red"], tokens: ["A": "aa01"]), at: t0)
            #expect(try await store.deleteDevice(appID: "app_test", deviceID: "d1", at: Date()))
            #expect(try await store.device(appID: "app_test", deviceID: "d1") == nil)
            #expect(!(try await store.deleteDevice(appID: "app_test", deviceID: "d1", at: Date())))
            #expect(try await store.devices(appID: "app_test", filter: DeviceFilter(tags: [DeviceTag(key: "team", value: "red")]), cursor: nil, limit: 5).items.isEmpty)
            // Registered again, it starts afresh: no token of its former life comes back.
            let again = try await store.putDevice(iPhone("d1"), at: t0.addingTimeInterval(1))
            #expect(again.created)
            #expect(again.device.pushToStartTokens.isEmpty && again.device.tags.isEmpty)
        }
    }

    @Test("a device's platform never changes", arguments: StoreKind.available)
    func platformMismatch(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.putDevice(iPhone("d1"), at: t0)
            await #expect(throws: StoreError.platformMismatch(registered: .ios)) {
                try await store.putDevice(DeviceRegistration(appID: "app_test", deviceID: "d1", platform: .android), at: t0)
            }
            await #expect(throws: StoreError.appNotFound) { try await store.putDevice(iPhone("d1", app: "app_nope"), at: t0) }
        }
    }

    @Test("one app never sees or touches another's device of the same id", arguments: StoreKind.available)
    func appIsolation(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store, id: "app_a")
            try await makeApp(store, id: "app_b")
            _ = try await store.putDevice(iPhone("shared", app: "app_a", userID: .set("u"), tags: ["t": "1"], tokens: ["A": "aa01"]), at: t0)
            #expect(try await store.device(appID: "app_b", deviceID: "shared") == nil)
            #expect(try await store.devices(appID: "app_b", filter: DeviceFilter(), cursor: nil, limit: 10).items.isEmpty)
            #expect(try await store.devices(appID: "app_b", filter: DeviceFilter(userID: "u", tags: [DeviceTag(key: "t", value: "1")]), cursor: nil, limit: 10).items.isEmpty)
            try await store.dropDeviceToken(appID: "app_b", deviceID: "shared", token: "aa01", reason: "BadDeviceToken", at: t0)
            #expect(!(try await store.deleteDevice(appID: "app_b", deviceID: "shared", at: Date())))
            // App B registers its own device under the same id: two devices, each with its own tokens.
            let other = try await store.putDevice(iPhone("shared", app: "app_b", tokens: ["A": "bb01"]), at: t0)
            #expect(other.created)
            let mine = try #require(try await store.device(appID: "app_a", deviceID: "shared"))
            #expect(mine.pushToStartTokens.map(\.token) == ["aa01"] && mine.pushToStartTokens.allSatisfy(\.isUsable))
            #expect(mine.userID == "u" && mine.tags == ["t": "1"])
            #expect(try await store.deleteDevice(appID: "app_b", deviceID: "shared", at: Date()))
            #expect(try await store.device(appID: "app_a", deviceID: "shared") != nil)
        }
    }

    @Test("the registration rule: what changes, which token rows to save or remove, and when updatedAt moves")
    func registrationRule() {
        let stored = DeviceRecord(
            appID: "app_test", deviceID: "d1", platform: .ios, userID: "u1", tags: ["team": "red"],
            pushToStartTokens: [
                PushToStartToken(attributesType: "A", token: "aa01", updatedAt: t0),
                PushToStartToken(attributesType: "B", token: "bb01", updatedAt: t0, droppedAt: t0, dropReason: "BadDeviceToken"),
                PushToStartToken(attributesType: "C", token: "cc01", updatedAt: t0),
            ],
            fcmToken: nil, osVersion: "17.2", locale: "en-US", createdAt: t0, updatedAt: t0
        )
        let later = t0.addingTimeInterval(60)
        let same = iPhone("d1", userID: .set("u1"), tags: ["team": "red"], tokens: ["A": "aa01"]).applied(to: stored, at: later)
        #expect(!same.changed)
        #expect(same.device == stored, "nothing changed, not even updatedAt")

        let outcome = iPhone("d1", tokens: ["A": "aa02", "B": "bb01", "C": nil, "D": nil]).applied(to: stored, at: later)
        #expect(outcome.changed && !outcome.deviceRowChanged && !outcome.tagsChanged)
        #expect(outcome.savedPushToStartTokens == [
            PushToStartToken(attributesType: "A", token: "aa02", updatedAt: later),
            PushToStartToken(attributesType: "B", token: "bb01", updatedAt: later),
        ])
        #expect(outcome.removedPushToStartTypes == ["C"])
        #expect(outcome.device.pushToStartTokens.map(\.attributesType) == ["A", "B"])
        let allUsable = outcome.device.pushToStartTokens.allSatisfy { $0.isUsable }
        #expect(allUsable, "B registered again is usable again")
        #expect(outcome.device.updatedAt == later)

        var fields = iPhone("d1", userID: .clear, tags: [:])
        fields.locale = .set("de-DE")
        let changed = fields.applied(to: stored, at: later)
        #expect(changed.deviceRowChanged && changed.tagsChanged)
        #expect(changed.device.userID == nil && changed.device.tags.isEmpty && changed.device.locale == "de-DE")
        #expect(changed.device.osVersion == "17.2")
    }

    @Test("migration 11 creates the device tables")
    func migration() async throws {
        try await withTemporaryStore { store, _ in
            let version = try await store.schemaVersion()
            #expect(version >= 11)
        }
    }
}
