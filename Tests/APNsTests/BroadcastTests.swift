import Foundation
import NIOCore
import Testing

@testable import APNs

let testBundleID = "com.example.app"
let testChannelID = "dHN0LTEyMzQ1Njc4OTA="

/// Answers like APNs does a broadcast: 200 with the request's `apns-request-id` echoed and an `apns-unique-id`.
@Sendable func broadcastAccepted(_ request: RecordedRequest) -> ServerAction {
    var headers: [(String, String)] = [("apns-unique-id", "a8f6c4b2-0000-4000-8000-000000000001")]
    if let requestID = request.header("apns-request-id") {
        headers.append(("apns-request-id", requestID))
    }
    return .respond(status: 200, headers: headers)
}

@Suite("Broadcast pushes")
struct BroadcastTests {
    @Test("a broadcast is POST /4/broadcasts/apps/<bundle id> with apns-channel-id, and no topic or device token")
    func requestShape() async throws {
        let tokens = APNsProviderTokens(signingKey: makeSigningKey())
        try await withServerAndClient(tokens: tokens, script: broadcastAccepted) { server, client in
            let requestID = UUID()
            let broadcast = APNsBroadcast(
                bundleID: testBundleID,
                channelID: testChannelID,
                priority: 5,
                expiration: 0,
                requestID: requestID,
                payload: ByteBuffer(string: payloadJSON)
            )
            let response = try await client.send(broadcast)
            #expect(response.status == 200)
            #expect(response.isSuccess)
            #expect(response.requestID == requestID.uuidString.lowercased())
            #expect(response.apnsUniqueID == "a8f6c4b2-0000-4000-8000-000000000001")

            let request = try #require(server.requests.first)
            #expect(server.requests.count == 1)
            #expect(request.header(":method") == "POST")
            #expect(request.header(":path") == "/4/broadcasts/apps/com.example.app")
            #expect(request.header(":scheme") == "https")
            #expect(request.header("apns-channel-id") == testChannelID)
            #expect(request.header("apns-push-type") == "liveactivity")
            #expect(request.header("apns-priority") == "5")
            #expect(request.header("apns-expiration") == "0")
            #expect(request.header("apns-request-id") == requestID.uuidString.lowercased())
            #expect(request.header("content-type") == "application/json")
            #expect(request.header("authorization") == "bearer " + tokens.current())
            #expect(request.header("apns-topic") == nil)
            #expect(request.header("apns-id") == nil)
            #expect(request.header("apns-collapse-id") == nil)
            #expect(request.headers.allSatisfy { $0.value != deviceToken })
            #expect(request.body == Array(payloadJSON.utf8))
            for name in ["apns-channel-id", "apns-push-type", "apns-priority", "apns-request-id", "authorization"] {
                #expect(request.count(of: name) == 1, "\(name)")
            }
        }
    }

    @Test("without an expiration the apns-expiration header is omitted")
    func noExpiration() async throws {
        try await withServerAndClient(script: broadcastAccepted) { server, client in
            let broadcast = APNsBroadcast(
                bundleID: testBundleID,
                channelID: testChannelID,
                priority: 10,
                expiration: nil,
                payload: ByteBuffer(string: payloadJSON)
            )
            _ = try await client.send(broadcast)
            let request = try #require(server.requests.first)
            #expect(request.header("apns-expiration") == nil)
            #expect(request.header("apns-priority") == "10")
            #expect(request.header("apns-request-id") == broadcast.requestID.uuidString.lowercased())
        }
    }

    @Test("a payload over 5,120 bytes is refused before anything is sent; 5,120 bytes go out")
    func oversizePayload() async throws {
        try await withServerAndClient(script: broadcastAccepted) { server, client in
            let tooLarge = APNsBroadcast(
                bundleID: testBundleID,
                channelID: testChannelID,
                priority: 10,
                expiration: nil,
                payload: ByteBuffer(repeating: UInt8(ascii: "x"), count: 5121)
            )
            await #expect(throws: APNsInvalidNotificationError.self) {
                _ = try await client.send(tooLarge)
            }
            #expect(server.requestCount == 0)

            let largest = APNsBroadcast(
                bundleID: testBundleID,
                channelID: testChannelID,
                priority: 10,
                expiration: nil,
                payload: ByteBuffer(repeating: UInt8(ascii: "x"), count: 5120)
            )
            let response = try await client.send(largest)
            #expect(response.status == 200)
            #expect(server.requests.first?.body.count == 5120)
        }
    }

    @Test(
        "bad input is refused before anything is sent",
        arguments: [
            ("", testChannelID, 10),
            ("com.example/app", testChannelID, 10),
            ("com.example app", testChannelID, 10),
            (testBundleID, "", 10),
            (testBundleID, "abc def", 10),
            (testBundleID, "abc\r\nx-evil: 1", 10),
            (testBundleID, testChannelID, 7),
        ]
    )
    func badInput(bundle: String, channel: String, priority: Int) async throws {
        try await withServerAndClient(script: broadcastAccepted) { server, client in
            let broadcast = APNsBroadcast(
                bundleID: bundle,
                channelID: channel,
                priority: priority,
                expiration: nil,
                payload: ByteBuffer(string: payloadJSON)
            )
            await #expect(throws: APNsInvalidNotificationError.self) {
                _ = try await client.send(broadcast)
            }
            #expect(server.requestCount == 0)
        }
    }

    @Test("an error answer is returned with its reason, request id and disposition")
    func errorAnswer() async throws {
        try await withServerAndClient(script: { request in
            .respond(
                status: 400,
                headers: [("apns-request-id", request.header("apns-request-id") ?? "none")],
                body: #"{"reason":"ChannelNotRegistered"}"#
            )
        }) { _, client in
            let broadcast = APNsBroadcast(
                bundleID: testBundleID,
                channelID: testChannelID,
                priority: 10,
                expiration: nil,
                payload: ByteBuffer(string: payloadJSON)
            )
            let response = try await client.send(broadcast)
            #expect(response.status == 400)
            #expect(!response.isSuccess)
            #expect(response.reason == .channelNotRegistered)
            #expect(response.disposition == .terminal)
            #expect(response.requestID == broadcast.requestID.uuidString.lowercased())
        }
    }

    @Test("broadcasts and device pushes share the connection, each with its own headers")
    func sharedConnection() async throws {
        try await withServerAndClient(script: { request in
            request.header("apns-request-id") == nil ? .ok : broadcastAccepted(request)
        }) { server, client in
            let device = try await client.send(makeNotification())
            let broadcast = try await client.send(
                APNsBroadcast(
                    bundleID: testBundleID,
                    channelID: testChannelID,
                    priority: 10,
                    expiration: nil,
                    payload: ByteBuffer(string: payloadJSON)
                )
            )
            #expect(device.status == 200)
            #expect(device.requestID == nil)
            #expect(broadcast.status == 200)
            #expect(broadcast.requestID != nil)
            let requests = server.requests
            #expect(requests.count == 2)
            #expect(Set(requests.map(\.connection)).count == 1)
            let devicePush = try #require(requests.first { $0.header(":path")?.hasPrefix("/3/device/") == true })
            #expect(devicePush.header("apns-topic") == topic)
            #expect(devicePush.header("apns-channel-id") == nil)
            #expect(devicePush.header("apns-request-id") == nil)
            let broadcastPush = try #require(requests.first { $0.header(":path")?.hasPrefix("/4/broadcasts/") == true })
            #expect(broadcastPush.header("apns-topic") == nil)
            #expect(broadcastPush.header("apns-channel-id") == testChannelID)
        }
    }
}
