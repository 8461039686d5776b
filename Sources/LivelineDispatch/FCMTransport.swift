import FCM
import Foundation
import LivelineCore
import LivelineStore
import Logging
import NIOCore

/// Sends Android live updates through an ``FCMClient`` and turns Google's answers into ``PushOutcome``s.
///
/// An ``OutgoingPush`` for Android carries in `payload` the whole `messages:send` body with the token already in it
/// (``FCMEncodedMessage/body(token:)`` of the sequence's ``FCMLiveUpdateMessage``); `token` is the same FCM
/// registration token, for records; `topic`, `priority` and `expiration` are not read (priority and TTL are in the
/// body). The project is the service account's.
///
/// The client has already retried a 401 once with a fresh access token; a refusal after that, or a 403 without an FCM
/// code, is `.credentialsRejected`, as is a token endpoint that refuses the service account. `UNREGISTERED` (404), and
/// an `INVALID_ARGUMENT` that blames the token (``FCMResponse/blamesToken``), is `.invalidToken`; `SENDER_ID_MISMATCH`
/// (the token belongs to another Firebase project) and `THIRD_PARTY_AUTH_ERROR` (an iOS or web registration token,
/// which needs the project's APNs or web push key): one token's refusal each, which must not hold back the app's other
/// phones; they, any other `INVALID_ARGUMENT` and other 4xx are `.rejected`;
/// `QUOTA_EXCEEDED`, `UNAVAILABLE`, `INTERNAL`, 429 and 5xx `.retryable` with the `Retry-After` delay; a transport
/// failure `.retryable` without one. The provider id of a delivered push is the message name
/// (`projects/<project>/messages/<id>`).
public struct FCMPushTransport: PushTransport {
    /// The client messages go through.
    public let client: FCMClient
    /// The Firebase project messages are sent for.
    public let projectID: String

    /// A transport over `client`, for `projectID` (defaults to the client's service account's project).
    public init(client: FCMClient, projectID: String? = nil) {
        self.client = client
        self.projectID = projectID ?? client.serviceAccount.projectID
    }

    public func send(_ push: OutgoingPush) async -> PushOutcome {
        let response: FCMResponse
        do {
            response = try await client.send(projectID: projectID, body: push.payload)
        } catch let error as FCMAuthenticationError {
            if error.isRetryable { return .retryable(reason: error.description, retryAfter: nil, providerID: nil) }
            return .credentialsRejected(reason: error.description, providerID: nil)
        } catch let error as FCMConfigurationError {
            return .credentialsRejected(reason: error.description, providerID: nil)
        } catch {
            return .retryable(reason: FailureText.of(error), retryAfter: nil, providerID: nil)
        }
        return Self.outcome(response)
    }

    /// The outcome of an answer FCM gave (after the client's one 401 retry).
    public static func outcome(_ response: FCMResponse) -> PushOutcome {
        guard let disposition = response.disposition else { return .delivered(providerID: response.messageName) }
        let reason = response.reason
        switch disposition {
        case .invalidToken: return .invalidToken(reason: reason, providerID: nil)
        case .terminal: return .rejected(reason: reason, providerID: nil)
        case .retryable: return .retryable(reason: reason, retryAfter: response.retryAfter, providerID: nil)
        case .credentials: return .credentialsRejected(reason: reason, providerID: nil)
        }
    }
}

extension DispatcherConfiguration {
    /// Whether a push to `platform` refused with `reason` is tried again within the pass (after a backoff) rather than
    /// left for the activity's next pass, ``RetryPolicy/passRetryDelay`` later (or the refusal's own wait, when longer:
    /// ``retryFloor(platform:reason:)``, `Retry-After`). A pass ends when its last push does, and the activity's next
    /// state waits for it, so a refusal of one device that asks for a long wait is not waited for within the pass:
    ///
    /// - APNs' `TooManyRequests` (429) says the provider sent too many notifications to that one device token in a
    ///   short time: sending again within a second or two, five times, is what it asks not to do.
    /// - FCM's `QUOTA_EXCEEDED` (429) is, as often as not, one device's limit ("240 messages/minute and 5,000
    ///   messages/hour to a single device"), and asks for a minute at least: waiting for it within the pass held every
    ///   other phone of the activity from its next state for that minute, and up to a quarter of an hour over its
    ///   attempts.
    public func retriesWithinPass(platform: Platform, reason: String) -> Bool {
        switch platform {
        case .ios: reason != "TooManyRequests"
        case .android: reason != FCMErrorCode.quotaExceeded.rawValue
        }
    }

    /// Where the backoff of a push to `platform` refused with `reason` starts (see
    /// ``RetryPolicy/delay(afterAttempt:retryAfter:floor:random:)``): zero for iOS; for FCM's `QUOTA_EXCEEDED`
    /// ``fcmQuotaRetryFloor`` (or ``fcmRetryFloor`` when longer), for FCM's other refusals ``fcmRetryFloor``.
    public func retryFloor(platform: Platform, reason: String) -> Duration {
        switch platform {
        case .ios: .zero
        case .android: reason == FCMErrorCode.quotaExceeded.rawValue ? max(fcmRetryFloor, fcmQuotaRetryFloor) : fcmRetryFloor
        }
    }
}

