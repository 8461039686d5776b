import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Public numbers: what an app sees in place of the counters all apps share")
struct PublicNumbersTests {
    let secret: [UInt8] = Array(0..<32)

    @Test("each counter has one number, in the numbers' range, and the number gives the counter back")
    func roundTrip() {
        let numbers = PublicNumbers(secret: secret, appID: "app_one")
        var seen = Set<Int64>()
        for counter in Array(1...3_000) + [1 << 26, (1 << 26) + 1, (1 << 52) - 1, 1 << 52] {
            let number = numbers.number(for: Int64(counter))
            #expect(PublicNumbers.numbers.contains(number))
            #expect(numbers.counter(for: number) == Int64(counter))
            seen.insert(number)
        }
        #expect(seen.count == 3_004, "two counters had the same number")
    }

    @Test("a number outside the range is no counter's; apps and secrets give different numbers")
    func keyed() {
        let one = PublicNumbers(secret: secret, appID: "app_one")
        #expect(one.counter(for: 5) == nil)
        #expect(one.counter(for: PublicNumbers.numbers.upperBound) == nil)
        #expect(one.counter(for: -1) == nil)
        let two = PublicNumbers(secret: secret, appID: "app_two")
        let otherSecret = PublicNumbers(secret: Array(repeating: 9, count: 32), appID: "app_one")
        let counters: [Int64] = Array(1...64)
        #expect(counters.map(one.number(for:)) != counters.map(two.number(for:)))
        #expect(counters.map(one.number(for:)) != counters.map(otherSecret.number(for:)))
        // Consecutive counters are not consecutive numbers: the gap between two numbers says nothing.
        #expect(zip(counters, counters.dropFirst()).contains { one.number(for: $1) - one.number(for: $0) != 1 })
    }

    @Test("the secret is the database's: the same numbers after a reopen, and in a second store on the database", arguments: StoreKind.available)
    func kept(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, location in
            let before = store.publicNumbers(appID: "app_test").number(for: 42)
            let again: SQLStore =
                switch kind {
                case .sqlite: try await SQLStore.open(path: location)
                case .postgres: try await SQLStore.open(postgres: try PostgresDatabaseURL(location), writers: 1, readers: 1)
                }
            #expect(again.publicNumbers(appID: "app_test").number(for: 42) == before)
            try await again.close()
        }
    }
}
