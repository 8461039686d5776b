import Foundation
import LivelineCore
import LivelineStore
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// How the delivery engine behaves.
public struct DispatcherConfiguration: Sendable {
    /// Activities worked on at the same time.
    ///
    /// Each worker takes one activity at a time through a few writes and reads of the Store and its pushes, so with many
    /// activities of a few phones each, the engine goes through about as many at once as it has workers, each waiting
    /// on a commit or an answer most of its time. See ``workersOnSQLite`` and ``workersSharingADatabase`` for the
    /// defaults `liveline serve` gives.
    public var workers: Int = 4
    /// `liveline serve`'s number of workers on SQLite, one node. A worker holds its activity until APNs has answered
    /// its pushes, so with many activities of one phone each the engine sends about `workers` activities per round
    /// trip to APNs: tens of milliseconds to Apple, microseconds to a sink on loopback. A burst of 20,000 updates to
    /// activities of one phone each (`bench api --per-activity 1 --watched`, 2-core machine, in turn) had every push
    /// at a sink 20 ms away 29.9 s after it began with 16 workers, 10.4 and 11.3 s with 64, 9.1 s with 128 and 8.2 s with
    /// 256; 60 ms away, 20.8 s with 64 and 12.0 s with 128. On loopback 8.3 – 10.3 s with 16, 6.6 s with 128. Waiting
    /// workers cost little: the API's accepts right after the burst kept a p99 of 7 – 8 ms with 128 (2 – 3 ms with
    /// 16, 18 – 22 ms with 256, which also slowed the burst's own accepts), and an idle server 0.33 % of a core
    /// (0.18 % with 16). Their claims and releases share the Store's one writer and its commits.
    public static let workersOnSQLite = 128
    /// `liveline serve`'s number of workers on PostgreSQL, per node. Each of a worker's statements is a round trip to
    /// PostgreSQL and its CPU: on a 2-core machine that also ran PostgreSQL, 16 workers caught the same burst up in
    /// 52 s against 62 s with 4, but the burst's accepts fell from 2,917 to 1,709 a second (p99 40 → 75 ms). A worker
    /// also waits for APNs' answers, as on SQLite: with the sink 20 ms away, every push of the burst was there 140.8 s
    /// after it began with 4 workers, 47.0 s with 16 and 34.8 s with 32 (the burst's accepts 4,906, 2,523 and 1,995 a
    /// second, p99 24, 47 and 91 ms, PostgreSQL on the same two cores). With two statements fewer an activity (its
    /// marks and its app's credentials read with the claim), the burst 20 ms away took 134.2 and 140.5 s with 4
    /// workers and 67.4 and 74.4 s with 8, the burst's accepts 3,251 and 4,488 a second (p99 33 and 26 ms) against
    /// 3,997 and 3,365 (p99 29 and 35 ms): APNs is always that far away, so 8. With PostgreSQL on a machine of its
    /// own, more workers cost the nodes' CPU less.
    public static let workersSharingADatabase = 8
    /// Pushes in flight per activity. Other activities' pushes on the same app's connections queue behind them.
    ///
    /// As many as the streams of an app's push connections: ``APNsTransportDirectory/defaultConnectionsPerApp`` (4) of
    /// ``APNsTransportDirectory/streamsPerConnection`` (1,000) each. Against a real APNs, tens of milliseconds away,
    /// a connection needs that many requests on the wire to carry tens of thousands of pushes a second; more than
    /// that only waits in the client's queues, ahead of other activities' pushes. On the path users take (`bench
    /// fanout --instances 100000`, SQLite, this 2-core machine, 2026-12-04, runs taken in turn), 4,000 sent 6 – 17 %
    /// more pushes a second than 2,048 did, the side accepts' p99 no higher; 8,192 was slower than 4,096. What it costs
    /// the app's other activities (`bench fanout --side-deliveries`, the same day): their pushes reached the sink about
    /// 10 ms later at the median and 25 – 30 ms later at p99 (p50 29.7 against 18.2 ms, p99 79.4 against 51.6 ms).
    public var pushesInFlight: Int = APNsTransportDirectory.defaultConnectionsPerApp * APNsTransportDirectory.streamsPerConnection
    /// Pushes handed to the transport in one call (one task, one hop to each connection for all of them); the call's
    /// results come back together, once its slowest push (retries included) is done.
    ///
    /// Larger calls cost less CPU a push but make the flow burstier. On the path users take (`bench fanout --instances
    /// 100000`, SQLite, this 2-core machine with the sink beside the server, 2026-11-26, 20:01 – 20:05, four runs of five
    /// rounds of each build, taken in turn), 1,000 a call with 8,000 in flight and progress batches of 1,000 sent 38,665
    /// – 46,492 pushes a second on average over a run where these defaults sent 33,444 – 40,319, but the side accepts'
    /// p99 over a run rose from 7.53 – 9.00 ms to 9.04 – 10.86 ms: the defaults keep accepts first
    /// (`liveline.engine.*` trades them).
    public var pushesPerCall: Int = 64
    /// Instances read from the Store per page.
    public var pageSize: Int = 1000
    /// Devices of a start's audience admitted as `starting` instances per Store write.
    public var admissionPageSize: Int = 1000
    /// Results written to the Store per progress write. Larger batches cost fewer commits; on SQLite an accepted update
    /// waits for a part of one at most (the Store commits a progress write in parts when an acknowledged write arrives
    /// meanwhile: ``DispatchStore/recordProgress(_:at:)``).
    public var progressBatchSize: Int = 250
    /// How many progress batches may wait to be written before the sends wait for the Store. Recording progress is
    /// bookkeeping (after a crash, anything unrecorded is sent again and the phone ignores what it already has), so
    /// sends run ahead of it rather than at the Store's pace. At 16 (4,000 results of 250) neither side waits for the
    /// other for long: a 100,000-instance fan-out went about a quarter faster than at 4, and its progress was recorded
    /// sooner too, for about 5 MB more memory.
    public var progressBatchesBehind: Int = 16
    /// Shares a large fan-out between the engines (of every node on a shared database): an activity with more
    /// instances to send than this is cut into slices of this many, each claimed and sent by whichever engine is free.
    /// `nil`: each activity's fan-out is sent by the engine that claimed it (SQLite, one node).
    public var sliceSize: Int?
    /// How often the engine holding a shared fan-out looks whether its slices are all sent, once it has none left to
    /// claim.
    public var slicePollInterval: Duration = .milliseconds(100)
    /// How long a claim on an activity (or a slice of its fan-out) lasts without renewal.
    public var claimLease: TimeInterval = 30
    /// Whether a fan-out records runs of pushes as marks instead of a row write each (``DeliveryRuns``,
    /// docs/progress-marks.md), on either store; `false`: every push writes its instance's row, as before marks.
    public var marksRuns = true
    /// How long graceful shutdown waits for the pushes in flight (a slow push service answers within its 30-second
    /// request timeout) before it gives them up. The answers already in are still recorded and the claims handed back
    /// (so that nothing answered is sent twice, and another node takes the work at once); what a push given up did is
    /// not known: it is sent again after the restart (at least once), as after a crash.
    public var shutdownGrace: Duration = .seconds(10)
    /// The longest an idle engine rests before it looks for work again when nobody wakes it. Accepted work wakes it
    /// at once, and work waiting for a retry or a lease is claimed when it falls due, so this only bounds how late a
    /// missed wake-up is noticed.
    public var idlePollInterval: Duration = .seconds(5)
    /// Retries of 429, 5xx and transport failures.
    public var retry = RetryPolicy()
    /// The least wait before retrying an Android (FCM) push, and where its exponential backoff starts (see
    /// ``RetryPolicy/delay(afterAttempt:retryAfter:floor:random:)``): Google asks senders to retry quota and
    /// availability errors with exponential backoff, never at once.
    public var fcmRetryFloor: Duration = .seconds(10)
    /// Where the backoff of an Android push refused with `QUOTA_EXCEEDED` starts, when FCM names no longer
    /// `Retry-After`: Google asks senders to retry a message rate exceeded "with exponential backoff with a minimum
    /// initial delay of 1 minute" (a project's quota is refilled in the following minute).
    public var fcmQuotaRetryFloor: Duration = .seconds(60)
    /// Apple's priority-10 budget per iOS instance.
    public var budget = PriorityBudget()
    /// The platforms this engine delivers to.
    public var platforms: [Platform] = [.ios, .android]
    /// Delivery timeline retention: attempts older than this are dropped …
    public var deliveryRetention: TimeInterval = 7 * 24 * 3600
    /// … and at most this many attempts are kept per activity.
    public var deliveriesPerActivity: Int = 10_000

    public init() {}
}

