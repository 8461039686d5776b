import CoreMetrics
import Hummingbird
import LivelineCore
import LivelineStore
import Synchronization

/// `GET /metrics`: the Prometheus text exposition format, without an API key (as `/healthz`). Before it writes the
/// registry out it counts the Store's activities and instances by state, and its pending work (gauges).
struct MetricsRoutes<Context: RequestContext>: Sendable {
    let metrics: LivelineMetrics
    let gauges: StoreGauges?

    init(metrics: LivelineMetrics, store: any Store) {
        self.metrics = metrics
        self.gauges = (store as? any MetricsStore).map {
            StoreGauges(store: $0, factory: metrics.factory, countingInterval: metrics.storeCountInterval)
        }
    }

    /// The content type of Prometheus' text format.
    static var contentType: String { "text/plain; version=0.0.4; charset=utf-8" }

    func add(to router: Router<Context>) {
        router.get("metrics") { _, context in
            if let gauges {
                do {
                    try await gauges.update()
                } catch {
                    // The rest is still worth a scrape; the gauges keep their last values.
                    context.logger.warning("Counting the Store's states for /metrics failed", metadata: ["error": "\(error)"])
                }
            }
            return Response(
                status: .ok, headers: [.contentType: Self.contentType],
                body: ResponseBody(byteBuffer: ByteBuffer(bytes: metrics.exposition()))
            )
        }
    }
}

/// The Store's state gauges: `liveline_activities{state}`, `liveline_instances{state}` and
/// `liveline_activities_pending_delivery`, set from ``MetricsStore/stateCounts()`` at each scrape.
final class StoreGauges: Sendable {
    private let store: any MetricsStore
    private let factory: any MetricsFactory
    private let pending: Gauge
    private let webhookBacklog: Gauge
    /// Gauges by family and state; a state seen once is reported (0 when it has none) from then on.
    private let gauges = Mutex<[String: Gauge]>([:])
    /// The least time between two counts of the Store.
    let countingInterval: Duration
    private let now: @Sendable () -> ContinuousClock.Instant
    /// When the last count that succeeded began, and the count running now.
    private let counted = Mutex<(last: ContinuousClock.Instant?, running: Task<Void, any Error>?)>((nil, nil))

    init(
        store: any MetricsStore, factory: any MetricsFactory, countingInterval: Duration = .seconds(5),
        now: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }
    ) {
        self.store = store
        self.factory = factory
        self.countingInterval = countingInterval
        self.now = now
        pending = Gauge(label: MetricNames.activitiesPendingDelivery, factory: factory)
        webhookBacklog = Gauge(label: MetricNames.webhookDeliveriesPending, factory: factory)
        // The known states are reported from the first scrape on, at 0 when none.
        for state in ActivityState.allCases { _ = gauge(MetricNames.activities, state.rawValue) }
        for state in InstanceState.allCases { _ = gauge(MetricNames.instances, state.rawValue) }
    }

    /// Counts the Store's rows and sets every gauge, at most once every ``countingInterval``: a scrape within it of
    /// the last count (or while one runs) keeps its values. `/metrics` needs no key, and each count reads every
    /// instance (about 0.3 s of a core at a million); Prometheus scrapes every 15 s or more.
    func update() async throws {
        let now = self.now()
        let counting: Task<Void, any Error>? = counted.withLock { counted in
            if let running = counted.running { return running }
            if let last = counted.last, now < last.advanced(by: countingInterval) { return nil }
            let task = Task { try await self.count() }
            counted.running = task
            return task
        }
        guard let counting else { return }
        let result = await counting.result
        counted.withLock { counted in
            // The first caller to see the count over writes it down (the others find it already taken).
            if counted.running == counting {
                counted.running = nil
                if case .success = result { counted.last = now }
            }
        }
        try result.get()
    }

    private func count() async throws {
        let counts = try await store.stateCounts()
        pending.record(counts.pendingActivities)
        webhookBacklog.record(counts.pendingWebhookDeliveries)
        set(MetricNames.activities, counts.activities)
        set(MetricNames.instances, counts.instances)
    }

    private func set(_ family: String, _ counts: [String: Int]) {
        var states = Set(counts.keys)
        gauges.withLock { gauges in
            for key in gauges.keys where key.hasPrefix(family + "|") { states.insert(String(key.dropFirst(family.count + 1))) }
        }
        for state in states { gauge(family, state).record(counts[state] ?? 0) }
    }

    private func gauge(_ family: String, _ state: String) -> Gauge {
        gauges.withLock { gauges in
            let key = family + "|" + state
            if let gauge = gauges[key] { return gauge }
            let gauge = Gauge(label: family, dimensions: [("state", state)], factory: factory)
            gauges[key] = gauge
            return gauge
        }
    }
}
