import Foundation
@testable import LivelineStore
import LivelineTestSupport
import Testing

@Suite("The housekeeping lease on PostgreSQL")
struct HousekeepingLeaseTests {
    @Test(
        "one node at a time holds it; a node that closes its store hands it over at once, not after the lease",
        .enabled(if: StoreKind.available.contains(.postgres))
    )
    func handedOverAtClose() async throws {
        try await withTemporaryPostgresDatabase { url in
            let first = try await SQLStore.open(postgres: try PostgresDatabaseURL(url), writers: 1, readers: 1)
            let second = try await SQLStore.open(postgres: try PostgresDatabaseURL(url), writers: 1, readers: 1)
            do {
                let now = Date()
                #expect(try await first.leadsHousekeeping(at: now))
                #expect(try await first.leadsHousekeeping(at: now.addingTimeInterval(60)), "its holder renews it")
                #expect(try await !second.leadsHousekeeping(at: now.addingTimeInterval(60)))
                try await first.close()
                // Well within the lease the first node renewed: it is free because the node let it go.
                #expect(try await second.leadsHousekeeping(at: now.addingTimeInterval(61)))
                try await second.close()
            } catch {
                try? await first.close()
                try? await second.close()
                throw error
            }
        }
    }
}
