@testable import APNs
import Foundation
import NIOCore
import NIOHPACK
import Testing

/// Apple, "Sending notification requests to APNs": APNs keeps a small HPACK dynamic table, so `:path` and
/// `authorization` go as literal header fields without indexing, and the other fields with incremental indexing.
@Suite("The header blocks are encoded as APNs asks")
struct HeaderEncodingTests {
    static func indexing(_ headers: HPACKHeaders) -> [String: HPACKIndexing] {
        var result: [String: HPACKIndexing] = [:]
        for (name, _, indexing) in headers { result[name] = indexing }
        return result
    }

    @Test("a device push: :path, authorization and apns-id without indexing, the rest indexed")
    func devicePush() {
        let notification = APNsNotification(
            deviceToken: "00fc13adff785122b4ad28809a3420982341241421348097878e577c991de8f0", topic: "com.example.app.push-type.liveactivity",
            priority: 10, expiration: 1_800_000_000, payload: ByteBuffer(string: "{}")
        )
        let request = PendingRequest(notification: notification, deadline: .now() + .seconds(30))
        let headers = HeaderEncodingTests.indexing(
            APNsConnection.deviceRequestHeaders(request, authority: "api.push.apple.com", authorization: "bearer eyJ.a.b")
        )
        #expect(headers[":path"] == .nonIndexable)
        #expect(headers["authorization"] == .nonIndexable)
        #expect(headers["apns-id"] == .nonIndexable)
        for name in [":method", ":scheme", ":authority", "apns-push-type", "apns-topic", "apns-priority", "apns-expiration", "content-type"] {
            #expect(headers[name] == .indexable, "\(name)")
        }
        #expect(headers.count == 11)
    }

    @Test("a broadcast or channel request: :path, authorization and apns-request-id without indexing")
    func otherRequest() {
        let head = APNsRequestHead(
            method: "POST", path: "/4/broadcasts/apps/com.example.app",
            headers: [("apns-channel-id", "dHdpY2U="), ("apns-push-type", "liveactivity"), ("apns-request-id", UUID().uuidString.lowercased())],
            body: ByteBuffer(string: "{}")
        )
        let headers = HeaderEncodingTests.indexing(
            APNsConnection.requestHeaders(head, authority: "api.push.apple.com", authorization: "bearer eyJ.a.b", hasBody: true)
        )
        #expect(headers[":path"] == .nonIndexable)
        #expect(headers["authorization"] == .nonIndexable)
        #expect(headers["apns-request-id"] == .nonIndexable)
        for name in [":method", ":scheme", ":authority", "apns-channel-id", "apns-push-type", "content-type"] {
            #expect(headers[name] == .indexable, "\(name)")
        }
    }
}
