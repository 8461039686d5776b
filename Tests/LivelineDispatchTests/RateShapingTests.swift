import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Logging
import ServiceLifecycle
import Testing

@Suite("Rate shaping (minUpdateInterval, injected clock)")
struct RateShapingTests {
    @Test("updates faster than the interval are coalesced; the newest goes out at the next allowed moment; an end goes at once", arguments: StoreKind.available)
    func shaping(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<3)
            let clock = ManualClock(Date(timeIntervalSince1970: 1_795_255_200))
            let transport = ScriptedTransport()
            // Leases far longer than the clock's jump below: a claim held when the clock jumps a minute must not
            // lapse with it, or a second worker would claim the activity and send the same sequence again.
            var configuration = fastConfiguration()
            configuration.claimLease = 3600
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: configuration, now: { clock.now })
            let task = Task { try await dispatcher.run() }
            defer { task.cancel() }
            func update(_ n: Int64) async throws {
                _ = try await store.acceptUpdate(
                    ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": .integer(n)], minUpdateInterval: n == 1 ? 60 : nil),
                    at: clock.now
                )
                dispatcher.wake()
            }
            func sequences(_ index: Int) -> [Int64] { transport.pushes(to: token(index)).map(\.sequence) }

            try await update(1)
            #expect(try await eventually { (0..<3).allSatisfy { sequences($0) == [1] } })

            // Three more within the minute: none goes out yet …
            for n: Int64 in 2...4 { try await update(n) }
            try await Task.sleep(for: .milliseconds(300))
            #expect((0..<3).allSatisfy { sequences($0) == [1] })

            // … and at the next allowed moment only the newest does.
            clock.set(clock.now.addingTimeInterval(60))
            dispatcher.wake()
            #expect(try await eventually { (0..<3).allSatisfy { sequences($0) == [1, 4] } }, "sent: \((0..<3).map(sequences))")

            // An end does not wait for the interval.
            try await update(5)
            _ = try await store.endActivity(ActivityEnd(appID: appID, activityID: "match", contentState: ["n": 6]), at: clock.now)
            dispatcher.wake()
            #expect(try await eventually { (0..<3).allSatisfy { sequences($0).last == 6 } })
            #expect(transport.pushes(to: token(0)).last?.event == .end)
            #expect((0..<3).allSatisfy { !sequences($0).contains(5) }, "the pending update was coalesced into the end")
            task.cancel()
            _ = await task.result
        }
    }

    @Test("a new token catches up at once, without waiting for the interval", arguments: StoreKind.available)
    func catchUpIsNotShaped(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<1)
            let clock = ManualClock(Date(timeIntervalSince1970: 1_795_255_200))
            let transport = ScriptedTransport()
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: fastConfiguration(), now: { clock.now })
            let task = Task { try await dispatcher.run() }
            defer { task.cancel() }
            _ = try await store.acceptUpdate(
                ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": 1], minUpdateInterval: 3600), at: clock.now
            )
            dispatcher.wake()
            #expect(try await eventually { transport.pushes(to: token(0)).count == 1 })
            try await register(store, activity: "match", devices: 1..<2)
            dispatcher.wake()
            #expect(try await eventually { transport.pushes(to: token(1)).map(\.sequence) == [1] })
            task.cancel()
            _ = await task.result
        }
    }
}

@Suite("FCM retry floor")
struct FCMRetryFloorTests {
    @Test("an Android push is retried no sooner than the floor, whatever the backoff says", arguments: StoreKind.available)
    func floor(on kind: StoreKind) async throws {
        var configuration = fastConfiguration()
        configuration.fcmRetryFloor = .milliseconds(400)
        let waited = try await secondAttempt(on: kind, refusedWith: "UNAVAILABLE", configuration)
        #expect(waited >= .milliseconds(400), "the 5 ms backoff was raised to the 400 ms floor")
    }

