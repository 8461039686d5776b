import Foundation
import HTTPTypes
import LivelineCore
import LivelineDispatch
import LivelineServer
@testable import LivelineStore
import LivelineTestSupport
import Synchronization
import Testing

private let adminToken = "admin-token-0123456789abcdef"

/// Gives `app` rows in every table an app's data lives in, through the API as its backend and phones would (and the
/// delivery timeline as the engine writes it).
private func populate(_ api: API, _ app: TestApp, store: any Store) async throws {
    let device: JSONValue = [
        "platform": "ios", "userId": "user-1", "tags": ["team": "lions"], "pushToStartTokens": ["MatchAttributes": .string(iosToken)],
    ]
    #expect(try await api.json(.put, "/v1/devices/iphone-1", key: app.publishableKey, device).status == .created)
    let schema: JSONValue = ["contentState": ["home": "integer", "away": "integer"], "attributes": ["home": "string", "away": "string"]]
    #expect(try await api.json(.put, "/v1/attributes-types/MatchAttributes/schema", key: app.secretKey, schema).status == .created)
    #expect(try await api.json(.put, "/v1/activities/order-1/instances/iphone-1", key: app.publishableKey, registerBody).status == .created)
    let update = try await api.call(
        .post, "/v1/activities/order-1/updates", key: app.secretKey, body: #"{"contentState": {"status": "cooking"}}"#,
        headers: [HTTPField.Name("Idempotency-Key")!: "update-1"]
    )
    #expect(update.status == .accepted)
    #expect(try await api.json(.post, "/v1/activities/match-1/start", key: app.secretKey, startBody(["userIds": ["user-1"]])).status == .accepted)
    #expect(try await api.json(.post, "/v1/webhooks", key: app.secretKey, ["url": "http://127.0.0.1:9/liveline"]).status == .created)
    let fcm = try await api.json(
        .put, "/admin/v1/apps/\(app.id)/credentials/fcm", key: adminToken, ["serviceAccount": .string(serviceAccountJSON())]
    )
    #expect(fcm.status == .ok)
    var progress = DeliveryProgress(appID: app.id, activityID: "order-1")
    progress.attempts = [
        DeliveryRecord(
            appID: app.id, activityID: "order-1", deviceID: "iphone-1", platform: .ios, sequence: 1, event: .update, priority: 10,
            status: .delivered, providerID: nil, reason: nil, latencyMilliseconds: 1, attempt: 1, attemptedAt: testStart
        )
    ]
    try await store.recordProgress(progress, at: testStart)
}

/// How many rows of the app each table with an `app_id` holds, by table (tables the app has no row in left out).
private func rows(of appID: String, in store: any Store) async throws -> [String: Int] {
    let store = try #require(store as? SQLStore)
    let tables =
        switch store.dialect {
        case .sqlite:
            try await store.reader.query(
                "SELECT m.name AS name FROM sqlite_master m JOIN pragma_table_info(m.name) p WHERE m.type = 'table' AND p.name = 'app_id'"
            )
        case .postgres:
            try await store.reader.query(
                "SELECT table_name::text AS name FROM information_schema.columns WHERE column_name = 'app_id' AND table_schema = current_schema()"
            )
        }
    var counts: [String: Int] = [:]
    for table in try tables.map({ try $0.string("name") }) {
        let count = try await store.reader.query("SELECT COUNT(*) AS n FROM \(table) WHERE app_id = ?", [.text(appID)]).first?.column("n")?.integer ?? 0
        if count > 0 { counts[table] = Int(count) }
    }
    let apps = try await store.reader.query("SELECT COUNT(*) AS n FROM apps WHERE id = ?", [.text(appID)]).first?.column("n")?.integer ?? 0
    if apps > 0 { counts["apps"] = Int(apps) }
    return counts
}

