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
        self.gauges = (store as? any MetricsStore).map { StoreGauges(store: $0, factory: metrics.factory) }
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

    init(store: any MetricsStore, factory: any MetricsFactory) {
        self.store = store
        self.factory = factory
        pending = Gauge(label: MetricNames.activitiesPendingDelivery, factory: factory)
        webhookBacklog = Gauge(label: MetricNames.webhookDeliveriesPending, factory: factory)
        // The known states are reported from the first scrape on, at 0 when none.
        for state in ActivityState.allCases { _ = gauge(MetricNames.activities, state.rawValue) }
        for state in InstanceState.allCases { _ = gauge(MetricNames.instances, state.rawValue) }
    }

    /// Counts the Store's rows and sets every gauge.
    func update() async throws {
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