    @Test("QUOTA_EXCEEDED is retried no sooner than the quota floor (Google: from at least a minute)", arguments: StoreKind.available)
    func quotaFloor(on kind: StoreKind) async throws {
        var configuration = fastConfiguration()
        configuration.fcmRetryFloor = .milliseconds(50)
        configuration.fcmQuotaRetryFloor = .milliseconds(900)
        let waited = try await secondAttempt(on: kind, refusedWith: "QUOTA_EXCEEDED", configuration)
        #expect(waited >= .milliseconds(900), "the 50 ms floor was raised to the 900 ms quota floor")
    }

    /// How long an Android push's second attempt came after the update, its first refused with `reason`.
    private func secondAttempt(on kind: StoreKind, refusedWith reason: String, _ configuration: DispatcherConfiguration) async throws -> Duration {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await store.registerInstance(
                InstanceRegistration(appID: appID, activityID: "match", deviceID: "pixel", platform: .android, pushToken: "fcm-token-1",
                                     attributesType: "A", attributes: [:], userID: nil),
                at: Date()
            )
            let transport = ScriptedTransport()
            transport.answer("fcm-token-1", with: [.retryable(reason: reason, retryAfter: nil, providerID: nil)])
            let started = ContinuousClock.now
            try await whileDispatching(store, transport, configuration: configuration) { (dispatcher: Dispatcher) async throws in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: "fcm-token-1").count == 2 })
            }
            return ContinuousClock.now - started
        }
    }

    @Test("where each refusal's backoff starts")
    func floors() {
        var configuration = DispatcherConfiguration()
        #expect(configuration.retryFloor(platform: .android, reason: "QUOTA_EXCEEDED") == .seconds(60))
        #expect(configuration.retryFloor(platform: .android, reason: "UNAVAILABLE") == .seconds(10))
        #expect(configuration.retryFloor(platform: .android, reason: "INTERNAL") == .seconds(10))
        #expect(configuration.retryFloor(platform: .ios, reason: "TooManyRequests") == .zero)
        // A general floor longer than the quota floor wins for quota refusals too.
        configuration.fcmRetryFloor = .seconds(90)
        #expect(configuration.retryFloor(platform: .android, reason: "QUOTA_EXCEEDED") == .seconds(90))
        // Google's answer: 60 – 90 s, then 120 – 180 s, 240 – 360 s.
        let policy = RetryPolicy(maximumDelay: .seconds(30))
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, floor: .seconds(60), random: 0) == .seconds(60))
        #expect(policy.delay(afterAttempt: 2, retryAfter: nil, floor: .seconds(60), random: 1) == .seconds(180))
        #expect(policy.delay(afterAttempt: 3, retryAfter: nil, floor: .seconds(60), random: 0) == .seconds(240))
    }
}

