import Crypto
import Foundation
import HTTPTypes
import LivelineCore
import LivelineDispatch
import LivelineServer
import LivelineStore
import Testing

@Suite("Admin API and keys")
struct AdminAPITests {
    let adminToken = "admin-token-0123456789abcdef"

    @Test("without a configured token the admin API is off")
    func disabled() async throws {
        try await withLiveline { api, _ in
            let reply = try await api.json(.post, "/admin/v1/apps", key: "anything", ["name": "X", "bundleId": "com.example.x"])
            #expect(reply.status == .unauthorized)
            #expect(reply.errorCode == "admin_api_disabled")
        }
    }

    @Test("create, list and rotate through the admin API; rotated keys stop working")
    func adminFlow() async throws {
        try await withLiveline(adminToken: adminToken) { api, _ in
            let anonymous = try await api.call(.get, "/admin/v1/apps")
            #expect(anonymous.status == .unauthorized && anonymous.errorCode == "unauthorized")
            #expect(anonymous["error"]?.objectValue?["message"]?.stringValue?.contains("admin token") == true, "it asks for the admin token, not an API key")
            #expect(try await api.call(.get, "/admin/v1/apps", key: "wrong-token-0123456789").errorCode == "invalid_admin_token")
            let created = try await api.json(
                .post, "/admin/v1/apps", key: adminToken, ["name": "Deliveries", "bundleId": "com.example.deliveries", "androidPackage": "com.example.deliveries"]
            )
            #expect(created.status == .created)
            let appID = try #require(created["app"]?.objectValue?["id"]?.stringValue)
            let secret = try #require(created["secretKey"]?.stringValue)
            #expect(secret.hasPrefix("sk_"))
            #expect(created["publishableKey"]?.stringValue?.hasPrefix("pk_") == true)
            #expect(try await api.json(.post, "/v1/activities/a/updates", key: secret, ["contentState": [:]]).status == .accepted)

            let list = try await api.call(.get, "/admin/v1/apps", key: adminToken)
            #expect(list["data"]!.arrayItems.count == 1)
            #expect(!list.json.encodedString.contains(secret))  // keys are never listed

            // The rotation takes no body; a malformed one is refused and rotates nothing.
            let garbled = try await api.call(.post, "/admin/v1/apps/\(appID)/keys/rotate", key: adminToken, body: "{{{garbage")
            #expect(garbled.status == .badRequest)
            #expect(garbled.errorCode == "malformed_json")
            #expect(try await api.call(.get, "/v1/activities/a", key: secret).status == .ok)

            let rotated = try await api.call(.post, "/admin/v1/apps/\(appID)/keys/rotate", key: adminToken)
            #expect(rotated.status == .ok)
            let newSecret = try #require(rotated["secretKey"]?.stringValue)
            #expect(newSecret != secret)
            #expect(try await api.call(.get, "/v1/activities/a", key: secret).status == .unauthorized)
            #expect(try await api.call(.get, "/v1/activities/a", key: newSecret).status == .ok)
            #expect(try await api.call(.post, "/admin/v1/apps/app_nope/keys/rotate", key: adminToken).status == .notFound)

            let invalid = try await api.json(.post, "/admin/v1/apps", key: adminToken, ["name": "X", "bundleId": "not a bundle"])
            #expect(invalid.status == .unprocessableContent)
            #expect(invalid.errorField == "bundleId")

            // The name's 200 is counted in code points, as the document's maxLength: 200 emoji with a skin tone are
            // 200 characters to Swift and 400 code points.
            let toned = String(repeating: "👋🏻", count: 200)
            let tooLong = try await api.json(.post, "/admin/v1/apps", key: adminToken, ["name": .string(toned), "bundleId": "com.example.x"])
            #expect(tooLong.status == .unprocessableContent)
            #expect(tooLong.errorField == "name")
            let fits = try await api.json(
                .post, "/admin/v1/apps", key: adminToken, ["name": .string(String(repeating: "👋🏻", count: 100)), "bundleId": "com.example.x"]
            )
            #expect(fits.status == .created)
        }
    }

