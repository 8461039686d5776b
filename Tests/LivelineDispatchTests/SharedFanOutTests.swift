import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

@testable import LivelineDispatch
@testable import LivelineStore

/// Engines sharing one activity's fan-out in slices (``DispatcherConfiguration/sliceSize``), as the nodes on one
/// PostgreSQL database do: here two engines on one Store, each with its own push service so that each one's share shows.
@Suite("Dispatcher: shared fan-outs")
struct SharedFanOutTests {
    private func slicing(_ size: Int) -> DispatcherConfiguration {
        var configuration = fastConfiguration()
        configuration.sliceSize = size
        configuration.slicePollInterval = .milliseconds(10)
        configuration.workers = 2
        return configuration
    }

    @Test("two engines share one update's fan-out: each sends a part, every instance gets it exactly once", arguments: StoreKind.available)
    func twoEnginesShareOneFanOut(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<1_000)
            // Slow enough that one engine cannot send every slice before the other looks.
            let first = ScriptedTransport(delay: .milliseconds(2))
            let second = ScriptedTransport(delay: .milliseconds(2))
            // Both engines have started (and taken back the claims on the store, as an engine on SQLite does at its
            // start) before the update arrives.
            let starts = LoggedMessages()
            try await whileDispatching(store, first, configuration: slicing(100), logger: starts.logger()) { (one: Dispatcher) async throws in
                try await whileDispatching(store, second, configuration: slicing(100), logger: starts.logger()) { (_: Dispatcher) async throws in
                    #expect(try await eventually { starts.enginesStarted == 2 })
                    _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": 1]), at: Date())
                    one.wake()
                    #expect(try await eventually { try await allCaughtUp(store, "match") })
                    #expect(
                        try await eventually {
                            let slices = try await store.sliceOutcomes(appID: appID, activityID: "match")
                            let due = try await store.nextClaimable().next
                            return slices.isEmpty && due == nil
                        },
                        "the slices are dropped and the activity is released as dispatched"
                    )
                }
            }
            // Each slice's pass sent its whole range the one sequence: the holder settled the activity at it.
            let settled = try await store.reader.query(
                "SELECT settled_sequence FROM activities WHERE app_id = ? AND activity_id = 'match'", [.text(appID)]
            ).first?.column("settled_sequence")?.integer
            #expect(settled == 1)
            let pushes = first.pushes + second.pushes
            #expect(pushes.count == 1_000, "no instance was sent the update twice")
            #expect(Set(pushes.map(\.token)) == Set((0..<1_000).map(token)))
            #expect(first.pushes.count > 0 && second.pushes.count > 0, "both engines sent part: \(first.pushes.count) and \(second.pushes.count)")
            let timeline = try await store.deliveries(appID: appID, activityID: "match", cursor: nil, limit: 2_000)
            #expect(timeline.items.count == 1_000)
        }
    }

    @Test("an engine stopped mid-way through a shared fan-out: the next one adopts its slices and ends every instance at the newest state", arguments: StoreKind.available)
    func stoppedEngineSlicesAreAdopted(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "big", devices: 0..<600)
            let slow = ScriptedTransport(delay: .milliseconds(5))
            var configuration = slicing(100)
            configuration.pushesInFlight = 8
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "big", contentState: ["n": 1]), at: Date())
            try await whileDispatching(store, slow, configuration: configuration) { (_: Dispatcher) async throws in
                #expect(try await eventually { slow.pushes.count > 100 })
            }
            #expect(try await !allCaughtUp(store, "big"), "the first engine was stopped part-way")
            #expect(try await store.sliceOutcomes(appID: appID, activityID: "big").count == 6, "its plan is left for the next holder")
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "big", contentState: ["n": 2]), at: Date())
            let fresh = ScriptedTransport()
            try await whileDispatching(store, fresh, configuration: slicing(100)) { (dispatcher: Dispatcher) async throws in
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "big") })
                #expect(try await eventually { try await store.sliceOutcomes(appID: appID, activityID: "big").isEmpty })
            }
            #expect(Set(fresh.pushes.map(\.token)).count == 600)
            #expect(fresh.pushes.allSatisfy { $0.sequence == 2 })
        }
    }

    @Test("the holder looks again as the slices' worst outcome says")
    func releaseTimingFromOutcomes() {
        #expect(Dispatcher.releaseTiming(after: [.done, .done]) == .now)
        #expect(Dispatcher.releaseTiming(after: [.done, .retryLater]) == .afterPassRetryDelay)
        #expect(Dispatcher.releaseTiming(after: [.retryLater, .storeFailed, .done]) == .afterStoreRetryDelay)
    }
}
