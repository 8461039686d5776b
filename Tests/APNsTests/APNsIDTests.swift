import Foundation
import NIOCore
import Testing

@testable import APNs

@Suite("apns-id values")
struct APNsIDTests {
    @Test("each notification gets its own version 4 UUID, sent in Apple's lowercase 8-4-4-4-12 form")
    func freshIDs() throws {
        let count = 10_000
        var seen = Set<UUID>()
        for _ in 0..<count {
            let id = APNsNotification(deviceToken: "ab", topic: "t", priority: 10, payload: ByteBuffer()).apnsID
            seen.insert(id)
            let text = id.lowercasedString
            #expect(text == id.uuidString.lowercased())
            let characters = Array(text)
            #expect(characters.count == 36)
            #expect(characters[14] == "4", "version 4: \(text)")
            #expect("89ab".contains(characters[19]), "RFC 4122 variant: \(text)")
        }
        #expect(seen.count == count)
    }

    @Test("a notification keeps the apns-id it was given")
    func givenID() {
        let id = UUID()
        #expect(APNsNotification(deviceToken: "ab", topic: "t", priority: 10, apnsID: id, payload: ByteBuffer()).apnsID == id)
    }
}
