import Foundation
import Synchronization
import LivelineCore
import LivelineDispatch
import LivelineStore

/// The server's defaults for iOS 18 broadcast channels; an app's own (``BroadcastDefaults``) come first.
public struct BroadcastSettings: Sendable, Hashable {
    /// How an activity is delivered when neither the request nor its app says.
    public var defaultDelivery: ActivityDelivery = .token
    /// What a new channel stores when neither the request nor its app says (Apple's default choice for Live
    /// Activities: the most recent message, so a phone that was offline catches up).
    public var storagePolicy: ChannelStoragePolicy = .mostRecent
    /// The most channels an app holds at once (Apple: 10,000 per app and environment).
    public var maximumChannels: Int = Limits.maximumChannelsPerApp

    public init() {}
}

/// What a start or update asks of the activity's delivery: both optional (`delivery`, `messageStoragePolicy`).
struct DeliveryRequest: Sendable, Hashable {
    var delivery: ActivityDelivery?
    var storagePolicy: ChannelStoragePolicy?
}

/// What an activity's delivery will be once a start or update is stored. Pure: ``plan(_:current:app:server:)`` decides,
/// from the request, the activity as stored and the defaults, whether a channel must be created first.
struct DeliveryPlan: Sendable, Hashable {
    var delivery: ActivityDelivery
    /// A channel to create, with this storage policy, before the state is stored.
    var createChannel: ChannelStoragePolicy?

    /// Delivery is chosen by the start or update that gives the activity its first state; afterwards it is fixed, and
    /// so is a channel's storage policy (APNs fixes it at creation).
    static func plan(
        _ request: DeliveryRequest, current: ActivityRecord?, app: BroadcastDefaults, server: BroadcastSettings
    ) throws(APIError) -> DeliveryPlan {
        if let channel = current?.channel {
            if request.delivery == .token { throw .deliveryMismatch(existing: .broadcast) }
            if let policy = request.storagePolicy, policy != channel.storagePolicy { throw .storagePolicyMismatch(existing: channel.storagePolicy) }
            return DeliveryPlan(delivery: .broadcast, createChannel: nil)
        }
        let choosing = (current?.sequence ?? 0) == 0
        guard choosing else {
            let existing = current?.delivery ?? .token
            if let asked = request.delivery, asked != existing { throw .deliveryMismatch(existing: existing) }
            if request.storagePolicy != nil { throw Self.storagePolicyWithoutBroadcast }
            return DeliveryPlan(delivery: existing, createChannel: nil)
        }
        let delivery = request.delivery ?? app.delivery ?? server.defaultDelivery
        guard delivery == .broadcast else {
            if request.storagePolicy != nil { throw Self.storagePolicyWithoutBroadcast }
            return DeliveryPlan(delivery: .token, createChannel: nil)
        }
        return DeliveryPlan(delivery: .broadcast, createChannel: request.storagePolicy ?? app.storagePolicy ?? server.storagePolicy)
    }

    static let storagePolicyWithoutBroadcast = APIError(
        .unprocessableContent, code: "storage_policy_without_broadcast",
        message: "messageStoragePolicy applies to broadcast delivery only (\"delivery\": \"broadcast\").", field: "messageStoragePolicy"
    )
}

extension ActivityLifecycle {
    /// Gives a broadcast activity its channel before its first state is stored: created at APNs' channel management
    /// API, then recorded (if the activity got a channel from a concurrent request meanwhile, the new one is deleted
    /// again, and so is one the Store refuses).
    func prepareDelivery(_ plan: DeliveryPlan, appID: String, activityID: String) async throws {
        guard let storagePolicy = plan.createChannel else { return }
        guard let channels else {
            throw APIError(
                .serviceUnavailable, code: "broadcast_unavailable", message: "This server cannot manage APNs broadcast channels.",
                field: "delivery"
            )
        }
        if try await store.liveChannelCount(appID: appID) >= broadcast.maximumChannels {
            throw APIError.channelLimitReached(maximum: broadcast.maximumChannels)
        }
        let channelID: String
        do {
            channelID = try await channels.createChannel(appID: appID, storagePolicy: storagePolicy)
        } catch {
            throw Self.apiError(error)
        }
        let kept: BroadcastChannel
        do {
            kept = try await store.assignChannel(
                appID: appID, activityID: activityID, channelID: channelID, storagePolicy: storagePolicy,
                maximumChannels: broadcast.maximumChannels, at: clock.now()
            )
        } catch {
            try? await channels.deleteChannel(appID: appID, channelID: channelID)
            if case StoreError.activityEnded = error { throw APIError.activityEnded(activityID) }
            throw error
        }
        if kept.id != channelID { try? await channels.deleteChannel(appID: appID, channelID: channelID) }
    }

    /// The activity's channel, for a phone to subscribe with `pushType: .channel(id)`.
    func channel(appID: String, activityID: String) async throws -> BroadcastChannel {
        guard let activity = try await store.activityWithoutInstanceCounts(appID: appID, activityID: activityID) else {
            throw APIError.activityNotFound(activityID)
        }
        guard let channel = activity.channel else { throw APIError.notBroadcast(activityID) }
        return channel
    }

    private static func apiError(_ error: ChannelManagementError) -> APIError {
        switch error.kind {
        case .limitReached:
            APIError(
                .conflict, code: "channel_limit_reached",
                message: "APNs holds as many broadcast channels for this app as it allows (\(error.reason)).", field: "delivery"
            )
        case .noCredentials:
            APIError(
                .conflict, code: "apns_credentials_missing",
                message: "The app has no APNs credentials (PUT /admin/v1/apps/{appId}/credentials/apns): no channel can be created.",
                field: "delivery"
            )
        case .credentials:
            APIError(
                .badGateway, code: "apns_credentials_refused", message: "APNs refused the app's credentials: \(error.reason).",
                field: "delivery"
            )
        case .refused:
            APIError(.badGateway, code: "channel_refused", message: "APNs refused to create the channel: \(error.reason).", field: "delivery")
        case .unavailable:
            APIError(
                .serviceUnavailable, code: "apns_unavailable",
                message: "APNs' channel management did not answer; try again (\(error.reason)).", field: "delivery"
            )
        }
    }
}

/// The apps' broadcast defaults as last read, kept for ``lifetime`` seconds: a new activity does not read its app's
/// row each time. A change through the admin API reaches new activities within that time.
final class AppDefaultsCache: Sendable {
    /// How long defaults read are used.
    static let lifetime: TimeInterval = 5
    private let entries = Mutex<[String: (defaults: BroadcastDefaults, readAt: Date)]>([:])

    /// The app's defaults: as cached if read less than ``lifetime`` ago, else from `read`.
    func defaults(appID: String, now: Date, read: () async throws -> BroadcastDefaults) async throws -> BroadcastDefaults {
        if let entry = entries.withLock({ $0[appID] }), now.timeIntervalSince(entry.readAt) < Self.lifetime { return entry.defaults }
        let defaults = try await read()
        entries.withLock { $0[appID] = (defaults, now) }
        return defaults
    }
}