/// The delivery engine: claims activities whose instances are behind, sends the newest state to
/// each (coalescing anything older), records progress in batches, retries what may succeed later
/// and invalidates what never will. Runs as a `Service` inside `liveline serve`.
public final class Dispatcher: Service, Sendable {
    let store: any DispatchStore & TimelineStore & BroadcastStore
    let transports: any PushTransportDirectory
    let configuration: DispatcherConfiguration
    let logger: Logger
    let now: @Sendable () -> Date
    let random: @Sendable () -> Double
    /// Counts push and broadcast attempts and their latency.
    let metrics: DeliveryMetrics
    /// The name the engine's claims carry in the Store (`claim_owner`; each worker adds `-w<n>`):
    /// `dispatcher-<process id>-<UUID>`, unique to this engine, and telling an operator which process holds a claim.
    private let owner: String
    private let wakeSignal = WakeSignal()
    /// When the idle workers next look by themselves (``IdleLookout``), and the signal that brings its timer forward.
    private let lookout: Mutex<IdleLookout>
    private let lookoutSooner = WakeSignal()
    /// Woken for good when the shutdown grace is over: the pushes still waiting for an answer are given up.
    private let pushesGivenUp = WakeSignal()
    /// How long, once its pushes are given up, a stopping engine has to record their answers and hand its claims back
    /// before it is cancelled (a Store that does not answer would hold the shutdown up for good).
    private static let shutdownWrapUp: Duration = .seconds(5)
    /// The engines of the other nodes sharing the Store, woken when a fan-out is shared (nil: no other node).
    private let peers: (any DeliveryWaking)?
    /// When batches refused with `BadDeviceToken` are worth a warning about the app's APNs environment.
    private let environmentWatch = Mutex(EnvironmentMismatchWatch())
    /// For each activity a pass of this engine is working on: the earliest time of its next pass that a push it left for
    /// that pass asked for (FCM's quota floor, a `Retry-After`), when later than the pass-retry delay. Taken when the
    /// pass releases the activity.
    private let laterPassNotBefore = Mutex<[ActivityKey: Date]>([:])

