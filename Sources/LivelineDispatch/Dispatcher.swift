import Foundation
import LivelineCore
import LivelineStore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import ServiceLifecycle

/// How the delivery engine behaves.
public struct DispatcherConfiguration: Sendable {
    /// Activities worked on at the same time.
    public var workers: Int = 4
    /// Pushes in flight per activity.
    public var pushesInFlight: Int = 2048
    /// Pushes handed to the transport in one call (one task, one hop to the connection for all of them).
    public var pushesPerCall: Int = 64
    /// Instances read from the Store per page.
    public var pageSize: Int = 1000
    /// Results written to the Store per progress transaction. Smaller batches let accepted updates (which share the
    /// Store's one writer) in sooner; larger ones cost fewer commits.
    public var progressBatchSize: Int = 250
    /// How many progress batches may wait to be written before the sends wait for the Store. Recording progress is
    /// bookkeeping (after a crash, anything unrecorded is sent again and the phone ignores what it already has), so
    /// sends run ahead of it rather than at the Store's pace. At 16 (4,000 results of 250) neither side waits for the
    /// other for long: a 100,000-instance fan-out went about a quarter faster than at 4, and its progress was recorded
    /// sooner too, for about 5 MB more memory.
    public var progressBatchesBehind: Int = 16
    /// How long a claim on an activity lasts without renewal.
    public var claimLease: TimeInterval = 30
    /// How often the engine looks for work when nobody wakes it.
    public var idlePollInterval: Duration = .milliseconds(250)
    /// Retries of 429, 5xx and transport failures.
    public var retry = RetryPolicy()
    /// The least wait before retrying an Android (FCM) push: Google asks senders not to retry quota and availability
    /// errors at once.
    public var fcmRetryFloor: Duration = .seconds(10)
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
    private let store: any DispatchStore
    private let transports: any PushTransportDirectory
    private let configuration: DispatcherConfiguration
    private let logger: Logger
    private let now: @Sendable () -> Date
    private let random: @Sendable () -> Double
    private let owner: String
    private let wakeStream: AsyncStream<Void>
    private let wakeContinuation: AsyncStream<Void>.Continuation

