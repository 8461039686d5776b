import Foundation
import LivelineCore
import SQLiteNIO

/// The Store's part in iOS 18 broadcast channels: which activities have one, how far their broadcasts got, and which
/// channels the sweeper deletes at APNs.
public protocol BroadcastStore: Sendable {
    /// How many channels the app holds at APNs (created and not deleted).
    func liveChannelCount(appID: String) async throws -> Int

    /// Makes the activity a broadcast activity with `channel` (creating the activity, with no state yet, on first sight).
    /// If it already has a channel, that one is kept and returned: the caller deletes its own at APNs. Refuses an ended
    /// activity (``StoreError/activityEnded``), one already reached by tokens that has a state
    /// (``StoreError/deliveryMismatch(existing:)``), and an app at `maximumChannels` (``StoreError/channelLimitReached(maximum:)``).
    func assignChannel(
        appID: String, activityID: String, channelID: String, storagePolicy: ChannelStoragePolicy, maximumChannels: Int, at now: Date
    ) async throws -> BroadcastChannel

    /// Records one broadcast attempt in the timeline; `settled` moves the activity's broadcast sequence to the attempt's
    /// (sent, or given up for good), `channelGone` marks the channel unregistered, `priority10` (when given) becomes the
    /// activity's tally of broadcasts at priority 10 (``ActivityRecord/broadcastPriority10``). A delivered end ends the
    /// instances subscribed to the channel.
    func recordBroadcast(_ attempt: DeliveryRecord, settled: Bool, channelGone: Bool, priority10: Priority10Tally?, at now: Date) async throws

    /// Sets the app's broadcast defaults (`nil` parts fall back to the server's).
    func setBroadcastDefaults(appID: String, _ defaults: BroadcastDefaults) async throws

    /// Channels of ended activities that have left every screen (their dismissal date, or four hours after the end)
    /// and are still held at APNs, oldest first — once the end was broadcast (or given up for good), since a channel
    /// deleted first never carries it, or when the channel is no longer registered; a channel whose end never went out
    /// is deleted twelve hours after the end, when no Live Activity can still be on a screen.
    func channelsToDelete(now: Date, limit: Int) async throws -> [ChannelToDelete]

    /// Every channel the app holds at APNs (created and not deleted), whatever its activity's state: those that deleting
    /// the app deletes first.
    func heldChannels(appID: String) async throws -> [ChannelToDelete]

    /// Records that the channel was deleted at APNs (or was already gone).
    func markChannelDeleted(appID: String, activityID: String, channelID: String, at now: Date) async throws
}

/// A channel the sweeper deletes at APNs.
public struct ChannelToDelete: Sendable, Hashable {
    public var appID: String
    public var activityID: String
    public var channelID: String

    public init(appID: String, activityID: String, channelID: String) {
        self.appID = appID
        self.activityID = activityID
        self.channelID = channelID
    }
}

extension SQLStore: BroadcastStore {
    public func liveChannelCount(appID: String) async throws -> Int {
        try await reader.query(
            "SELECT COUNT(*) AS n FROM activities WHERE app_id = ? AND channel_id IS NOT NULL AND channel_deleted_at IS NULL",
            [.text(appID)]
        ).first?.column("n")?.integer ?? 0
    }

    public func assignChannel(
        appID: String, activityID: String, channelID: String, storagePolicy: ChannelStoragePolicy, maximumChannels: Int, at now: Date
    ) async throws -> BroadcastChannel {
        try await transaction { db in
            let nowMillis = Self.millis(now)
            let row = try db.query(
                "SELECT * FROM activities WHERE app_id = ? AND activity_id = ?", [.text(appID), .text(activityID)]
            ).first
            if let row {
                let activity = try Self.activity(from: row)
                if activity.state == .ended { throw StoreError.activityEnded }
                if let existing = activity.channel { return existing }
                if activity.sequence > 0 { throw StoreError.deliveryMismatch(existing: activity.delivery) }
            }
            let held = try db.query(
                "SELECT COUNT(*) AS n FROM activities WHERE app_id = ? AND channel_id IS NOT NULL AND channel_deleted_at IS NULL",
                [.text(appID)]
            ).first?.column("n")?.integer ?? 0
            if held >= maximumChannels { throw StoreError.channelLimitReached(maximum: maximumChannels) }
            let binds: [SQLiteData] = [
                .text(channelID), .integer(storagePolicy.apnsValue), .text(ChannelStatus.active.rawValue), .integer(nowMillis),
            ]
            if row == nil {
                _ = try db.query(
                    """
                    INSERT INTO activities (channel_id, channel_storage_policy, channel_status, channel_created_at, delivery,
                        app_id, activity_id, state, sequence, created_at, updated_at)
                    VALUES (?, ?, ?, ?, 'broadcast', ?, ?, 'active', 0, ?, ?)
                    """,
                    binds + [.text(appID), .text(activityID), .integer(nowMillis), .integer(nowMillis)]
                )
            } else {
                _ = try db.query(
                    """
                    UPDATE activities SET channel_id = ?, channel_storage_policy = ?, channel_status = ?, channel_created_at = ?,
                        delivery = 'broadcast', updated_at = ?
                    WHERE app_id = ? AND activity_id = ?
                    """,
                    binds + [.integer(nowMillis), .text(appID), .text(activityID)]
                )
            }
            return BroadcastChannel(id: channelID, storagePolicy: storagePolicy, createdAt: Self.date(nowMillis))
        }
    }

