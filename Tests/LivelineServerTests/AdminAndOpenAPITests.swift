import Foundation
import HTTPTypes
import LivelineCore
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
            #expect(reply.status == .forbidden)
            #expect(reply.errorCode == "admin_api_disabled")
        }
    }

    @Test("create, list and rotate through the admin API; rotated keys stop working")
    func adminFlow() async throws {
        try await withLiveline(adminToken: adminToken) { api, _ in
            #expect(try await api.call(.get, "/admin/v1/apps").status == .unauthorized)
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
        #expect(!APIKeys.verify(issued.key.dropLast() + "0", against: issued.record))
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
        let store = try await SQLiteStore.open(path: directory.databasePath)
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