    @Test("keys are stored only as hashes")
    func hashedKeys() async throws {
        let directory = try TemporaryDirectory()
        let created = try await withLiveline(directory: directory) { _, store in try await createApp(store) }
        let file = try Data(contentsOf: URL(fileURLWithPath: directory.databasePath))
        let wal = (try? Data(contentsOf: URL(fileURLWithPath: directory.databasePath + "-wal"))) ?? Data()
        for key in [created.secretKey, created.publishableKey] {
            let secretPart = Data(key.suffix(32).utf8)
            #expect(file.range(of: secretPart) == nil)
            #expect(wal.range(of: secretPart) == nil)
        }
    }

    @Test("key parsing and constant-time comparison")
    func keyRules() {
        let issued = APIKeys.issue(appID: "app_x", scope: .secret, at: Date())
        #expect(APIKeys.parse(issued.key)?.scope == .secret)
        #expect(APIKeys.verify(issued.key, against: issued.record))
        // Change the last character (to one it is not, or the test would flake once in 62 runs).
        let tampered = issued.key.dropLast() + (issued.key.hasSuffix("0") ? "1" : "0")
        #expect(!APIKeys.verify(String(tampered), against: issued.record))
        #expect(APIKeys.parse("xk_" + String(issued.key.dropFirst(3))) == nil)
        #expect(APIKeys.constantTimeEquals([1, 2, 3], [1, 2, 3]))
        #expect(!APIKeys.constantTimeEquals([1, 2, 3], [1, 2, 4]))
        #expect(!APIKeys.constantTimeEquals([1, 2], [1, 2, 3]))
    }
}

@Suite("OpenAPI document")
struct OpenAPITests {
    @Test("every route the server serves is in the OpenAPI document, and nothing else")
    func routesDocumented() async throws {
        let directory = try TemporaryDirectory()
        let store = try await SQLStore.open(path: directory.databasePath)
        defer { Task { try? await store.close() } }
        let router = LivelineApplication.makeRouter(store: store, adminToken: nil)
        let document = try JSONValue(parsing: Array(LivelineApplication.openAPIDocument.utf8))
        let paths = try #require(document.objectValue?["paths"]?.objectValue)
        var documented: Set<String> = []
        for (path, item) in paths {
            for method in item.objectValue?.keys ?? [:].keys where ["get", "put", "post", "delete", "patch"].contains(method) {
                documented.insert("\(method.uppercased()) \(path)")
            }
        }
        var served: Set<String> = []
        for route in router.routes {
            let path = "/" + "\(route.path)".split(separator: "/").map { component in
                component.hasPrefix(":") ? "{\(component.dropFirst())}" : String(component)
            }.joined(separator: "/")
            served.insert("\(route.method) \(path)")
        }
        #expect(!served.isEmpty)
        for route in served.sorted() {
            #expect(documented.contains(route), "\(route) is served but missing from the OpenAPI document")
        }
        for route in documented.sorted() {
            #expect(served.contains(route), "\(route) is documented but not served")
        }
        #expect(document.objectValue?["openapi"] == "3.1.0")
    }
}

@Suite("Credentials and the delivery timeline")
struct CredentialsAPITests {
    let adminToken = "admin-token-0123456789abcdef"