@Suite("Shutdown during a retry's wait")
struct ShutdownDuringRetryTests {
    @Test("a graceful shutdown ends a long wait before a retry at once; the push is left for the next pass", arguments: StoreKind.available)
    func shutdownEndsTheWait(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<1)
            let transport = ScriptedTransport()
            // A 503 with a Retry-After of a minute is waited for within the pass. (A 429 TooManyRequests is not: it goes
            // to the next pass.)
            transport.answer(token(0), with: [.retryable(reason: "ServiceUnavailable", retryAfter: .seconds(60), providerID: nil)])
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: fastConfiguration())
            let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [dispatcher], logger: Logger(label: "test")))
            let running = Task { try await group.run() }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": 1]), at: Date())
            dispatcher.wake()
            #expect(try await eventually { transport.pushes(to: token(0)).count == 1 })
            // The push now waits a minute (its Retry-After) before its second attempt.
            try await Task.sleep(for: .milliseconds(200))
            let asked = ContinuousClock.now
            await group.triggerGracefulShutdown()
            try await running.value
            #expect(ContinuousClock.now - asked < .seconds(20), "the engine stopped without waiting out the Retry-After")
            #expect(transport.pushes(to: token(0)).count == 1, "nothing was sent again on the way out")
            let instance = try await store.instances(appID: appID, activityID: "match", cursor: nil, limit: 1).items.first
            #expect(instance?.deliveredSequence == 0, "not delivered: the next pass sends it")
        }
    }

    @Test(
        "a shutdown past its grace gives up the pushes still unanswered, records the answers in and hands the claim back",
        arguments: StoreKind.available
    )
    func answersInAreRecordedAfterTheGrace(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<40)
            // Every phone's push is answered at once but one, whose answer would take two minutes; it shares its chunk
            // with others, whose answers then wait for the chunk.
            let transport = ScriptedTransport()
            transport.delay(token(0), by: .seconds(120))
            var configuration = fastConfiguration()
            configuration.shutdownGrace = .seconds(1)
            configuration.pushesPerCall = 8
            configuration.progressBatchSize = 5
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: configuration)
            let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [dispatcher], logger: Logger(label: "test")))
            let running = Task { try await group.run() }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": 1]), at: Date())
            dispatcher.wake()
            #expect(try await eventually { transport.pushesBegun == 40 }, "every push is sent")
            try await Task.sleep(for: .milliseconds(200))
            let asked = ContinuousClock.now
            await group.triggerGracefulShutdown()
            try await running.value
            #expect(ContinuousClock.now - asked < .seconds(20), "the engine stopped at the end of the grace")
            let instances = try await store.instances(appID: appID, activityID: "match", cursor: nil, limit: 100).items
            let delivered = instances.filter { $0.deliveredSequence == 1 }.map(\.deviceID)
            #expect(delivered.count == 39, "every answered push is recorded: \(delivered.count) of 39")
            #expect(!delivered.contains("device-00000"), "the push given up is left for the next pass")
            // The claim was handed back: another engine can take the activity well within the lease (30 s), once its
            // retry falls due.
            let claimed = try await store.claimPendingActivity(
                owner: "another-engine", now: Date().addingTimeInterval(5), lease: 30, platforms: [.ios]
            )
            #expect(claimed?.claim?.activity.activityID == "match", "the stopped engine still held the activity")
        }
    }

    @Test("a graceful shutdown waits for a push in flight no longer than the grace, then cancels it", arguments: StoreKind.available)
    func shutdownGraceBoundsPushesInFlight(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<1)
            // A push service that takes two minutes to answer.
            let transport = ScriptedTransport(delay: .seconds(120))
            var configuration = fastConfiguration()
            configuration.shutdownGrace = .seconds(1)
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: configuration)
            let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [dispatcher], logger: Logger(label: "test")))
            let running = Task { try await group.run() }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": 1]), at: Date())
            dispatcher.wake()
            #expect(try await eventually { transport.pushesBegun == 1 }, "the push is in flight")
            try await Task.sleep(for: .milliseconds(200))
            let asked = ContinuousClock.now
            await group.triggerGracefulShutdown()
            try await running.value
            let took = ContinuousClock.now - asked
            #expect(took >= .milliseconds(900), "the grace was given")
            #expect(took < .seconds(20), "the engine stopped at the end of the grace, not when the push service answered")
        }
    }
}


@Suite("A phone left for a later pass holds no one back (injected clock)")
struct LaterPassTests {
    /// An engine over `store` whose clock stands still unless the test moves it: a retry time set for the activity never
    /// comes by itself.
    private func withStandingClock(
        _ store: SQLStore, _ transport: ScriptedTransport, _ configure: (inout DispatcherConfiguration) -> Void = { _ in },
        _ body: (Dispatcher, ManualClock) async throws -> Void
    ) async throws {
        let clock = ManualClock(Date(timeIntervalSince1970: 1_795_255_200))
        var configuration = fastConfiguration()
        configuration.retry.passRetryDelay = .seconds(30)
        configuration.claimLease = 3600
        configure(&configuration)
        let dispatcher = Dispatcher(store: store, transports: transport, configuration: configuration, now: { clock.now })
        let task = Task { try await dispatcher.run() }
        defer { task.cancel() }
        try await body(dispatcher, clock)
        task.cancel()
        _ = await task.result
    }

