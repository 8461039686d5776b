import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import SQLiteNIO
import Testing

/// A device written straight into the devices tables, so these tests exercise the start's own SQL.
private func device(
    _ store: SQLStore, _ id: String, platform: Platform, user: String? = nil, tags: [String: String] = [:],
    startTokens: [String: String] = [:], fcm: String? = nil, app: String = "app_test"
) async throws {
    let millis = SQLStore.millis(t0)
    _ = try await store.write(
        "INSERT INTO devices (app_id, device_id, platform, user_id, tags, fcm_token, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [.text(app), .text(id), .text(platform.rawValue), SQLStore.text(user),
         .text(JSONValue.object(tags.mapValues(JSONValue.string)).encodedString), SQLStore.text(fcm), .integer(millis), .integer(millis)]
    )
    for (key, value) in tags {
        _ = try await store.write(
            "INSERT INTO device_tags (app_id, device_id, key, value) VALUES (?, ?, ?, ?)", [.text(app), .text(id), .text(key), .text(value)]
        )
    }
    for (type, token) in startTokens {
        _ = try await store.write(
            "INSERT INTO push_to_start_tokens (app_id, device_id, attributes_type, token, updated_at) VALUES (?, ?, ?, ?, ?)",
            [.text(app), .text(id), .text(type), .text(token), .integer(millis)]
        )
    }
}

private func start(
    _ audience: StartAudience, activity: String = "match-1", type: String = "MatchAttributes", app: String = "app_test"
) -> ActivityStart {
    ActivityStart(
        appID: app, activityID: activity, attributesType: type, attributes: ["home": "Lions"], contentState: ["minute": 1],
        alert: LiveActivityAlert(title: "Kick-off", body: "Lions – Tigers"), audience: audience
    )
}

/// Four devices: an iPhone with a push-to-start token for the type, one with a token for another type only, an
/// Android phone with an FCM token and one without.
private func fourDevices(_ store: SQLStore) async throws {
    try await device(store, "ios-1", platform: .ios, user: "user-1", tags: ["team": "lions", "tier": "gold"], startTokens: ["MatchAttributes": "aa01"])
    try await device(store, "ios-2", platform: .ios, user: "user-2", tags: ["team": "lions"], startTokens: ["OtherAttributes": "aa02"])
    try await device(store, "android-1", platform: .android, user: "user-1", tags: ["team": "lions", "tier": "gold"], fcm: "fcm-token-1")
    try await device(store, "android-2", platform: .android, user: "user-3")
}