    /// Creates the engine.
    public init(
        store: any DispatchStore, transports: any PushTransportDirectory, configuration: DispatcherConfiguration = .init(),
        logger: Logger = Logger(label: "liveline.dispatch"), now: @escaping @Sendable () -> Date = { Date() },
        random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) }
    ) {
        self.store = store
        self.transports = transports
        self.configuration = configuration
        self.logger = logger
        self.now = now
        self.random = random
        self.owner = "dispatcher-\(UUID().uuidString.lowercased())"
        (self.wakeStream, self.wakeContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Tells the engine new work may be waiting (called after an update is committed).
    public func wake() { wakeContinuation.yield() }

    /// Runs until graceful shutdown: claimed work in flight is finished and its claim handed back.
    public func run() async throws {
        try await store.releaseAllClaims()
        logger.info("Delivery engine started", metadata: ["workers": "\(configuration.workers)", "platforms": "\(configuration.platforms)"])
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<configuration.workers {
                group.addTask { await self.workerLoop(index: index) }
            }
            group.addTask { await self.pruneLoop() }
            await group.waitForAll()
        }
        logger.info("Delivery engine stopped")
    }

    private func workerLoop(index: Int) async {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                if let claim = try await store.claimPendingActivity(owner: owner, now: now(), lease: configuration.claimLease) {
                    try await deliver(claim)
                    continue
                }
            } catch is CancellationError {
                return
            } catch {
                if Task.isCancelled { return }
                logger.error("Delivery pass failed", metadata: ["worker": "\(index)", "error": "\(error)"])
            }
            await idle()
        }
    }

    /// Waits for a wake-up or the idle poll interval, whichever comes first.
    private func idle() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [wakeStream] in
                for await _ in wakeStream { return }
            }
            group.addTask { [interval = configuration.idlePollInterval] in
                try? await Task.sleep(for: interval)
            }
            group.addTask { try? await gracefulShutdown() }
            await group.next()
            group.cancelAll()
        }
    }

    private func pruneLoop() async {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await store.pruneDeliveries(
                    olderThan: now().addingTimeInterval(-configuration.deliveryRetention),
                    keepPerActivity: configuration.deliveriesPerActivity
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
    private struct InstanceResult: Sendable {
        var instance: InstanceRecord
        var sequence: Int64
        var event: LiveActivityEvent
        var priority: Int
        var final: Final
        var attempts: [DeliveryRecord]

        enum Final: Sendable {
            case delivered, invalidated, rejected, exhausted, credentials
        }
    }

    /// The bytes and headers of one sequence, built once per platform.
    private struct PreparedSequence: Sendable {
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

        /// What goes on the wire for one token.
        func body(for token: String) -> ByteBuffer {
            guard let fcmMessage else { return payload }
            var body: [UInt8] = []
            fcmMessage.append(token: token, to: &body)
            return ByteBuffer(bytes: body)
        }
    }

    private func prepare(_ claim: DispatchClaim, for platform: Platform) -> PreparedSequence? {
        let activity = claim.activity
        guard let contentState = activity.contentState, let event = activity.event else { return nil }
        let timestamp = activity.timestampSeconds ?? Int64((activity.sequenceAt ?? now()).timeIntervalSince1970)
        let dismissalDate = event == .end ? activity.dismissalDate : nil
        switch platform {
        case .ios:
            let payload = APNsLiveActivityPayload(
                event: event, timestamp: timestamp, contentState: contentState, staleDate: activity.staleDate,
                relevanceScore: activity.relevanceScore, alert: activity.alert, dismissalDate: dismissalDate
            )
            var buffer = ByteBufferAllocator().buffer(capacity: 512)
            buffer.writeBytes(payload.encoded())
            return PreparedSequence(
                sequence: activity.sequence, event: event, hasAlert: activity.alert != nil, requestedPriority: activity.priority,
                payload: buffer, fcmMessage: nil,
                topic: claim.bundleID + ".push-type.liveactivity",
                expiration: APNsLiveActivityPayload.expiration(event: event, staleDate: activity.staleDate, now: now())
            )
        case .android:
            let message = FCMLiveUpdateMessage(
                activityID: activity.activityID, event: event, sequence: activity.sequence, timestamp: timestamp,
                contentState: contentState, staleDate: activity.staleDate, dismissalDate: dismissalDate, alert: activity.alert,
                priority: .high,
                timeToLive: FCMLiveUpdateMessage.timeToLive(event: event, staleDate: activity.staleDate, now: now())
            )
            return PreparedSequence(
                sequence: activity.sequence, event: event, hasAlert: activity.alert != nil, requestedPriority: activity.priority,
                payload: ByteBuffer(), fcmMessage: message.encoded(),
                topic: "", expiration: nil
            )
        }
    }

    private func deliver(_ initialClaim: DispatchClaim) async throws {
        var claim = initialClaim
        let appID = claim.activity.appID
        let activityID = claim.activity.activityID
        var retryAt: Date?
        var stopped = false
        let budget = claim.budget.applied(to: configuration.budget)
        // The claim's lease was set (or renewed) just now.
        let leaseRenewedAt = NIOLockedValueBox(now())

        // Rate shaping: a new state goes out no sooner than the activity's minimum interval after the last one
        // (coalesced meanwhile: whatever is newest then goes); an end goes at once, and so does a catch-up of the
        // state already sent (a new or rotated token).
        let activity = claim.activity
        if activity.lastSentSequence != activity.sequence {
            if let interval = activity.minUpdateInterval, interval > 0, activity.event != .end, let last = activity.lastSentAt {
                let allowed = last.addingTimeInterval(interval)
                if now() < allowed {
                    try await store.deferClaim(appID: appID, activityID: activityID, owner: owner, sequence: activity.sequence, until: allowed)
                    return
                }
            }
            try await store.recordSendStart(appID: appID, activityID: activityID, sequence: activity.sequence, at: now())
        }

        for platform in configuration.platforms {
            // The first page, read before anything else: a platform none of whose instances is behind needs no
            // transport (nor credentials).
            let firstPage = try await store.pendingInstances(
                appID: appID, activityID: activityID, below: claim.activity.sequence, platforms: [platform], after: nil,
                limit: configuration.pageSize
            )
            if firstPage.isEmpty { continue }
            guard let transport = try await transports.transport(appID: appID, platform: platform) else {
                logger.warning("No way to send this app's pushes; its instances wait", metadata: ["app": "\(appID)", "platform": "\(platform)"])
                retryAt = now().addingTimeInterval(configuration.retry.passRetryDelay.seconds)
                continue
            }
            guard var prepared = prepare(claim, for: platform) else { break }
            var cursor = firstPage.last?.deviceID
            var buffer: [InstanceResult] = []
            var credentialsRefused = false

            await withTaskGroup(of: [InstanceResult].self) { group in
                var inFlight = 0
                var page = firstPage
                var pageIndex = 0
                var exhaustedPages = firstPage.count < configuration.pageSize
                // The next page is read while this one is sent, and progress is written behind the sends: they wait
                // for the Store only when it is more than `progressBatchesBehind` batches behind.
                var nextPage: Task<PageFetch, Never>?
                // Progress writes in order, oldest first; each waits for the one before it.
                var progressWrites: [Task<Void, Never>] = []

                func flush(force: Bool) async {
                    guard !buffer.isEmpty, force || buffer.count >= configuration.progressBatchSize else { return }
                    let batch = buffer
                    buffer.removeAll(keepingCapacity: true)
                    let previous = progressWrites.last
                    progressWrites.append(Task {
                        await previous?.value
                        await self.recordProgress(appID: appID, activityID: activityID, batch, budget: budget)
                    })
                    while progressWrites.count > configuration.progressBatchesBehind {
                        await progressWrites.removeFirst().value
                    }
                }

                func collect(_ results: [InstanceResult]) {
                    for result in results {
                        inFlight -= 1
                        buffer.append(result)
                        switch result.final {
                        case .exhausted:
                            retryAt = now().addingTimeInterval(configuration.retry.passRetryDelay.seconds)
                        case .credentials:
                            credentialsRefused = true
                        default:
                            break
                        }
                    }
                }

                while true {
                    if Task.isShuttingDownGracefully || Task.isCancelled || credentialsRefused {
                        stopped = stopped || Task.isShuttingDownGracefully || Task.isCancelled
                        break
                    }
                    if nextPage == nil, !exhaustedPages, let after = cursor {
                        nextPage = Task { [sequence = prepared.sequence] in
                            await self.fetchPage(
                                appID: appID, activityID: activityID, platform: platform, sequence: sequence, after: after,
                                leaseRenewedAt: leaseRenewedAt
                            )
                        }
                    }
                    if pageIndex == page.count {
                        guard !exhaustedPages, let fetch = await nextPage?.value else { break }
                        nextPage = nil
                        guard case .page(let newer, let instances) = fetch else {
                            if case .claimLost = fetch { stopped = true } else { retryAt = now().addingTimeInterval(1) }
                            break
                        }
                        // Coalesce: each further page goes out at the activity's newest sequence.
                        if let newer {
                            claim = newer.claim
                            prepared = newer.prepared
                        }
                        page = instances
                        pageIndex = 0
                        if page.count < configuration.pageSize { exhaustedPages = true }
                        if page.isEmpty { break }
                        cursor = page.last?.deviceID
                        continue
                    }
                    if inFlight >= configuration.pushesInFlight, let result = await group.next() {
                        collect(result)
                        await flush(force: false)
                        continue
                    }
                    // The next chunk of this page, within the in-flight limit, goes out in one transport call.
                    let count = min(configuration.pushesPerCall, page.count - pageIndex, configuration.pushesInFlight - inFlight)
                    let instances = Array(page[pageIndex..<(pageIndex + count)])
                    pageIndex += count
                    inFlight += count
                    let pushes = instances.map { instance in
                        OutgoingPush(
                            appID: appID, activityID: activityID, deviceID: instance.deviceID, platform: platform, token: instance.pushToken,
                            topic: prepared.topic, sequence: prepared.sequence, event: prepared.event,
                            priority: priority(of: prepared, for: instance, platform: platform, budget: budget),
                            expiration: prepared.expiration, payload: prepared.body(for: instance.pushToken)
                        )
                    }
                    group.addTask { await self.push(pushes, instances: instances, transport: transport) }
                }
                while let result = await group.next() {
                    collect(result)
                    await flush(force: false)
                }
                await flush(force: true)
                for write in progressWrites { await write.value }
                // A page read ahead but not sent: let it finish (it only reads).
                _ = await nextPage?.value
            }

            if credentialsRefused {
                await transports.credentialsHealth(appID: appID, platform: platform, healthy: false, reason: "The push service refused the app's credentials")
                retryAt = now().addingTimeInterval(configuration.retry.passRetryDelay.seconds)
            }
            if stopped { break }
        }
        try await store.releaseClaim(
            appID: appID, activityID: activityID, owner: owner, platforms: configuration.platforms,
            retryAt: retryAt ?? (stopped ? nil : now())
        )
    }

    /// The next page of a pass, read ahead while the current one is sent.
    private enum PageFetch: Sendable {
        /// The renewed claim and its sequence, prepared, if a newer one was accepted meanwhile; and the instances behind
        /// the newest sequence after the cursor.
        case page(newer: (claim: DispatchClaim, prepared: PreparedSequence)?, [InstanceRecord])
        /// Another engine holds the activity now.
        case claimLost
        /// The Store failed; the pass ends and is retried.
        case failed
    }

    /// Re-reads the claim (renewing its lease once a third of it has passed since `leaseRenewedAt`) and reads the
    /// instances after `cursor` that are behind the newest sequence.
    ///
    /// Between renewals the claim is only read, on the Store's reader: a page never waits for a progress write.
    private func fetchPage(
        appID: String, activityID: String, platform: Platform, sequence: Int64, after cursor: String, leaseRenewedAt: NIOLockedValueBox<Date>
    ) async -> PageFetch {
        do {
            let at = now()
            let renewed: DispatchClaim?
            if at.timeIntervalSince(leaseRenewedAt.withLockedValue { $0 }) >= configuration.claimLease / 3 {
                renewed = try await store.renewClaim(appID: appID, activityID: activityID, owner: owner, now: at, lease: configuration.claimLease)
                leaseRenewedAt.withLockedValue { $0 = at }
            } else {
                renewed = try await store.heldClaim(appID: appID, activityID: activityID, owner: owner, now: at)
            }
            guard let renewed else { return .claimLost }
            let newer = renewed.activity.sequence != sequence ? prepare(renewed, for: platform).map { (claim: renewed, prepared: $0) } : nil
            let instances = try await store.pendingInstances(
                appID: appID, activityID: activityID, below: newer?.prepared.sequence ?? sequence, platforms: [platform], after: cursor,
                limit: configuration.pageSize
            )
            return .page(newer: newer, instances)
        } catch {
            if !Task.isCancelled { logger.error("Reading instances failed", metadata: ["error": "\(error)"]) }
            return .failed
        }
    }

    /// Writes one batch's progress and attempts; a failure only means those instances are sent again later.
    private func recordProgress(appID: String, activityID: String, _ batch: [InstanceResult], budget: PriorityBudget) async {
        do {
            let batchProgress = progress(appID: appID, activityID: activityID, batch, budget: budget)
            if batchProgress.budgetWarnings > 0 {
                logger.notice(
                    "budget.warning: instances reached the warning share of their hourly priority-10 budget",
                    metadata: ["app": "\(appID)", "activity": "\(activityID)", "instances": "\(batchProgress.budgetWarnings)"]
                )
            }
            try await store.recordProgress(batchProgress, at: now())
        } catch {
            logger.error("Recording delivery progress failed; those instances will be sent again", metadata: ["error": "\(error)"])
        }
    }

    /// Sends a chunk of pushes in one transport call; those that may succeed later are retried one by one (with
    /// backoff and jitter) while the others are done. Each first attempt's latency is the chunk's.
    private func push(_ pushes: [OutgoingPush], instances: [InstanceRecord], transport: any PushTransport) async -> [InstanceResult] {
        if pushes.count == 1 {
            return [await push(pushes[0], instance: instances[0], transport: transport)]
        }
        let started = ContinuousClock.now
        let outcomes = await transport.send(pushes)
        let latency = (ContinuousClock.now - started).seconds * 1000
        return await withTaskGroup(of: (Int, InstanceResult).self) { group in
            var results = [InstanceResult?](repeating: nil, count: pushes.count)
            for index in pushes.indices {
                let first = (outcomes[index], latency)
                if case .retryable = outcomes[index] {
                    group.addTask { [push = pushes[index], instance = instances[index]] in
                        (index, await self.push(push, instance: instance, transport: transport, first: first))
                    }
                } else {
                    // Final at once: no wait inside.
                    results[index] = await self.push(pushes[index], instance: instances[index], transport: transport, first: first)
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
                if attempt < configuration.retry.maximumAttempts, !Task.isShuttingDownGracefully {
                    var delay = configuration.retry.delay(afterAttempt: attempt, retryAfter: retryAfter, random: random())
                    if push.platform == .android { delay = max(delay, configuration.fcmRetryFloor) }
                    try? await Task.sleep(for: delay)
                    continue
                }
                final = .exhausted
            }
            return InstanceResult(
                instance: instance, sequence: push.sequence, event: push.event, priority: push.priority, final: final, attempts: attempts
            )
        }
    }

    /// The priority of one push: Apple's budget decides for iOS; FCM messages are always high priority.
    private func priority(of prepared: PreparedSequence, for instance: InstanceRecord, platform: Platform, budget: PriorityBudget) -> Int {
        guard platform == .ios else { return 10 }
        return budget.priority(
            event: prepared.event, hasAlert: prepared.hasAlert, requested: prepared.requestedPriority,
            used: PriorityBudget.used(instance.priority10Sent, now: Int64(now().timeIntervalSince1970)),
            frequentPushes: instance.frequentPushesEnabled
        )
    }

    private func progress(appID: String, activityID: String, _ results: [InstanceResult], budget: PriorityBudget) -> DeliveryProgress {
        var progress = DeliveryProgress(appID: appID, activityID: activityID)
        let nowSeconds = Int64(now().timeIntervalSince1970)
        for result in results {
            progress.attempts += result.attempts
            let pushed = PushedInstance(deviceID: result.instance.deviceID, token: result.instance.pushToken, sequence: result.sequence)
            if result.final == .delivered, result.priority == 10, result.instance.platform == .ios {
                let sent = PriorityBudget.recording(result.instance.priority10Sent, at: nowSeconds)
                progress.priority10Sent.append((pushed, sent))
                let used = PriorityBudget.used(sent, now: nowSeconds)
                if budget.warns(used: used, frequentPushes: result.instance.frequentPushesEnabled),
                    !budget.warns(used: used - 1, frequentPushes: result.instance.frequentPushesEnabled)
                {
                    progress.budgetWarnings += 1
                }
            }
            switch result.final {
            case .delivered:
                progress.delivered.append(pushed)
                if result.event == .end { progress.endDelivered.append(pushed) }
            case .rejected:
                // Refused for good: this sequence is done for the instance; a newer one is tried afresh.
                progress.delivered.append(pushed)
            case .invalidated:
                progress.invalidated.append(pushed)
            case .exhausted, .credentials:
                break
            }
        }
        return progress
    }
}

extension Duration {
    /// The duration in seconds, as a `TimeInterval`.
    var seconds: TimeInterval {
        TimeInterval(components.seconds) + TimeInterval(components.attoseconds) / 1e18
    }
}
