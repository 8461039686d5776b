import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Logging
import NIOCore
import Testing

/// A push service at the edge of a unit test: records every push and answers from a script.
final class ScriptedTransport: PushTransport, PushTransportDirectory, @unchecked Sendable {
    private let lock = NSLock()
    private var sent: [OutgoingPush] = []
    private var script: [String: [PushOutcome]] = [:]
    private var healthReports: [(String, Bool)] = []
    private var begun = 0
    private var delays: [String: Duration] = [:]
    let delay: Duration?

    /// A transport that answers each push after `delay` (at once when nil); a push cancelled meanwhile is a retry.
    init(delay: Duration? = nil) { self.delay = delay }

    /// Answers the pushes to `token` after `delay` instead.
    func delay(_ token: String, by delay: Duration) { lock.withLock { delays[token] = delay } }

    /// The next outcomes for `token`, in order; afterwards pushes are delivered.
    func answer(_ token: String, with outcomes: [PushOutcome]) { lock.withLock { script[token] = outcomes } }

    var pushes: [OutgoingPush] { lock.withLock { sent } }
    func pushes(to token: String) -> [OutgoingPush] { pushes.filter { $0.token == token } }
    var unhealthyReports: Int { lock.withLock { healthReports.filter { !$0.1 }.count } }
    /// The health reports, in order: true for healthy.
    var healthReported: [Bool] { lock.withLock { healthReports.map(\.1) } }
    /// Pushes handed over, answered or still in flight (in `delay`).
    var pushesBegun: Int { lock.withLock { begun } }

    func send(_ push: OutgoingPush) async -> PushOutcome {
        let delay = lock.withLock {
            begun += 1
            return delays[push.token] ?? self.delay
        }
        if let delay {
            do {
                try await Task.sleep(for: delay)
            } catch {
                return .retryable(reason: "cancelled", retryAfter: nil, providerID: nil)
            }
        }
        return lock.withLock {
            sent.append(push)
            if var outcomes = script[push.token], !outcomes.isEmpty {
                let next = outcomes.removeFirst()
                script[push.token] = outcomes
                return next
            }
            return .delivered(providerID: UUID().uuidString.lowercased())
        }
    }

    func transport(appID: String, platform: Platform) async throws -> (any PushTransport)? { self }
    func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async {
        lock.withLock { healthReports.append((appID, healthy)) }
    }
}

let appID = "app_dispatch"

func seedApp(_ store: some Store) async throws {
    try await store.createApp(AppRecord(id: appID, name: "D", bundleID: "com.example.d", androidPackage: nil, createdAt: Date()), keys: [])
}

func token(_ index: Int) -> String { String(format: "%064x", index + 1) }

func register(_ store: some Store, activity: String, devices: Range<Int>) async throws {
    for index in devices {
        _ = try await store.registerInstance(
            InstanceRegistration(
                appID: appID, activityID: activity, deviceID: String(format: "device-%05d", index), platform: .ios,
                pushToken: token(index), attributesType: "A", attributes: [:], userID: nil
            ),
            at: Date()
        )
    }
}

func fastConfiguration() -> DispatcherConfiguration {
    var configuration = DispatcherConfiguration()
    configuration.idlePollInterval = .milliseconds(10)
    configuration.retry = RetryPolicy(maximumAttempts: 4, baseDelay: .milliseconds(5), maximumDelay: .milliseconds(20), passRetryDelay: .milliseconds(50))
    configuration.pageSize = 100
    configuration.pushesInFlight = 64
    return configuration
}

/// Runs a dispatcher while `body` runs, then stops it.
func whileDispatching<T>(
    _ store: SQLStore, _ transport: ScriptedTransport, configuration: DispatcherConfiguration = fastConfiguration(),
    logger: Logger = Logger(label: "liveline.dispatch"), _ body: (Dispatcher) async throws -> T
) async throws -> T {
    let dispatcher = Dispatcher(store: store, transports: transport, configuration: configuration, logger: logger)
    let task = Task { try await dispatcher.run() }
    defer { task.cancel() }
    let result = try await body(dispatcher)
    task.cancel()
    _ = await task.result
    return result
}

