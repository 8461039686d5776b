import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Priority budget across a simulated hour (injected clock)")
struct PriorityBudgetDispatchTests {
    /// With one phone, each push is written in the instance's row; with twelve, the pushes of a pass go as one run, a
    /// mark in place of the rows (``DeliveryRuns``), and the budget counts them alike.
    @Test(
        "updates go at 10 within the budget and at 5 beyond it; alerts and ends at 10, counted; the hour slides",
        arguments: StoreKind.available, [1, 12]
    )
    func budgetAcrossAnHour(on kind: StoreKind, phones: Int) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<phones)
            let start = Date(timeIntervalSince1970: 1_795_255_200)
            let clock = ManualClock(start)
            let transport = ScriptedTransport()
            var configuration = fastConfiguration()
            configuration.budget = PriorityBudget(hourly: 3, hourlyWithFrequentPushes: 6)
            // The clock jumps up to 15 minutes between updates: a worker that read it before a jump claims with a lease
            // that has run out by the clock's new time, and another worker claimed the same activity beside it, each
            // pass counting its pushes (twice as many as went out, when they go as marks). A lease longer than the
            // simulated hour keeps one pass an update, as on a real clock.
            configuration.claimLease = 3 * 3_600
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: configuration, now: { clock.now })
            let task = Task { try await dispatcher.run() }
            defer { task.cancel() }

            var sequence: Int64 = 0
            /// Posts an update at `second` after the start and returns the priority its push went at.
            func update(at second: TimeInterval, alert: Bool = false, priority: Int? = nil) async throws -> Int? {
                clock.set(start.addingTimeInterval(second))
                sequence = try await store.acceptUpdate(
                    ActivityUpdate(
                        appID: appID, activityID: "match", contentState: ["n": .integer(sequence + 1)],
                        alert: alert ? LiveActivityAlert(title: "Goal", body: "1-0") : nil, priority: priority
                    ),
                    at: clock.now
                ).sequence
                dispatcher.wake()
                let expected = sequence
                _ = try await eventually {
                    try await store.activity(appID: appID, activityID: "match")?.dispatchedSequence == expected
                }
                let priorities = Set((0..<phones).map { transport.pushes(to: token($0)).last { $0.sequence == expected }?.priority })
                #expect(priorities.count == 1, "every phone's push went at the same priority: \(priorities)")
                return priorities.first ?? nil
            }

            #expect(try await update(at: 0) == 10)
            #expect(try await update(at: 60) == 10)
            #expect(try await update(at: 120) == 10)
            #expect(try await update(at: 180) == 5, "the fourth in the hour is over the budget of 3")
            #expect(try await update(at: 240, alert: true) == 10, "alerts always go at 10 …")
            #expect(try await update(at: 300, priority: 5) == 5, "an explicit priority is honoured")
            // … and are counted. The pushes count per quarter of an hour (`Priority10Tally`), and the start is a
            // quarter's first second: at 3600 s all four (0, 60, 120, 240 s) still count, their quarter being four
            // quarters old, so this one goes at 5 …
            #expect(try await update(at: 3600) == 5)
            // … and at 4500 s, five quarters on, none does: 10 again.
            #expect(try await update(at: 4500) == 10)
            #expect(try await store.activity(appID: appID, activityID: "match")?.budgetWarnedAt != nil, "crossing 80 % was recorded")
            // … and told as a lifecycle event, in the same transaction as the progress.
            let warnings = try await store.events(appID: appID, after: nil, types: [.budgetWarning], limit: 10)
            #expect(!warnings.isEmpty)
            #expect(warnings.first?.activityID == "match")
            #expect(warnings.first?.data.objectValue?["instances"] == .integer(Int64(phones)))
            let marks = try await store.priority10Marks(appID: appID, activityID: "match", since: 0)
            #expect(phones == 1 ? marks.isEmpty : !marks.isEmpty, "the twelve phones' priority-10 pushes went as runs: \(marks.count)")

            // The app reports frequent updates enabled: a larger budget.
            for phone in 0..<phones {
                _ = try await store.setFrequentPushes(
                    appID: appID, activityID: "match", deviceID: String(format: "device-%05d", phone), enabled: true, at: clock.now
                )
            }
            #expect(try await update(at: 4501) == 10)
            let usage = try await store.priority10Usage(appID: appID, activityID: "match")
            #expect(usage.count == phones)
            let used = usage.map { $0.tally.used(at: Int64(clock.now.timeIntervalSince1970)) }
            #expect(used.allSatisfy { $0 == 2 }, "\(used)")
            #expect(usage.allSatisfy { $0.frequentPushes == true })
            task.cancel()
            _ = await task.result
        }
    }
}

@Suite("Per-app priority budget")
struct AppBudgetTests {
    @Test("an app's own budget overrides the server's", arguments: StoreKind.available)
    func override(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await store.setBudget(appID: appID, BudgetOverride(hourly: 1))
            #expect(try await store.app(id: appID)?.budget == BudgetOverride(hourly: 1))
            try await register(store, activity: "match", devices: 0..<1)
            let transport = ScriptedTransport()
            try await whileDispatching(store, transport) { (dispatcher: Dispatcher) async throws in
                for n: Int64 in 1...2 {
                    _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": .integer(n)]), at: Date())
                    dispatcher.wake()
                    #expect(try await eventually { transport.pushes(to: token(0)).contains { $0.sequence == n } })
                }
            }
            #expect(transport.pushes(to: token(0)).map(\.priority) == [10, 5], "the server's 10 an hour would have sent both at 10")
        }
    }
}