    private func update(_ store: SQLStore, _ n: Int64, at clock: ManualClock) async throws {
        _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["n": .integer(n)]), at: clock.now)
    }

    @Test("an iPhone refused with TooManyRequests waits for the next pass; a new update reaches the others at once", arguments: StoreKind.available)
    func tooManyRequests(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<2)
            let transport = ScriptedTransport()
            transport.answer(token(0), with: [.retryable(reason: "TooManyRequests", retryAfter: nil, providerID: nil)])
            try await withStandingClock(store, transport) { dispatcher, clock in
                try await update(store, 1, at: clock)
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: token(1)).map(\.sequence) == [1] })
                #expect(transport.pushes(to: token(0)).map(\.sequence) == [1], "not tried again within the pass")
                // The activity is due again 30 s on (the clock stands still): the next state is not held until then.
                try await update(store, 2, at: clock)
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: token(1)).map(\.sequence) == [1, 2] })
                #expect(try await eventually { transport.pushes(to: token(0)).map(\.sequence) == [1, 2] })
            }
        }
    }

    @Test(
        "an Android phone refused with QUOTA_EXCEEDED is not waited for within the pass: the others get the next state at once, it gets a retry no sooner than the quota floor",
        arguments: StoreKind.available
    )
    func quotaExceeded(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            for (device, fcmToken) in [("pixel-a", "fcm-a"), ("pixel-b", "fcm-b")] {
                _ = try await store.registerInstance(
                    InstanceRegistration(appID: appID, activityID: "match", deviceID: device, platform: .android, pushToken: fcmToken,
                                         attributesType: "A", attributes: [:], userID: nil),
                    at: Date(timeIntervalSince1970: 1_795_255_200)
                )
            }
            let transport = ScriptedTransport()
            transport.answer("fcm-a", with: [.retryable(reason: "QUOTA_EXCEEDED", retryAfter: nil, providerID: nil)])
            try await withStandingClock(store, transport, { $0.fcmQuotaRetryFloor = .seconds(60) }) { dispatcher, clock in
                try await update(store, 1, at: clock)
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: "fcm-b").map(\.sequence) == [1] })
                // Released (no longer due at its lease's end, an hour on): due again in 60 – 90 s, by the standing clock.
                let start = clock.now
                #expect(try await eventually {
                    guard let due = try await store.nextClaimable().next else { return false }
                    return due < start.addingTimeInterval(3000)
                })
                let due = try #require(try await store.nextClaimable().next)
                #expect(due >= start.addingTimeInterval(60) && due <= start.addingTimeInterval(90), "\(due.timeIntervalSince(start))")
                #expect(transport.pushes(to: "fcm-a").map(\.sequence) == [1])
                // The pass-retry delay (30 s) is not enough: Google asks a minute at least.
                clock.set(clock.now.addingTimeInterval(45))
                dispatcher.wake()
                try await Task.sleep(for: .milliseconds(300))
                #expect(transport.pushes(to: "fcm-a").map(\.sequence) == [1])
                clock.set(clock.now.addingTimeInterval(60))
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: "fcm-a").map(\.sequence) == [1, 1] })
                // A new state goes to both at once, whatever either was refused before.
                transport.answer("fcm-b", with: [.retryable(reason: "QUOTA_EXCEEDED", retryAfter: nil, providerID: nil)])
                try await update(store, 2, at: clock)
                dispatcher.wake()
                #expect(try await eventually { transport.pushes(to: "fcm-b").map(\.sequence) == [1, 2] })
                try await update(store, 3, at: clock)
                dispatcher.wake()
                #expect(try await eventually {
                    transport.pushes(to: "fcm-a").map(\.sequence) == [1, 1, 2, 3] && transport.pushes(to: "fcm-b").map(\.sequence) == [1, 2, 3]
                })
            }
        }
    }
}