/// Waits (bounded) until `condition` holds.
///
/// The bound is generous: these tests share the process (and NIO's thread pool, where every store's SQLite work
/// queues) with the end-to-end fan-outs, so on a loaded 2-core machine one push has taken over 20 s to go out. What
/// they check is what happens, not how fast.
func eventually(timeout: Duration = .seconds(60), _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: .milliseconds(20))
    }
    return try await condition()
}

func allCaughtUp(_ store: SQLStore, _ activity: String) async throws -> Bool {
    guard let record = try await store.activity(appID: appID, activityID: activity) else { return false }
    var cursor: String?
    repeat {
        let page = try await store.instances(appID: appID, activityID: activity, cursor: cursor, limit: 200)
        for instance in page.items where instance.state == .active && instance.deliveredSequence < record.sequence { return false }
        cursor = page.nextCursor
    } while cursor != nil
    return true
}

@Suite("Delivery engine")
struct DispatcherTests {
    @Test("one update fans out to every instance once, with one shared payload", arguments: StoreKind.available)
    func fanOut(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "order-1", devices: 0..<250)
            let transport = ScriptedTransport()
            try await whileDispatching(store, transport) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "order-1", contentState: ["eta": 5]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "order-1") })
            }
            let pushes = transport.pushes
            #expect(pushes.count == 250)
            #expect(Set(pushes.map(\.token)).count == 250)
            let first = try #require(pushes.first)
            #expect(first.topic == "com.example.d.push-type.liveactivity")
            #expect(first.event == .update)
            let payload = try JSONValue(parsing: first.payload.readableBytesView)
            let aps = try #require(payload.objectValue?["aps"]?.objectValue)
            #expect(aps["content-state"] == ["eta": 5])
            #expect(aps["event"] == "update")
            if case .integer = aps["timestamp"] {} else { Issue.record("timestamp is not an integer") }
            let timeline = try await store.deliveries(appID: appID, activityID: "order-1", cursor: nil, limit: 500)
            #expect(timeline.items.count == 250)
            #expect(timeline.items.allSatisfy { $0.status == .delivered && $0.sequence == 1 })
        }
    }

    @Test("a pass that recorded as many attempts as the timeline keeps trims the activity's timeline itself", arguments: StoreKind.available)
    func passTrimsTimeline(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "crowd", devices: 0..<250)
            try await register(store, activity: "other", devices: 0..<30)
            var configuration = fastConfiguration()
            configuration.deliveriesPerActivity = 100
            let transport = ScriptedTransport()
            func timeline(_ activity: String) async throws -> [DeliveryRecord] {
                try await store.deliveries(appID: appID, activityID: activity, cursor: nil, limit: 1000).items
            }
            try await whileDispatching(store, transport, configuration: configuration) { dispatcher in
                // The periodic prune ran when the engine started, before anything was sent; it runs again only after
                // a minute, so what trims the timeline from here on is the passes themselves.
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "other", contentState: ["n": 1]), at: Date())
                for n in 1...2 {
                    _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "crowd", contentState: ["n": .integer(Int64(n))]), at: Date())
                    dispatcher.wake()
                    #expect(try await eventually { try await allCaughtUp(store, "crowd") })
                    #expect(try await eventually(timeout: .seconds(20)) { try await timeline("crowd").count == 100 })
                }
            }
            let kept = try await timeline("crowd")
            // The newest: all from the second pass.
            #expect(kept.allSatisfy { $0.sequence == 2 })
            // A small pass trims nothing.
            #expect(try await timeline("other").count == 30)
        }
    }

    @Test(
        "a pass over many more instances than the timeline keeps writes few more than it keeps, and keeps the newest",
        arguments: StoreKind.available
    )
    func passHoldsBackWhatItWouldPrune(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "crowd", devices: 0..<600)
            var configuration = fastConfiguration()
            configuration.deliveriesPerActivity = 50
            configuration.pageSize = 40
            configuration.progressBatchSize = 10
            let transport = ScriptedTransport()
            func timeline() async throws -> [DeliveryRecord] {
                try await store.deliveries(appID: appID, activityID: "crowd", cursor: nil, limit: 1000).items
            }
            try await whileDispatching(store, transport, configuration: configuration) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "crowd", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "crowd") })
                #expect(try await eventually(timeout: .seconds(20)) { try await timeline().count == 50 })
            }
            #expect(transport.pushes.count == 600)
            let kept = try await timeline()
            // The newest 50 attempts, one a device: devices pushed to last. Progress is recorded in the order the
            // engine takes the answers, which may differ from the transport's by the pushes in flight (64).
            #expect(Set(kept.map(\.deviceID)).count == 50)
            #expect(kept.allSatisfy { $0.sequence == 1 && $0.status == .delivered })
            let pushedLast = Set(transport.pushes.suffix(50 + configuration.pushesInFlight).map(\.deviceID))
            #expect(Set(kept.map(\.deviceID)).isSubset(of: pushedLast))
            // An attempt's id is its segment's times 4,096 plus its place: the segments the pass wrote. Each batch of
            // ten written is one; written as they came, the 600 attempts would have taken 60.
            let segments = Set(kept.map { $0.id / 4096 })
            let newestSegment = try #require(segments.max())
            #expect(newestSegment <= 10, "segments written: \(newestSegment)")
        }
    }

    @Test("latest state wins: intermediate states may be skipped, the final one always arrives, end ends instances", arguments: StoreKind.available)
    func coalescing(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "match", devices: 0..<40)
            let transport = ScriptedTransport(delay: .milliseconds(2))
            try await whileDispatching(store, transport) { dispatcher in
                for goal in 0..<20 {
                    _ = try await store.acceptUpdate(
                        ActivityUpdate(appID: appID, activityID: "match", contentState: ["goals": .integer(Int64(goal))]), at: Date()
                    )
                    dispatcher.wake()
                }
                _ = try await store.endActivity(ActivityEnd(appID: appID, activityID: "match", contentState: ["goals": 99]), at: Date())
                dispatcher.wake()
                #expect(try await eventually {
                    try await store.activity(appID: appID, activityID: "match")?.instanceCounts[.ended] == 40
                })
            }
            for index in 0..<40 {
                let received = transport.pushes(to: token(index))
                let sequences = received.map(\.sequence)
                #expect(sequences == sequences.sorted(), "sequences must only rise per instance")
                #expect(Set(sequences).count == sequences.count, "no sequence twice")
                #expect(received.last?.event == .end)
                let timestamps = try received.map { push -> Int64 in
                    let aps = try JSONValue(parsing: push.payload.readableBytesView).objectValue?["aps"]?.objectValue
                    guard case .integer(let value)? = aps?["timestamp"] else { return -1 }
                    return value
                }
                #expect(zip(timestamps, timestamps.dropFirst()).allSatisfy { $0 < $1 }, "timestamps strictly increase: \(timestamps)")
            }
            #expect(transport.pushes.count < 21 * 40, "intermediate states were coalesced")
        }
    }

    @Test("a bad token invalidates only its instance; 503s are retried until delivered", arguments: StoreKind.available)
    func invalidationAndRetry(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "a", devices: 0..<10)
            let transport = ScriptedTransport()
            transport.answer(token(3), with: [.invalidToken(reason: "Unregistered", providerID: nil)])
            transport.answer(token(5), with: [
                .retryable(reason: "ServiceUnavailable", retryAfter: nil, providerID: nil),
                .retryable(reason: "TooManyRequests", retryAfter: .milliseconds(10), providerID: nil),
            ])
            try await whileDispatching(store, transport) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "a", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "a") })
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "a", contentState: ["n": 2]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "a") })
            }
            let activity = try #require(try await store.activity(appID: appID, activityID: "a"))
            #expect(activity.instanceCounts[.invalidated] == 1)
            #expect(activity.instanceCounts[.active] == 9)
            #expect(transport.pushes(to: token(3)).count == 1, "nothing more after invalidation")
            #expect(transport.pushes(to: token(5)).count == 4, "two failures, then sequence 1, then sequence 2")
            let timeline = try await store.deliveries(appID: appID, activityID: "a", cursor: nil, limit: 100).items
            let device5 = timeline.filter { $0.deviceID == "device-00005" && $0.sequence == 1 }.sorted { $0.id < $1.id }
            #expect(device5.map(\.status) == [.retrying, .retrying, .delivered])
            // The 503 is retried within the pass; APNs' TooManyRequests (too many pushes to that device) waits for the
            // next pass, where the push is a first attempt again.
            #expect(device5.map(\.attempt) == [1, 2, 1])
            #expect(!fastConfiguration().retriesWithinPass(platform: .ios, reason: "TooManyRequests"))
            #expect(fastConfiguration().retriesWithinPass(platform: .ios, reason: "ServiceUnavailable"))
            // FCM's QUOTA_EXCEEDED (often one device's limit, and a minute's wait at least) waits for a later pass too.
            #expect(!fastConfiguration().retriesWithinPass(platform: .android, reason: "QUOTA_EXCEEDED"))
            #expect(fastConfiguration().retriesWithinPass(platform: .android, reason: "UNAVAILABLE"))
        }
    }

    @Test("work that falls due later is sent when it does, with every worker idle and no wake-up", arguments: StoreKind.available)
    func dueLaterWithoutAWakeUp(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "a", devices: 0..<3)
            let transport = ScriptedTransport()
            // Too many pushes to that device: the push waits for the activity's next pass, the pass retry delay later.
            transport.answer(token(1), with: [.retryable(reason: "TooManyRequests", retryAfter: nil, providerID: nil)])
            var configuration = fastConfiguration()
            configuration.workers = 16
            // Far beyond the test's bound: only the time the workers' looks report can bring the next pass.
            configuration.idlePollInterval = .seconds(600)
            configuration.retry.passRetryDelay = .milliseconds(300)
            try await whileDispatching(store, transport, configuration: configuration) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "a", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "a") })
            }
            #expect(transport.pushes(to: token(1)).count == 2, "refused, then sent again at the next pass")
        }
    }

    @Test("a dismissed instance receives nothing; a new token gets the latest state at once", arguments: StoreKind.available)
    func dismissedAndRotation(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "a", devices: 0..<3)
            _ = try await store.recordInstanceEvent(appID: appID, activityID: "a", deviceID: "device-00000", event: .dismissedOnDevice, at: Date())
            let transport = ScriptedTransport()
            try await whileDispatching(store, transport) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "a", contentState: ["n": 1]), at: Date())
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "a", contentState: ["n": 2]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "a") })
                _ = try await store.registerInstance(
                    InstanceRegistration(appID: appID, activityID: "a", deviceID: "device-00001", platform: .ios, pushToken: "abcdef12",
                                         attributesType: nil, attributes: nil, userID: nil),
                    at: Date()
                )
                dispatcher.wake()
                #expect(try await eventually { !transport.pushes(to: "abcdef12").isEmpty })
            }
            #expect(transport.pushes(to: token(0)).isEmpty)
            let rotated = transport.pushes(to: "abcdef12")
            #expect(rotated.count == 1)
            #expect(rotated.first?.sequence == 2)
        }
    }

    @Test("refused credentials stop the pass and are reported unhealthy; nothing is lost", arguments: StoreKind.available)
    func credentialsRefused(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "a", devices: 0..<5)
            let transport = ScriptedTransport()
            for index in 0..<5 { transport.answer(token(index), with: [.credentialsRejected(reason: "InvalidProviderToken", providerID: nil)]) }
            try await whileDispatching(store, transport) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "a", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { transport.unhealthyReports > 0 })
                #expect(try await eventually { try await allCaughtUp(store, "a") })  // after the pass-retry delay
            }
        }
    }

    @Test("a dispatcher stopped mid-fan-out and a new one started leave every instance at the latest state", arguments: StoreKind.available)
    func crashRecovery(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "big", devices: 0..<600)
            let slow = ScriptedTransport(delay: .milliseconds(5))
            var configuration = fastConfiguration()
            configuration.pushesInFlight = 8
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "big", contentState: ["n": 1]), at: Date())
            try await whileDispatching(store, slow, configuration: configuration) { (_: Dispatcher) async throws in
                #expect(try await eventually { slow.pushes.count > 100 })
            }
            #expect(try await !allCaughtUp(store, "big"), "the first dispatcher was stopped part-way")
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "big", contentState: ["n": 2]), at: Date())
            let fresh = ScriptedTransport()
            try await whileDispatching(store, fresh) { (dispatcher: Dispatcher) async throws in
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "big") })
            }
            #expect(Set(fresh.pushes.map(\.token)).count == 600)
            #expect(fresh.pushes.allSatisfy { $0.sequence == 2 })
        }
    }
}

