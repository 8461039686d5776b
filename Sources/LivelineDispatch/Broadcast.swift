import Foundation
import LivelineCore
import LivelineStore
import NIOCore

/// One update or end published to a broadcast activity's APNs channel: one request, whatever the number of subscribers.
public struct OutgoingBroadcast: Sendable {
    public var appID: String
    public var activityID: String
    /// The app's iOS bundle id (the broadcast path names it; there is no topic).
    public var bundleID: String
    public var channelID: String
    public var sequence: Int64
    public var event: LiveActivityEvent
    /// 10, 5 or 1.
    public var priority: Int
    /// `apns-expiration`: 0 on a channel that stores nothing; nil leaves it to APNs.
    public var expiration: Int64?
    /// The `{"aps": {...}}` payload, at most 5,120 bytes.
    public var payload: ByteBuffer

    public init(
        appID: String, activityID: String, bundleID: String, channelID: String, sequence: Int64, event: LiveActivityEvent,
        priority: Int, expiration: Int64?, payload: ByteBuffer
    ) {
        self.appID = appID
        self.activityID = activityID
        self.bundleID = bundleID
        self.channelID = channelID
        self.sequence = sequence
        self.event = event
        self.priority = priority
        self.expiration = expiration
        self.payload = payload
    }
}

/// What APNs said to a broadcast, in the delivery engine's terms; `requestID` is the `apns-request-id`.
public enum BroadcastOutcome: Sendable, Hashable {
    /// Accepted for every subscriber.
    case delivered(requestID: String?)
    /// APNs no longer knows the channel (`ChannelNotRegistered`): its subscribers cannot be reached by broadcast again.
    case channelNotRegistered(reason: String, requestID: String?)
    /// Refused for good (`BadChannelId`, `PayloadTooLarge`, `BadExpirationDate` …): never retried.
    case rejected(reason: String, requestID: String?)
    /// Try again later (429, 5xx, transport failure), no sooner than `retryAfter` if APNs said so.
    case retryable(reason: String, retryAfter: Duration?, requestID: String?)
    /// The app's credentials were refused.
    case credentialsRejected(reason: String, requestID: String?)
}

/// A push transport that can also publish to broadcast channels (APNs, iOS 18).
public protocol BroadcastTransport: Sendable {
    /// Publishes one broadcast and reports the outcome; transport failures are `.retryable`, never thrown.
    func broadcast(_ broadcast: OutgoingBroadcast) async -> BroadcastOutcome
}

/// Why a channel could not be created or deleted.
public struct ChannelManagementError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: Sendable, Hashable {
        /// APNs holds as many channels for the app as it allows (`CannotCreateChannelConfig`).
        case limitReached
        /// APNs refused the request for good (its reason says why).
        case refused
        /// No answer, or one worth retrying later (429, 5xx).
        case unavailable
        /// The app cannot reach APNs: no credentials and no emulator.
        case noCredentials
        /// APNs refused the app's credentials.
        case credentials
    }

    public var kind: Kind
    public var reason: String

    public init(_ kind: Kind, _ reason: String) {
        self.kind = kind
        self.reason = reason
    }

    public var description: String { reason }
}

/// Creates and deletes apps' broadcast channels at APNs' channel management API.
public protocol BroadcastChannelManagement: Sendable {
    /// Creates a Live Activity channel for the app and returns Apple's channel id.
    func createChannel(appID: String, storagePolicy: ChannelStoragePolicy) async throws(ChannelManagementError) -> String
    /// Deletes the app's channel; one APNs no longer knows counts as deleted.
    func deleteChannel(appID: String, channelID: String) async throws(ChannelManagementError)
}

extension Dispatcher {
    /// What one broadcast attempt's outcome means: how it is recorded, whether the activity's broadcast sequence moves
    /// on, and what comes next. Pure.
    struct BroadcastStep: Sendable, Hashable {
        enum Next: Sendable, Hashable {
            /// Nothing more for this sequence.
            case done
            /// Try again after `delay`, within this pass.
            case retry(after: Duration)
            /// Try again in a later pass (attempts ran out, or the credentials were refused).
            case nextPass
        }

        var status: DeliveryStatus
        var requestID: String?
        var reason: String?
        /// The sequence is sent, or given up for good.
        var settled: Bool
        var channelGone: Bool
        var credentialsRefused: Bool
        var next: Next

