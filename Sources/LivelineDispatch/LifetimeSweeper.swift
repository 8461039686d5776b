import Foundation
import LivelineCore
import LivelineStore
import Logging
import ServiceLifecycle

/// How long activities and instances live before Liveline ends them, and how long ended ones are kept.
///
/// iOS ends a Live Activity after 8 hours active and removes it from the Lock Screen 4 hours later at the latest.
/// Liveline ends an activity shortly before the first limit (with its last state, so the phone shows it as ended
/// rather than frozen), marks instances ended once the platform has surely ended them, and purges ended activities
/// after a retention period.
public struct LifetimePolicy: Sendable, Hashable {
    /// An activity active this long (since Liveline first saw it) is ended with reason `lifetime`.
    public var endAfter: TimeInterval
    /// An instance registered this long ago is marked ended: the platform has ended it.
    public var instancesEndAfter: TimeInterval
    /// An ended activity is deleted, with its instances and timeline, this long after it ended.
    public var retention: TimeInterval
    /// How often the sweeper looks.
    public var interval: Duration
    /// A remotely started instance still `starting` this long after its start is reported once
    /// (`instance.start_unconfirmed`).
    public var startConfirmationTimeout: TimeInterval = 120
    /// Lifecycle events are kept in the feed this long.
    public var eventRetention: TimeInterval = 7 * 24 * 3600

    /// The defaults: end at 7 h 45 min, instances ended at 12 h, ended activities kept 7 days, a sweep a minute.
    public init(
        endAfter: TimeInterval = 7 * 3600 + 45 * 60, instancesEndAfter: TimeInterval = 12 * 3600, retention: TimeInterval = 7 * 24 * 3600,
        interval: Duration = .seconds(60)
    ) {
        self.endAfter = endAfter
        self.instancesEndAfter = instancesEndAfter
        self.retention = retention
        self.interval = interval
    }
}

/// Ends activities nobody ended before the platform does, records why every activity ended, and purges old ones (and
/// the requests remembered under idempotency keys, once their 24 hours are over).
/// Runs as a `Service` inside `liveline serve`; ``sweep()`` is one pass, for tests with an injected clock.
public final class LifetimeSweeper: Service, Sendable {
    private let store: any LifetimeStore & LifecycleStore & BroadcastStore & EventStore
    private let channels: (any BroadcastChannelManagement)?
    private let policy: LifetimePolicy
    private let now: @Sendable () -> Date
    private let logger: Logger
    private let delivery: any DeliveryWaking
    private static let batch = 500

    /// What one pass did.
    public struct Sweep: Sendable, Hashable {
        /// Activities ended because they reached ``LifetimePolicy/endAfter``.
        public var endedForLifetime = 0
        /// Activities ended because every instance was gone.
        public var endedWithAllInstancesGone = 0
        /// Instances marked ended after ``LifetimePolicy/instancesEndAfter``.
        public var instancesEnded = 0
        /// Ended activities deleted after ``LifetimePolicy/retention``.
        public var purged = 0
        /// Requests remembered under idempotency keys forgotten after ``IdempotencyKey/retention``.
        public var idempotencyKeysPruned = 0
        /// Broadcast channels of ended activities deleted at APNs once the activity left every screen.
        public var channelsDeleted = 0
        /// Remote starts reported unconfirmed (`instance.start_unconfirmed`).
        public var startsUnconfirmed = 0
        /// Events forgotten after ``LifetimePolicy/eventRetention``.
        public var eventsPruned = 0
        /// Finished webhook deliveries forgotten after ``LifetimePolicy/eventRetention`` (each carries its event).
        public var webhookDeliveriesPruned = 0

        /// A pass that did nothing.
        public init() {}
    }

    /// Creates the sweeper; `delivery` is woken after it ends activities, for their `end` pushes; `channels` deletes
    /// the broadcast channels of ended activities at APNs.
    public init(
        store: any LifetimeStore & LifecycleStore & BroadcastStore & EventStore, policy: LifetimePolicy = LifetimePolicy(),
        now: @escaping @Sendable () -> Date = { Date() }, logger: Logger = Logger(label: "liveline.lifetime"),
        delivery: any DeliveryWaking = NoDeliveryEngine(), channels: (any BroadcastChannelManagement)? = nil
    ) {
        self.store = store
        self.channels = channels
        self.policy = policy
        self.now = now
        self.logger = logger
        self.delivery = delivery
    }

