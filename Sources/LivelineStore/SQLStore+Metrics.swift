import LivelineCore
import SQLiteNIO

/// How many activities and instances are in each state, and how many activities wait for delivery: what `/metrics`
/// reports as gauges, counted when it is scraped.
public struct StoreStateCounts: Sendable, Hashable {
    /// Activities per state (`active`, `ended`); a state with none may be missing.
    public var activities: [String: Int]
    /// Instances per state (`starting`, `active`, `dismissed`, `ended`, `invalidated`); a state with none may be missing.
    public var instances: [String: Int]
    /// Activities whose current sequence is not yet delivered (the delivery engine's pending work).
    public var pendingActivities: Int
    /// Webhook deliveries not yet delivered (nor given up).
    public var pendingWebhookDeliveries = 0

    /// Counts as given (none by default).
    public init(activities: [String: Int] = [:], instances: [String: Int] = [:], pendingActivities: Int = 0) {
        self.activities = activities
        self.instances = instances
        self.pendingActivities = pendingActivities
    }
}

/// A Store that can count its rows by state, cheaply and read-only, for metrics.
public protocol MetricsStore: Sendable {
    /// Counts activities and instances by state, and the activities pending delivery.
    func stateCounts() async throws -> StoreStateCounts
}

extension SQLStore: MetricsStore {
    /// Three `COUNT(*)` queries on a reader (never the writer): activities and instances grouped by state, and the
    /// pending activities (the partial index `activities_pending` holds exactly those).
    public func stateCounts() async throws -> StoreStateCounts {
        try await reader.read { db in
            var counts = StoreStateCounts()
            for row in try db.query("SELECT state, COUNT(*) AS n FROM activities GROUP BY state") {
                guard let state = row.column("state")?.string else { continue }
                counts.activities[state] = row.column("n")?.integer ?? 0
            }
            for row in try db.query("SELECT state, COUNT(*) AS n FROM instances GROUP BY state") {
                guard let state = row.column("state")?.string else { continue }
                counts.instances[state] = row.column("n")?.integer ?? 0
            }
            let pending = try db.query("SELECT COUNT(*) AS n FROM activities WHERE dispatched_sequence < sequence").first
            counts.pendingActivities = pending?.column("n")?.integer ?? 0
            let webhooks = try db.query("SELECT COUNT(*) AS n FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE d.status = 'pending' AND w.enabled = 1").first
            counts.pendingWebhookDeliveries = webhooks?.column("n")?.integer ?? 0
            return counts
        }
    }
}
