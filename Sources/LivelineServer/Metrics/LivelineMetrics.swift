import CoreMetrics
import Prometheus

/// What `GET /metrics` serves, and the factory the HTTP API's own metrics are made from.
///
/// Everything in Liveline records through swift-metrics and does not know the backend. `liveline serve` bootstraps
/// the process's `MetricsSystem` with a ``prometheusFactory(registry:)`` over one registry, and serves that registry;
/// a test gives each router a registry of its own (the process-wide bootstrap can be done only once).
public struct LivelineMetrics: Sendable {
    /// The registry `/metrics` writes out.
    public let registry: PrometheusCollectorRegistry
    /// Where the HTTP API's metrics (requests, their latency, the Store's state gauges) are made.
    public let factory: any MetricsFactory
    /// The least time between two counts of the Store's rows for the state gauges (``LivelineConfiguration/metricsCountInterval``).
    public var storeCountInterval: Duration = .seconds(5)

    /// Metrics over `registry`, made by `factory`; by default a ``prometheusFactory(registry:)`` over `registry`.
    public init(registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry(), factory: (any MetricsFactory)? = nil) {
        self.registry = registry
        self.factory = factory ?? Self.prometheusFactory(registry: registry)
    }

    /// A Prometheus factory over `registry` with histogram buckets fitted to each of Liveline's timers (an HTTP
    /// request takes well under a millisecond to a few; a commit about a millisecond; a push tens of milliseconds).
    public static func prometheusFactory(registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        let fine: [Duration] = [
            .microseconds(250), .microseconds(500), .milliseconds(1), .microseconds(2500), .milliseconds(5), .milliseconds(10),
            .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
            .milliseconds(2500), .seconds(5),
        ]
        let pushes: [Duration] = [
            .milliseconds(1), .microseconds(2500), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10),
            .seconds(30),
        ]
        factory.durationHistogramBuckets = [
            MetricNames.httpRequestDuration: fine,
            MetricNames.storeCommitDuration: fine,
            MetricNames.storeWriteDuration: fine,
            MetricNames.pushLatency: pushes,
        ]
        return factory
    }

    /// The Prometheus text exposition format (0.0.4) of everything recorded so far.
    public func exposition() -> [UInt8] { registry.emitToBuffer() }
}

/// The names of Liveline's metric families (each documented in the README's "Metrics and logs").
public enum MetricNames {
    /// HTTP requests answered, by `method`, `route` and `status_class`.
    public static let httpRequests = "liveline_http_requests_total"
    /// How long the HTTP API took to answer a request (to the response's head), by `method`, `route`, `status_class`.
    public static let httpRequestDuration = "liveline_http_request_duration_seconds"
    /// Activities by `state`.
    public static let activities = "liveline_activities"
    /// Instances by `state`.
    public static let instances = "liveline_instances"
    /// Activities whose current sequence is not yet delivered.
    public static let activitiesPendingDelivery = "liveline_activities_pending_delivery"
    /// Gauge: webhook deliveries pending (the backlog).
    public static let webhookDeliveriesPending = "liveline_webhook_deliveries_pending"
    /// The Store's commit time, by `durability` (recorded by the Store's writer).
    public static let storeCommitDuration = "liveline_store_commit_duration_seconds"
    /// How long the Store's writes took, from their call until their callers had the outcome, by `durability`.
    public static let storeWriteDuration = "liveline_store_write_duration_seconds"
    /// The Store's commits, by `durability`.
    public static let storeCommits = "liveline_store_commits_total"
    /// PostgreSQL write transactions run again, by `sqlstate`.
    public static let storeWriteRetries = "liveline_store_write_retries_total"
    /// PostgreSQL writes committed as members of a set, by `decided` (`set`, `body`).
    public static let storeSetMembers = "liveline_store_set_members_total"
    /// Push attempts, by `platform`, `status`, `reason` (recorded by the delivery engine).
    public static let pushes = "liveline_pushes_total"
    /// Push attempt latency, by `platform`.
    public static let pushLatency = "liveline_push_latency_seconds"
    /// Broadcast attempts, by `status`.
    public static let broadcasts = "liveline_broadcasts_total"
}
