import Foundation
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import Testing

/// What the OpenAPI document promises about methods and admin credentials, checked through the router.
@Suite("The server does what the OpenAPI document says")
struct ContractTests {
    let adminToken = "admin-token-0123456789abcdef"

    @Test(
        "a known path with a method it does not serve: 405 method_not_allowed with Allow",
        arguments: [
            (HTTPRequest.Method.patch, "/v1/app", "GET"),
            (.post, "/healthz", "GET"),
            (.delete, "/openapi.json", "GET"),
            (.put, "/v1/activities", "GET"),
            (.post, "/v1/activities/order-1", "DELETE, GET"),
            (.get, "/v1/activities/order-1/updates", "POST"),
            (.options, "/v1/activities/order-1/instances/device-1", "PUT"),
            (.head, "/v1/activities/order-1/instances", "GET"),
            (.delete, "/admin/v1/apps", "GET, POST"),
            (.get, "/admin/v1/apps/app_x/credentials/apns", "PUT"),
            (HTTPRequest.Method("QUERY")!, "/v1/attributes-types/Delivery/schema", "GET, PUT"),
        ]
    )
    func methodNotAllowed(method: HTTPRequest.Method, path: String, allow: String) async throws {
        try await withLiveline(adminToken: adminToken) { api, store in
            let app = try await createApp(store)
            let reply = try await api.call(method, path, key: app.secretKey)
            #expect(reply.status == .methodNotAllowed)
            #expect(reply.headers[.allow] == allow)
            if method != .head {
                #expect(reply.errorCode == "method_not_allowed")
                #expect(reply.json.member("error")?.member("message")?.stringValue?.isEmpty == false)
                #expect(reply.json.member("error")?.member("field") == .null)
            }
        }
    }

    @Test("an unknown path stays 404 not_found, whatever the method")
    func unknownPath() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            for (method, path) in [(HTTPRequest.Method.get, "/v1/nope"), (.patch, "/v1/activities/a/b/c/d/e"), (.post, "/admin/v2/apps")] {
                let reply = try await api.call(method, path, key: app.secretKey)
                #expect(reply.status == .notFound, "\(method) \(path)")
                #expect(reply.errorCode == "not_found")
                #expect(reply.headers[.allow] == nil)
            }
        }
    }

    @Test("every admin route answers a missing or wrong admin token with 401 and the JSON error shape")
    func adminUnauthorized() async throws {
        let routes: [(HTTPRequest.Method, String, JSONValue?)] = [
            (.post, "/admin/v1/apps", ["name": "X", "bundleId": "com.example.x"]),
            (.get, "/admin/v1/apps", nil),
            (.post, "/admin/v1/apps/app_x/keys/rotate", nil),
            (.put, "/admin/v1/apps/app_x/credentials/apns", [:]),
            (.put, "/admin/v1/apps/app_x/credentials/fcm", [:]),
            (.get, "/admin/v1/apps/app_x/credentials", nil),
            (.put, "/admin/v1/apps/app_x/budget", [:]),
        ]
        try await withLiveline(adminToken: adminToken) { api, store in
            let app = try await createApp(store)
            for (method, path, body) in routes {
                for key in [nil, "wrong-token-0123456789", app.secretKey, adminToken + "x", "Basic"] as [String?] {
                    let reply = try await api.call(method, path, key: key, body: body?.encodedString)
                    #expect(reply.status == .unauthorized, "\(method) \(path) with \(key ?? "no token")")
                    #expect(reply.errorCode == (key == nil ? "unauthorized" : "invalid_admin_token"), "\(method) \(path)")
                    #expect(reply.json.member("error")?.member("message")?.stringValue?.isEmpty == false)
                }
            }
        }
    }
}

extension JSONValue {
    /// The member `key` of an object.
    fileprivate func member(_ key: String) -> JSONValue? { objectValue?[key] }
    /// The value of an integer.
    fileprivate var integer: Int64? {
        if case .integer(let value) = self { return value }
        return nil
    }
}
