import Testing

@testable import LivelineStore

@Suite("Priority-10 times in the instances table")
struct Priority10TimesTests {
    @Test("times survive a round trip, padded to a multiple of the reserved width")
    func roundTrip() {
        for sent in [[], [1_700_000_000], Array(1_700_000_000..<1_700_000_040)] as [[Int64]] {
            let text = Priority10Times.encode(sent)
            #expect(text.utf8.count % Priority10Times.reservedWidth == 0)
            #expect(text.utf8.count >= Priority10Times.reservedWidth)
            #expect(Priority10Times.decode(text) == sent)
        }
    }

    @Test("adding a time keeps the length until the reserved room is used up")
    func lengthIsStable() {
        let lengths = (0...8).map { count in Priority10Times.encode(Array(1_700_000_000..<1_700_000_000 + Int64(count))).utf8.count }
        // Eight ten-digit times and their commas take 87 bytes: all fit in the first 96.
        #expect(Set(lengths) == [Priority10Times.reservedWidth])
        #expect(Priority10Times.encode(Array(1_700_000_000..<1_700_000_009)).utf8.count == 2 * Priority10Times.reservedWidth)
    }

    @Test("the unpadded form written before is still read, and nothing is read from nothing")
    func legacyText() {
        #expect(Priority10Times.decode("1700000000,1700000100") == [1_700_000_000, 1_700_000_100])
        #expect(Priority10Times.decode(nil) == [])
        #expect(Priority10Times.decode("") == [])
    }
}
