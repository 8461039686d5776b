@testable import APNs
import Foundation
import NIOCore
import NIOHPACK
import Testing

/// Apple, "Sending notification requests to APNs": APNs keeps a small HPACK dynamic table, so `:path` and
/// `authorization` go as literal header fields without indexing; `apns-id`, `apns-expiration` (and a broadcast's
/// `apns-request-id`) with incremental indexing the first time on a connection, then without; the other fields with
/// incremental indexing.
@Suite("The header blocks are encoded as APNs asks")
struct HeaderEncodingTests {
    static func indexing(_ headers: HPACKHeaders) -> [String: HPACKIndexing] {
        var result: [String: HPACKIndexing] = [:]
        for (name, _, indexing) in headers { result[name] = indexing }
        return result
    }

    @Test("a device push: :path and authorization without indexing; apns-id and apns-expiration indexed the first time, then not; the rest indexed")
    func devicePush() {
        let notification = APNsNotification(
            deviceToken: "00fc13adff785122b4ad28809a3420982341241421348097878e577c991de8f0", topic: "com.example.app.push-type.liveactivity",
            priority: 10, expiration: 1_800_000_000, apnsID: UUID(), payload: ByteBuffer(string: "{}")
        )
        let request = PendingRequest(notification: notification, deadline: .now() + .seconds(30))
        var changing = ChangingHeaders()
        for first in [true, false, false] {
            let headers = HeaderEncodingTests.indexing(
                APNsConnection.deviceRequestHeaders(request, authority: "api.push.apple.com", authorization: "bearer eyJ.a.b", changing: &changing)
            )
            #expect(headers[":path"] == .nonIndexable)
            #expect(headers["authorization"] == .nonIndexable)
            #expect(headers["apns-id"] == (first ? .indexable : .nonIndexable))
            #expect(headers["apns-expiration"] == (first ? .indexable : .nonIndexable))
            for name in [":method", ":scheme", ":authority", "apns-push-type", "apns-topic", "apns-priority"] {
                #expect(headers[name] == .indexable, "\(name)")
            }
            #expect(headers.count == 10)
        }
    }

    @Test("a device push without an apns-id sends none, and no header Apple does not document")
    func withoutAPNsID() {
        var changing = ChangingHeaders()
        let request = PendingRequest(
            notification: APNsNotification(deviceToken: "00", topic: "t", priority: 10, payload: ByteBuffer(string: "{}")), deadline: .now() + .seconds(30)
        )
        let headers = APNsConnection.deviceRequestHeaders(request, authority: "a", authorization: "b", changing: &changing)
        #expect(
            Set(headers.map(\.name)) == [":method", ":scheme", ":path", ":authority", "authorization", "apns-push-type", "apns-topic", "apns-priority"]
        )
        #expect(headers.count == 8)
    }

    @Test("a push without an expiration leaves apns-expiration's first time for the first push that has one")
    func expirationLater() {
        var changing = ChangingHeaders()
        let without = PendingRequest(
            notification: APNsNotification(deviceToken: "00", topic: "t", priority: 5, apnsID: UUID(), payload: ByteBuffer(string: "{}")),
            deadline: .now() + .seconds(30)
        )
        let with = PendingRequest(
            notification: APNsNotification(deviceToken: "00", topic: "t", priority: 5, expiration: 1, apnsID: UUID(), payload: ByteBuffer(string: "{}")),
            deadline: .now() + .seconds(30)
        )
        _ = APNsConnection.deviceRequestHeaders(without, authority: "a", authorization: "b", changing: &changing)
        let second = HeaderEncodingTests.indexing(APNsConnection.deviceRequestHeaders(with, authority: "a", authorization: "b", changing: &changing))
        #expect(second["apns-id"] == .nonIndexable)
        #expect(second["apns-expiration"] == .indexable)
    }

    @Test("a broadcast or channel request: :path and authorization without indexing; apns-request-id and apns-expiration indexed the first time, then not")
    func otherRequest() {
        var changing = ChangingHeaders()
        for first in [true, false] {
            let head = APNsRequestHead(
                method: "POST", path: "/4/broadcasts/apps/com.example.app",
                headers: [
                    ("apns-channel-id", "dHdpY2U="), ("apns-push-type", "liveactivity"), ("apns-expiration", "1800000000"),
                    ("apns-request-id", UUID().uuidString.lowercased()),
                ],
                body: ByteBuffer(string: "{}")
            )
            let headers = HeaderEncodingTests.indexing(
                APNsConnection.requestHeaders(head, authority: "api.push.apple.com", authorization: "bearer eyJ.a.b", hasBody: true, changing: &changing)
            )
            #expect(headers[":path"] == .nonIndexable)
            #expect(headers["authorization"] == .nonIndexable)
            #expect(headers["apns-request-id"] == (first ? .indexable : .nonIndexable))
            #expect(headers["apns-expiration"] == (first ? .indexable : .nonIndexable))
            for name in [":method", ":scheme", ":authority", "apns-channel-id", "apns-push-type", "content-type"] {
                #expect(headers[name] == .indexable, "\(name)")
            }
        }
    }
}
