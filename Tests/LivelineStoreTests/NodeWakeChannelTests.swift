import Foundation
@testable import LivelineStore
import LivelineTestSupport
import PostgresNIO
import Synchronization
import Testing

@Suite("Wake-ups between nodes (LISTEN / NOTIFY)")
struct NodeWakeChannelTests {
    /// What a node's channel heard, in order.
    final class Heard: Sendable {
        private let heard = Mutex<[NodeWakeChannel.Announcer]>([])
        func append(_ announcer: NodeWakeChannel.Announcer) { heard.withLock { $0.append(announcer) } }
        var all: [NodeWakeChannel.Announcer] { heard.withLock { $0 } }
        func clear() { heard.withLock { $0.removeAll() } }
    }

    /// Polls `condition` every 50 ms for up to `seconds`.
    func eventually(_ seconds: Double = 20, _ condition: () async throws -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if try await condition() { return true }
            try await Task.sleep(for: .milliseconds(50))
        }
        return try await condition()
    }

    @Test(
        "after the connections are lost, each node reconnects once, and its announcements reach the others and itself again",
        .enabled(if: StoreKind.available.contains(.postgres))
    )
    func announcementsSurviveALostConnection() async throws {
        try await withTemporaryPostgresDatabase { url in
            let database = try PostgresDatabaseURL(url)
            let a = NodeWakeChannel(url: database, logger: PostgresTestServer.logger)
            let b = NodeWakeChannel(url: database, logger: PostgresTestServer.logger)
            let heardByA = Heard()
            let heardByB = Heard()
            let noticesToA = Mutex<[AppNotice]>([])
            let noticesToB = Mutex<[AppNotice]>([])
            let running = [
                Task { await a.run(onWake: { heardByA.append($0) }, onAppNotice: { notice in noticesToA.withLock { $0.append(notice) } }) },
                Task { await b.run(onWake: { heardByB.append($0) }, onAppNotice: { notice in noticesToB.withLock { $0.append(notice) } }) },
            ]
            defer { for task in running { task.cancel() } }

            // Both listening: A's announcement reaches B, and A itself.
            #expect(try await eventually {
                a.announce()
                return heardByB.all.contains(.anotherNode) && heardByA.all.contains(.thisNode)
            })

            // Every connection to the database is cut (as a restart of PostgreSQL does).
            heardByA.clear()
            heardByB.clear()
            let killer = try await PostgresConnection.connect(configuration: try database.configuration(), id: 99, logger: PostgresTestServer.logger)
            _ = try await killer.query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
                logger: PostgresTestServer.logger
            )
            try await killer.close()
            // Each node wakes its own engine once for what it may have missed, after a pause (a second, or more on a
            // loaded machine), and then rests. Once listening again, each reads the apps again: the notices sent
            // meanwhile were not heard. (Both nodes' notices are awaited: an announcement of A's sent just before the cut
            // may reach B before B has noticed its own loss, and B's wake-up for that loss then comes later.)
            #expect(try await eventually {
                noticesToA.withLock { $0 } == [.mayHaveMissed] && noticesToB.withLock { $0 } == [.mayHaveMissed]
                    && heardByA.all.contains(.anotherNode) && heardByB.all.contains(.anotherNode)
            }, "\(noticesToA.withLock { $0 }), \(noticesToB.withLock { $0 }), \(heardByA.all), \(heardByB.all)")
            heardByA.clear()
            heardByB.clear()
            try await Task.sleep(for: .seconds(1))
            #expect(heardByA.all.isEmpty && heardByB.all.isEmpty, "a node reconnecting in a loop wakes itself at every turn")

            // A's announcements are sent again: B hears them as another node's, A as its own.
            #expect(try await eventually {
                a.announce()
                return heardByB.all.contains(.anotherNode) && heardByA.all.contains(.thisNode)
            })
            #expect(!heardByB.all.contains(.thisNode), "B announced nothing")
            for task in running { task.cancel() }
            for task in running { await task.value }
        }
    }

    @Test("an app notice's wire form is read back as the same notice; unknown and malformed ones are ignored")
    func appNoticeWire() {
        for notice in [AppNotice.keysRevoked(appID: "app_1"), .appDeleted(appID: "app_two")] {
            #expect(notice.wire.flatMap(AppNotice.init(wire:)) == notice)
        }
        #expect(AppNotice.mayHaveMissed.wire == nil, "never sent")
        for payload in ["", "deleted", "deleted ", "renamed app_1", "keys-revoked"] {
            #expect(AppNotice(wire: payload) == nil, "\(payload.debugDescription)")
        }
    }

    @Test(
        "the Store's key rotations and app deletions are heard by every node once committed; refused ones are not",
        .enabled(if: StoreKind.available.contains(.postgres))
    )
    func appNoticesFromTheStore() async throws {
        try await withTemporaryStore(.postgres) { store, url in
            // Another node's channel; the Store is a node of its own, or a one-shot command.
            let node = NodeWakeChannel(url: try PostgresDatabaseURL(url), logger: PostgresTestServer.logger)
            let heard = Mutex<[AppNotice]>([])
            let listening = Task { await node.run(onWake: { _ in }, onAppNotice: { notice in heard.withLock { $0.append(notice) } }) }
            defer { listening.cancel() }
            for id in ["app_kept", "app_gone"] {
                try await store.createApp(AppRecord(id: id, name: id, bundleID: "com.example.\(id)", androidPackage: nil, createdAt: Date()), keys: [])
            }
            // Rotated until the node listens (a rotation is harmless to repeat).
            #expect(try await eventually {
                try await store.replaceKeys(appID: "app_kept", with: [])
                return heard.withLock { $0.contains(.keysRevoked(appID: "app_kept")) }
            })
            // Refused: no such app.
            await #expect(throws: StoreError.appNotFound) { try await store.replaceKeys(appID: "app_missing", with: []) }
            #expect(try await store.deleteApp(id: "app_missing", leavingChannels: false) == nil)
            #expect(try await store.deleteApp(id: "app_gone", leavingChannels: false) != nil)
            #expect(try await eventually { heard.withLock { $0.contains(.appDeleted(appID: "app_gone")) } })
            // Notices arrive in the order of their commits: a notice for a refused change would have come before.
            let all = heard.withLock { $0 }
            #expect(all.allSatisfy { $0 == .keysRevoked(appID: "app_kept") || $0 == .appDeleted(appID: "app_gone") }, "\(all)")
            #expect(all.filter { $0 == .appDeleted(appID: "app_gone") }.count == 1)
            listening.cancel()
            await listening.value
        }
    }
}