    public func recordBroadcast(_ attempt: DeliveryRecord, settled: Bool, channelGone: Bool, priority10: Priority10Tally?, at now: Date) async throws {
        var statements = Self.timelineStatements(appID: attempt.appID, activityID: attempt.activityID, attempts: [attempt])
        if let priority10 {
            statements.append((
                "UPDATE activities SET broadcast_priority10_tally = ? WHERE app_id = ? AND activity_id = ?",
                [.integer(Int(priority10.packed)), .text(attempt.appID), .text(attempt.activityID)]
            ))
        }
        if settled {
            statements.append((
                "UPDATE activities SET broadcast_sequence = MAX(broadcast_sequence, ?) WHERE app_id = ? AND activity_id = ?",
                [.integer(Int(attempt.sequence)), .text(attempt.appID), .text(attempt.activityID)]
            ))
        }
        if settled, attempt.status == .delivered, attempt.event == .end, let channelID = attempt.channelID {
            // The end reached the channel: its subscribers' Live Activities have ended, as a token's does when its end is
            // delivered.
            statements.append((
                """
                UPDATE instances SET state = 'ended', updated_at = ?, delivered_sequence = \(Self.effectiveDelivered("instances."))
                WHERE app_id = ? AND activity_id = ? AND channel_id = ? AND state = 'active'
                """,
                [.integer(Self.millis(now)), .text(attempt.appID), .text(attempt.activityID), .text(channelID)]
            ))
        }
        if attempt.status == .rejected {
            statements.append(Self.engineEventStatement(
                NewEvent(
                    .deliveryFailed, appID: attempt.appID, activityID: attempt.activityID,
                    data: [
                        "platform": "ios", "channelId": attempt.channelID.map(JSONValue.string) ?? .null,
                        "sequence": .integer(attempt.sequence), "event": .string(attempt.event.rawValue),
                        "reason": attempt.reason.map(JSONValue.string) ?? .null,
                    ]
                ),
                at: now
            ))
        }
        if channelGone {
            statements.append((
                "UPDATE activities SET channel_status = ? WHERE app_id = ? AND activity_id = ? AND channel_id = ?",
                [.text(ChannelStatus.unregistered.rawValue), .text(attempt.appID), .text(attempt.activityID), Self.text(attempt.channelID)]
            ))
        }
        // Bookkeeping, as a fan-out's progress: lost in a power cut, the broadcast goes again (phones keep the newest).
        try await transaction(statements: statements, durability: .bookkeeping)
    }

    public func setBroadcastDefaults(appID: String, _ defaults: BroadcastDefaults) async throws {
        let rows = try await write(
            "UPDATE apps SET default_delivery = ?, default_channel_storage_policy = ? WHERE id = ? RETURNING id",
            [Self.text(defaults.delivery?.rawValue), defaults.storagePolicy.map { .integer($0.apnsValue) } ?? .null, .text(appID)]
        )
        if rows.isEmpty { throw StoreError.appNotFound }
    }

    public func setAudienceFrom(appID: String, _ source: AudienceSource) async throws {
        let rows = try await write("UPDATE apps SET audience_from = ? WHERE id = ? RETURNING id", [.text(source.rawValue), .text(appID)])
        if rows.isEmpty { throw StoreError.appNotFound }
    }

    /// How long after its end a channel whose end broadcast has not gone out is kept, at most: twelve hours, past which
    /// no Live Activity is on a screen (eight hours active, four more on the Lock Screen once ended), sent or not.
    static let channelKeptAfterUnsentEnd: TimeInterval = 12 * 3600

    public func channelsToDelete(now: Date, limit: Int) async throws -> [ChannelToDelete] {
        let nowMillis = Self.millis(now)
        let rows = try await reader.query(
            """
            SELECT app_id, activity_id, channel_id FROM activities
            WHERE state = 'ended' AND channel_id IS NOT NULL AND channel_deleted_at IS NULL
              AND ((MIN(COALESCE(dismissal_date * 1000, ended_at + ?), ended_at + ?) <= ?
                    AND (broadcast_sequence >= sequence OR channel_status <> 'active'))
                   OR ended_at + ? <= ?)
            ORDER BY ended_at LIMIT \(limit)
            """,
            [.integer(Int(Limits.maximumDismissalDelaySeconds) * 1000), .integer(Int(Limits.maximumDismissalDelaySeconds) * 1000),
             .integer(nowMillis), .integer(Int(Self.channelKeptAfterUnsentEnd * 1000)), .integer(nowMillis)]
        )
        return try rows.map {
            ChannelToDelete(appID: try $0.string("app_id"), activityID: try $0.string("activity_id"), channelID: try $0.string("channel_id"))
        }
    }

    public func heldChannels(appID: String) async throws -> [ChannelToDelete] {
        try await reader.query(Self.heldChannelsSQL, [.text(appID)]).map { ChannelToDelete(appID: appID, activityID: try $0.string("activity_id"), channelID: try $0.string("channel_id")) }
    }

    /// The channels an app holds at APNs (created and not deleted), with their activities, in the activities' order.
    static let heldChannelsSQL =
        "SELECT activity_id, channel_id FROM activities WHERE app_id = ? AND channel_id IS NOT NULL AND channel_deleted_at IS NULL ORDER BY activity_id"

    public func markChannelDeleted(appID: String, activityID: String, channelID: String, at now: Date) async throws {
        _ = try await write(
            """
            UPDATE activities SET channel_status = ?, channel_deleted_at = ?
            WHERE app_id = ? AND activity_id = ? AND channel_id = ? AND channel_deleted_at IS NULL
            """,
            [.text(ChannelStatus.deleted.rawValue), .integer(Self.millis(now)), .text(appID), .text(activityID), .text(channelID)]
        )
    }
}
