import Foundation
import Logging
import NIOCore
import Testing

@testable import APNs

/// Runs `body` with a started server and a channel manager for it, and shuts both down afterwards.
func withServerAndManager(
    tokens: APNsProviderTokens = APNsProviderTokens(signingKey: makeSigningKey()),
    script: @escaping TestAPNsServer.Script,
    _ body: (TestAPNsServer, APNsChannelManager) async throws -> Void
) async throws {
    let server = try await TestAPNsServer.start(script: script)
    var logger = Logger(label: "apns-channels-test")
    logger.logLevel = .critical
    let manager = try APNsChannelManager(tokens: tokens, endpoint: server.endpoint, logger: logger)
    do {
        try await body(server, manager)
    } catch {
        await manager.shutdown()
        try await server.shutdown()
        throw error
    }
    await manager.shutdown()
    try await server.shutdown()
}

/// The request's `apns-request-id`, echoed as APNs does.
private func echo(_ request: RecordedRequest) -> [(String, String)] {
    request.header("apns-request-id").map { [("apns-request-id", $0)] } ?? []
}

@Suite("Channel management")
struct ChannelManagerTests {
    @Test("the channel management endpoints are Apple's hosts and ports")
    func endpoints() {
        #expect(APNsEndpoint.channelManagementProduction.host == "api-manage-broadcast.push.apple.com")
        #expect(APNsEndpoint.channelManagementProduction.port == 2196)
        #expect(APNsEndpoint.channelManagementSandbox.host == "api-manage-broadcast.sandbox.push.apple.com")
        #expect(APNsEndpoint.channelManagementSandbox.port == 2195)
    }

