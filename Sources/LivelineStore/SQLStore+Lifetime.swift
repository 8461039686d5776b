import Foundation
import LivelineCore
import SQLiteNIO

extension SQLStore {
    public func activitiesActive(since cutoff: Date, limit: Int) async throws -> [ActivityKey] {
        // iOS's eight hours run on each phone from when it started the Live Activity: an activity the backend created
        // (its first update) hours before any phone started it counts from its first instance, not from then. One with
        // no instance counts from its creation. (Instances are never registered before their activity exists, so the
        // activity's own age is a first, indexed filter.)
        try await reader.query(
            """
            SELECT a.app_id, a.activity_id FROM activities a
            WHERE a.state = 'active' AND a.created_at <= ?
              AND (
                  EXISTS (SELECT 1 FROM instances i WHERE i.app_id = a.app_id AND i.activity_id = a.activity_id AND i.created_at <= ?)
                  OR NOT EXISTS (SELECT 1 FROM instances i WHERE i.app_id = a.app_id AND i.activity_id = a.activity_id)
              )
            ORDER BY a.created_at LIMIT \(limit)
            """,
            [.integer(Self.millis(cutoff)), .integer(Self.millis(cutoff))]
        ).map { ActivityKey(appID: try $0.string("app_id"), activityID: try $0.string("activity_id")) }
    }

    /// A broadcast activity is never among them: phones subscribed to its channel need not register with Liveline.
    public func activitiesWithAllInstancesGone(limit: Int) async throws -> [ActivityKey] {
        try await reader.query(
            """
            SELECT a.app_id, a.activity_id FROM activities a
            WHERE a.state = 'active' AND a.delivery = 'token'
              AND EXISTS (SELECT 1 FROM instances i WHERE i.app_id = a.app_id AND i.activity_id = a.activity_id)
              AND NOT EXISTS (
                  SELECT 1 FROM instances i WHERE i.app_id = a.app_id AND i.activity_id = a.activity_id
                    AND i.state IN ('active', 'starting', 'invalidated')
              )
              AND NOT EXISTS (SELECT 1 FROM start_audiences s WHERE s.app_id = a.app_id AND s.activity_id = a.activity_id AND s.admitted = 0)
            LIMIT \(limit)
            """
        ).map { ActivityKey(appID: try $0.string("app_id"), activityID: try $0.string("activity_id")) }
    }

    public func endInstances(registeredBefore cutoff: Date, at now: Date) async throws -> Int {
        try await transaction { db in
            // Through `instances_by_age` (``InstanceAgeIndex``): the hours up to the cutoff's, then the instant.
            let cutoffMillis = Self.millis(cutoff)
            let rows = try db.query(
                """
                UPDATE instances SET state = 'ended', updated_at = ?, delivered_sequence = \(Self.effectiveDelivered("instances."))
                WHERE state IN ('active', 'starting') AND \(InstanceAgeIndex.hour) <= ? AND created_at <= ?
                RETURNING device_id
                """,
                [.integer(Self.millis(now)), .integer(cutoffMillis / InstanceAgeIndex.millisecondsPerHour), .integer(cutoffMillis)]
            )
            return rows.count
        }
    }

    /// An activity whose broadcast channel is still held at APNs keeps its row (which names the channel) until the
    /// sweeper has deleted the channel; its instances (push tokens, user ids), start audience and timeline go at the
    /// retention all the same, so that a channel APNs never lets go of (revoked credentials, an app taken down) does
    /// not keep them for ever.
    public func purgeActivities(endedBefore cutoff: Date) async throws -> Int {
        try await transaction { db in
            let cutoffMillis = Self.millis(cutoff)
            for table in ["delivery_segments", "start_audiences", "instances"] {
                _ = try db.query(
                    """
                    DELETE FROM \(table) WHERE (app_id, activity_id) IN
                        (SELECT app_id, activity_id FROM activities WHERE state = 'ended' AND ended_at <= ?)
                    """,
                    [.integer(cutoffMillis)]
                )
            }
            let purged = try db.query(
                "DELETE FROM activities WHERE state = 'ended' AND ended_at <= ? AND (channel_id IS NULL OR channel_deleted_at IS NOT NULL) RETURNING activity_id", [.integer(cutoffMillis)]
            )
            return purged.count
        }
    }
}

extension SQLStore: HousekeepingStore {
    public func leadsHousekeeping(at now: Date) async throws -> Bool {
        guard dialect == .postgres else { return true }
        let nowMillis = Self.millis(now)
        return try await write(
            """
            INSERT INTO housekeeping_lease (id, owner, expires_at) VALUES (1, ?, ?)
            ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
            WHERE housekeeping_lease.owner = excluded.owner OR housekeeping_lease.expires_at < ?
            RETURNING owner
            """,
            [.text(nodeID), .integer(nowMillis + Int(housekeepingLease * 1000)), .integer(nowMillis)]
        ).isEmpty == false
    }
}