@Suite("Deleting an app")
struct AppDeletionTests {
    @Test("DELETE /admin/v1/apps/{appId} removes the app and every row it owns, revokes its keys, and leaves other apps whole")
    func deletesEverything() async throws {
        try await withLiveline(adminToken: adminToken, webhookURLs: WebhookURLPolicy(allowsPrivateNetworks: true)) { api, store in
            let leaving = try await createApp(store, name: "Leaving")
            let staying = try await createApp(store, name: "Staying")
            try await populate(api, staying, store: store)
            try await populate(api, leaving, store: store)
            // The leaving app's events are the newest (a feed read gives them their positions on PostgreSQL).
            #expect(try await api.call(.get, "/v1/events", key: leaving.secretKey).status == .ok)
            let sqlStore = try #require(store as? SQLStore)
            let newest = try #require(try await sqlStore.reader.query("SELECT MAX(id) AS id FROM events").first?.column("id")?.integer)
            let before = try await rows(of: leaving.id, in: store)
            // Not vacuous: the app has rows in each table its data lives in.
            for table in [
                "apps", "api_keys", "activities", "instances", "devices", "device_tags", "push_to_start_tokens", "start_audiences",
                "attributes_type_schemas", "idempotency_keys", "events", "webhooks", "app_credentials", "delivery_segments",
            ] {
                #expect(before[table, default: 0] > 0, "no row of the app in \(table) before the deletion")
            }
            let others = try await rows(of: staying.id, in: store)
            #expect(others == before)

            let deleted = try await api.call(.delete, "/admin/v1/apps/\(leaving.id)", key: adminToken)
            #expect(deleted.status == .ok)
            #expect(deleted["app"]?.objectValue?["id"]?.stringValue == leaving.id)
            #expect(deleted["activitiesDeleted"] == 2)
            #expect(deleted["devicesDeleted"] == 1)
            #expect(deleted["channelsDeleted"] == 0)
            #expect(deleted["channelsLeft"] == [])

            #expect(try await rows(of: leaving.id, in: store) == [:])
            #expect(try await rows(of: staying.id, in: store) == others)
            // The feed goes on above the positions the deleted events had: none is given out twice.
            #expect(try await api.json(.post, "/v1/activities/order-1/updates", key: staying.secretKey, ["contentState": [:]]).status == .accepted)
            #expect(try await api.call(.get, "/v1/events", key: staying.secretKey).status == .ok)
            let next = try await sqlStore.reader.query("SELECT MAX(id) AS id FROM events").first?.column("id")?.integer
            #expect(next.map { $0 > newest } == true)
            #expect(try await api.call(.get, "/v1/activities/order-1", key: leaving.secretKey).status == .unauthorized)
            #expect(try await api.json(.put, "/v1/devices/iphone-2", key: leaving.publishableKey, ["platform": "ios"]).status == .unauthorized)
            #expect(try await api.call(.get, "/v1/activities/order-1", key: staying.secretKey).status == .ok)
            let listed = try await api.call(.get, "/admin/v1/apps", key: adminToken)["data"]?.arrayItems.compactMap { $0.objectValue?["id"]?.stringValue }
            #expect(listed == [staying.id])

            let again = try await api.call(.delete, "/admin/v1/apps/\(leaving.id)", key: adminToken)
            #expect(again.status == .notFound)
            #expect(again.errorCode == "app_not_found")
            #expect(try await api.call(.delete, "/admin/v1/apps/\(staying.id)", key: staying.secretKey).status == .unauthorized)
            // Its one option is in the query: a body is refused, not ignored.
            let withBody = try await api.json(.delete, "/admin/v1/apps/\(staying.id)", key: adminToken, ["leaveChannels": true])
            #expect(withBody.status == .badRequest)
            #expect(withBody.errorField == "leaveChannels")
            let counted = try await rows(of: staying.id, in: store)
            let garbled = try await api.call(.delete, "/admin/v1/apps/\(staying.id)?leaveChannels=yes", key: adminToken)
            #expect(garbled.status == .badRequest)
            #expect(garbled.errorField == "leaveChannels")
            #expect(try await rows(of: staying.id, in: store) == counted)
        }
    }

    @Test("an app's broadcast channels are deleted at APNs first; one that cannot be keeps the app, unless leaveChannels=true")
    func channelsFirst() async throws {
        let channels = RecordingChannels()
        try await withLiveline(adminToken: adminToken, channels: channels) { api, store in
            let app = try await createApp(store)
            for activity in ["match-1", "match-2"] {
                let body: JSONValue = ["contentState": ["home": 0, "away": 0], "delivery": "broadcast"]
                #expect(try await api.json(.post, "/v1/activities/\(activity)/updates", key: app.secretKey, body).status == .accepted)
            }
            let held = Set(channels.creations.map(\.id))
            #expect(held.count == 2)

            channels.failDeletions(with: ChannelManagementError(.unavailable, "APNs answered 503"))
            let refused = try await api.call(.delete, "/admin/v1/apps/\(app.id)", key: adminToken)
            #expect(refused.status == .conflict)
            #expect(refused.errorCode == "channels_not_deleted")
            #expect(refused.errorField == "leaveChannels")
            #expect(refused.message?.contains("APNs answered 503") == true)
            #expect(try await store.app(id: app.id) != nil)
            #expect(try await api.call(.get, "/v1/activities/match-1", key: app.secretKey).status == .ok)
            #expect(try await store.heldChannels(appID: app.id).count == 2)

            // One deleted, one not: the deleted one is written down, the app stays.
            channels.failDeletions(with: ChannelManagementError(.unavailable, "APNs answered 503"), except: channels.creations[0].id)
            #expect(try await api.call(.delete, "/admin/v1/apps/\(app.id)", key: adminToken).status == .conflict)
            #expect(try await store.heldChannels(appID: app.id).map(\.channelID) == [channels.creations[1].id])

            let askedBefore = channels.deletionsAsked.count
            let left = try await api.call(.delete, "/admin/v1/apps/\(app.id)?leaveChannels=true", key: adminToken)
            #expect(left.status == .ok)
            // The failing channel was asked for once, not again after the keys went.
            #expect(channels.deletionsAsked.count == askedBefore + 1)
            #expect(left["channelsDeleted"] == 0)
            #expect(left["channelsLeft"] == [.string(channels.creations[1].id)])
            #expect(try await store.app(id: app.id) == nil)

            let other = try await createApp(store, name: "Other")
            channels.failDeletions(with: nil)
            #expect(try await api.json(.post, "/v1/activities/match-3/updates", key: other.secretKey, ["contentState": [:], "delivery": "broadcast"]).status == .accepted)
            let created = try #require(channels.creations.last?.id)
            let deleted = try await api.call(.delete, "/admin/v1/apps/\(other.id)", key: adminToken)
            #expect(deleted.status == .ok)
            #expect(deleted["channelsDeleted"] == 1)
            #expect(deleted["channelsLeft"] == [])
            #expect(channels.deletions.contains(created))
        }
    }

