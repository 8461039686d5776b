import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LivelineCore
import LivelineDispatch
import LivelineServer
import LivelineStore
import LivelineTestSupport
import NIOCore
import Testing

/// A response as the tests read it.
struct Reply {
    var status: HTTPResponse.Status
    var json: JSONValue
    var headers: HTTPFields

    subscript(_ key: String) -> JSONValue? { json.objectValue?[key] }

    var errorCode: String? { json.objectValue?["error"]?.objectValue?["code"]?.stringValue }
    var message: String? { json.objectValue?["error"]?.objectValue?["message"]?.stringValue }
    var errorField: String? { json.objectValue?["error"]?.objectValue?["field"]?.stringValue }
}

/// A client over HummingbirdTesting that speaks JSON.
struct API {
    let client: any TestClientProtocol

    func call(_ method: HTTPRequest.Method, _ uri: String, key: String? = nil, body: String? = nil, headers extra: HTTPFields = [:]) async throws -> Reply {
        var headers = extra
        if let key { headers[.authorization] = "Bearer \(key)" }
        if body != nil { headers[.contentType] = "application/json" }
        let response = try await client.executeRequest(
            uri: uri, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) }
        )
        let data = Data(buffer: response.body)
        let json = data.isEmpty ? JSONValue.null : ((try? JSONValue(parsing: data)) ?? .string(String(decoding: data, as: UTF8.self)))
        return Reply(status: response.status, json: json, headers: response.headers)
    }

    func json(_ method: HTTPRequest.Method, _ uri: String, key: String? = nil, _ body: JSONValue) async throws -> Reply {
        try await call(method, uri, key: key, body: body.encodedString)
    }
}

/// An app and its keys, created through the same path the CLI uses.
struct TestApp {
    var id: String
    var secretKey: String
    var publishableKey: String
}

/// A temporary data directory with a SQLite file; removed at the end.
final class TemporaryDirectory {
    let url: URL
    init() throws {
        url = uniqueTemporaryURL(prefix: "liveline-server")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    var databasePath: String { url.appendingPathComponent("liveline.sqlite").path }
    deinit { try? FileManager.default.removeItem(at: url) }
}

/// Where the server tests' clocks start: 2026-11-21T10:00:00Z.
let testStart = Date(timeIntervalSince1970: 1_795_255_200)

extension TestClock {
    /// The clock as the server's wall clock.
    var wallClock: WallClock { WallClock { [self] in self.now } }
}

/// Runs `body` against a Liveline router on a real SQLite file.
func withLiveline<T: Sendable>(
    directory: TemporaryDirectory? = nil, clock: TestClock = TestClock(testStart), adminToken: String? = nil,
    channels: (any BroadcastChannelManagement)? = nil, broadcast: BroadcastSettings = BroadcastSettings(),
    sealer: CredentialSealer? = nil, webhookURLs: WebhookURLPolicy = WebhookURLPolicy(allowsPrivateNetworks: false),
    delivery: any DeliveryWaking = NoDeliveryEngine(), _ body: @Sendable (API, any Store) async throws -> T
) async throws -> T {
    // With LIVELINE_TEST_STORE=postgres, a test that does not look at the SQLite file itself runs on a fresh
    // PostgreSQL database instead.
    if directory == nil, StoreKind.underTest == .postgres {
        return try await withTemporaryPostgresDatabase { url in
            let store = try await SQLStore.open(postgres: try PostgresDatabaseURL(url), writers: 3, readers: 2)
            return try await serve(store)
        }
    }
    let directory = try directory ?? TemporaryDirectory()
    return try await serve(try await SQLStore.open(path: directory.databasePath))

    func serve(_ store: SQLStore) async throws -> T {
        try await withRouter(
            on: store, clock: clock, adminToken: adminToken, channels: channels, broadcast: broadcast, sealer: sealer, webhookURLs: webhookURLs,
            delivery: delivery, body
        )
    }
}

private func withRouter<T: Sendable>(
    on store: SQLStore, clock: TestClock, adminToken: String?, channels: (any BroadcastChannelManagement)?, broadcast: BroadcastSettings,
    sealer: CredentialSealer?, webhookURLs: WebhookURLPolicy, delivery: any DeliveryWaking, _ body: @Sendable (API, any Store) async throws -> T
) async throws -> T {
    let router = LivelineApplication.makeRouter(
        store: store, clock: clock.wallClock, adminToken: adminToken, sealer: sealer, delivery: delivery, channels: channels,
        broadcast: broadcast, webhookURLs: webhookURLs
    )
    let app = Application(router: HeadServingRouter(router))
    do {
        let result = try await app.test(.router) { client in try await body(API(client: client), store) }
        try await store.close()
        return result
    } catch {
        try? await store.close()
        throw error
    }
}

func createApp(
    _ store: any Store, name: String = "Test", bundleID: String = "com.example.test", androidPackage: String? = "com.example.test"
) async throws -> TestApp {
    let sealer = try CredentialSealer(masterKey: Array(repeating: 3, count: 32))
    let created = try await AppAdministration(store: store, sealer: sealer).createApp(name: name, bundleID: bundleID, androidPackage: androidPackage)
    return TestApp(id: created.app.id, secretKey: created.secretKey, publishableKey: created.publishableKey)
}

let iosToken = "80f6d2a41c0e5e6b2f8f4b8d5b1a6c9e3d7f0a2b4c6d8e0f1a3b5c7d9e1f3a5b"
let registerBody: JSONValue = [
    "platform": "ios", "pushToken": .string(iosToken), "attributesType": "DeliveryAttributes",
    "attributes": ["orderId": "1234"], "userId": "user-7",
]
