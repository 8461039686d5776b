import APNs
import CoreMetrics
import FCM
import LivelineCore
import LivelineStore
import NIOConcurrencyHelpers

/// The delivery engine's metrics, recorded through swift-metrics (the backend is whatever factory it is given:
/// Prometheus in `liveline serve`, a test's own registry in tests, nothing when metrics are not bootstrapped).
///
/// - `liveline_pushes_total{platform, status, reason}`: push attempts, one per attempt (a retry is a `retrying`
///   attempt, an invalidation an `invalidated` one).
/// - `liveline_push_latency_seconds{platform}`: how long each attempt took, as the engine measured it.
/// - `liveline_broadcasts_total{status}`: broadcast attempts (iOS 18 channels), one per attempt.
///
/// No app ids, activity ids or tokens are labels: tenant data stays out, and the number of series stays bounded.
/// `reason` is APNs' reason or FCM's error code when it is one Apple or Google documents, `HTTP <status>` when the
/// answer had none, `none` when there is no reason (a delivered push), and `other` for anything else (a transport
/// error's text, an undocumented reason).
///
/// The engine records tens of thousands of attempts a second: the metric objects are made once per label combination
/// (the common ones up front) and looked up, never made per attempt.
public final class DeliveryMetrics: Sendable {
    /// The counter's name.
    public static let pushesName = "liveline_pushes_total"
    /// The latency timer's name.
    public static let pushLatencyName = "liveline_push_latency_seconds"
    /// The broadcast counter's name.
    public static let broadcastsName = "liveline_broadcasts_total"

    private struct PushKey: Hashable {
        var platform: Platform
        var status: DeliveryStatus
        var reason: String
    }

    private let factory: any MetricsFactory
    /// Delivered pushes (the hot path: no reason), per platform.
    private let delivered: [Platform: Counter]
    private let latency: [Platform: CoreMetrics.Timer]
    private let broadcasts: [DeliveryStatus: Counter]
    private let others: NIOLockedValueBox<[PushKey: Counter]>

    /// Creates the metrics from `factory` (by default the process's, as bootstrapped).
    public init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        var delivered: [Platform: Counter] = [:]
        var latency: [Platform: CoreMetrics.Timer] = [:]
        for platform in Platform.allCases {
            delivered[platform] = Counter(
                label: Self.pushesName,
                dimensions: [("platform", platform.rawValue), ("status", DeliveryStatus.delivered.rawValue), ("reason", "none")],
                factory: factory
            )
            latency[platform] = CoreMetrics.Timer(label: Self.pushLatencyName, dimensions: [("platform", platform.rawValue)], factory: factory)
        }
        self.delivered = delivered
        self.latency = latency
        var broadcasts: [DeliveryStatus: Counter] = [:]
        for status in DeliveryStatus.allCases {
            broadcasts[status] = Counter(label: Self.broadcastsName, dimensions: [("status", status.rawValue)], factory: factory)
        }
        self.broadcasts = broadcasts
        self.others = NIOLockedValueBox([:])
    }

    /// Counts one push attempt and records its latency.
    public func recordPush(platform: Platform, status: DeliveryStatus, reason: String?, latencyMilliseconds: Double?) {
        if let latencyMilliseconds, latencyMilliseconds >= 0 {
            latency[platform]?.recordNanoseconds(Int64(latencyMilliseconds * 1_000_000))
        }
        let reasonLabel = Self.reasonLabel(reason)
        if status == .delivered, reasonLabel == "none", let counter = delivered[platform] {
            counter.increment()
            return
        }
        let key = PushKey(platform: platform, status: status, reason: reasonLabel)
        let counter = others.withLockedValue { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(
                label: Self.pushesName,
                dimensions: [("platform", platform.rawValue), ("status", status.rawValue), ("reason", reasonLabel)],
                factory: factory
            )
            counters[key] = counter
            return counter
        }
        counter.increment()
    }

    /// Counts one broadcast attempt.
    public func recordBroadcast(status: DeliveryStatus) {
        broadcasts[status]?.increment()
    }

    /// The reasons kept as they are: the ones Apple and Google document (a small, fixed set).
    static let documentedReasons: Set<String> = Set(
        (APNsErrorReason.allDocumented + APNsErrorReason.allDocumentedForBroadcast).map(\.rawValue)
            + FCMErrorCode.allDocumented.map(\.rawValue)
    )

    /// The `reason` label for a push's reason: bounded whatever the reason (see ``DeliveryMetrics``).
    public static func reasonLabel(_ reason: String?) -> String {
        guard let reason, !reason.isEmpty else { return "none" }
        if documentedReasons.contains(reason) { return reason }
        // "HTTP 503": an answer without a reason; the status codes are a bounded set.
        if reason.hasPrefix("HTTP "), reason.utf8.count == 8, let code = Int(reason.dropFirst(5)), (100...599).contains(code) {
            return reason
        }
        return "other"
    }
}