    @Test("the administration tells of a deletion (the push clients close) once the app is gone, and not when it is kept")
    func toldOfDeletions() async throws {
        let channels = RecordingChannels()
        try await withLiveline(channels: channels) { api, store in
            let told = Mutex<[String]>([])
            let administration = AppAdministration(
                store: store, sealer: try CredentialSealer(masterKey: Array(repeating: 3, count: 32)), channels: channels,
                appDeleted: { appID in
                    #expect(try! await store.app(id: appID) == nil, "told before the app was gone")
                    told.withLock { $0.append(appID) }
                }
            )
            let app = try await createApp(store)
            #expect(try await api.json(.post, "/v1/activities/m/updates", key: app.secretKey, ["contentState": [:], "delivery": "broadcast"]).status == .accepted)
            channels.failDeletions(with: ChannelManagementError(.unavailable, "no answer"))
            await #expect(throws: AppAdministration.ChannelsNotDeleted.self) { try await administration.deleteApp(appID: app.id, leavingChannels: false) }
            #expect(told.withLock { $0.isEmpty })
            channels.failDeletions(with: nil)
            #expect(try await administration.deleteApp(appID: app.id, leavingChannels: false).channelsDeleted == 1)
            #expect(told.withLock { $0 } == [app.id])
        }
    }

    @Test("a pass still sending when its app is deleted writes neither attempts nor events, and fails nothing")
    func passAfterDeletion() async throws {
        try await withLiveline(adminToken: adminToken) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.put, "/v1/activities/order-1/instances/iphone-1", key: app.publishableKey, registerBody).status == .created)
            #expect(try await api.call(.delete, "/admin/v1/apps/\(app.id)", key: adminToken).status == .ok)
            var progress = DeliveryProgress(appID: app.id, activityID: "order-1")
            progress.attempts = [
                DeliveryRecord(
                    appID: app.id, activityID: "order-1", deviceID: "iphone-1", platform: .ios, sequence: 1, event: .update, priority: 10,
                    status: .rejected, providerID: nil, reason: "BadDeviceToken", latencyMilliseconds: 1, attempt: 1, attemptedAt: testStart
                )
            ]
            progress.events = [NewEvent(.deliveryFailed, appID: app.id, activityID: "order-1", deviceID: "iphone-1", data: ["reason": "BadDeviceToken"])]
            try await store.recordProgress(progress, at: testStart)
            #expect(try await rows(of: app.id, in: store) == [:])
        }
    }

    @Test("channels of an app without APNs credentials (the built-in emulator's) do not keep it: they are left and listed")
    func emulatorChannelsLeft() async throws {
        let channels = RecordingChannels()
        try await withLiveline(adminToken: adminToken, channels: channels) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.post, "/v1/activities/m/updates", key: app.secretKey, ["contentState": [:], "delivery": "broadcast"]).status == .accepted)
            channels.failDeletions(with: ChannelManagementError(.noCredentials, "the app has no APNs credentials"))
            let deleted = try await api.call(.delete, "/admin/v1/apps/\(app.id)", key: adminToken)
            #expect(deleted.status == .ok)
            #expect(deleted["channelsLeft"] == .array(channels.creations.map { .string($0.id) }))
            #expect(try await store.app(id: app.id) == nil)
        }
    }

    @Test("the Store refuses to delete an app that still holds a channel unless told to leave it")
    func storeRefusesHeldChannels() async throws {
        let channels = RecordingChannels()
        try await withLiveline(channels: channels) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.post, "/v1/activities/m/updates", key: app.secretKey, ["contentState": [:], "delivery": "broadcast"]).status == .accepted)
            await #expect(throws: StoreError.channelsHeld(count: 1)) { try await store.deleteApp(id: app.id, leavingChannels: false) }
            #expect(try await store.app(id: app.id) != nil)
            let deletion = try await store.deleteApp(id: app.id, leavingChannels: true)
            #expect(deletion?.channelsLeft == channels.creations.map(\.id))
            #expect(try await store.deleteApp(id: app.id, leavingChannels: true) == nil)
        }
    }
}