@Suite("Retry policy and sealing")
struct RetryPolicyTests {
    @Test("exponential backoff with jitter, capped, never below Retry-After")
    func backoff() {
        let policy = RetryPolicy(maximumAttempts: 5, baseDelay: .milliseconds(100), maximumDelay: .seconds(1))
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, random: 1) == .milliseconds(100))
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, random: 0) == .milliseconds(50))
        #expect(policy.delay(afterAttempt: 3, retryAfter: nil, random: 1) == .milliseconds(400))
        #expect(policy.delay(afterAttempt: 10, retryAfter: nil, random: 1) == .seconds(1))
        #expect(policy.delay(afterAttempt: 1, retryAfter: .seconds(5), random: 1) == .seconds(5))
    }

    @Test("with a floor (FCM), the backoff starts at the floor, doubles, and its jitter only adds")
    func flooredBackoff() {
        let policy = RetryPolicy(maximumAttempts: 5, baseDelay: .milliseconds(200), maximumDelay: .seconds(30))
        let floor = Duration.seconds(10)
        // 10, 20, 40, 80 s, then no longer than eight times the floor (longer than the 30 s maximum).
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, floor: floor, random: 0) == .seconds(10))
        #expect(policy.delay(afterAttempt: 2, retryAfter: nil, floor: floor, random: 0) == .seconds(20))
        #expect(policy.delay(afterAttempt: 3, retryAfter: nil, floor: floor, random: 0) == .seconds(40))
        #expect(policy.delay(afterAttempt: 4, retryAfter: nil, floor: floor, random: 0) == .seconds(80))
        #expect(policy.delay(afterAttempt: 9, retryAfter: nil, floor: floor, random: 0) == .seconds(80))
        // Jitter: up to half again, never below the floor; two pushes refused together wait differently.
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, floor: floor, random: 1) == .seconds(15))
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, floor: floor, random: 0.2) != policy.delay(afterAttempt: 1, retryAfter: nil, floor: floor, random: 0.7))
        // Retry-After still wins when it is longer; a zero floor is the plain backoff.
        #expect(policy.delay(afterAttempt: 1, retryAfter: .seconds(60), floor: floor, random: 1) == .seconds(60))
        #expect(policy.delay(afterAttempt: 2, retryAfter: nil, floor: .zero, random: 1) == .milliseconds(400))
        // A floor above the maximum delay still doubles.
        let small = RetryPolicy(maximumAttempts: 5, baseDelay: .milliseconds(5), maximumDelay: .milliseconds(100))
        #expect(small.delay(afterAttempt: 2, retryAfter: nil, floor: .milliseconds(400), random: 0) == .milliseconds(800))
    }

    @Test("sealed secrets open only with the same master key and app")
    func sealing() throws {
        let sealer = try CredentialSealer(masterKey: Array(repeating: 1, count: 32))
        let sealed = try sealer.seal(Array("secret".utf8), appID: "app_a", provider: .apns)
        #expect(!String(decoding: sealed, as: UTF8.self).contains("secret"))
        #expect(try sealer.open(sealed, appID: "app_a", provider: .apns) == Array("secret".utf8))
        #expect(throws: CredentialError.self) { try sealer.open(sealed, appID: "app_b", provider: .apns) }
        let other = try CredentialSealer(masterKey: Array(repeating: 2, count: 32))
        #expect(throws: CredentialError.self) { try other.open(sealed, appID: "app_a", provider: .apns) }
        #expect(throws: CredentialError.self) { try CredentialSealer(masterKey: [1, 2, 3]) }
    }
}
