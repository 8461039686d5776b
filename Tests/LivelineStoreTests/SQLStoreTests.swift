import Foundation
import LivelineCore
@testable import LivelineStore
import LivelineTestSupport
import Testing

let t0 = Date(timeIntervalSince1970: 1_795_255_200)

func makeApp(_ store: some Store, id: String = "app_test") async throws {
    try await store.createApp(
        AppRecord(id: id, name: "Test", bundleID: "com.example.test", androidPackage: nil, createdAt: t0),
        keys: [APIKeyRecord(id: "lookup-\(id)", appID: id, scope: .secret, hash: Array(repeating: 7, count: 32), createdAt: t0)]
    )
}

func registration(_ device: String, activity: String = "order-1", app: String = "app_test", token: String = "aabb") -> InstanceRegistration {
    InstanceRegistration(
        appID: app, activityID: activity, deviceID: device, platform: .ios, pushToken: token,
        attributesType: "DeliveryAttributes", attributes: ["orderId": "1"], userID: "user-1"
    )
}

@Suite("SQLite store")
struct SQLStoreTests {
    @Test("migrations create the schema once and are idempotent on reopen")
    func migrations() async throws {
        try await withTemporaryStore { store, path in
            let latest = try await store.schemaVersion()
            #expect(latest >= 2)
            let again = try await SQLStore.open(path: path)
            #expect(try await again.schemaVersion() == latest)
            try await again.close()
        }
    }

