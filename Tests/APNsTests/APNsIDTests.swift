import Foundation
import NIOCore
import Testing

@testable import APNs

@Suite("apns-id values")
struct APNsIDTests {
    @Test("a notification has no apns-id unless it is given one: APNs makes one up for a request without")
    func noIDByDefault() {
        #expect(APNsNotification(deviceToken: "ab", topic: "t", priority: 10, payload: ByteBuffer()).apnsID == nil)
        let request = PendingRequest(
            notification: APNsNotification(deviceToken: "ab", topic: "t", priority: 10, payload: ByteBuffer()), deadline: .now() + .seconds(30)
        )
        #expect(request.apnsIDString == nil)
    }

    @Test("a notification keeps the apns-id it was given, sent in Apple's lowercase 8-4-4-4-12 form")
    func givenID() {
        let id = UUID()
        let notification = APNsNotification(deviceToken: "ab", topic: "t", priority: 10, apnsID: id, payload: ByteBuffer())
        #expect(notification.apnsID == id)
        let text = PendingRequest(notification: notification, deadline: .now() + .seconds(30)).apnsIDString
        #expect(text == id.uuidString.lowercased())
        #expect(text?.count == 36)
    }
}