    @Test(
        "create is POST /1/apps/<bundle id>/channels with the policy and push type; the id comes from apns-channel-id",
        arguments: [APNsMessageStoragePolicy.noMessageStored, .mostRecentMessageStored]
    )
    func create(policy: APNsMessageStoragePolicy) async throws {
        let tokens = APNsProviderTokens(signingKey: makeSigningKey())
        try await withServerAndManager(tokens: tokens, script: { request in
            .respond(status: 201, headers: echo(request) + [("apns-channel-id", testChannelID)])
        }) { server, manager in
            let requestID = UUID()
            let channel = try await manager.createChannel(bundleID: testBundleID, storagePolicy: policy, requestID: requestID)
            #expect(channel == APNsChannel(channelID: testChannelID, storagePolicy: policy, pushType: "LiveActivity"))

            let request = try #require(server.requests.first)
            #expect(server.requests.count == 1)
            #expect(request.header(":method") == "POST")
            #expect(request.header(":path") == "/1/apps/com.example.app/channels")
            #expect(request.header("authorization") == "bearer " + tokens.current())
            #expect(request.header("apns-request-id") == requestID.uuidString.lowercased())
            #expect(request.header("content-type") == "application/json")
            #expect(request.header("apns-channel-id") == nil)
            #expect(request.header("apns-topic") == nil)
            let body = try #require(
                try JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any]
            )
            #expect(body.count == 2)
            #expect(body["message-storage-policy"] as? Int == policy.rawValue)
            #expect(body["push-type"] as? String == "LiveActivity")
        }
    }

    @Test("a 201 without apns-channel-id throws a terminal error")
    func createWithoutChannelID() async throws {
        try await withServerAndManager(script: { request in .respond(status: 201, headers: echo(request)) }) { _, manager in
            let requestID = UUID()
            let error = await #expect(throws: APNsChannelManagementError.self) {
                _ = try await manager.createChannel(
                    bundleID: testBundleID,
                    storagePolicy: .noMessageStored,
                    requestID: requestID
                )
            }
            #expect(error?.status == 201)
            #expect(error?.reason == nil)
            #expect(error?.disposition == .terminal)
            #expect(error?.requestID == requestID.uuidString.lowercased())
        }
    }

    @Test("read is GET /1/apps/<bundle id>/channels with apns-channel-id; the body gives the configuration")
    func read() async throws {
        try await withServerAndManager(script: { request in
            .respond(
                status: 200,
                headers: echo(request),
                body: #"{"message-storage-policy":1,"push-type":"LiveActivity"}"#
            )
        }) { server, manager in
            let channel = try await manager.channel(bundleID: testBundleID, channelID: testChannelID)
            #expect(channel.channelID == testChannelID)
            #expect(channel.storagePolicy == .mostRecentMessageStored)
            #expect(channel.pushType == "LiveActivity")

            let request = try #require(server.requests.first)
            #expect(request.header(":method") == "GET")
            #expect(request.header(":path") == "/1/apps/com.example.app/channels")
            #expect(request.header("apns-channel-id") == testChannelID)
            #expect(request.header("apns-request-id") != nil)
            #expect(request.header("authorization")?.hasPrefix("bearer ") == true)
            #expect(request.header("apns-topic") == nil)
            #expect(request.body.isEmpty)
        }
    }

    @Test("a channel body that cannot be read throws a terminal error")
    func readUnreadable() async throws {
        try await withServerAndManager(script: { _ in .respond(status: 200, body: #"{"push-type":"LiveActivity"}"#) }) {
            _,
            manager in
            let error = await #expect(throws: APNsChannelManagementError.self) {
                _ = try await manager.channel(bundleID: testBundleID, channelID: testChannelID)
            }
            #expect(error?.status == 200)
            #expect(error?.disposition == .terminal)
        }
    }

    @Test("delete is DELETE /1/apps/<bundle id>/channels with apns-channel-id; 204 succeeds")
    func delete() async throws {
        try await withServerAndManager(script: { request in .respond(status: 204, headers: echo(request)) }) {
            server,
            manager in
            try await manager.deleteChannel(bundleID: testBundleID, channelID: testChannelID)
            let request = try #require(server.requests.first)
            #expect(request.header(":method") == "DELETE")
            #expect(request.header(":path") == "/1/apps/com.example.app/channels")
            #expect(request.header("apns-channel-id") == testChannelID)
            #expect(request.body.isEmpty)
        }
    }

    @Test("all-channels is GET /1/apps/<bundle id>/all-channels; the body lists the ids")
    func list() async throws {
        try await withServerAndManager(script: { request in
            .respond(status: 200, headers: echo(request), body: #"{"channels":["YWJj","ZGVm","Z2hp"]}"#)
        }) { server, manager in
            let channels = try await manager.allChannels(bundleID: testBundleID)
            #expect(channels == ["YWJj", "ZGVm", "Z2hp"])
            let request = try #require(server.requests.first)
            #expect(request.header(":method") == "GET")
            #expect(request.header(":path") == "/1/apps/com.example.app/all-channels")
            #expect(request.header("apns-channel-id") == nil)
            #expect(request.body.isEmpty)
        }
    }

    @Test("a long channel list is read whole")
    func longList() async throws {
        let ids = (0..<2000).map { "Y2hhbm5lbC0\($0)LXh4eHh4eHh4eA==" }
        let body = #"{"channels":["# + ids.map { "\"\($0)\"" }.joined(separator: ",") + "]}"
        #expect(body.utf8.count > 32 * 1024)
        try await withServerAndManager(script: { _ in .respond(status: 200, body: body) }) { _, manager in
            let listed = try await manager.allChannels(bundleID: testBundleID)
            #expect(listed == ids)
        }
    }

    @Test(
        "an error answer throws APNsChannelManagementError with APNs' reason, request id and disposition",
        arguments: [
            (400, "CannotCreateChannelConfig", APNsErrorDisposition.terminal),
            (400, "ChannelNotRegistered", .terminal),
            (400, "BadChannelId", .terminal),
            (400, "FeatureNotEnabled", .terminal),
            (403, "TopicMismatch", .terminal),
            (403, "InvalidProviderToken", .credentials),
            (429, "TooManyRequests", .retryable),
            (500, "InternalServerError", .retryable),
        ]
    )
    func errorAnswer(status: Int, reason: String, disposition: APNsErrorDisposition) async throws {
        try await withServerAndManager(script: { request in
            .respond(status: status, headers: echo(request), body: #"{"reason":"\#(reason)"}"#)
        }) { _, manager in
            let requestID = UUID()
            let error = await #expect(throws: APNsChannelManagementError.self) {
                try await manager.deleteChannel(bundleID: testBundleID, channelID: testChannelID, requestID: requestID)
            }
            #expect(error?.status == status)
            #expect(error?.reason == APNsErrorReason(rawValue: reason))
            #expect(error?.requestID == requestID.uuidString.lowercased())
            #expect(error?.disposition == disposition)
            #expect(error?.description.contains(reason) == true)
        }
    }

    @Test("an error answer without a body is classified by its status")
    func errorWithoutBody() async throws {
        try await withServerAndManager(script: { _ in .respond(status: 503) }) { _, manager in
            let error = await #expect(throws: APNsChannelManagementError.self) {
                _ = try await manager.allChannels(bundleID: testBundleID)
            }
            #expect(error?.status == 503)
            #expect(error?.reason == nil)
            #expect(error?.disposition == .retryable)
        }
    }

    @Test("bad input is refused before anything is sent")
    func badInput() async throws {
        try await withServerAndManager(script: { _ in .respond(status: 204) }) { server, manager in
            await #expect(throws: APNsInvalidNotificationError.self) {
                _ = try await manager.createChannel(bundleID: "", storagePolicy: .noMessageStored)
            }
            await #expect(throws: APNsInvalidNotificationError.self) {
                _ = try await manager.allChannels(bundleID: "com.example/app")
            }
            await #expect(throws: APNsInvalidNotificationError.self) {
                _ = try await manager.channel(bundleID: testBundleID, channelID: "")
            }
            await #expect(throws: APNsInvalidNotificationError.self) {
                try await manager.deleteChannel(bundleID: testBundleID, channelID: "a\nb")
            }
            #expect(server.requestCount == 0)
        }
    }

    @Test("no answer throws APNsTransportError")
    func noAnswer() async throws {
        try await withServerAndManager(script: { _ in .closeConnection }) { _, manager in
            await #expect(throws: APNsTransportError.self) {
                _ = try await manager.allChannels(bundleID: testBundleID)
            }
        }
    }

    @Test("after shutdown every request throws APNsTransportError")
    func afterShutdown() async throws {
        try await withServerAndManager(script: { _ in .respond(status: 204) }) { server, manager in
            await manager.shutdown()
            await #expect(throws: APNsTransportError.self) {
                try await manager.deleteChannel(bundleID: testBundleID, channelID: testChannelID)
            }
            #expect(server.requestCount == 0)
        }
    }
}