    @Test("APNs credentials: validated, sealed at rest, shown without the key, health visible to the app")
    func apnsCredentials() async throws {
        let directory = try TemporaryDirectory()
        let keyPEM = P256.Signing.PrivateKey().pemRepresentation
        try await withLiveline(directory: directory, adminToken: adminToken) { api, store in
            let app = try await createApp(store)
            let path = "/admin/v1/apps/\(app.id)/credentials/apns"
            let good: JSONValue = [
                "teamId": "TEAM123456", "keyId": "KEY1234567", "privateKey": .string(keyPEM), "environment": "sandbox",
                "baseUrl": "https://127.0.0.1:8443",
            ]
            let saved = try await api.json(.put, path, key: adminToken, good)
            #expect(saved.status == .ok)
            #expect(saved["healthy"] == true)
            #expect(!saved.json.encodedString.contains("PRIVATE KEY"))
            var badKey = good.objectValue!
            badKey["privateKey"] = "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----"
            #expect(try await api.json(.put, path, key: adminToken, .object(badKey)).errorField == "privateKey")
            var badTeam = good.objectValue!
            badTeam["teamId"] = "short"
            #expect(try await api.json(.put, path, key: adminToken, .object(badTeam)).errorField == "teamId")
            // Each host override is read as the client reads it: https://host[:port], no path.
            for field in ["baseUrl", "channelManagementBaseUrl", "broadcastBaseUrl"] {
                for url in ["http://127.0.0.1:8443", "https://127.0.0.1:8443/3/device", "https://"] {
                    var badURL = good.objectValue!
                    badURL[field] = .string(url)
                    let refused = try await api.json(.put, path, key: adminToken, .object(badURL))
                    #expect(refused.status == .unprocessableContent, "\(field): \(url)")
                    #expect(refused.errorCode == "invalid_base_url" && refused.errorField == field, "\(field): \(url)")
                }
            }
            var withBroadcastHost = good.objectValue!
            withBroadcastHost["broadcastBaseUrl"] = "https://127.0.0.1:8444"
            let savedBroadcastHost = try await api.json(.put, path, key: adminToken, .object(withBroadcastHost))
            #expect(savedBroadcastHost["settings"]?.objectValue?["broadcastBaseUrl"] == "https://127.0.0.1:8444")
            #expect(try await api.json(.put, path, key: adminToken, good)["settings"]?.objectValue?["broadcastBaseUrl"] == .null)
            #expect(try await api.json(.put, "/admin/v1/apps/app_nope/credentials/apns", key: adminToken, good).status == .notFound)
            #expect(try await api.json(.put, path, key: app.secretKey, good).status == .unauthorized)

            let listed = try await api.call(.get, "/admin/v1/apps/\(app.id)/credentials", key: adminToken)
            #expect(listed["data"]?.arrayItems.count == 1)
            let setAt = try await store.credentials(appID: app.id, provider: .apns)?.updatedAt
            try await store.setCredentialsHealth(appID: app.id, provider: .apns, healthy: false, reason: "InvalidProviderToken", at: Date() + 60)
            // When they were set stays: it is also the version the push connections are built from, and a change of health
            // rebuilt them, cutting off the pushes in flight.
            #expect(try await store.credentials(appID: app.id, provider: .apns)?.updatedAt == setAt)
            let seen = try await api.call(.get, "/v1/app", key: app.secretKey)
            #expect(seen["id"] == .string(app.id))
            let credentials = try #require(seen["credentials"]?.arrayItems.first?.objectValue)
            #expect(credentials["healthy"] == false)
            #expect(credentials["healthReason"] == "InvalidProviderToken")
            #expect(!seen.json.encodedString.contains("PRIVATE KEY"))
            #expect(try await api.call(.get, "/v1/app", key: app.publishableKey).status == .forbidden)
        }
        let file = try Data(contentsOf: URL(fileURLWithPath: directory.databasePath))
        let wal = (try? Data(contentsOf: URL(fileURLWithPath: directory.databasePath + "-wal"))) ?? Data()
        let keyBody = Data(keyPEM.split(separator: "\n")[1].utf8)
        #expect(file.range(of: keyBody) == nil && wal.range(of: keyBody) == nil, "the .p8 key is sealed at rest")
    }

    @Test("the delivery timeline route pages newest first and is scoped to the app")
    func deliveriesRoute() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            let other = try await createApp(store, name: "Other")
            _ = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["n": 1]])
            let attempts = (1...3).map { attempt in
                DeliveryRecord(
                    appID: app.id, activityID: "a1", deviceID: "d\(attempt)", platform: .ios, sequence: 1, event: .update, priority: 10,
                    status: attempt == 3 ? .invalidated : .delivered, providerID: "id-\(attempt)", reason: attempt == 3 ? "Unregistered" : nil,
                    latencyMilliseconds: 1.5, attempt: 1, attemptedAt: Date()
                )
            }
            try await store.recordProgress(DeliveryProgress(appID: app.id, activityID: "a1", attempts: attempts), at: Date())
            let first = try await api.call(.get, "/v1/activities/a1/deliveries?limit=2", key: app.secretKey)
            #expect(first.status == .ok)
            #expect(first["data"]?.arrayItems.compactMap { $0.objectValue?["deviceId"]?.stringValue } == ["d3", "d2"])
            #expect(first["data"]?.arrayItems.first?.objectValue?["reason"] == "Unregistered")
            let cursor = try #require(first["nextCursor"]?.stringValue)
            let second = try await api.call(.get, "/v1/activities/a1/deliveries?limit=2&cursor=\(cursor)", key: app.secretKey)
            #expect(second["data"]?.arrayItems.compactMap { $0.objectValue?["deviceId"]?.stringValue } == ["d1"])
            #expect(try await api.call(.get, "/v1/activities/a1/deliveries", key: other.secretKey).status == .notFound)
        }
    }
}