    @Test("apps and keys: create, look up, rotate revokes old keys", arguments: StoreKind.available)
    func appsAndKeys(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            #expect(try await store.apps().map(\.id) == ["app_test"])
            #expect(try await store.app(id: "app_test")?.bundleID == "com.example.test")
            let key = try #require(try await store.apiKey(id: "lookup-app_test"))
            #expect(key.hash == Array(repeating: 7, count: 32))
            #expect(key.scope == .secret)
            let fresh = APIKeyRecord(id: "new-key", appID: "app_test", scope: .publishable, hash: [1, 2, 3], createdAt: t0)
            try await store.replaceKeys(appID: "app_test", with: [fresh])
            #expect(try await store.apiKey(id: "lookup-app_test") == nil)
            #expect(try await store.apiKey(id: "new-key")?.scope == .publishable)
            await #expect(throws: StoreError.appNotFound) { try await store.replaceKeys(appID: "nope", with: []) }
            await #expect(throws: StoreError.duplicateApp) { try await makeApp(store) }
        }
    }

    @Test("registration creates the activity, is idempotent, and rotation overwrites the token", arguments: StoreKind.available)
    func registrationLifecycle(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let first = try await store.registerInstance(registration("device-1"), at: t0)
            #expect(first.change == .created)
            #expect(!first.needsDelivery, "no state to catch up on yet")
            let again = try await store.registerInstance(registration("device-1"), at: t0.addingTimeInterval(5))
            #expect(again.change == .unchanged)
            #expect(again.instance.updatedAt == first.instance.updatedAt)
            let rotated = try await store.registerInstance(registration("device-1", token: "ccdd"), at: t0.addingTimeInterval(9))
            #expect(rotated.change == .updated)
            #expect(!rotated.needsDelivery)
            #expect(rotated.instance.pushToken == "ccdd")
            var other = registration("device-2")
            other.attributesType = "Other"
            other.attributes = ["different": true]
            _ = try await store.registerInstance(other, at: t0)
            let activity = try #require(try await store.activity(appID: "app_test", activityID: "order-1"))
            #expect(activity.attributesType == "DeliveryAttributes")  // kept from the first registration
            #expect(activity.attributes == ["orderId": "1"])
            #expect(activity.instanceCounts[.active] == 2)
            #expect(activity.sequence == 0)
        }
    }

    @Test("updates take the next sequence; an activity without instances keeps its latest state", arguments: StoreKind.available)
    func updates(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let one = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "match-42", contentState: ["score": "0-0"]), at: t0)
            let two = try await store.acceptUpdate(
                ActivityUpdate(appID: "app_test", activityID: "match-42", contentState: ["score": "1-0"], staleDate: 99, priority: 5),
                at: t0.addingTimeInterval(1)
            )
            #expect(one.sequence == 1)
            #expect(two.sequence == 2)
            let late = try await store.registerInstance(registration("late", activity: "match-42"), at: t0.addingTimeInterval(2))
            #expect(late.needsDelivery, "a newcomer is caught up on the accepted state")
            let rotated = try await store.registerInstance(registration("late", activity: "match-42", token: "eeff"), at: t0.addingTimeInterval(3))
            #expect(rotated.needsDelivery, "so is a new token")
            let same = try await store.registerInstance(registration("late", activity: "match-42", token: "eeff"), at: t0.addingTimeInterval(4))
            #expect(!same.needsDelivery)
            let activity = try #require(try await store.activity(appID: "app_test", activityID: "match-42"))
            #expect(activity.contentState == ["score": "1-0"])
            #expect(activity.sequence == 2)
            #expect(activity.staleDate == 99)
            #expect(activity.priority == 5)
            #expect(activity.sequenceAt == t0.addingTimeInterval(1))
            #expect(activity.attributesType == "DeliveryAttributes")  // first registration fills it in
        }
    }

    @Test("end is a sequence; nothing is accepted after it", arguments: StoreKind.available)
    func end(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: ["n": 1]), at: t0)
            let ended = try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "a", dismissalDate: 123), at: t0)
            #expect(ended.sequence == 2)
            #expect(ended.event == .end)
            let activity = try #require(try await store.activity(appID: "app_test", activityID: "a"))
            #expect(activity.state == .ended)
            #expect(activity.contentState == ["n": 1])  // kept when the end brings none
            #expect(activity.dismissalDate == 123)
            await #expect(throws: StoreError.activityEnded) {
                try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "a", contentState: [:]), at: t0)
            }
            await #expect(throws: StoreError.activityEnded) { try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "a"), at: t0) }
            await #expect(throws: StoreError.activityEnded) { try await store.registerInstance(registration("d", activity: "a"), at: t0) }
            await #expect(throws: StoreError.activityNotFound) { try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "zz"), at: t0) }
        }
    }

    @Test("instance events: dismissed is final, frequent pushes recorded", arguments: StoreKind.available)
    func instanceEvents(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("d1"), at: t0)
            let dismissed = try await store.recordInstanceEvent(appID: "app_test", activityID: "order-1", deviceID: "d1", event: .dismissedOnDevice, at: t0)
            #expect(dismissed.state == .dismissed)
            let rotated = try await store.registerInstance(registration("d1", token: "eeff"), at: t0)
            #expect(rotated.instance.state == .dismissed)
            let frequent = try await store.setFrequentPushes(appID: "app_test", activityID: "order-1", deviceID: "d1", enabled: true, at: t0)
            #expect(frequent.frequentPushesEnabled == true)
            await #expect(throws: StoreError.instanceNotFound) {
                try await store.recordInstanceEvent(appID: "app_test", activityID: "order-1", deviceID: "nobody", event: .endedOnDevice, at: t0)
            }
        }
    }

    @Test("keyset pagination visits every activity and instance once, with filters", arguments: StoreKind.available)
    func pagination(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for index in 0..<25 {
                _ = try await store.acceptUpdate(
                    ActivityUpdate(appID: "app_test", activityID: String(format: "act-%02d", index), contentState: ["i": .integer(Int64(index))]),
                    at: t0
                )
                _ = try await store.registerInstance(registration(String(format: "dev-%02d", index), activity: "act-00"), at: t0)
            }
            _ = try await store.endActivity(ActivityEnd(appID: "app_test", activityID: "act-03"), at: t0)
            var seen: [String] = []
            var cursor: String?
            repeat {
                let page = try await store.activities(appID: "app_test", filter: ActivityFilter(), cursor: cursor, limit: 10)
                seen += page.items.map(\.activityID)
                cursor = page.nextCursor
            } while cursor != nil
            #expect(seen == (0..<25).map { String(format: "act-%02d", $0) })
            let ended = try await store.activities(appID: "app_test", filter: ActivityFilter(state: .ended), cursor: nil, limit: 10)
            #expect(ended.items.map(\.activityID) == ["act-03"])
            #expect(ended.nextCursor == nil)
            let typed = try await store.activities(appID: "app_test", filter: ActivityFilter(attributesType: "DeliveryAttributes"), cursor: nil, limit: 10)
            #expect(typed.items.map(\.activityID) == ["act-00"])
            #expect(typed.items.first?.instanceCounts[.active] == 25)

            var devices: [String] = []
            cursor = nil
            repeat {
                let page = try await store.instances(appID: "app_test", activityID: "act-00", cursor: cursor, limit: 7)
                devices += page.items.map(\.deviceID)
                cursor = page.nextCursor
            } while cursor != nil
            #expect(devices == (0..<25).map { String(format: "dev-%02d", $0) })
            await #expect(throws: StoreError.invalidCursor) {
                try await store.instances(appID: "app_test", activityID: "act-00", cursor: "%%%", limit: 7)
            }
        }
    }

    @Test("one app never sees another's activities", arguments: StoreKind.available)
    func tenantIsolation(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store, id: "app_a")
            try await makeApp(store, id: "app_b")
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_a", activityID: "shared-id", contentState: ["owner": "a"]), at: t0)
            #expect(try await store.activity(appID: "app_b", activityID: "shared-id") == nil)
            #expect(try await store.activities(appID: "app_b", filter: ActivityFilter(), cursor: nil, limit: 10).items.isEmpty)
            let b = try await store.acceptUpdate(ActivityUpdate(appID: "app_b", activityID: "shared-id", contentState: ["owner": "b"]), at: t0)
            #expect(b.sequence == 1)
            #expect(try await store.activity(appID: "app_a", activityID: "shared-id")?.contentState == ["owner": "a"])
        }
    }

    @Test("data survives closing and reopening the file")
    func durability() async throws {
        try await withTemporaryStore { store, path in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("d1"), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "order-1", contentState: ["eta": 5]), at: t0)
            let reopened = try await SQLStore.open(path: path)
            let activity = try await reopened.activity(appID: "app_test", activityID: "order-1")
            try await reopened.close()
            #expect(activity?.contentState == ["eta": 5])
            #expect(activity?.instanceCounts[.active] == 1)
        }
    }

    @Test("concurrent updates each get their own sequence", arguments: StoreKind.available)
    func concurrentUpdates(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            let sequences = try await withThrowingTaskGroup(of: Int64.self) { group in
                for index in 0..<40 {
                    group.addTask {
                        try await store.acceptUpdate(
                            ActivityUpdate(appID: "app_test", activityID: "busy", contentState: ["i": .integer(Int64(index))]), at: t0
                        ).sequence
                    }
                }
                return try await group.reduce(into: [Int64]()) { $0.append($1) }
            }
            #expect(sequences.sorted() == Array(1...40))
        }
    }

    @Test("events all pruned: the next event's position comes after every one given, not from 1 again", arguments: StoreKind.available)
    func pruningKeepsThePosition(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for n in 1...3 {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "match", contentState: ["n": .integer(Int64(n))]), at: t0)
            }
            let before = try await store.events(appID: "app_test", after: nil, types: [], limit: 100)
            let last = try #require(before.last)
            #expect(before.count == 3)
            // Every event is past its retention.
            #expect(try await store.pruneEvents(olderThan: t0.addingTimeInterval(3_600)) == 3)
            #expect(try await store.events(appID: "app_test", after: nil, types: [], limit: 100).isEmpty)
            #expect(try await store.pruneEvents(olderThan: t0.addingTimeInterval(3_600)) == 0)

            _ = try await store.acceptUpdate(
                ActivityUpdate(appID: "app_test", activityID: "match", contentState: ["n": 4]), at: t0.addingTimeInterval(7_200)
            )
            // A reader (or a webhook) that had seen the last event sees the new one after it.
            let after = try await store.events(appID: "app_test", after: last.position, types: [], limit: 100)
            #expect(after.map(\.type) == [.activityUpdated])
            #expect(after.allSatisfy { $0.position > last.position })
            #expect(!before.map(\.id).contains(after.first?.id ?? ""))
        }
    }
}