    /// Creates the engine.
    public init(
        store: any DispatchStore & TimelineStore & BroadcastStore, transports: any PushTransportDirectory, configuration: DispatcherConfiguration = .init(),
        logger: Logger = Logger(label: "liveline.dispatch"), now: @escaping @Sendable () -> Date = { Date() },
        random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) }, metrics: DeliveryMetrics = DeliveryMetrics(),
        peers: (any DeliveryWaking)? = nil
    ) {
        self.metrics = metrics
        self.peers = peers
        self.store = store
        self.transports = transports
        self.configuration = configuration
        self.logger = logger
        self.now = now
        self.random = random
        self.lookout = Mutex(IdleLookout(longest: configuration.idlePollInterval, now: now()))
        self.owner = "dispatcher-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString.lowercased())"
    }

    /// Tells the engine new work may be waiting (called after an update is committed): one idle worker looks for it,
    /// and wakes another if it found some (there may be more).
    public func wake() { wakeSignal.wakeOne() }

    /// Runs until graceful shutdown: claimed work in flight is finished and its claim handed back.
    public func run() async throws {
        try await store.releaseAllClaims()
        logger.info(
            "Delivery engine started",
            metadata: ["workers": "\(configuration.workers)", "platforms": "\(configuration.platforms.map(\.rawValue).joined(separator: ","))"]
        )
        let grace = configuration.shutdownGrace
        // The workers, and beside them a timer that starts at graceful shutdown: when the workers have not finished or
        // handed back their passes within the grace, the pushes they still wait for are given up, and the passes record
        // the answers already in and hand their claims back; cancelled (what was not recorded is sent again after the
        // restart) only when that too takes longer than ``shutdownWrapUp``.
        let wrapUpOver = await withTaskGroup(of: Bool.self) { outer in
            outer.addTask {
                await withTaskGroup(of: Void.self) { group in
                    for index in 0..<self.configuration.workers {
                        group.addTask { await self.workerLoop(index: index) }
                    }
                    group.addTask { await self.pruneLoop() }
                    group.addTask { await self.lookoutLoop() }
                    await group.waitForAll()
                }
                return false
            }
            outer.addTask {
                do {
                    try await gracefulShutdown()
                    try await Task.sleep(for: grace)
                } catch {
                    return false  // Cancelled: the workers ended first.
                }
                self.logger.warning(
                    "Pushes still in flight at the end of the shutdown grace were given up; they are sent again after the restart",
                    metadata: ["grace": "\(grace)"]
                )
                self.pushesGivenUp.wakeForGood()
                do {
                    try await Task.sleep(for: Self.shutdownWrapUp)
                    return true
                } catch {
                    return false
                }
            }
            let first = await outer.next() ?? false
            outer.cancelAll()
            return first
        }
        if wrapUpOver {
            logger.warning(
                "The delivery engine did not record its last answers and hand its claims back in time; cancelled (what was not recorded is sent again after the restart)",
                metadata: ["wrapUp": "\(Self.shutdownWrapUp)"]
            )
        }
        logger.info("Delivery engine stopped")
    }

    private func workerLoop(index: Int) async {
        // Each worker claims under a name of its own: were a pass's lease to run out (a paused process, a Store too busy
        // to renew it), another worker of this engine claiming the activity must not pass for its holder, or both
        // would renew it and send every phone the state twice.
        let workerOwner = "\(owner)-w\(index)"
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            var due: ClaimableTimes?
            do {
                // What was committed before this look, it sees: a wake-up for it need not wake another worker.
                wakeSignal.beginLook()
                if let found = try await store.claimPendingActivity(
                    owner: workerOwner, now: now(), lease: configuration.claimLease, platforms: configuration.platforms
                ) {
                    // The claim marked done those with nothing behind; the first with something to send is this
                    // worker's. When the claim left some due, another idle worker looks too, and so on while looks find
                    // work. (Woken all at once for each update, idle workers looked in vain several times an update.)
                    if found.leftPending { wakeSignal.wakeOne() }
                    if let claim = found.claim {
                        try await deliver(claim)
                        continue
                    }
                    // Marked done only, and every activity due seen: another look now would find none (what is
                    // committed from now on wakes the engine). Looking again all the same was four statements on
                    // PostgreSQL after each burst's look.
                    if found.leftPending { continue }
                }
                due = try? await store.nextClaimable()
                // A slice of a fan-out another engine shares, when one is due (asking at every rest was three more
                // statements on PostgreSQL each time, with activities due but held by the other workers).
                if configuration.sliceSize != nil, let sliceDue = due?.slice, sliceDue <= now(),
                    let slice = try await store.claimSlice(owner: workerOwner, now: now(), lease: configuration.claimLease, of: nil)
                {
                    wakeSignal.wakeOne()
                    await send(slice)
                    continue
                }
            } catch is CancellationError {
                return
            } catch {
                if Task.isCancelled { return }
                logger.error("Delivery pass failed", metadata: ["worker": "\(index)", "error": "\(error)"])
                due = try? await store.nextClaimable()
            }
            // The lookout wakes a worker when the next pending activity falls due (or after the longest rest); this one
            // waits for a wake-up.
            if lookout.withLock({ $0.looked(due: due?.next, now: now()) }) { lookoutSooner.wake() }
            await wakeSignal.waitUnlessShuttingDown()
        }
    }

    /// The idle workers' one timer (``IdleLookout``): when it runs out, one idle worker looks (or the next to be idle);
    /// a look that reports a sooner time sets it again.
    private func lookoutLoop() async {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            let (armedFor, wait) = lookout.withLock { ($0.next, $0.wait(now: now())) }
            await lookoutSooner.wait(atMost: wait)
            if Task.isShuttingDownGracefully || Task.isCancelled { return }
            let fires = lookout.withLock { lookout in
                // Brought forward meanwhile: the timer is set again for the sooner time.
                guard lookout.next >= armedFor else { return false }
                lookout.fire(now: now())
                return true
            }
            if fires { wakeSignal.wakeOne() }
        }
    }

    /// How long after a look the engine looks again by itself (``IdleLookout``) when the next pending activity falls
    /// due at `due` (`nil`: none is pending): until then, never longer than `longest`. One due already but not claimed is
    /// held by another worker or was just taken: a short rest, not none, so that idle workers never spin on it.
    static func rest(untilDue due: Date?, now: Date, longest: Duration) -> Duration {
        guard let due else { return longest }
        let wait = due.timeIntervalSince(now)
        guard wait > 0 else { return min(.milliseconds(50), longest) }
        return min(.milliseconds(Int64((wait * 1000).rounded(.up))), longest)
    }

    private func pruneLoop() async {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                guard try await store.leadsHousekeeping(at: now()) else {
                    await sleepUnlessShuttingDown(for: .seconds(60))
                    continue
                }
                try await store.pruneDeliveries(
                    olderThan: now().addingTimeInterval(-configuration.deliveryRetention),
                    keepPerActivity: configuration.deliveriesPerActivity
                )
                try await store.pruneDeliveryMarks(
                    sentBefore: now().addingTimeInterval(-Double(Priority10Tally.windowSeconds))
                )
            } catch {
                logger.warning("Pruning the delivery timeline failed", metadata: ["error": "\(error)"])
            }
            await sleepUnlessShuttingDown(for: .seconds(60))
        }
    }

    /// Sleeps for `duration`, or less if graceful shutdown begins.
    private func sleepUnlessShuttingDown(for duration: Duration) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(for: duration) }
            group.addTask { try? await gracefulShutdown() }
            await group.next()
            group.cancelAll()
        }
    }

    // MARK: One pass over one activity

    /// What happened to one instance in this pass.
    ///
    /// A class, and immutable: a pass hands each result on several times (from the push to the chunk's results, into
    /// the fan-out's batches, to the progress written), and a copy of a struct holding the instance's record retains
    /// each of its strings, where a copy of a reference retains once.
    final class InstanceResult: FanOutResult {
        let instance: InstanceRecord
        let sequence: Int64
        let event: LiveActivityEvent
        let priority: Int
        let final: Final
        let attempts: [DeliveryRecord]

        init(instance: InstanceRecord, sequence: Int64, event: LiveActivityEvent, priority: Int, final: Final, attempts: [DeliveryRecord]) {
            self.instance = instance
            self.sequence = sequence
            self.event = event
            self.priority = priority
            self.final = final
            self.attempts = attempts
        }

        enum Final: Sendable {
            case delivered, invalidated, rejected, exhausted, credentials
            /// Nothing was sent and nothing will be: an iPhone whose start had not gone out when the activity ended.
            case startCancelled
        }

        var fanOutOutcome: FanOutInstanceOutcome {
            switch final {
            case .delivered, .invalidated, .rejected, .startCancelled: .done
            case .exhausted: .retryLater
            case .credentials: .credentialsRefused
            }
        }
    }

    /// One sequence rendered for one platform (once, whatever the number of instances), and the transport it goes by.
    struct Rendition: FanOutRendition {
        var sequence: Int64
        var event: LiveActivityEvent
        var hasAlert: Bool
        /// The caller's explicit priority, if any.
        var requestedPriority: Int?
        /// iOS: the `aps` payload, the same for every token.
        var payload: ByteBuffer
        /// Android: the `messages:send` body, encoded once; each token is spliced in.
        var fcmMessage: FCMEncodedMessage?
        var topic: String
        var expiration: Int64?
        var transport: any PushTransport
        /// The same state as a start, for instances started remotely whose start has not gone out (`nil` when the
        /// activity was never started remotely, or has ended: an ended activity starts nowhere).
        var start: Start?

        /// A start's rendering: the iOS payload, or the Android message.
        struct Start: Sendable {
            var payload: ByteBuffer
            var fcmMessage: FCMEncodedMessage?
            /// iOS, a broadcast activity: the start that subscribes an iPhone on iOS 18 or later to the channel
            /// (`input-push-channel`) instead of asking for a token.
            var channelPayload: ByteBuffer?
        }

        /// What goes on the wire for one token.
        func body(for token: String) -> ByteBuffer {
            Self.body(payload, fcmMessage, for: token)
        }

        /// What goes on the wire for one token when it is sent the start (into the channel, for an instance admitted as
        /// the channel's subscriber).
        func startBody(for token: String, subscribing channelID: String?) -> ByteBuffer? {
            guard let start else { return nil }
            if channelID != nil, let channelPayload = start.channelPayload { return channelPayload }
            return Self.body(start.payload, start.fcmMessage, for: token)
        }

        private static func body(_ payload: ByteBuffer, _ fcmMessage: FCMEncodedMessage?, for token: String) -> ByteBuffer {
            guard let fcmMessage else { return payload }
            var body: [UInt8] = []
            fcmMessage.append(token: token, to: &body)
            return ByteBuffer(bytes: body)
        }
    }

    /// What one instance is sent of a rendition: the state, its start, or — an iPhone whose start never went out before
    /// the activity ended — nothing.
    enum InstanceSend: Sendable, Hashable {
        case state
        case start
        case nothing

        /// Pure: an instance started remotely and not yet confirmed gets the start until its first push went out (an
        /// iPhone's push-to-start token takes nothing else; an Android phone's FCM token takes the states after it).
        static func decide(state: InstanceState, platform: Platform, deliveredSequence: Int64, event: LiveActivityEvent, hasStart: Bool) -> InstanceSend {
            guard state == .starting, deliveredSequence == 0 else { return .state }
            if event == .end || !hasStart {
                // Nothing started yet: an iPhone is never started only to be ended; an Android phone hears the end (its app
                // may post and close the notification as it likes).
                return platform == .ios ? .nothing : .state
            }
            return .start
        }
    }

    /// Renders the claimed activity's current state for `platform` with Core's one render step
    /// (``LiveActivityState``), or nil when it has no state yet.
    private func render(_ claim: DispatchClaim, for platform: Platform, transport: any PushTransport) -> Rendition? {
        guard let state = claim.activity.currentState else { return nil }
        let at = now()
        // The start as well, for instances started remotely — not once the activity has ended: it starts nowhere then.
        let activity = claim.activity
        var startParts: (type: String, attributes: JSONValue, alert: LiveActivityAlert)?
        if state.event != .end, let type = activity.attributesType, let attributes = activity.attributes, let alert = activity.startAlert {
            startParts = (type, attributes, alert)
        }
        switch platform {
        case .ios:
            var buffer = ByteBufferAllocator().buffer(capacity: 512)
            buffer.writeBytes(state.apnsPayload.encoded())
            return Rendition(
                sequence: state.sequence, event: state.event, hasAlert: state.alert != nil, requestedPriority: activity.priority,
                payload: buffer, fcmMessage: nil, topic: claim.bundleID + ".push-type.liveactivity",
                expiration: state.apnsExpiration(now: at), transport: transport,
                start: startParts.map { start in
                    let channelID = activity.channel.flatMap { $0.status == .active ? $0.id : nil }
                    return Rendition.Start(
                        payload: ByteBuffer(bytes: state.apnsStartPayload(attributesType: start.type, attributes: start.attributes, alert: start.alert).encoded()),
                        fcmMessage: nil,
                        // Too large with the channel's id, the start goes as the one with `input-push-token` (checked when
                        // the state was accepted) to every iPhone.
                        channelPayload: channelID.flatMap { channelID in
                            state.apnsChannelStartPayload(attributesType: start.type, attributes: start.attributes, alert: start.alert, channelID: channelID)
                                .map { ByteBuffer(bytes: $0.encoded()) }
                        }
                    )
                }
            )
        case .android:
            return Rendition(
                sequence: state.sequence, event: state.event, hasAlert: state.alert != nil, requestedPriority: activity.priority,
                payload: ByteBuffer(), fcmMessage: state.fcmMessage(now: at).encoded(), topic: "", expiration: nil, transport: transport,
                start: startParts.map { start in
                    Rendition.Start(
                        payload: ByteBuffer(),
                        fcmMessage: state.fcmStartMessage(attributesType: start.type, attributes: start.attributes, alert: start.alert, now: at).encoded()
                    )
                }
            )
        }
    }

    private typealias FanOut = FanOutStateMachine<InstanceRecord, Rendition, InstanceResult>

    /// What a pass's marks leave to its release (``DeliveryRun``).
    enum PassMarks: Sendable, Hashable {
        /// Neither it nor a pass before it marked the sequence: nothing to settle.
        case none
        /// It read every platform's pending instances to their end, sent them all one `sequence`, and every push is
        /// done with (nothing to retry): every instance that joined before its claim has that sequence, marked, written
        /// in its row, or refused for good.
        case complete(Int64)
        /// It wrote marks, but another sequence overtook part of it, an engine sending to some platforms only wrote
        /// them, or slices shared with other engines did: a read says whether anything still waits.
        case unknown
    }

    /// What a pass's child tasks come back with: an event of its fan-out, or the count of its pending instances
    /// (``TimelineThinning/counted(pending:)``; nil when the read failed).
    private enum PassEvent: Sendable {
        case fanOut(FanOut.Event)
        case counted(Int?)
        /// A chunk's results, with the runs of them its marks record (``DeliveryRuns``).
        case sent([InstanceResult], runs: [DeliveryRun])
    }

    /// Works on a claimed activity: rate shaping, then one pass over it while its lease is kept, then the claim is
    /// handed back saying when the activity is due again.
    private func deliver(_ claim: DispatchClaim) async throws {
        let appID = claim.activity.appID
        let activityID = claim.activity.activityID
        let budget = claim.budget.applied(to: configuration.budget)

        // Rate shaping: a new state goes out no sooner than the activity's minimum interval after the last one
        // (coalesced meanwhile: whatever is newest then goes); an end goes at once, and so does a catch-up of the
        // state already sent (a new or rotated token). When this pass sends a new state, its start is recorded with
        // the claim's release: the next claim reads it, and none comes while this one holds the activity. (A pass
        // whose claim is lost, or whose release fails, leaves it unrecorded: the activity is sent again by whoever
        // claims it next, and spaced from the send before.)
        let activity = claim.activity
        var sendStart: SendStart?
        if activity.lastSentSequence != activity.sequence {
            if let interval = activity.minUpdateInterval, interval > 0, activity.event != .end, let last = activity.lastSentAt {
                let allowed = last.addingTimeInterval(interval)
                if now() < allowed {
                    try await store.deferClaim(appID: appID, activityID: activityID, owner: claim.owner, sequence: activity.sequence, until: allowed)
                    return
                }
            }
            sendStart = SendStart(sequence: activity.sequence, at: now())
        }

        // From here on the claim's lease is renewed on a timer, whatever the pass waits for (a slow push service, a
        // long admission), so that no other node takes the activity while this one is still sending it.
        let passRelease = try await keepingClaim(claim) { claimWatch in
            try await pass(claim, budget: budget, claimWatch: claimWatch)
        }
        // What the pass's pushes left for the next one asked of its time: taken whatever the pass ended with.
        let laterPass = laterPassNotBefore.withLock { $0.removeValue(forKey: ActivityKey(appID: appID, activityID: activityID)) }
        // A lost claim is its new holder's to release.
        guard let passRelease else { return }
        let (release, broadcastDue, attempts, marked) = passRelease
        let retryAt: Date?
        switch release {
        case .now: retryAt = now()
        case .afterPassRetryDelay:
            retryAt = max(now().addingTimeInterval(configuration.retry.passRetryDelay.seconds), laterPass ?? .distantPast)
        case .afterStoreRetryDelay: retryAt = now().addingTimeInterval(1)
        case .unscheduled: retryAt = nil
        }
        // An unsettled broadcast keeps the activity pending: it is looked at again when it falls due, never at once.
        // A fan-out with nothing to retry (`.now`: look again only if something new came meanwhile) does not bring it
        // forward: the broadcast is what is behind, and looking at once published it again at once, a refused or
        // failing broadcast a few times a second for as long as the activity lived.
        let due = release == .now && broadcastDue != nil ? broadcastDue : [retryAt, broadcastDue].compactMap { $0 }.min()
        // A pass that marked runs and has nothing to retry settles the activity at the sequence it sent, so that no
        // later search seeks each instance's marks: at once when the pass itself read and sent everything, after a
        // read of what still waits otherwise (on the Store's reader; a read that fails only leaves it unsettled).
        var verified: SettledPass?
        switch marked {
        case .complete(let sequence) where release == .now: verified = SettledPass(sequence: sequence, pass: claim.pass, at: now())
        case .unknown where release == .now: verified = await verifiedPass(claim)
        default: verified = nil
        }
        try await store.releaseClaim(
            appID: appID, activityID: activityID, owner: claim.owner, platforms: configuration.platforms, retryAt: due,
            claimedSequence: activity.sequence, sendStart: sendStart, verified: verified
        )
        // A pass that recorded as many attempts as the timeline keeps for an activity has pushed the older ones out:
        // they go now, a pass's worth at a time, rather than all at once at the next periodic prune (which, after
        // a minute of large fan-outs, stalled the writer under a whole minute's deletions).
        if attempts >= configuration.deliveriesPerActivity {
            do {
                try await store.pruneDeliveries(appID: appID, activityID: activityID, keepNewest: configuration.deliveriesPerActivity)
            } catch {
                logger.warning("Pruning an activity's delivery timeline failed", metadata: ["activity": "\(activityID)", "error": "\(error)"])
            }
        }
    }

    /// The claimed activity's sequence as it is now, when no instance of any platform waits for it
    /// (``SettledPass``); `nil` when some do, the claim was lost, or a read failed.
    private func verifiedPass(_ claim: DispatchClaim) async -> SettledPass? {
        let at = now()
        do {
            guard
                let held = try await store.heldClaim(
                    appID: claim.activity.appID, activityID: claim.activity.activityID, owner: claim.owner, now: at
                )
            else { return nil }
            let waiting = try await store.pendingInstanceCount(
                appID: claim.activity.appID, activityID: claim.activity.activityID, below: held.activity.sequence,
                platforms: Platform.allCases, after: nil, through: nil
            )
            return waiting == 0 ? SettledPass(sequence: held.activity.sequence, pass: claim.pass, at: at) : nil
        } catch {
            logger.warning("Reading what a pass left waiting failed", metadata: ["activity": "\(claim.activity.activityID)", "error": "\(error)"])
            return nil
        }
    }

    /// The claimed activity's pass, under ``keepingClaim(_:_:)``: admits a remote start's audience,
    /// publishes on the broadcast channel, and fans the state out — alone (``fanOut(_:budget:claimWatch:slice:)``), or,
    /// when ``DispatcherConfiguration/sliceSize`` is set and the activity has more instances to send, in slices shared
    /// with the other engines (``sendSlices(of:claimWatch:)``). Returns when to look at the activity again and when its
    /// broadcast falls due, and how many attempts it recorded in the timeline (0 when it shared the fan-out in slices),
    /// or `nil` when the claim was lost (its new holder releases it).
    private func pass(
        _ claim: DispatchClaim, budget: PriorityBudget, claimWatch: ClaimWatch
    ) async throws -> (FanOut.ReleaseTiming, broadcastDue: Date?, attempts: Int, marked: PassMarks)? {
        let appID = claim.activity.appID
        let activityID = claim.activity.activityID
        let activity = claim.activity

        // A remote start's audience becomes `starting` instances first, a page per write.
        while claim.audienceWaiting, try await store.admitStartAudience(appID: appID, activityID: activityID, limit: configuration.admissionPageSize, at: now()) {
            if claimWatch.isLost { return nil }
            if Task.isShuttingDownGracefully || Task.isCancelled { return (.unscheduled, nil, 0, .none) }
        }
        if claimWatch.isLost { return nil }

        // A broadcast activity's state goes to its channel first: one request for every subscribed iPhone.
        var broadcastDue: Date?
        if configuration.platforms.contains(.ios), let channel = activity.channel, channel.status == .active,
            activity.broadcastSequence < activity.sequence
        {
            broadcastDue = await publish(claim, on: channel)
        }

        var firstRead: FirstPage?
        if let size = configuration.sliceSize {
            // A large fan-out is shared: cut into slices that every engine of every node may claim and send. The pass's
            // first page, read first, says whether the activity has more instances to send than a slice holds.
            if !claim.slicesLeft, let first = configuration.platforms.first {
                do {
                    firstRead = try await firstPage(claim, slice: nil, platform: first)
                } catch {
                    logger.error("Reading instances failed", metadata: ["activity": "\(activityID)", "error": "\(error)"])
                    return claimWatch.isLost ? nil : (.afterStoreRetryDelay, broadcastDue, 0, .none)
                }
            }
            var slices = 0
            if FanOut.asksForSlices(slicesLeft: claim.slicesLeft, pending: firstRead?.everyPending, sliceSize: size) {
                do {
                    slices = try await store.planSlices(
                        appID: appID, activityID: activityID, owner: claim.owner, below: activity.sequence, platforms: configuration.platforms,
                        size: size, now: now(), consultingMarks: claim.sequenceMarked
                    )
                } catch {
                    logger.error("Planning a shared fan-out failed", metadata: ["activity": "\(activityID)", "error": "\(error)"])
                    return claimWatch.isLost ? nil : (.afterStoreRetryDelay, broadcastDue, 0, .none)
                }
            }
            if slices > 0 {
                wakeSignal.wake()
                peers?.wake()
                guard let (shared, completed) = await sendSlices(of: claim, claimWatch: claimWatch) else { return nil }
                // The slices' engines marked what they sent: when each says its pass sent its whole range one sequence,
                // the pass is complete at the lowest of them; otherwise only a read can say whether they sent everything.
                return (shared, broadcastDue, 0, completed.map { .complete($0) } ?? .unknown)
            }
        }
        let (release, attempts, marked) = await fanOut(claim, budget: budget, claimWatch: claimWatch, slice: nil, readBefore: firstRead)
        if claimWatch.isLost { return nil }
        return (release, broadcastDue, attempts, marked)
    }

    /// Sends the claimed activity's slices with the other engines, as the holder of its claim: claims the ones nobody
    /// has taken (or whose lease ran out) and sends them, then waits until every slice is sent, drops them and says when
    /// to look at the activity again, from their outcomes, and the sequence they were all completed with, if they were
    /// (``DispatchStore/slicesCompleted(appID:activityID:)``). `nil` when the activity's claim was lost meanwhile.
    private func sendSlices(of claim: DispatchClaim, claimWatch: ClaimWatch) async -> (FanOut.ReleaseTiming, completed: Int64?)? {
        let key = ActivityKey(appID: claim.activity.appID, activityID: claim.activity.activityID)
        while true {
            if claimWatch.isLost { return nil }
            // The slices stay for whoever claims the activity next.
            if Task.isShuttingDownGracefully || Task.isCancelled { return (.unscheduled, nil) }
            var wait = configuration.slicePollInterval
            do {
                if let taken = try await store.claimSlice(owner: claim.owner, now: now(), lease: configuration.claimLease, of: key) {
                    await send(taken)
                    continue
                }
                let outcomes = try await store.sliceOutcomes(appID: key.appID, activityID: key.activityID)
                if outcomes.allSatisfy({ $0 != nil }) {
                    let completed = try await store.slicesCompleted(appID: key.appID, activityID: key.activityID)
                    try await store.dropSlices(appID: key.appID, activityID: key.activityID, owner: claim.owner)
                    return (Self.releaseTiming(after: outcomes.compactMap { $0 }), completed)
                }
            } catch {
                if Task.isCancelled { return (.unscheduled, nil) }
                logger.error("Following a shared fan-out failed", metadata: ["activity": "\(key.activityID)", "error": "\(error)"])
                // The Store's retry delay, as elsewhere after a failed Store call (while the database is away, looking
                // every 100 ms logged this ten times a second).
                wait = .seconds(1)
            }
            // Other engines hold the rest: look again shortly.
            try? await Task.sleep(for: wait)
        }
    }

    /// When to look at an activity again once its slices were sent with these outcomes: soon after a Store failure,
    /// after the pass-retry delay when instances still failed, at once otherwise (it may be pending again).
    static func releaseTiming(after outcomes: [SliceOutcome]) -> FanOutStateMachine<InstanceRecord, Rendition, InstanceResult>.ReleaseTiming {
        if outcomes.contains(.storeFailed) { return .afterStoreRetryDelay }
        if outcomes.contains(.retryLater) { return .afterPassRetryDelay }
        return .now
    }

    /// Sends one claimed slice while its lease is kept, and records how its pass ended — or hands it back unsent when
    /// this engine stopped, and leaves it when its lease was lost (another engine has it).
    private func send(_ taken: SliceClaim) async {
        let slice = taken.slice
        let owner = taken.claim.owner
        let budget = taken.claim.budget.applied(to: configuration.budget)
        let passed = try? await keepingLease(
            of: "slice \(slice.index) of activity \(slice.activityID)",
            renew: { try await self.store.renewSlice(slice, owner: owner, now: self.now(), lease: self.configuration.claimLease) }
        ) { watch in
            let (release, _, marked) = await fanOut(taken.claim, budget: budget, claimWatch: watch, slice: slice)
            return (release, marked, watch.isLost)
        }
        // Lost: another engine has it now.
        guard let (timing, marked, lost) = passed, !lost else { return }
        // A pass that read its whole range and sent every instance one sequence completed the slice at it.
        let completed: Int64? =
            if timing == .now, case .complete(let sequence) = marked { sequence } else { nil }
        let outcome: SliceOutcome? =
            switch timing {
            case .now: .done
            case .afterPassRetryDelay: .retryLater
            case .afterStoreRetryDelay: .storeFailed
            case .unscheduled: nil
            }
        do {
            // Recorded even when this engine's task is being cancelled: a slice left held waits out its lease.
            try await Task { try await self.store.finishSlice(slice, owner: owner, outcome: outcome, completed: completed) }.value
        } catch {
            // Its lease runs out, and another engine sends it again.
            logger.error("Recording a slice's outcome failed", metadata: ["activity": "\(slice.activityID)", "error": "\(error)"])
        }
    }

    /// The fan-out of one pass, over the whole activity or one `slice` of it: the ``FanOutStateMachine`` decides and this
    /// performs its actions — reads pages, sends, records progress — each as a child task whose outcome is fed back as the
    /// machine's next event. Returns when to look at the activity (or slice) again, and how many attempts it handed to
    /// the timeline.
    private func fanOut(
        _ claim: DispatchClaim, budget: PriorityBudget, claimWatch: ClaimWatch, slice: FanOutSlice?, readBefore: FirstPage? = nil
    ) async -> (release: FanOut.ReleaseTiming, attempts: Int, marked: PassMarks) {
        let appID = claim.activity.appID
        let activityID = claim.activity.activityID
        var readBefore = readBefore
        // The marks of priority-10 pushes that count against the instances' budgets besides their rows' tallies (read
        // once a pass: the pass's own pushes go to instances it does not read again).
        let priority10Marks: Priority10MarkIndex
        if !claim.priority10Marked {
            priority10Marks = Priority10MarkIndex([])
        } else {
            do {
                let since = Int64(now().timeIntervalSince1970) - Priority10Tally.windowSeconds
                priority10Marks = Priority10MarkIndex(try await store.priority10Marks(appID: appID, activityID: activityID, since: since))
            } catch {
                logger.error("Reading the marks of priority-10 pushes failed", metadata: ["activity": "\(activityID)", "error": "\(error)"])
                return (.afterStoreRetryDelay, 0, .none)
            }
        }
        var machine = FanOut(
            platforms: configuration.platforms,
            limits: FanOutLimits(
                pageSize: configuration.pageSize, pushesPerCall: configuration.pushesPerCall, pushesInFlight: configuration.pushesInFlight,
                progressBatchSize: configuration.progressBatchSize, progressBatchesBehind: configuration.progressBatchesBehind
            )
        )
        // The pass's attempts for the timeline: a pass over many more instances than it keeps holds back those it
        // would prune at its end (``TimelineThinning``), once it has counted its instances. It holds a batch's
        // attempts alone, not its results, which would keep their instances' records alive too.
        var timeline = TimelineThinning<[DeliveryRecord]>(keep: configuration.deliveriesPerActivity)
        return await withTaskGroup(of: PassEvent.self) { group in
            // Where the next chunk of each platform starts in the pass's reading (``DeliveryRun``), the runs sent and not
            // written yet, the results they record whose batch is not written yet, and whether any mark was written.
            var positions: [Platform: Int] = [:]
            var unwrittenRuns: [DeliveryRun] = []
            var covered: Set<ObjectIdentifier> = []
            var wroteMarks = false
            var sequencesSent: Set<Int64> = []
            // Only one page read runs at a time.
            var stopping = false
            var leaseLost = false
            var attempts = 0
            var counting = false
            while true {
                if !stopping, Task.isShuttingDownGracefully || Task.isCancelled {
                    stopping = true
                    machine.receive(.shutdown)
                }
                if !leaseLost, claimWatch.isLost {
                    leaseLost = true
                    machine.receive(.leaseLost)
                }
                switch machine.nextAction() {
                case .readPage(let platform, let below, let cursor):
                    // The first page read before the pass began (for the question of slices) serves its platform's first
                    // read, once.
                    var early: FirstPage?
                    if below == nil, cursor == nil, readBefore?.platform == platform { swap(&early, &readBefore) }
                    group.addTask { [early] in
                        .fanOut(
                            await self.readPage(
                                claim, slice: slice, platform: platform, below: below, after: cursor, priority10Marks: priority10Marks,
                                readBefore: early
                            )
                        )
                    }
                case .send(let instances, let rendition):
                    // Where the chunk is in its platform's reading, for its runs to join those of the chunks beside it.
                    let platform = instances.first?.platform ?? .ios
                    sequencesSent.insert(rendition.sequence)
                    let firstPosition = positions[platform, default: 0]
                    positions[platform] = firstPosition + instances.count
                    var pushes: [OutgoingPush] = []
                    pushes.reserveCapacity(instances.count)
                    // The instances pushed to, in order: the chunk itself, without copying an instance, unless one is
                    // left out (a start cancelled), when those after it move up.
                    var sent = instances
                    var kept = sent.startIndex
                    var cancelled: [InstanceResult] = []
                    for (index, instance) in zip(instances.indices, instances) {
                        let event: LiveActivityEvent
                        let pushPriority: Int
                        let payload: ByteBuffer
                        switch InstanceSend.decide(
                            state: instance.state, platform: instance.platform, deliveredSequence: instance.deliveredSequence,
                            event: rendition.event, hasStart: rendition.start != nil
                        ) {
                        case .state:
                            (event, payload) = (rendition.event, rendition.body(for: instance.pushToken))
                            pushPriority = priority(of: rendition, for: instance, budget: budget)
                        case .start:
                            // A start lights the screen with its alert: priority 10, outside the update budget (push-to-start
                            // has its own).
                            (event, pushPriority, payload) = (.start, 10, rendition.startBody(for: instance.pushToken, subscribing: instance.channelID)!)
                        case .nothing:
                            cancelled.append(
                                InstanceResult(
                                    instance: instance, sequence: rendition.sequence, event: rendition.event, priority: 0, final: .startCancelled,
                                    attempts: []
                                )
                            )
                            continue
                        }
                        pushes.append(
                            OutgoingPush(
                                appID: appID, activityID: activityID, deviceID: instance.deviceID, platform: instance.platform,
                                token: instance.pushToken, topic: rendition.topic, sequence: rendition.sequence, event: event,
                                priority: pushPriority, expiration: rendition.expiration, payload: payload
                            )
                        )
                        if kept != index { sent[kept] = instance }
                        kept += 1
                    }
                    if kept != sent.endIndex { sent.removeSubrange(kept...) }
                    group.addTask { [pushes, sent, cancelled] in
                        let results =
                            pushes.isEmpty
                            ? [] : await self.untilPushesGivenUp { await self.push(pushes, instances: sent, transport: rendition.transport) }
                        // A push the service took says the app's credentials work: marked unhealthy after a refusal,
                        // they are healthy again (the directory writes only then).
                        if let platform = pushes.first?.platform, results.contains(where: { $0.final == .delivered }) {
                            await self.transports.credentialsHealth(appID: appID, platform: platform, healthy: true, reason: nil)
                        }
                        let runs =
                            self.configuration.marksRuns
                            ? Self.runs(
                                of: instances, results: results, firstPosition: firstPosition, sequence: rendition.sequence,
                                pass: claim.pass, sentAt: Int64(self.now().timeIntervalSince1970)
                            ) : []
                        return .sent(cancelled + results, runs: runs)
                    }
                case .recordProgress(let batch):
                    // The runs sent so far (those of this batch's results among them), joined, and this batch's
                    // results they record.
                    let marks = DeliveryRuns.joined(unwrittenRuns).map(\.mark)
                    unwrittenRuns.removeAll(keepingCapacity: true)
                    var marked: Set<ObjectIdentifier> = []
                    if !covered.isEmpty {
                        for result in batch where covered.remove(ObjectIdentifier(result)) != nil {
                            marked.insert(ObjectIdentifier(result))
                        }
                    }
                    if !marks.isEmpty { wroteMarks = true }
                    let own = batch.flatMap(\.attempts)
                    let written: [DeliveryRecord]
                    switch timeline.record(own, instances: batch.count, attempts: own.count) {
                    case .hold: written = []
                    case .write(let earlier): written = earlier.isEmpty ? own : earlier.flatMap { $0 } + own
                    }
                    attempts += written.count
                    group.addTask { [marked] in
                        await self.recordProgress(
                            appID: appID, activityID: activityID, batch, timeline: written, budget: budget, marks: marks, marked: marked
                        )
                        return .fanOut(.progressRecorded)
                    }
                case .reportCredentialsRefused(let platform):
                    await transports.credentialsHealth(
                        appID: appID, platform: platform, healthy: false, reason: "The push service refused the app's credentials"
                    )
                case .wait:
                    switch await group.next() {
                    case .fanOut(let event):
                        // A full page with the sequence to send (a platform's first page): the pass may reach many more
                        // instances than the timeline keeps. They are counted beside the sends, once; a slice's pass
                        // takes its slice's size instead (``TimelineThinning/countWithoutReading(slice:sliceSize:)``).
                        if !counting, case .pageRead(let instances, _, .some, _) = event, instances.count >= configuration.pageSize {
                            counting = true
                            if let bound = TimelineThinning<[DeliveryRecord]>.countWithoutReading(
                                slice: slice != nil, sliceSize: configuration.sliceSize
                            ) {
                                timeline.counted(pending: bound)
                            } else {
                                group.addTask {
                                    // Without the count (the read failed), every attempt is written, as for a small pass.
                                    .counted(
                                        try? await self.store.pendingInstanceCount(
                                            appID: appID, activityID: activityID, below: claim.activity.sequence,
                                            platforms: self.configuration.platforms, after: slice?.after, through: slice?.through,
                                            consultingMarks: claim.sequenceMarked
                                        )
                                    )
                                }
                            }
                        }
                        machine.receive(event)
                    case .counted(let pending):
                        if let pending { timeline.counted(pending: pending) }
                    case .sent(let results, let runs):
                        if !runs.isEmpty {
                            unwrittenRuns += runs
                            // The results the runs record: their progress writes no row for them.
                            for result in results
                            where result.final == .delivered && result.event == .update && runs.contains(where: { $0.mark.covers(result.instance) }) {
                                covered.insert(ObjectIdentifier(result))
                            }
                        }
                        machine.receive(.resultsReceived(results))
                    case nil:
                        preconditionFailure("the fan-out waits with nothing in flight")
                    }
                case .release(let timing):
                    let held = timeline.passEnded().flatMap { $0 }
                    let marks = DeliveryRuns.joined(unwrittenRuns).map(\.mark)
                    if !marks.isEmpty { wroteMarks = true }
                    if !held.isEmpty || !marks.isEmpty {
                        attempts += held.count
                        await recordProgress(appID: appID, activityID: activityID, [], timeline: held, budget: budget, marks: marks, marked: [])
                    }
                    // Marks of the sequence left by a pass before it (a retry's, a stopped pass's) are settled alike.
                    let marked: PassMarks =
                        if !wroteMarks && !claim.sequenceMarked {
                            .none
                        } else if timing == .now, sequencesSent.count == 1, let sequence = sequencesSent.first,
                            Set(configuration.platforms) == Set(Platform.allCases)
                        {
                            .complete(sequence)
                        } else {
                            .unknown
                        }
                    return (timing, attempts, marked)
                }
            }
        }
    }

    /// Runs `body` while a child task renews the claim's lease every third of the lease, so a pass keeps its claim
    /// however long its pushes wait for answers. When a renewal finds the claim gone (another engine took it after the
    /// lease ran out, e.g. while this process was paused), `body`'s ``ClaimWatch`` says so and the pass stops sending.
    /// A renewal that fails (the Store is busy) is tried again at the next tick. The renewals have stopped when it
    /// returns.
    private func keepingClaim<T: Sendable>(_ claim: DispatchClaim, _ body: (ClaimWatch) async throws -> T) async throws -> T {
        let (appID, activityID, owner) = (claim.activity.appID, claim.activity.activityID, claim.owner)
        return try await keepingLease(
            of: "activity \(activityID)",
            renew: {
                try await self.store.renewClaim(appID: appID, activityID: activityID, owner: owner, now: self.now(), lease: self.configuration.claimLease)
                    != nil
            },
            body
        )
    }

    /// Runs `body` while a child task calls `renew` every third of the claim lease (a claim on an activity, or on a
    /// slice of its fan-out); `renew` answers false when the claim was lost, and `body`'s ``ClaimWatch`` then says so.
    private func keepingLease<T: Sendable>(
        of what: String, renew: @escaping @Sendable () async throws -> Bool, _ body: (ClaimWatch) async throws -> T
    ) async throws -> T {
        let watch = ClaimWatch()
        return try await withThrowingTaskGroup(of: Void.self, returning: T.self) { group in
            group.addTask { await self.renewLease(of: what, renew: renew, watch: watch) }
            defer { group.cancelAll() }
            return try await body(watch)
        }
    }

    private func renewLease(of what: String, renew: @Sendable () async throws -> Bool, watch: ClaimWatch) async {
        let interval = Duration.milliseconds(Int64(max(configuration.claimLease / 3, 0.001) * 1000))
        var renewed = ContinuousClock.now
        while true {
            do { try await Task.sleep(for: interval) } catch { return }
            do {
                let asked = ContinuousClock.now
                guard try await renew() else {
                    if Task.isCancelled { return }
                    logger.warning(
                        "A claim was lost mid-pass: another engine has it, or its activity was deleted",
                        metadata: ["claim": "\(what)", "sinceRenewal": "\(ContinuousClock.now - renewed)"]
                    )
                    watch.markLost()
                    return
                }
                let answered = ContinuousClock.now
                if answered - renewed > .milliseconds(Int64(configuration.claimLease * 1000 / 2)) {
                    logger.warning(
                        "A claim was renewed late",
                        metadata: ["claim": "\(what)", "sinceRenewal": "\(answered - renewed)", "renewalTook": "\(answered - asked)"]
                    )
                }
                renewed = answered
            } catch {
                if Task.isCancelled { return }
                logger.warning("Renewing a claim failed; trying again", metadata: ["claim": "\(what)", "error": "\(error)"])
            }
        }
    }

    /// Reads a page of the pass as the fan-out asked. A platform's first page (`below` nil) is read at the claim's
    /// sequence and, when it has instances, comes with the platform's transport and the rendered state. A later page
    /// first re-reads the claim (only reading it, on the Store's reader, so a page never waits for a progress write;
    /// the lease is renewed by ``keepingClaim(_:_:)``) and comes with the newest state when a newer one
    /// was accepted.
    ///
    /// A `slice`'s pages are its range's, and its claim is the slice's.
    private func readPage(
        _ claim: DispatchClaim, slice: FanOutSlice?, platform: Platform, below: Int64?, after cursor: String?,
        priority10Marks: Priority10MarkIndex, readBefore: FirstPage?
    ) async -> FanOut.Event {
        let appID = claim.activity.appID
        let activityID = claim.activity.activityID
        // Each instance's priority-10 pushes: its row's tally with the marks that speak for it.
        func counted(_ instances: [InstanceRecord]) -> [InstanceRecord] {
            guard !priority10Marks.isEmpty else { return instances }
            return instances.map { instance in
                guard instance.platform == .ios else { return instance }
                var counted = instance
                counted.priority10 = priority10Marks.counting(instance.priority10, for: instance)
                return counted
            }
        }
        do {
            guard let below else {
                let first = if let readBefore { readBefore } else { try await firstPage(claim, slice: slice, platform: platform) }
                let instances = counted(first.instances)
                let nothingBehind = first.nothingBehind
                if instances.isEmpty { return .pageRead(instances: [], cursor: nil, rendition: nil, nothingBehind: nothingBehind) }
                guard let transport = try await transports.transport(appID: appID, platform: platform, stored: claim.credentials) else {
                    logger.warning("No way to send this app's pushes; its instances wait", metadata: ["app": "\(appID)", "platform": "\(platform)"])
                    return .transportUnavailable
                }
                guard let rendition = render(claim, for: platform, transport: transport) else { return .nothingToSend }
                return .pageRead(instances: instances, cursor: instances.last?.deviceID, rendition: rendition, nothingBehind: nothingBehind)
            }
            let at = now()
            let held =
                if let slice {
                    try await store.heldSlice(slice, owner: claim.owner, now: at)
                } else {
                    try await store.heldClaim(appID: appID, activityID: activityID, owner: claim.owner, now: at)
                }
            guard let held else { return .claimLost }
            var newer: Rendition?
            if held.activity.sequence != below, let transport = try await transports.transport(appID: appID, platform: platform, stored: held.credentials) {
                newer = render(held, for: platform, transport: transport)
            }
            let instances = counted(
                try await store.pendingInstances(
                    appID: appID, activityID: activityID, below: newer?.sequence ?? below, platforms: [platform], after: cursor ?? slice?.after,
                    through: slice?.through, limit: configuration.pageSize, consultingMarks: claim.sequenceMarked
                )
            )
            return .pageRead(instances: instances, cursor: instances.last?.deviceID, rendition: newer)
        } catch {
            if !Task.isCancelled { logger.error("Reading instances failed", metadata: ["error": "\(error)"]) }
            return .storeFailed
        }
    }

    /// A platform's first page of the pass, read with the engine's platforms after it, and taken apart by
    /// ``FanOutStateMachine/firstPage(of:in:readWith:pageSize:platformOf:)``; read again alone when that read cannot
    /// say. On PostgreSQL each read is a round trip, and an activity of one phone used to cost one for each platform,
    /// most of them finding nothing.
    private func firstPage(_ claim: DispatchClaim, slice: FanOutSlice?, platform: Platform) async throws -> FirstPage {
        let later = Array(configuration.platforms.drop { $0 != platform }.dropFirst())
        func read(_ platforms: [Platform]) async throws -> [InstanceRecord] {
            try await store.pendingInstances(
                appID: claim.activity.appID, activityID: claim.activity.activityID, below: claim.activity.sequence, platforms: platforms,
                after: slice?.after, through: slice?.through, limit: configuration.pageSize, consultingMarks: claim.sequenceMarked
            )
        }
        // A read of fewer than a page holds every instance behind on the platforms it read.
        func everyPending(_ read: [InstanceRecord]) -> Int? { read.count < configuration.pageSize ? read.count : nil }
        guard !later.isEmpty else {
            let read = try await read([platform])
            return FirstPage(platform: platform, instances: read, nothingBehind: [], everyPending: everyPending(read))
        }
        let together = try await read([platform] + later)
        if let first = FanOut.firstPage(of: platform, in: together, readWith: later, pageSize: configuration.pageSize, platformOf: \.platform) {
            return FirstPage(platform: platform, instances: first.instances, nothingBehind: first.nothingBehind, everyPending: everyPending(together))
        }
        return FirstPage(platform: platform, instances: try await read([platform]), nothingBehind: [], everyPending: nil)
    }

    /// A platform's first page of a pass (``firstPage(_:slice:platform:)``).
    struct FirstPage: Sendable {
        var platform: Platform
        /// Its instances behind, by device id (a page at most).
        var instances: [InstanceRecord]
        /// The platforms after it found with nothing behind.
        var nothingBehind: [Platform]
        /// How many instances are behind on `platform` and the engine's platforms after it, when the read held every
        /// one of them; `nil` when there may be more.
        var everyPending: Int?
    }

    /// Runs `send` (pushes and their answers) until it returns or the shutdown grace is over: then it is cancelled, so
    /// that the pushes still waiting for an answer are given up (their outcome is a retry) and it returns at once with
    /// the answers it has. Only `send` is cancelled: the pass goes on to record those answers and hand its claim back.
    private func untilPushesGivenUp(_ send: @escaping @Sendable () async -> [InstanceResult]) async -> [InstanceResult] {
        await withTaskGroup(of: [InstanceResult]?.self) { group in
            group.addTask { await send() }
            group.addTask {
                await self.pushesGivenUp.wait()
                return nil
            }
            while let next = await group.next() {
                // The other one, whichever it is, is done with: the latch's wait, or the send (which then returns).
                group.cancelAll()
                if let results = next { return results }
            }
            preconditionFailure("the send's task returns its results")
        }
    }

    /// Writes one batch's progress, and `timeline`'s attempts (``TimelineThinning``: those of batches held back before
    /// it, then usually the batch's own; at the end of a pass, an empty batch with what was still held); a failure only
    /// means those instances are sent again later.
    ///
    /// `marks` are runs of pushes the batch's results among them (``DeliveryRuns``): the results they record
    /// (`marked`) write no row.
    private func recordProgress(
        appID: String, activityID: String, _ batch: [InstanceResult], timeline: [DeliveryRecord], budget: PriorityBudget,
        marks: [DeliveryMark] = [], marked: Set<ObjectIdentifier> = []
    ) async {
        do {
            var batchProgress = progress(appID: appID, activityID: activityID, batch, budget: budget, marked: marked)
            batchProgress.attempts = timeline
            batchProgress.marks = marks
            if batchProgress.budgetWarnings > 0 {
                logger.notice(
                    "budget.warning: instances reached the warning share of their hourly priority-10 budget",
                    metadata: ["app": "\(appID)", "activity": "\(activityID)", "instances": "\(batchProgress.budgetWarnings)"]
                )
            }
            warnOfEnvironmentMismatch(appID: appID, batch)
            try await store.recordProgress(batchProgress, at: now())
        } catch {
            logger.error(
                "Recording delivery progress failed; those instances will be sent again, and its attempts are missing from the timeline",
                metadata: ["error": "\(error)"]
            )
        }
    }

    /// Sends a chunk of pushes in one transport call; those that may succeed later are retried one by one (with
    /// backoff and jitter) while the others are done. Each first attempt's latency is the chunk's.
    private func push(_ pushes: [OutgoingPush], instances: ArraySlice<InstanceRecord>, transport: any PushTransport) async -> [InstanceResult] {
        // One instance a push, in the same order: the push at `index` goes to `instances[start + index]`.
        let start = instances.startIndex
        if pushes.count == 1 {
            return [await push(pushes[0], instance: instances[start], transport: transport)]
        }
        let started = ContinuousClock.now
        let outcomes = await transport.send(pushes)
        let latency = (ContinuousClock.now - started).seconds * 1000
        return await withTaskGroup(of: (Int, InstanceResult).self) { group in
            var results = [InstanceResult?](repeating: nil, count: pushes.count)
            for index in pushes.indices {
                let first = (outcomes[index], latency)
                if case .retryable = outcomes[index] {
                    group.addTask { [push = pushes[index], instance = instances[start + index]] in
                        (index, await self.push(push, instance: instance, transport: transport, first: first))
                    }
                } else {
                    // Final at once: no wait inside.
                    results[index] = await self.push(pushes[index], instance: instances[start + index], transport: transport, first: first)
                }
            }
            for await (index, result) in group {
                results[index] = result
            }
            return results.map { $0! }
        }
    }

    /// Sends one push, retrying what may succeed later with backoff and jitter.
    ///
    /// `first` is the first attempt's outcome and latency when it was already sent (in a chunk).
    private func push(
        _ push: OutgoingPush, instance: InstanceRecord, transport: any PushTransport, first: (PushOutcome, Double)? = nil
    ) async -> InstanceResult {
        var attempts: [DeliveryRecord] = []
        var attempt = 0
        while true {
            attempt += 1
            let outcome: PushOutcome
            let latency: Double
            if attempt == 1, let first {
                (outcome, latency) = first
            } else {
                let started = ContinuousClock.now
                outcome = await transport.send(push)
                latency = (ContinuousClock.now - started).seconds * 1000
            }
            func record(_ status: DeliveryStatus, _ providerID: String?, _ reason: String?) {
                metrics.recordPush(platform: push.platform, status: status, reason: reason, latencyMilliseconds: latency)
                attempts.append(
                    DeliveryRecord(
                        appID: push.appID, activityID: push.activityID, deviceID: push.deviceID, platform: push.platform,
                        sequence: push.sequence, event: push.event, priority: push.priority, status: status, providerID: providerID,
                        reason: reason, latencyMilliseconds: latency, attempt: attempt, attemptedAt: now()
                    )
                )
            }
            let final: InstanceResult.Final
            switch outcome {
            case .delivered(let providerID):
                record(.delivered, providerID, nil)
                final = .delivered
            case .invalidToken(let reason, let providerID):
                record(.invalidated, providerID, reason)
                final = .invalidated
            case .rejected(let reason, let providerID):
                record(.rejected, providerID, reason)
                final = .rejected
            case .credentialsRejected(let reason, let providerID):
                record(.credentialsRejected, providerID, reason)
                final = .credentials
            case .retryable(let reason, let retryAfter, let providerID):
                record(.retrying, providerID, reason)
                let floor = configuration.retryFloor(platform: push.platform, reason: reason)
                let withinPass = configuration.retriesWithinPass(platform: push.platform, reason: reason)
                if attempt < configuration.retry.maximumAttempts, withinPass, !Task.isShuttingDownGracefully {
                    let delay = configuration.retry.delay(afterAttempt: attempt, retryAfter: retryAfter, floor: floor, random: random())
                    // A shutdown ends the wait (it may be a minute or more): the push is left for the next pass, after
                    // the restart, instead of holding the server up.
                    try? await cancelWhenGracefulShutdown { try await Task.sleep(for: delay) }
                    if !Task.isShuttingDownGracefully { continue }
                }
                if !withinPass {
                    // Left for the next pass, which comes no sooner than the refusal asks (a new state still goes at once).
                    let wait = configuration.retry.delay(afterAttempt: 1, retryAfter: retryAfter, floor: floor, random: random())
                    if wait > configuration.retry.passRetryDelay, floor > .zero || retryAfter != nil {
                        let passed = now()
                        let notBefore = passed.addingTimeInterval(wait.seconds)
                        laterPassNotBefore.withLock { waits in
                            let key = ActivityKey(appID: push.appID, activityID: push.activityID)
                            if let earlier = waits[key] {
                                waits[key] = max(earlier, notBefore)
                            } else {
                                // Times gone by are of no use (a slice sent here for another node's pass leaves its
                                // own): dropped as an activity is added, not at each of its refusals.
                                waits = waits.filter { $0.value > passed }
                                waits[key] = notBefore
                            }
                        }
                    }
                }
                final = .exhausted
            }
            return InstanceResult(
                instance: instance, sequence: push.sequence, event: push.event, priority: push.priority, final: final, attempts: attempts
            )
        }
    }

    /// The priority of one push: Apple's budget decides for iOS; FCM messages are always high priority.
    private func priority(of rendition: Rendition, for instance: InstanceRecord, budget: PriorityBudget) -> Int {
        guard instance.platform == .ios else { return 10 }
        return budget.priority(
            event: rendition.event, hasAlert: rendition.hasAlert, requested: rendition.requestedPriority,
            used: instance.priority10.used(at: Int64(now().timeIntervalSince1970)),
            frequentPushes: instance.frequentPushesEnabled
        )
    }

    /// The runs of one chunk's pushes (``DeliveryRuns``): `instances` as the pass read them, `results` in any order.
    static func runs(
        of instances: ArraySlice<InstanceRecord>, results: [InstanceResult], firstPosition: Int, sequence: Int64, pass: Int64, sentAt: Int64
    ) -> [DeliveryRun] {
        guard results.count >= DeliveryRuns.minimumLength, let platform = instances.first?.platform else { return [] }
        var byDevice: [String: InstanceResult] = [:]
        byDevice.reserveCapacity(results.count)
        for result in results { byDevice[result.instance.deviceID] = result }
        let entries = instances.map { instance in
            let result = byDevice[instance.deviceID]
            return DeliveryRuns.Entry(
                deviceID: instance.deviceID,
                markable: result.map {
                    $0.sequence == sequence
                        && DeliveryRuns.markable(
                            state: instance.state, channelID: instance.channelID, joinedPass: instance.joinedPass, pass: pass, event: $0.event,
                            delivered: $0.final == .delivered
                        )
                } ?? false,
                priority: result?.priority ?? 0
            )
        }
        return DeliveryRuns.runs(of: entries, firstPosition: firstPosition, platform: platform, sequence: sequence, pass: pass, sentAt: sentAt)
    }

    /// Logs a warning when a batch's iOS pushes were all refused with `BadDeviceToken` (``EnvironmentMismatchWatch``).
    private func warnOfEnvironmentMismatch(appID: String, _ batch: [InstanceResult]) {
        // Counted in one pass, without copying the batch: it runs for every batch a fan-out records.
        var refused = 0
        var delivered = 0
        for result in batch where result.instance.platform == .ios {
            if result.final == .delivered {
                delivered += 1
            } else if result.final == .invalidated, result.attempts.last?.reason == "BadDeviceToken" {
                refused += 1
            }
        }
        let warn = environmentWatch.withLock { $0.shouldWarn(appID: appID, badDeviceTokens: refused, delivered: delivered, at: now()) }
        guard warn else { return }
        logger.warning(
            """
            APNs refused every push of a batch with BadDeviceToken. It answers so for a token of the other environment too: \
            check that the environment of the app's APNs credentials (sandbox for builds from Xcode, production for \
            TestFlight and the App Store) matches its phones' builds. The refused instances are invalidated; each comes \
            back when its phone registers its token again.
            """,
            metadata: ["app": "\(appID)", "refused": "\(refused)"]
        )
    }

    /// One batch's progress, without its attempts (the timeline's: ``recordProgress(appID:activityID:_:timeline:budget:)``).
    private func progress(
        appID: String, activityID: String, _ results: [InstanceResult], budget: PriorityBudget, marked: Set<ObjectIdentifier> = []
    ) -> DeliveryProgress {
        var progress = DeliveryProgress(appID: appID, activityID: activityID)
        let nowSeconds = Int64(now().timeIntervalSince1970)
        for result in results {
            // A push a mark records: nothing of it goes into the instance's row (its budget warning is still counted).
            let isMarked = !marked.isEmpty && marked.contains(ObjectIdentifier(result))
            let pushed = PushedInstance(deviceID: result.instance.deviceID, token: result.instance.pushToken, sequence: result.sequence)
            if result.final == .delivered, result.priority == 10, result.instance.platform == .ios, result.event != .start {
                let tally = result.instance.priority10.recording(at: nowSeconds)
                if !isMarked { progress.priority10Tallies.append((pushed, tally)) }
                let used = tally.used(at: nowSeconds)
                if budget.warns(used: used, frequentPushes: result.instance.frequentPushesEnabled),
                    !budget.warns(used: used - 1, frequentPushes: result.instance.frequentPushesEnabled)
                {
                    progress.budgetWarnings += 1
                }
            }
            let last = result.attempts.last
            // The instance turns `invalidated`, with its `instance.invalidated` event.
            func invalidate() {
                progress.invalidated.append(pushed)
                progress.events.append(
                    NewEvent(
                        .instanceInvalidated, appID: appID, activityID: activityID, deviceID: result.instance.deviceID,
                        data: [
                            "platform": .string(result.instance.platform.rawValue), "reason": last?.reason.map(JSONValue.string) ?? .null,
                            "at": .string(APIDate.iso8601(last?.attemptedAt ?? now())),
                        ]
                    )
                )
            }
            switch result.final {
            case .delivered:
                if isMarked { continue }
                if result.event == .start { progress.startsDelivered.append(pushed) } else { progress.delivered.append(pushed) }
                if result.event == .end { progress.endDelivered.append(pushed) }
            case .rejected:
                // Refused for good: this sequence is done for the instance; a newer one is tried afresh.
                progress.delivered.append(pushed)
                progress.events.append(
                    NewEvent(
                        .deliveryFailed, appID: appID, activityID: activityID, deviceID: result.instance.deviceID,
                        data: [
                            "platform": .string(result.instance.platform.rawValue), "sequence": .integer(result.sequence),
                            "event": .string(result.event.rawValue), "reason": last?.reason.map(JSONValue.string) ?? .null,
                        ]
                    )
                )
                if result.event == .start, result.instance.platform == .ios {
                    // An iPhone whose start was refused (its topic, the app's settings: not its token, which stays) has
                    // no Live Activity, and no newer state can reach it: its push-to-start token takes nothing but a
                    // start. It is invalidated, so the next start admits it afresh, once what was wrong is put right.
                    invalidate()
                }
            case .invalidated:
                invalidate()
                // The token is dropped from its device wherever the device holds it: a start's push-to-start or FCM
                // token, and an Android phone's FCM token whatever the push (its instances use the device's one token),
                // so that the next remote start skips the device instead of sending to a token known to be gone.
                if result.event == .start || result.instance.platform == .android {
                    progress.refusedTokens.append((pushed, result.attempts.last?.reason ?? "refused"))
                }
            case .startCancelled:
                // Never started, now over: the instance ends without a push.
                progress.delivered.append(pushed)
                progress.endDelivered.append(pushed)
            case .exhausted, .credentials:
                break
            }
        }
        if progress.budgetWarnings > 0 {
            progress.events.append(
                NewEvent(.budgetWarning, appID: appID, activityID: activityID, data: ["instances": .integer(Int64(progress.budgetWarnings))])
            )
        }
        return progress
    }
}

/// Whether a pass's claim is still its engine's, as the renewals of its lease find it: set once, by
/// ``Dispatcher``'s lease keeper, when a renewal finds another engine holding the activity; read by the pass.
final class ClaimWatch: Sendable {
    private let lost = Atomic<Bool>(false)

    /// A renewal found the claim gone.
    var isLost: Bool { lost.load(ordering: .acquiring) }

    func markLost() { lost.store(true, ordering: .releasing) }
}