@Suite("SQLite store: remote starts")
struct StartStoreTests {
    @Test("a start is one activity row and one audience row, counted: who has a token is reached, the rest skipped", arguments: StoreKind.available)
    func acceptedAndCounted(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            let accepted = try await store.startActivity(start(.all), at: t0)
            #expect(accepted.sequence.sequence == 1)
            #expect(accepted.sequence.event == .start)
            #expect(accepted.counts == AudienceCounts(ios: 1, android: 1, skipped: 2))
            // O(1) writes: no instance yet; the engine admits the audience.
            #expect(try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items.isEmpty)
            let activity = try #require(try await store.activity(appID: "app_test", activityID: "match-1"))
            #expect(activity.attributesType == "MatchAttributes")
            #expect(activity.startAlert == LiveActivityAlert(title: "Kick-off", body: "Lions – Tigers"))
            #expect(activity.alert == nil)
            #expect(activity.contentState == ["minute": 1])
        }
    }

    @Test("admitted devices become starting instances at the token their start goes to; the activity stays pending until all are", arguments: StoreKind.available)
    func admission(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            let claim = try #require(try await store.claimToSend(owner: "w", now: t0, lease: 30))
            #expect(claim.activity.activityID == "match-1")
            #expect(try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0) == false)
            let instances = try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items
            #expect(instances.map(\.deviceID) == ["android-1", "ios-1"])
            #expect(instances.allSatisfy { $0.state == .starting && $0.deliveredSequence == 0 })
            #expect(instances.map(\.pushToken) == ["fcm-token-1", "aa01"])
            let pending = try await store.pendingInstances(
                appID: "app_test", activityID: "match-1", below: 1, platforms: [.ios, .android], after: nil, limit: 10
            )
            #expect(pending.count == 2)
        }
    }

    @Test("an iPhone gets nothing after its start until it registers its own token; an Android phone keeps receiving", arguments: StoreKind.available)
    func afterTheStart(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0)
            try await store.recordProgress(
                DeliveryProgress(
                    appID: "app_test", activityID: "match-1",
                    delivered: [PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 1), PushedInstance(deviceID: "android-1", token: "fcm-token-1", sequence: 1)]
                ),
                at: t0
            )
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "match-1", contentState: ["minute": 2]), at: t0)
            var pending = try await store.pendingInstances(
                appID: "app_test", activityID: "match-1", below: 2, platforms: [.ios, .android], after: nil, limit: 10
            )
            #expect(pending.map(\.deviceID) == ["android-1"])
            // The app on the iPhone registers the activity's update token: active, and caught up at once.
            let registered = try await store.registerInstance(
                InstanceRegistration(
                    appID: "app_test", activityID: "match-1", deviceID: "ios-1", platform: .ios, pushToken: "bb01",
                    attributesType: "MatchAttributes", attributes: nil, userID: nil
                ),
                at: t0
            )
            #expect(registered.instance.state == .active)
            #expect(registered.needsDelivery)
            // The Android app confirms with the same FCM token.
            let android = try await store.registerInstance(
                InstanceRegistration(
                    appID: "app_test", activityID: "match-1", deviceID: "android-1", platform: .android, pushToken: "fcm-token-1",
                    attributesType: nil, attributes: nil, userID: nil
                ),
                at: t0
            )
            #expect(android.instance.state == .active)
            #expect(android.instance.deliveredSequence == 1)
            pending = try await store.pendingInstances(
                appID: "app_test", activityID: "match-1", below: 2, platforms: [.ios, .android], after: nil, limit: 10
            )
            #expect(Set(pending.map(\.deviceID)) == ["android-1", "ios-1"])
        }
    }

    @Test("an iPhone confirming with the token of the activity its start created is not sent the state it shows again", arguments: StoreKind.available)
    func confirmedWithoutRepeat(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0)
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "match-1", delivered: [PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 1)]),
                at: t0
            )
            let registered = try await store.registerInstance(
                InstanceRegistration(
                    appID: "app_test", activityID: "match-1", deviceID: "ios-1", platform: .ios, pushToken: "bb01",
                    attributesType: "MatchAttributes", attributes: nil, userID: nil
                ),
                at: t0
            )
            #expect(registered.instance.state == .active)
            #expect(registered.instance.deliveredSequence == 1)
            #expect(!registered.needsDelivery)
        }
    }

    @Test(
        "an iPhone confirming before its start's delivery is written still has the start's sequence once it is: no repeat",
        arguments: StoreKind.available
    )
    func confirmedBeforeTheStartIsRecorded(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0)
            // The phone shows the start and registers the activity's update token before the engine has written the
            // start's delivery (a fast phone, or a busy writer).
            let registered = try await store.registerInstance(
                InstanceRegistration(
                    appID: "app_test", activityID: "match-1", deviceID: "ios-1", platform: .ios, pushToken: "bb01",
                    attributesType: "MatchAttributes", attributes: nil, userID: nil
                ),
                at: t0
            )
            #expect(registered.instance.deliveredSequence == 0)
            var progress = DeliveryProgress(appID: "app_test", activityID: "match-1")
            progress.startsDelivered = [PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 1)]
            try await store.recordProgress(progress, at: t0)
            let pending = try await store.pendingInstances(
                appID: "app_test", activityID: "match-1", below: 1, platforms: [.ios], after: nil, limit: 10
            )
            #expect(!pending.map(\.deviceID).contains("ios-1"), "the update token is not sent the state the start showed")
            let instance = try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items
                .first { $0.deviceID == "ios-1" }
            #expect(instance?.deliveredSequence == 1)
            #expect(instance?.pushToken == "bb01")
            // An update's delivery to the old token still moves nothing.
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "match-1", contentState: ["minute": 2]), at: t0)
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "match-1", delivered: [PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 2)]),
                at: t0
            )
            let after = try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items
                .first { $0.deviceID == "ios-1" }
            #expect(after?.deliveredSequence == 1)
        }
    }

    @Test("audiences by device ids (unknown ones skipped), user ids and tags (all must match)", arguments: StoreKind.available)
    func audiences(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            let byID = try await store.startActivity(start(.deviceIDs(["ios-1", "ios-2", "nobody"]), activity: "a"), at: t0)
            #expect(byID.counts == AudienceCounts(ios: 1, android: 0, skipped: 2))
            let byUser = try await store.startActivity(start(.userIDs(["user-1"]), activity: "b"), at: t0)
            #expect(byUser.counts == AudienceCounts(ios: 1, android: 1, skipped: 0))
            let byTags = try await store.startActivity(start(.tags(["team": "lions", "tier": "gold"]), activity: "c"), at: t0)
            #expect(byTags.counts == AudienceCounts(ios: 1, android: 1, skipped: 0))
            let oneTag = try await store.startActivity(start(.tags(["team": "lions"]), activity: "d"), at: t0)
            #expect(oneTag.counts == AudienceCounts(ios: 1, android: 1, skipped: 1))
            _ = try await store.admitStartAudience(appID: "app_test", activityID: "b", limit: 1000, at: t0)
            let instances = try await store.instances(appID: "app_test", activityID: "b", cursor: nil, limit: 10).items
            #expect(instances.map(\.deviceID) == ["android-1", "ios-1"])
        }
    }

    @Test("a large audience is admitted a page at a time", arguments: StoreKind.available)
    func paging(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for index in 0..<5 {
                try await device(store, "phone-\(index)", platform: .ios, startTokens: ["MatchAttributes": "cc0\(index)"])
            }
            _ = try await store.startActivity(start(.all), at: t0)
            #expect(try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 2, at: t0))
            #expect(try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 2, at: t0))
            #expect(try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 2, at: t0) == false)
            #expect(try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items.count == 5)
        }
    }

    @Test("a claim released before its audience is admitted leaves the activity pending", arguments: StoreKind.available)
    func releaseWaitsForAdmission(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try #require(try await store.claimToSend(owner: "w", now: t0, lease: 30))
            let done = try await store.releaseClaim(appID: "app_test", activityID: "match-1", owner: "w", platforms: [.ios, .android], retryAt: t0)
            #expect(!done)
            #expect(try await store.claimToSend(owner: "w", now: t0, lease: 30) != nil)
        }
    }

    @Test("a start on an ended activity, or with another attributes type, is refused; on an active one its audience is added", arguments: StoreKind.available)
    func refusals(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.deviceIDs(["ios-1"])), at: t0)
            await #expect(throws: StoreError.attributesTypeMismatch(existing: "MatchAttributes")) {
                try await store.startActivity(start(.all, type: "OtherAttributes"), at: t0)
            }
            let again = try await store.startActivity(start(.userIDs(["user-1"])), at: t0)
            #expect(again.sequence.sequence == 2)
            _ = try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "match-1"), at: t0)
            await #expect(throws: StoreError.activityEnded) { try await store.startActivity(start(.all), at: t0) }
            // An ended activity starts nowhere: what was not admitted is dropped.
            #expect(try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0) == false)
            #expect(try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items.isEmpty)
        }
    }

    @Test("a refused push-to-start token is dropped from its device, with its reason; the next start skips the device", arguments: StoreKind.available)
    func refusedTokenDropped(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0)
            var progress = DeliveryProgress(
                appID: "app_test", activityID: "match-1", invalidated: [PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 1)]
            )
            progress.refusedTokens = [(PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 1), "Unregistered")]
            try await store.recordProgress(progress, at: t0)
            let row = try #require(
                try await store.write(
                    "SELECT dropped_at, drop_reason FROM push_to_start_tokens WHERE app_id = 'app_test' AND device_id = 'ios-1'", []
                ).first
            )
            #expect(row.column("drop_reason")?.string == "Unregistered")
            #expect(row.column("dropped_at")?.integer == SQLStore.millis(t0))
            let instance = try #require(try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items.first { $0.deviceID == "ios-1" })
            #expect(instance.state == .invalidated)
            let next = try await store.startActivity(start(.all, activity: "match-2"), at: t0)
            #expect(next.counts == AudienceCounts(ios: 0, android: 1, skipped: 3))
        }
    }

    @Test("deleting a device withdraws its remote starts not yet sent; the ones sent, and its other instances, stay", arguments: StoreKind.available)
    func deletedDeviceWithdrawsStarts(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try await store.startActivity(start(.all, activity: "match-2"), at: t0)
            for activity in ["match-1", "match-2"] {
                _ = try await store.admitStartAudience(appID: "app_test", activityID: activity, limit: 1000, at: t0)
            }
            // match-2's start went out to both phones; match-1's to neither yet.
            let sent = [PushedInstance(deviceID: "ios-1", token: "aa01", sequence: 1), PushedInstance(deviceID: "android-1", token: "fcm-token-1", sequence: 1)]
            var progress = DeliveryProgress(appID: "app_test", activityID: "match-2", delivered: sent)
            progress.startsDelivered = sent
            try await store.recordProgress(progress, at: t0)
            // And ios-1 watches a third activity of its own.
            _ = try await store.registerInstance(
                InstanceRegistration(appID: "app_test", activityID: "match-3", deviceID: "ios-1", platform: .ios, pushToken: "bb01", attributesType: nil, attributes: nil, userID: nil), at: t0
            )

            let later = t0.addingTimeInterval(5)
            #expect(try await store.deleteDevice(appID: "app_test", deviceID: "ios-1", at: later))
            #expect(try await store.deleteDevice(appID: "app_test", deviceID: "android-1", at: later))
            func state(_ activity: String, _ device: String) async throws -> InstanceState? {
                try await store.instances(appID: "app_test", activityID: activity, cursor: nil, limit: 10).items.first { $0.deviceID == device }?.state
            }
            #expect(try await state("match-1", "ios-1") == .ended)
            #expect(try await state("match-1", "android-1") == .ended)
            #expect(try await state("match-2", "ios-1") == .starting, "its start went out: the phone shows it")
            #expect(try await state("match-2", "android-1") == .starting)
            #expect(try await state("match-3", "ios-1") == .active)
            let pending = try await store.instances(appID: "app_test", activityID: "match-1", cursor: nil, limit: 10).items
            #expect(pending.allSatisfy { $0.state == .ended || ($0.deviceID != "ios-1" && $0.deviceID != "android-1") })
            let ended = try await store.events(appID: "app_test", after: nil, types: [.instanceEnded], limit: 100)
            #expect(ended.compactMap(\.deviceID).sorted() == ["android-1", "ios-1"])
            #expect(ended.allSatisfy { $0.activityID == "match-1" && $0.data.objectValue?["reason"] == "device_deleted" && $0.data.objectValue?["reportedBy"] == "backend" })
        }
    }

    @Test("instances still starting after the allowed time are listed as unconfirmed, oldest first", arguments: StoreKind.available)
    func unconfirmed(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            try await fourDevices(store)
            _ = try await store.startActivity(start(.all), at: t0)
            _ = try await store.admitStartAudience(appID: "app_test", activityID: "match-1", limit: 1000, at: t0)
            let none = try await store.unconfirmedStarts(appID: "app_test", activityID: "match-1", startedBefore: t0.addingTimeInterval(-120), limit: 10)
            #expect(none.count == 0)
            let late = try await store.unconfirmedStarts(appID: "app_test", activityID: "match-1", startedBefore: t0.addingTimeInterval(1), limit: 1)
            #expect(late.count == 2)
            #expect(late.instances.count == 1)
            // Other apps see nothing of it.
            try await makeApp(store, id: "app_other")
            #expect(try await store.unconfirmedStarts(appID: "app_other", activityID: "match-1", startedBefore: t0.addingTimeInterval(1), limit: 10).count == 0)
        }
    }
}
