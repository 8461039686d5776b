import Foundation
import Testing

@testable import LivelineCore

@Suite("Random UUIDs")
struct RandomUUIDTests {
    @Test("the version and variant bits are set whatever the generator's bits")
    func versionAndVariant() {
        for (high, low) in [(UInt64.max, UInt64.max), (0, 0), (0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210)] {
            let text = RandomUUID.uuid(high: high, low: low).lowercasedString
            #expect(Array(text)[14] == "4")
            #expect("89ab".contains(Array(text)[19]))
        }
        #expect(RandomUUID.uuid(high: 0x0123_4567_89AB_CDEF, low: 0xFEDC_BA98_7654_3210).lowercasedString
            == "01234567-89ab-4def-bedc-ba9876543210")
    }

    @Test("values do not repeat, and print as Foundation prints them, in lowercase")
    func distinct() {
        var seen = Set<UUID>()
        for _ in 0..<10_000 {
            let id = RandomUUID.next()
            #expect(id.lowercasedString == id.uuidString.lowercased())
            seen.insert(id)
        }
        #expect(seen.count == 10_000)
    }
}