        static func decide(_ outcome: BroadcastOutcome, attempt: Int, retry: RetryPolicy, random: Double) -> BroadcastStep {
            switch outcome {
            case .delivered(let requestID):
                return BroadcastStep(
                    status: .delivered, requestID: requestID, reason: nil, settled: true, channelGone: false, credentialsRefused: false,
                    next: .done
                )
            case .channelNotRegistered(let reason, let requestID):
                return BroadcastStep(
                    status: .rejected, requestID: requestID, reason: reason, settled: true, channelGone: true, credentialsRefused: false,
                    next: .done
                )
            case .rejected(let reason, let requestID):
                return BroadcastStep(
                    status: .rejected, requestID: requestID, reason: reason, settled: true, channelGone: false, credentialsRefused: false,
                    next: .done
                )
            case .credentialsRejected(let reason, let requestID):
                return BroadcastStep(
                    status: .credentialsRejected, requestID: requestID, reason: reason, settled: false, channelGone: false,
                    credentialsRefused: true, next: .nextPass
                )
            case .retryable(let reason, let retryAfter, let requestID):
                let next: Next =
                    attempt < retry.maximumAttempts
                    ? .retry(after: retry.delay(afterAttempt: attempt, retryAfter: retryAfter, random: random)) : .nextPass
                return BroadcastStep(
                    status: .retrying, requestID: requestID, reason: reason, settled: false, channelGone: false, credentialsRefused: false,
                    next: next
                )
            }
        }
    }

    /// Publishes the claimed activity's current state to its channel: ONE request for every subscriber, retried as a
    /// push is; each attempt goes in the timeline. Returns when the activity must be looked at again for it (`nil`:
    /// the sequence is settled).
    func publish(_ claim: DispatchClaim, on channel: BroadcastChannel) async -> Date? {
        let activity = claim.activity
        guard let state = activity.currentState else { return nil }
        let passRetry = now().addingTimeInterval(configuration.retry.passRetryDelay.seconds)
        let transport: (any BroadcastTransport)?
        do {
            transport = try await transports.transport(appID: activity.appID, platform: .ios) as? any BroadcastTransport
        } catch {
            logger.error("Finding the app's APNs transport failed", metadata: ["app": "\(activity.appID)", "error": "\(error)"])
            return passRetry
        }
        guard let transport else {
            logger.warning("No way to send this app's broadcasts; they wait", metadata: ["app": "\(activity.appID)"])
            return passRetry
        }
        let at = now()
        let budget = claim.budget.applied(to: configuration.budget)
        let broadcast = OutgoingBroadcast(
            appID: activity.appID, activityID: activity.activityID, bundleID: claim.bundleID, channelID: channel.id,
            sequence: state.sequence, event: state.event,
            // Every subscriber got the channel's broadcasts, so each one's budget is drawn down as the channel's tally
            // counts (whether a subscriber allowed frequent updates is not known here: the stricter budget).
            priority: budget.priority(
                event: state.event, hasAlert: state.alert != nil, requested: activity.priority,
                used: activity.broadcastPriority10.used(at: Int64(at.timeIntervalSince1970)), frequentPushes: nil
            ),
            expiration: channel.storagePolicy.broadcastExpiration(stateExpiration: state.apnsExpiration(now: at)),
            payload: ByteBuffer(bytes: state.apnsPayload.encoded())
        )
        var attempt = 0
        while true {
            attempt += 1
            let started = ContinuousClock.now
            let outcome = await transport.broadcast(broadcast)
            let latency = (ContinuousClock.now - started).seconds * 1000
            let step = BroadcastStep.decide(outcome, attempt: attempt, retry: configuration.retry, random: random())
            metrics.recordBroadcast(status: step.status)
            let record = DeliveryRecord(
                appID: activity.appID, activityID: activity.activityID, deviceID: "", platform: .ios, sequence: broadcast.sequence,
                event: broadcast.event, priority: broadcast.priority, status: step.status, providerID: step.requestID,
                reason: step.reason, latencyMilliseconds: latency, attempt: attempt, attemptedAt: now(), channelID: channel.id
            )
            // A broadcast APNs took at priority 10 counts against the subscribers' budget.
            let priority10 =
                step.status == .delivered && broadcast.priority == 10
                ? activity.broadcastPriority10.recording(at: Int64(record.attemptedAt.timeIntervalSince1970)) : nil
            do {
                try await store.recordBroadcast(record, settled: step.settled, channelGone: step.channelGone, priority10: priority10, at: now())
            } catch {
                logger.error("Recording a broadcast failed; it will be sent again", metadata: ["error": "\(error)"])
                return passRetry
            }
            if step.channelGone {
                logger.error(
                    "APNs no longer knows the activity's broadcast channel: its subscribers get no more broadcasts",
                    metadata: ["app": "\(activity.appID)", "activity": "\(activity.activityID)", "channel": "\(channel.id)"]
                )
            }
            if step.credentialsRefused {
                await transports.credentialsHealth(
                    appID: activity.appID, platform: .ios, healthy: false, reason: "APNs refused the app's credentials"
                )
            } else if step.status == .delivered {
                // APNs took it: the app's credentials work, as after a token push (the directory writes only when they
                // were marked unhealthy). A broadcast-only app has no token push to say so.
                await transports.credentialsHealth(appID: activity.appID, platform: .ios, healthy: true, reason: nil)
            }
            switch step.next {
            case .done:
                return nil
            case .nextPass:
                return now().addingTimeInterval(configuration.retry.passRetryDelay.seconds)
            case .retry(let delay):
                if Task.isShuttingDownGracefully || Task.isCancelled { return now() }
                try? await Task.sleep(for: delay)
            }
        }
    }
}