@Suite("SQLite store: delivery progress")
struct DeliveryProgressTests {
    @Test("progress for a token that rotated meanwhile does not mark the new token as served", arguments: StoreKind.available)
    func rotatedTokenStaysBehind(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("d1", token: "aaaa"), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "order-1", contentState: ["n": 1]), at: t0)
            _ = try await store.registerInstance(registration("d1", token: "bbbb"), at: t0)  // rotation while the push to aaaa is in flight
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "order-1", delivered: [PushedInstance(deviceID: "d1", token: "aaaa", sequence: 1)],
                                 invalidated: [PushedInstance(deviceID: "d1", token: "aaaa", sequence: 1)]),
                at: t0
            )
            let instance = try #require(try await store.instances(appID: "app_test", activityID: "order-1", cursor: nil, limit: 5).items.first)
            #expect(instance.deliveredSequence == 0)
            #expect(instance.state == .active)
            let pending = try await store.pendingInstances(appID: "app_test", activityID: "order-1", below: 1, platforms: [.ios], after: nil, limit: 10)
            #expect(pending.map(\.pushToken) == ["bbbb"])
        }
    }

    @Test("delivered instances raise only the devices and tokens named, not the instances between them, and never lower a sequence", arguments: StoreKind.available)
    func deliveredChunkRaisesWhatItNames(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for device in ["d1", "d2", "d3", "d4", "d5"] {
                _ = try await store.registerInstance(registration(device, token: "aa" + device.dropFirst()), at: t0)
            }
            for n in 1...2 {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "order-1", contentState: ["n": .integer(Int64(n))]), at: t0)
            }
            _ = try await store.registerInstance(registration("d3", token: "bb3"), at: t0)  // rotated while aa3 was pushed to
            // d2 lies between the devices of the chunk and was not sent to; d5 lies beyond them.
            let chunk = ["d1": "aa1", "d3": "aa3", "d4": "aa4"].map { PushedInstance(deviceID: $0.key, token: $0.value, sequence: 2) }
            try await store.recordProgress(DeliveryProgress(appID: "app_test", activityID: "order-1", delivered: chunk), at: t0)
            func delivered() async throws -> [Int64] {
                try await store.instances(appID: "app_test", activityID: "order-1", cursor: nil, limit: 10).items.map(\.deliveredSequence)
            }
            #expect(try await delivered() == [2, 0, 0, 2, 0])
            // An answer to an older push comes in late.
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "order-1", delivered: [PushedInstance(deviceID: "d1", token: "aa1", sequence: 1)]),
                at: t0
            )
            #expect(try await delivered() == [2, 0, 0, 2, 0])
            let pending = try await store.pendingInstances(appID: "app_test", activityID: "order-1", below: 2, platforms: [.ios], after: nil, limit: 10)
            #expect(pending.map(\.deviceID) == ["d2", "d3", "d5"] && pending.map(\.pushToken) == ["aa2", "bb3", "aa5"])
            // The count of a pass's instances is that of the pages it reads, whatever their limit.
            func count(below: Int64, platforms: [Platform] = [.ios], after: String? = nil, through: String? = nil) async throws -> Int {
                try await store.pendingInstanceCount(
                    appID: "app_test", activityID: "order-1", below: below, platforms: platforms, after: after, through: through
                )
            }
            #expect(try await count(below: 2) == 3)
            #expect(try await count(below: 2, platforms: [.ios, .android]) == 3)
            #expect(try await count(below: 2, platforms: [.android]) == 0)
            #expect(try await count(below: 2, platforms: []) == 0)
            #expect(try await count(below: 3) == 5)
            #expect(try await count(below: 2, after: "d2") == 2)
            #expect(try await count(below: 2, after: "d2", through: "d4") == 1)
        }
    }

    @Test("a batch that only delivers is written whole, its timeline with it (one statement on PostgreSQL); one that changes states is not joined", arguments: StoreKind.available)
    func deliveredBatchTogether(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for device in ["d1", "d2", "d3"] {
                _ = try await store.registerInstance(registration(device, token: "aa" + device.dropFirst()), at: t0)
            }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "order-1", contentState: ["n": 1]), at: t0)
            func attempt(_ device: String) -> DeliveryRecord {
                DeliveryRecord(
                    appID: "app_test", activityID: "order-1", deviceID: device, platform: .ios, sequence: 1, event: .update, priority: 10,
                    status: .delivered, providerID: "id-\(device)", reason: nil, latencyMilliseconds: 1.5, attempt: 1, attemptedAt: t0
                )
            }
            let delivered = DeliveryProgress(
                appID: "app_test", activityID: "order-1",
                delivered: [PushedInstance(deviceID: "d1", token: "aa1", sequence: 1), PushedInstance(deviceID: "d2", token: "aa2", sequence: 1)],
                attempts: [attempt("d1"), attempt("d2")]
            )
            #expect(SQLStore.progressGoesTogether(delivered))
            try await store.recordProgress(delivered, at: t0)
            var invalidated = DeliveryProgress(
                appID: "app_test", activityID: "order-1", delivered: [], invalidated: [PushedInstance(deviceID: "d3", token: "aa3", sequence: 1)]
            )
            invalidated.attempts = [attempt("d3")]
            #expect(!SQLStore.progressGoesTogether(invalidated))
            try await store.recordProgress(invalidated, at: t0)
            let pending = try await store.pendingInstances(appID: "app_test", activityID: "order-1", below: 1, platforms: [.ios], after: nil, limit: 10)
            #expect(pending.isEmpty)
            let instances = try await store.instances(appID: "app_test", activityID: "order-1", cursor: nil, limit: 10).items
            #expect(instances.map(\.deliveredSequence) == [1, 1, 0] && instances.map(\.state) == [.active, .active, .invalidated])
            // Newest first: the second batch's attempt, then the first's in their order.
            let timeline = try await store.deliveries(appID: "app_test", activityID: "order-1", cursor: nil, limit: 10).items
            #expect(timeline.map(\.deviceID) == ["d3", "d2", "d1"])
            // More attempts than a segment holds keep their segments' order: not joined.
            var large = delivered
            large.attempts = Array(repeating: attempt("d1"), count: SQLStore.attemptsPerSegment + 1)
            #expect(!SQLStore.progressGoesTogether(large))
        }
    }

    @Test("progress raises delivered sequences (never lowers them), keeps priority-10 tallies and moves states, per instance", arguments: StoreKind.available)
    func progressPerInstance(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            for device in ["d1", "d2", "d3", "d4"] {
                _ = try await store.registerInstance(registration(device, token: "aa" + device.dropFirst()), at: t0)
            }
            for n in 1...3 {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "order-1", contentState: ["n": .integer(Int64(n))]), at: t0)
            }
            var progress = DeliveryProgress(
                appID: "app_test", activityID: "order-1",
                delivered: [PushedInstance(deviceID: "d1", token: "aa1", sequence: 3), PushedInstance(deviceID: "d2", token: "aa2", sequence: 2)],
                invalidated: [PushedInstance(deviceID: "d3", token: "aa3", sequence: 3)]
            )
            let tally = Priority10Tally(times: [1_795_255_100, 1_795_255_200])
            progress.priority10Tallies = [(PushedInstance(deviceID: "d1", token: "aa1", sequence: 3), tally)]
            try await store.recordProgress(progress, at: t0)
            // A late batch for an older sequence does not lower d1.
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "order-1", delivered: [PushedInstance(deviceID: "d1", token: "aa1", sequence: 1)]),
                at: t0
            )
            let instances = try await store.instances(appID: "app_test", activityID: "order-1", cursor: nil, limit: 10).items
            let byDevice = Dictionary(uniqueKeysWithValues: instances.map { ($0.deviceID, $0) })
            #expect(byDevice["d1"]?.deliveredSequence == 3)
            #expect(byDevice["d1"]?.priority10 == tally)
            #expect(byDevice["d1"]?.priority10.used(at: 1_795_255_200) == 2)
            #expect(byDevice["d2"]?.deliveredSequence == 2)
            #expect(byDevice["d2"]?.priority10.used(at: 1_795_255_200) == 0)
            #expect(byDevice["d3"]?.state == .invalidated)
            #expect(byDevice["d4"]?.deliveredSequence == 0)
            #expect(byDevice["d4"]?.state == .active)
        }
    }

    @Test("the phone registering its refused token again revives the instance, which is caught up; once active, the same registration changes nothing", arguments: StoreKind.available)
    func refusedTokenRegisteredAgain(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            _ = try await store.registerInstance(registration("d1", token: "aa1"), at: t0)
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "order-1", contentState: ["n": 1]), at: t0)
            // APNs answered BadDeviceToken (say, the pushes went to its other environment).
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "order-1", invalidated: [PushedInstance(deviceID: "d1", token: "aa1", sequence: 1)]),
                at: t0
            )
            let refused = try await store.registerInstance(registration("d1", token: "aa1"), at: t0.addingTimeInterval(1))
            #expect(refused.change == .updated)
            #expect(refused.instance.state == .active)
            #expect(refused.needsDelivery)
            let pending = try await store.pendingInstances(appID: "app_test", activityID: "order-1", below: 1, platforms: [.ios], after: nil, limit: 10)
            #expect(pending.map(\.pushToken) == ["aa1"])
            let events = try await store.events(appID: "app_test", after: nil, types: [.instanceRegistered, .instanceTokenRotated], limit: 10)
            #expect(events.map(\.type) == [.instanceRegistered, .instanceRegistered])
            // Active again: the same registration is the idempotent one.
            let again = try await store.registerInstance(registration("d1", token: "aa1"), at: t0.addingTimeInterval(2))
            #expect(again.change == .unchanged)
            #expect(!again.needsDelivery)
        }
    }

    @Test("the delivery timeline drops attempts past the retention and keeps only the newest per activity", arguments: StoreKind.available)
    func timelineRetention(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            // The timeline keeps attempts only of activities that exist.
            for activity in ["a", "b"] { _ = try await store.registerInstance(registration("setup", activity: activity), at: t0) }
            func attempt(_ activity: String, _ n: Int, at date: Date) -> DeliveryRecord {
                DeliveryRecord(
                    appID: "app_test", activityID: activity, deviceID: "d\(n)", platform: .ios, sequence: 1, event: .update, priority: 10,
                    status: .delivered, providerID: nil, reason: nil, latencyMilliseconds: 1, attempt: 1, attemptedAt: date
                )
            }
            let old = t0.addingTimeInterval(-8 * 86400)
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "a", attempts: (0..<5).map { attempt("a", $0, at: old) }), at: old
            )
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "a", attempts: (5..<8).map { attempt("a", $0, at: t0) }), at: t0
            )
            try await store.recordProgress(
                DeliveryProgress(appID: "app_test", activityID: "b", attempts: (0..<30).map { attempt("b", $0, at: t0) }), at: t0
            )
            try await store.pruneDeliveries(olderThan: t0.addingTimeInterval(-7 * 86400), keepPerActivity: 20)
            let a = try await store.deliveries(appID: "app_test", activityID: "a", cursor: nil, limit: 100).items
            #expect(Set(a.map(\.deviceID)) == ["d5", "d6", "d7"])
            let b = try await store.deliveries(appID: "app_test", activityID: "b", cursor: nil, limit: 100).items
            #expect(Set(b.map(\.deviceID)) == Set((10..<30).map { "d\($0)" }))
        }
    }
}
