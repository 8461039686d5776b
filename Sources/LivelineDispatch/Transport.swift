import Foundation
import LivelineCore
import LivelineStore
import NIOCore

/// One push, ready for the wire: the payload bytes are built once per sequence and shared by every
/// instance it goes to.
public struct OutgoingPush: Sendable {
    public var appID: String
    public var activityID: String
    public var deviceID: String
    public var platform: Platform
    /// The instance's current push token.
    public var token: String
    /// `<bundle id>.push-type.liveactivity` for APNs.
    public var topic: String
    public var sequence: Int64
    public var event: LiveActivityEvent
    /// 5 or 10.
    public var priority: Int
    /// Seconds since 1970 after which the push service may drop the push; nil to leave it to the service.
    public var expiration: Int64?
    /// The encoded payload.
    public var payload: ByteBuffer

    public init(
        appID: String, activityID: String, deviceID: String, platform: Platform, token: String, topic: String, sequence: Int64,
        event: LiveActivityEvent, priority: Int, expiration: Int64?, payload: ByteBuffer
    ) {
        self.appID = appID
        self.activityID = activityID
        self.deviceID = deviceID
        self.platform = platform
        self.token = token
        self.topic = topic
        self.sequence = sequence
        self.event = event
        self.priority = priority
        self.expiration = expiration
        self.payload = payload
    }
}

/// What the push service said, in the delivery engine's terms.
public enum PushOutcome: Sendable, Hashable {
    /// Accepted; `providerID` is the `apns-id` (or FCM message name).
    case delivered(providerID: String?)
    /// The token is gone (410, BadDeviceToken, DeviceTokenNotForTopic, UNREGISTERED): invalidate the instance.
    case invalidToken(reason: String, providerID: String?)
    /// Refused for good (PayloadTooLarge, BadTopic, INVALID_ARGUMENT …): never retried.
    case rejected(reason: String, providerID: String?)
    /// Try again later (429, 5xx, transport failure), no sooner than `retryAfter` if the service said so.
    case retryable(reason: String, retryAfter: Duration?, providerID: String?)
    /// The app's credentials were refused even after a fresh provider token.
    case credentialsRejected(reason: String, providerID: String?)
}

/// The small protocol the delivery engine talks to push services through, so tests and the
/// emulator can stand in.
public protocol PushTransport: Sendable {
    /// Sends one push and reports the outcome. Transport failures are `.retryable`, never thrown.
    func send(_ push: OutgoingPush) async -> PushOutcome
    /// Sends several pushes and reports each one's outcome, in order; the same as sending each concurrently, but a
    /// transport may do it more cheaply (one task, one hop to the connection). Transport failures are `.retryable`.
    func send(_ pushes: [OutgoingPush]) async -> [PushOutcome]
}

extension PushTransport {
    /// Sends each push concurrently.
    public func send(_ pushes: [OutgoingPush]) async -> [PushOutcome] {
        await withTaskGroup(of: (Int, PushOutcome).self) { group in
            for (index, push) in pushes.enumerated() {
                group.addTask { (index, await self.send(push)) }
            }
            var outcomes = [PushOutcome?](repeating: nil, count: pushes.count)
            for await (index, outcome) in group {
                outcomes[index] = outcome
            }
            return outcomes.map { $0! }
        }
    }
}

/// Finds the transport for an app's pushes on a platform.
public protocol PushTransportDirectory: Sendable {
    /// The transport for the app on `platform`, or nil when the app cannot send there (no credentials and no emulator).
    func transport(appID: String, platform: Platform) async throws -> (any PushTransport)?
    /// The transport for the app on `platform`, as ``transport(appID:platform:)``, told which of the app's credentials
    /// are stored (``DispatchClaim/credentials``, read with the engine's claim): a directory whose client was built
    /// from those need not read them again. `nil` says nothing.
    func transport(appID: String, platform: Platform, stored: [CredentialProvider: CredentialsVersion]?) async throws -> (any PushTransport)?
    /// Marks the app's credentials as refused (`healthy == false`) or accepted. The engine reports them accepted after
    /// every call with a delivered push: a directory records that only when they were marked refused.
    func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async
}

extension PushTransportDirectory {
    /// Reads what it needs itself (``transport(appID:platform:)``): what was stored is not told.
    public func transport(appID: String, platform: Platform, stored: [CredentialProvider: CredentialsVersion]?) async throws -> (any PushTransport)? {
        try await transport(appID: appID, platform: platform)
    }
}
