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

    @Test("the version and variant bits are set whatever the generator's bits")
    func versionAndVariant() {
        for (high, low) in [(UInt64.max, UInt64.max), (0, 0), (0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210)] {
            let text = APNsIDGenerator.uuid(high: high, low: low).lowercasedString
            #expect(Array(text)[14] == "4")
            #expect("89ab".contains(Array(text)[19]))
        }
        #expect(APNsIDGenerator.uuid(high: 0x0123_4567_89AB_CDEF, low: 0xFEDC_BA98_7654_3210).lowercasedString
            == "01234567-89ab-4def-bedc-ba9876543210")
    }

    @Test("a notification keeps the apns-id it was given")
    func givenID() {
        let id = UUID()
        #expect(APNsNotification(deviceToken: "ab", topic: "t", priority: 10, apnsID: id, payload: ByteBuffer()).apnsID == id)
    }
}