    /// Sweeps every `interval` until graceful shutdown.
    public func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                // Several nodes on one database: one sweeps, the others wait for its lease to run out.
                let sweep = try await store.leadsHousekeeping(at: now()) ? try await sweep() : Sweep()
                if sweep != Sweep() {
                    logger.info(
                        "Lifetime sweep",
                        metadata: [
                            "ended.lifetime": "\(sweep.endedForLifetime)", "ended.allInstancesGone": "\(sweep.endedWithAllInstancesGone)",
                            "instances.ended": "\(sweep.instancesEnded)", "purged": "\(sweep.purged)",
                            "idempotencyKeys.pruned": "\(sweep.idempotencyKeysPruned)", "channels.deleted": "\(sweep.channelsDeleted)",
                            "starts.unconfirmed": "\(sweep.startsUnconfirmed)", "events.pruned": "\(sweep.eventsPruned)",
                            "webhookDeliveries.pruned": "\(sweep.webhookDeliveriesPruned)",
                        ]
                    )
                }
            } catch is CancellationError {
                return
            } catch {
                logger.error("Lifetime sweep failed", metadata: ["error": "\(error)"])
            }
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: self.policy.interval) }
        }
    }

    /// One pass: end activities at the end of their lifetime, mark old instances ended, end activities whose
    /// instances are all gone, delete the channels of ended broadcast activities, purge long-ended activities, forget
    /// idempotency keys past their 24 hours, report remote starts still unconfirmed, forget events past their retention.
    public func sweep() async throws -> Sweep {
        var sweep = Sweep()
        let now = now()
        while true {
            let due = try await store.activitiesActive(since: now.addingTimeInterval(-policy.endAfter), limit: Self.batch)
            for key in due where try await end(key, reason: .lifetime, at: now) { sweep.endedForLifetime += 1 }
            if due.count < Self.batch { break }
        }
        sweep.instancesEnded = try await store.endInstances(registeredBefore: now.addingTimeInterval(-policy.instancesEndAfter), at: now)
        while true {
            let gone = try await store.activitiesWithAllInstancesGone(limit: Self.batch)
            for key in gone where try await end(key, reason: .allInstancesGone, at: now) { sweep.endedWithAllInstancesGone += 1 }
            if gone.count < Self.batch { break }
        }
        sweep.channelsDeleted = try await deleteChannels(at: now)
        sweep.purged = try await store.purgeActivities(endedBefore: now.addingTimeInterval(-policy.retention))
        sweep.idempotencyKeysPruned = try await store.pruneIdempotencyKeys(olderThan: now.addingTimeInterval(-IdempotencyKey.retention))
        sweep.startsUnconfirmed = try await store.reportUnconfirmedStarts(
            startedBefore: now.addingTimeInterval(-policy.startConfirmationTimeout), at: now
        )
        sweep.eventsPruned = try await store.pruneEvents(olderThan: now.addingTimeInterval(-policy.eventRetention))
        sweep.webhookDeliveriesPruned = try await store.pruneWebhookDeliveries(finishedBefore: now.addingTimeInterval(-policy.eventRetention))
        if sweep.endedForLifetime + sweep.endedWithAllInstancesGone > 0 { delivery.wake() }
        return sweep
    }

    /// Deletes at APNs the channels of ended activities that have left every screen, keeping the app under Apple's
    /// channel limit; a channel APNs cannot delete now is tried again at the next sweep.
    private func deleteChannels(at now: Date) async throws -> Int {
        guard let channels else { return 0 }
        var deleted = 0
        for channel in try await store.channelsToDelete(now: now, limit: Self.batch) {
            do {
                try await channels.deleteChannel(appID: channel.appID, channelID: channel.channelID)
            } catch {
                logger.warning(
                    "Deleting a broadcast channel failed; the next sweep tries again",
                    metadata: ["app": "\(channel.appID)", "activity": "\(channel.activityID)", "error": "\(error)"]
                )
                continue
            }
            try await store.markChannelDeleted(appID: channel.appID, activityID: channel.activityID, channelID: channel.channelID, at: now)
            deleted += 1
        }
        return deleted
    }

    /// Ends one activity with its last state; false when it had already ended (a race with the caller).
    private func end(_ key: ActivityKey, reason: EndReason, at now: Date) async throws -> Bool {
        do {
            _ = try await store.endActivity(ActivityEnd(appID: key.appID, activityID: key.activityID, reason: reason), at: now)
            return true
        } catch StoreError.activityEnded {
            return false
        } catch StoreError.activityNotFound {
            return false
        }
    }
}