@Suite("Broadcast and channel reasons")
struct BroadcastReasonTests {
    static let table: [(String, APNsErrorDisposition)] = [
        ("FeatureNotEnabled", .terminal),
        ("MissingChannelId", .terminal),
        ("BadChannelId", .terminal),
        ("ChannelNotRegistered", .terminal),
        ("CannotCreateChannelConfig", .terminal),
        ("MissingPushType", .terminal),
        ("TopicMismatch", .terminal),
    ]

    @Test("every broadcast and channel reason has a constant and is terminal whatever the status")
    func documented() {
        #expect(APNsErrorReason.allDocumentedForBroadcast.map(\.rawValue) == Self.table.map(\.0))
        #expect(Set(APNsErrorReason.allDocumentedForBroadcast).isDisjoint(with: APNsErrorReason.allDocumented))
        for (raw, disposition) in Self.table {
            let reason = APNsErrorReason(rawValue: raw)
            #expect(reason.knownDisposition == disposition, "\(raw)")
            for status in [400, 403, 404, 410, 429, 500] {
                #expect(APNsErrorDisposition.disposition(status: status, reason: reason) == disposition, "\(raw) \(status)")
            }
        }
    }

    @Test("the constants are Apple's strings")
    func constants() {
        #expect(APNsErrorReason.featureNotEnabled.rawValue == "FeatureNotEnabled")
        #expect(APNsErrorReason.missingChannelId.rawValue == "MissingChannelId")
        #expect(APNsErrorReason.badChannelId.rawValue == "BadChannelId")
        #expect(APNsErrorReason.channelNotRegistered.rawValue == "ChannelNotRegistered")
        #expect(APNsErrorReason.cannotCreateChannelConfig.rawValue == "CannotCreateChannelConfig")
        #expect(APNsErrorReason.missingPushType.rawValue == "MissingPushType")
        #expect(APNsErrorReason.topicMismatch.rawValue == "TopicMismatch")
    }

    @Test("the reasons broadcasts share with device pushes keep their disposition; provider token 403s stay credentials")
    func shared() {
        #expect(APNsErrorReason.badPriority.disposition == .terminal)
        #expect(APNsErrorReason.badExpirationDate.disposition == .terminal)
        #expect(APNsErrorReason.invalidPushType.disposition == .terminal)
        #expect(APNsErrorReason.expiredProviderToken.disposition == .credentials)
        #expect(APNsErrorReason.invalidProviderToken.disposition == .credentials)
        #expect(APNsErrorDisposition.disposition(status: 429, reason: .tooManyRequests) == .retryable)
        #expect(APNsErrorDisposition.disposition(status: 503, reason: nil) == .retryable)
    }

    @Test("APNsChannelManagementError derives its disposition")
    func errorValue() {
        let error = APNsChannelManagementError(status: 400, reason: .channelNotRegistered, requestID: "r-1")
        #expect(error.disposition == .terminal)
        #expect(error.description.contains("ChannelNotRegistered"))
        #expect(error.description.contains("r-1"))
        #expect(APNsChannelManagementError(status: 500, reason: nil).disposition == .retryable)
        #expect(APNsChannelManagementError(status: 403, reason: .expiredProviderToken).disposition == .credentials)
    }
}
