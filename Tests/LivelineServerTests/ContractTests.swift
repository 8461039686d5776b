import Foundation
import HTTPTypes
import LivelineCore
import LivelineServer
import LivelineStore
import Testing

/// What the OpenAPI document promises about methods, admin credentials and cursors, checked through the router.
@Suite("The server does what the OpenAPI document says")
struct ContractTests {
    let adminToken = "admin-token-0123456789abcdef"

    @Test(
        "a known path with a method it does not serve: 405 method_not_allowed with Allow",
        arguments: [
            (HTTPRequest.Method.patch, "/v1/app", "GET, HEAD"),
            (.post, "/healthz", "GET, HEAD"),
            (.delete, "/openapi.json", "GET, HEAD"),
            (.put, "/v1/activities", "GET, HEAD"),
            (.post, "/v1/activities/order-1", "DELETE, GET, HEAD"),
            (.get, "/v1/activities/order-1/updates", "POST"),
            (.options, "/v1/activities/order-1/instances/device-1", "PUT"),
            (.head, "/v1/activities/order-1/updates", "POST"),
            (.delete, "/admin/v1/apps", "GET, HEAD, POST"),
            (.get, "/admin/v1/apps/app_x/credentials/apns", "PUT"),
            (HTTPRequest.Method("QUERY")!, "/v1/attributes-types/Delivery/schema", "GET, HEAD, PUT"),
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

    @Test("HEAD is served wherever GET is: the same status and headers, no body (RFC 9110)")
    func head() async throws {
        try await withLiveline { api, store in
            let app = try await createApp(store)
            for path in ["/healthz", "/v1/app", "/v1/activities/nope", "/openapi.json"] {
                let get = try await api.call(.get, path, key: app.secretKey)
                let head = try await api.call(.head, path, key: app.secretKey)
                #expect(head.status == get.status, "\(path)")
                #expect(head.headers[.contentType] == get.headers[.contentType], "\(path)")
                #expect(head.headers[.contentLength] == get.headers[.contentLength], "\(path)")
                #expect(head.headers[.contentLength].flatMap { Int($0) } ?? 0 > 0, "\(path)")
                #expect(head.json == .null, "\(path): no body")
            }
            // Authentication applies as to GET.
            #expect(try await api.call(.head, "/v1/app").status == .unauthorized)
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
            (.put, "/admin/v1/apps/app_x/broadcast", [:]),
            (.put, "/admin/v1/apps/app_x/devices", ["audienceFrom": "backend"]),
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

    @Test("the cursor patterns in the document accept exactly the cursors the server accepts")
    func cursorPatterns() async throws {
        let document = try JSONValue(parsing: Array(LivelineApplication.openAPIDocument.utf8))
        func pattern(_ parameter: String) throws -> (NSRegularExpression, Int, Int) {
            let schema = try #require(document.member("components")?.member("parameters")?.member(parameter)?.member("schema")?.objectValue)
            let regex = try NSRegularExpression(pattern: try #require(schema["pattern"]?.stringValue))
            return (regex, Int(try #require(schema["minLength"]?.integer)), Int(try #require(schema["maxLength"]?.integer)))
        }
        func documented(_ cursor: String, _ rule: (NSRegularExpression, Int, Int)) -> Bool {
            let range = NSRange(cursor.startIndex..., in: cursor)
            return (rule.1...rule.2).contains(cursor.count) && rule.0.firstMatch(in: cursor, range: range)?.range == range
        }
        func base64url(_ text: String) -> String {
            Data(text.utf8).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }
        let identifierRule = try pattern("Cursor")
        let sequenceRule = try pattern("DeliveryCursor")
        var generator = SystemRandomNumberGenerator()
        let identifierCharacters = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
        let cursorCharacters = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.")
        // "Lg" and "Li4" are the dot segments, . and .., ids no longer take but positions among ids still are.
        var identifierCursors = ["", "Lg", "Li4", "MA", "YQ", "YR", "YQ==", "YWI", "YWJ", "YWJj", "YWJjZ", "LTE", "MDE", base64url(String(repeating: "a", count: 129))]
        var sequenceCursors = ["", "MA", "MQ", "MR", "MTA", "LTE", "MDE", base64url("999999999999999999"), base64url("1000000000000000000")]
        for _ in 0..<300 {
            let length = [1, 2, 3, 4, 5, 127, 128].randomElement(using: &generator)!
            identifierCursors.append(base64url(String((0..<length).map { _ in identifierCharacters.randomElement(using: &generator)! })))
            sequenceCursors.append(base64url(String(UInt64.random(in: 1...999_999_999_999_999_999, using: &generator))))
            let noise = String((0..<Int.random(in: 1...8, using: &generator)).map { _ in cursorCharacters.randomElement(using: &generator)! })
            identifierCursors.append(noise)
            sequenceCursors.append(noise)
        }
        // What the document says of each cursor, worked out before the requests.
        let identifierCases = identifierCursors.map { ($0, documented($0, identifierRule)) }
        let sequenceCases = sequenceCursors.map { ($0, documented($0, sequenceRule)) }
        try await withLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.json(.post, "/v1/activities/a1/updates", key: app.secretKey, ["contentState": ["n": 1]])
            for (cursor, allowed) in identifierCases {
                let query = cursor.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? cursor
                for path in ["/v1/activities", "/v1/activities/a1/instances"] {
                    let reply = try await api.call(.get, "\(path)?cursor=\(query)", key: app.secretKey)
                    #expect(reply.status == (allowed ? .ok : .badRequest), "\(path) cursor \(cursor.debugDescription)")
                    if reply.status == .badRequest { #expect(reply.errorCode == "invalid_cursor") }
                }
            }
            for (cursor, allowed) in sequenceCases {
                let query = cursor.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? cursor
                let reply = try await api.call(.get, "/v1/activities/a1/deliveries?cursor=\(query)", key: app.secretKey)
                #expect(reply.status == (allowed ? .ok : .badRequest), "deliveries cursor \(cursor.debugDescription)")
            }
        }
    }

    @Test("the limits the document states are the server's")
    func documentedLimits() throws {
        let document = try JSONValue(parsing: Array(LivelineApplication.openAPIDocument.utf8))
        let schemas = try #require(document.member("components")?.member("schemas"))
        #expect(schemas.member("Identifier")?.member("maxLength")?.integer == Int64(Limits.maximumIdentifierLength))
        for variant in ["RegisterIOSInstanceRequest", "RegisterAndroidInstanceRequest"] {
            #expect(schemas.member(variant)?.member("properties")?.member("pushToken")?.member("maxLength")?.integer == Int64(Limits.maximumPushTokenLength))
        }
        let description = try #require(document.member("info")?.member("description")?.stringValue)
        #expect(description.contains("at most \(Limits.maximumRequestBodyBytes / 1024) KiB"))
        #expect(description.contains("over \(Limits.maximumAPNsPayloadBytes) bytes"))
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