/// Builds and keeps one ``FCMClient`` per app from its stored (sealed) FCM credentials; an app without credentials
/// uses `fallback` (the local FCM emulator's demo service account) when there is one.
public actor FCMTransportDirectory: PushTransportDirectory {
    /// Credentials for an app that has none stored: the built-in emulator's, or nil.
    public typealias Fallback = @Sendable (_ appID: String) async throws -> FCMCredentials?

    private let store: any CredentialStore & AppStore
    private let sealer: CredentialSealer
    private let fallback: Fallback?
    private let clientConfiguration: FCMClient.Configuration
    private let now: @Sendable () -> Date
    private let logger: Logger
    private var clients: [String: (version: Date?, client: FCMClient)] = [:]
    /// Apps whose stored credentials are marked refused, as last read.
    private var unhealthy: Set<String> = []
    private var warned: Set<String> = []

    /// Creates the directory. Each app's client takes its timeouts and its limit of concurrent sends from
    /// `clientConfiguration`, and its base URL and trusted CA from the app's credentials.
    public init(
        store: any CredentialStore & AppStore, sealer: CredentialSealer, fallback: Fallback? = nil,
        clientConfiguration: FCMClient.Configuration = FCMClient.Configuration(), now: @escaping @Sendable () -> Date = { Date() },
        logger: Logger = Logger(label: "liveline.fcm")
    ) {
        self.store = store
        self.sealer = sealer
        self.fallback = fallback
        self.clientConfiguration = clientConfiguration
        self.now = now
        self.logger = logger
    }

    public func transport(appID: String, platform: Platform) async throws -> (any PushTransport)? {
        try await transport(appID: appID, platform: platform, stored: nil)
    }

    public func transport(appID: String, platform: Platform, stored versions: [CredentialProvider: CredentialsVersion]?) async throws -> (any PushTransport)? {
        guard platform == .android else { return nil }
        // As the APNs directory does: the client of the credentials the claim says are stored serves without a read.
        if let versions, let cached = clients[appID], cached.version == versions[FCMCredentials.provider]?.updatedAt {
            noteHealth(healthy: versions[FCMCredentials.provider]?.healthy ?? true, appID: appID)
            return FCMPushTransport(client: cached.client)
        }
        let stored = try await store.credentials(appID: appID, provider: FCMCredentials.provider)
        noteHealth(healthy: stored?.healthy ?? true, appID: appID)
        if let cached = clients[appID], cached.version == stored?.updatedAt { return FCMPushTransport(client: cached.client) }
        let credentials: FCMCredentials
        if let stored {
            credentials = try FCMCredentials(stored, sealer: sealer)
        } else if let fallback, let emulated = try await fallback(appID) {
            if !warned.contains(appID) {
                warned.insert(appID)
                logger.warning(
                    "App has no FCM credentials: its pushes go to the built-in FCM emulator, not to Google",
                    metadata: ["app": "\(appID)", "emulator": "\(emulated.baseURL ?? "")"]
                )
            }
            credentials = emulated
        } else {
            return nil
        }
        var configuration = clientConfiguration
        configuration.baseURL = credentials.baseURL ?? FCMClient.defaultBaseURL
        configuration.trustedCAPEM = credentials.caCertificatePEM
        let client = try FCMClient(serviceAccount: try credentials.serviceAccount(), configuration: configuration, now: now, logger: logger)
        if let previous = clients[appID]?.client { await previous.shutdown() }
        clients[appID] = (stored?.updatedAt, client)
        return FCMPushTransport(client: client)
    }

    /// Remembers whether the app's stored credentials are marked refused, as read for its pushes (none stored: not).
    private func noteHealth(healthy: Bool, appID: String) {
        if healthy { unhealthy.remove(appID) } else { unhealthy.insert(appID) }
    }

    public func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async {
        // Accepted credentials are written only when they were marked refused: the engine says so after every call.
        if healthy {
            guard unhealthy.remove(appID) != nil else { return }
            logger.notice("FCM takes the app's credentials again", metadata: ["app": "\(appID)"])
        } else {
            unhealthy.insert(appID)
        }
        do {
            try await store.setCredentialsHealth(
                appID: appID, provider: FCMCredentials.provider, healthy: healthy, reason: reason, at: now()
            )
        } catch {
            logger.error("Recording credentials health failed", metadata: ["app": "\(appID)", "error": "\(error)"])
        }
        if !healthy {
            logger.error("FCM refused the app's credentials; its pushes wait until they are fixed", metadata: ["app": "\(appID)"])
        }
    }

    /// Closes and forgets the app's client: the app was deleted, and its connections and service account must not
    /// outlive it.
    public func forget(appID: String) async {
        let client = clients.removeValue(forKey: appID)?.client
        unhealthy.remove(appID)
        warned.remove(appID)
        await client?.shutdown()
    }

    /// Forgets (``forget(appID:)``) the clients of every app no longer in the Store: deletions may have been missed
    /// (another node's, heard through ``AppNotice``s while this node was not listening). Keeps them when the Store
    /// cannot be read.
    public func forgetDeletedApps() async {
        do {
            for appID in try await store.deletedApps(among: clients.keys) { await forget(appID: appID) }
        } catch {
            logger.debug("Could not look for deleted apps", metadata: ["error": "\(error)"])
        }
    }

    /// Closes every client's connections.
    public func shutdown() async {
        for (_, entry) in clients { await entry.client.shutdown() }
        clients.removeAll()
    }
}
