import APNs
import Foundation
import LivelineCore
import LivelineStore
import Logging
import NIOCore
import NIOPosix

/// Sends Live Activity pushes through an ``APNsClient`` and turns Apple's answers into ``PushOutcome``s.
///
/// A 403 InvalidProviderToken or ExpiredProviderToken gets one more try when the client has replaced the refused
/// provider token (it keeps one younger than 20 minutes, Apple's least time between renewals); if APNs refuses that
/// too, or the token was kept, the outcome is `.credentialsRejected`.
public struct APNsPushTransport: PushTransport {
    public let client: APNsClient
    /// Where broadcasts go when the credentials name a host of their own for them; `nil`: through `client`.
    public let broadcastClient: APNsClient?

    /// A transport over `client` (and `broadcastClient` for broadcasts, when there is one).
    public init(client: APNsClient, broadcastClient: APNsClient? = nil) {
        self.client = client
        self.broadcastClient = broadcastClient
    }

    public func send(_ push: OutgoingPush) async -> PushOutcome {
        let notification = Self.notification(push)
        var retriedWithFreshToken = false
        while true {
            let result: Result<APNsResponse, any Error>
            do {
                result = .success(try await client.send(notification))
            } catch {
                result = .failure(error)
            }
            switch Self.outcome(result, retriedWithFreshToken: retriedWithFreshToken) {
            case .done(let outcome):
                return outcome
            case .retryWithFreshToken:
                retriedWithFreshToken = true
            }
        }
    }

    /// Sends the pushes through the client's batch call (one hop to each connection for all of them); a push whose
    /// provider token was refused is sent once more on its own, with the fresh token.
    public func send(_ pushes: [OutgoingPush]) async -> [PushOutcome] {
        let results = await client.send(pushes.map(Self.notification))
        var outcomes: [PushOutcome] = []
        outcomes.reserveCapacity(pushes.count)
        var again: [Int] = []
        for (index, result) in results.enumerated() {
            switch Self.outcome(result, retriedWithFreshToken: false) {
            case .done(let outcome):
                outcomes.append(outcome)
            case .retryWithFreshToken:
                outcomes.append(.retryable(reason: "provider token refused", retryAfter: nil, providerID: nil))
                again.append(index)
            }
        }
        for index in again {
            outcomes[index] = await send(pushes[index])
        }
        return outcomes
    }

    private static func notification(_ push: OutgoingPush) -> APNsNotification {
        APNsNotification(deviceToken: push.token, topic: push.topic, priority: push.priority, expiration: push.expiration, payload: push.payload)
    }

    private enum Step {
        case done(PushOutcome)
        case retryWithFreshToken
    }

    /// What one answer (or failure) means for the engine.
    private static func outcome(_ result: Result<APNsResponse, any Error>, retriedWithFreshToken: Bool) -> Step {
        let response: APNsResponse
        switch result {
        case .success(let answer):
            response = answer
        case .failure(let error as APNsInvalidNotificationError):
            return .done(.rejected(reason: error.description, providerID: nil))
        case .failure(let error):
            return .done(.retryable(reason: FailureText.of(error), retryAfter: nil, providerID: nil))
        }
        if response.isSuccess { return .done(.delivered(providerID: response.apnsID)) }
        let reason = response.reason?.rawValue ?? "HTTP \(response.status)"
        switch response.disposition ?? .terminal {
        case .invalidToken:
            return .done(.invalidToken(reason: reason, providerID: response.apnsID))
        case .terminal:
            return .done(.rejected(reason: reason, providerID: response.apnsID))
        case .retryable:
            return .done(.retryable(reason: reason, retryAfter: response.retryAfter, providerID: response.apnsID))
        case .credentials:
            let tokenProblem = response.reason == .expiredProviderToken || response.reason == .invalidProviderToken
            if tokenProblem, response.providerTokenReplaced, !retriedWithFreshToken { return .retryWithFreshToken }
            return .done(.credentialsRejected(reason: reason, providerID: response.apnsID))
        }
    }
}

/// Builds and keeps one ``APNsClient`` per app from its stored (sealed) credentials; an app without
/// credentials uses `fallback` (the local emulator) when there is one.
///
/// It also manages the apps' broadcast channels (``BroadcastChannelManagement``), through one ``APNsChannelManager`` per
/// app on Apple's channel management host for the app's environment (or the credentials' `channelManagementBaseURL`).
public actor APNsTransportDirectory: PushTransportDirectory, BroadcastChannelManagement {
    /// Credentials for an app that has none stored: the built-in emulator's, or nil.
    public typealias Fallback = @Sendable (_ appID: String, _ bundleID: String) async throws -> APNsCredentials?

    private let store: any CredentialStore & AppStore
    private let sealer: CredentialSealer
    private let fallback: Fallback?
    private let connections: Int
    private let now: @Sendable () -> Date
    private let logger: Logger
    private var clients: [String: (version: Date?, transport: APNsPushTransport)] = [:]
    /// Apps whose stored credentials are marked refused, as last read.
    private var unhealthy: Set<String> = []
    private var channelManagers: [String: (version: Date?, manager: APNsChannelManager, bundleID: String)] = [:]
    private var warned: Set<String> = []

    /// The push connections an app gets unless the directory is told otherwise.
    public static let defaultConnectionsPerApp = 4
    /// The concurrent streams APNs allows on one connection (its `SETTINGS_MAX_CONCURRENT_STREAMS`; each connection
    /// still keeps to what its server announces).
    public static let streamsPerConnection = 1_000

    /// Creates the directory.
    public init(
        store: any CredentialStore & AppStore, sealer: CredentialSealer, connectionsPerApp: Int = defaultConnectionsPerApp,
        fallback: Fallback? = nil,
        now: @escaping @Sendable () -> Date = { Date() }, logger: Logger = Logger(label: "liveline.apns")
    ) {
        self.store = store
        self.sealer = sealer
        self.connections = connectionsPerApp
        self.fallback = fallback
        self.now = now
        self.logger = logger
    }

    /// The app's APNs credentials: its own (with their version), else the emulator's, else nil.
    private func credentials(appID: String) async throws -> (credentials: APNsCredentials, version: Date?)? {
        let stored = try await store.credentials(appID: appID, provider: .apns)
        if let stored { return (try APNsCredentials(stored, sealer: sealer), stored.updatedAt) }
        guard let fallback, let app = try await store.app(id: appID), let emulated = try await fallback(appID, app.bundleID) else { return nil }
        if !warned.contains(appID) {
            warned.insert(appID)
            logger.warning(
                "App has no APNs credentials: its pushes go to the built-in APNs emulator, not to Apple",
                metadata: ["app": "\(appID)", "emulator": "\(emulated.baseURL ?? "")"]
            )
        }
        return (emulated, nil)
    }

    public func transport(appID: String, platform: Platform) async throws -> (any PushTransport)? {
        try await transport(appID: appID, platform: platform, stored: nil)
    }

    public func transport(appID: String, platform: Platform, stored versions: [CredentialProvider: CredentialsVersion]?) async throws -> (any PushTransport)? {
        guard platform == .ios else { return nil }
        // The client built from the credentials the claim says are stored (their version, or none: the emulator's) serves
        // without a read of them; the read decides otherwise.
        if let versions, let cached = clients[appID], cached.version == versions[.apns]?.updatedAt {
            noteHealth(healthy: versions[.apns]?.healthy ?? true, appID: appID)
            return cached.transport
        }
        let stored = try await store.credentials(appID: appID, provider: .apns)
        noteHealth(healthy: stored?.healthy ?? true, appID: appID)
        if let cached = clients[appID], cached.version == stored?.updatedAt { return cached.transport }
        guard let credentials = try await credentials(appID: appID)?.credentials else { return nil }
        // The actor is reentrant: while this call waited for the Store, another may have built the client for these
        // credentials (or newer ones). Replacing it would shut it down under the pushes it is sending — several passes
        // of one app start at once (a shared fan-out's slices), and each failed its pushes with "The APNs client was
        // shut down", retried them into the dead client and sent the ones APNs had already taken again.
        if let cached = clients[appID], Self.serves(cached.version, stored?.updatedAt) { return cached.transport }
        // One provider token for both hosts: Apple refuses renewals more often than every 20 minutes.
        let tokens = try credentials.providerTokens(now: now)
        let client = try APNsClient(endpoint: try credentials.endpoint(.push), tokens: tokens, connections: connections, logger: logger)
        // A host of their own for broadcasts: one connection (a broadcast is one request per state, whatever the audience).
        let broadcastClient = try credentials.broadcastBaseURL.map { _ in
            try APNsClient(endpoint: try credentials.endpoint(.broadcast), tokens: tokens, connections: 1, logger: logger)
        }
        let transport = APNsPushTransport(client: client, broadcastClient: broadcastClient)
        let previous = clients[appID]?.transport
        clients[appID] = (stored?.updatedAt, transport)
        // The clients of the replaced credentials are closed before their replacement is handed out (their pushes in
        // flight finish first). The actor is reentrant: other apps' transports are not held up meanwhile.
        await previous?.client.shutdown()
        await previous?.broadcastClient?.shutdown()
        return transport
    }

    /// Whether an entry cached for credentials of version `cached` serves credentials of version `version`: the same
    /// ones or newer (`nil`: the emulator's, which never change).
    static func serves(_ cached: Date?, _ version: Date?) -> Bool {
        switch (cached, version) {
        case (nil, nil): true
        case (let cached?, let version?): cached >= version
        default: false
        }
    }

    /// Remembers whether the app's stored credentials are marked refused, as read for its pushes (none stored: not).
    private func noteHealth(healthy: Bool, appID: String) {
        if healthy { unhealthy.remove(appID) } else { unhealthy.insert(appID) }
    }

    public func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async {
        // Accepted credentials are written only when they were marked refused: the engine says so after every call.
        if healthy {
            guard unhealthy.remove(appID) != nil else { return }
            logger.notice("APNs takes the app's credentials again", metadata: ["app": "\(appID)"])
        } else {
            unhealthy.insert(appID)
        }
        do {
            try await store.setCredentialsHealth(appID: appID, provider: .apns, healthy: healthy, reason: reason, at: now())
        } catch {
            logger.error("Recording credentials health failed", metadata: ["app": "\(appID)", "error": "\(error)"])
        }
        if !healthy {
            logger.error("APNs refused the app's credentials; its pushes wait until they are fixed", metadata: ["app": "\(appID)"])
        }
    }

    // MARK: Broadcast channels

    public func createChannel(appID: String, storagePolicy: ChannelStoragePolicy) async throws(ChannelManagementError) -> String {
        let (manager, bundleID) = try await channelManager(appID: appID)
        do {
            let policy = APNsMessageStoragePolicy(rawValue: storagePolicy.apnsValue) ?? .mostRecentMessageStored
            return try await manager.createChannel(bundleID: bundleID, storagePolicy: policy).channelID
        } catch {
            throw Self.managementError(error)
        }
    }

    public func deleteChannel(appID: String, channelID: String) async throws(ChannelManagementError) {
        let (manager, bundleID) = try await channelManager(appID: appID)
        do {
            try await manager.deleteChannel(bundleID: bundleID, channelID: channelID)
        } catch let error as APNsChannelManagementError where error.reason == .channelNotRegistered {
            // Already gone at APNs: deleted. (A 404 is Apple's `BadPath`, a request to a path it does not have, which
            // says nothing of the channel: it fails, and the sweeper tries again.)
        } catch {
            throw Self.managementError(error)
        }
    }

    /// A failed channel management request in the engine's terms: Apple's answer, a request refused before it was
    /// sent, or no answer.
    private static func managementError(_ error: any Error) -> ChannelManagementError {
        switch error {
        case let answer as APNsChannelManagementError: answer.managementError
        case let invalid as APNsInvalidNotificationError: ChannelManagementError(.refused, invalid.description)
        default: ChannelManagementError(.unavailable, FailureText.of(error))
        }
    }

    /// The app's channel manager and bundle id, built from its credentials and kept while they are unchanged.
    private func channelManager(appID: String) async throws(ChannelManagementError) -> (APNsChannelManager, String) {
        do {
            let stored = try await store.credentials(appID: appID, provider: .apns)
            if let cached = channelManagers[appID], cached.version == stored?.updatedAt { return (cached.manager, cached.bundleID) }
            guard let app = try await store.app(id: appID), let (credentials, version) = try await credentials(appID: appID) else {
                throw ChannelManagementError(.noCredentials, "the app has no APNs credentials")
            }
            // Built meanwhile by another call (see `transport(appID:platform:)`).
            if let cached = channelManagers[appID], Self.serves(cached.version, stored?.updatedAt) { return (cached.manager, cached.bundleID) }
            let manager = try APNsChannelManager(
                tokens: try credentials.providerTokens(now: now), endpoint: try credentials.endpoint(.channelManagement), logger: logger
            )
            let previous = channelManagers[appID]?.manager
            channelManagers[appID] = (version, manager, app.bundleID)
            await previous?.shutdown()
            return (manager, app.bundleID)
        } catch let error as ChannelManagementError {
            throw error
        } catch {
            throw ChannelManagementError(.noCredentials, "the app's APNs credentials cannot be used: \(error)")
        }
    }

    /// Closes and forgets the app's clients (pushes, broadcasts, channel management): the app was deleted, and its
    /// connections and signing key must not outlive it.
    public func forget(appID: String) async {
        // Taken out before the first wait: the actor is reentrant, and no pass may be handed a client being closed.
        let transport = clients.removeValue(forKey: appID)?.transport
        let manager = channelManagers.removeValue(forKey: appID)?.manager
        unhealthy.remove(appID)
        warned.remove(appID)
        await transport?.client.shutdown()
        await transport?.broadcastClient?.shutdown()
        await manager?.shutdown()
    }

    /// Forgets (``forget(appID:)``) the clients of every app no longer in the Store: deletions may have been missed
    /// (another node's, heard through ``AppNotice``s while this node was not listening). Keeps them when the Store
    /// cannot be read.
    public func forgetDeletedApps() async {
        do {
            for appID in try await store.deletedApps(among: Set(clients.keys).union(channelManagers.keys)) { await forget(appID: appID) }
        } catch {
            logger.debug("Could not look for deleted apps", metadata: ["error": "\(error)"])
        }
    }

    /// Closes every client's connections.
    public func shutdown() async {
        for (_, entry) in clients {
            await entry.transport.client.shutdown()
            await entry.transport.broadcastClient?.shutdown()
        }
        clients.removeAll()
        for (_, entry) in channelManagers { await entry.manager.shutdown() }
        channelManagers.removeAll()
    }
}

/// The APNs hosts an app's requests go to.
enum APNsHost: Sendable, Hashable {
    /// Device pushes (and broadcasts, unless the credentials name a host for them).
    case push
    /// Broadcasts to iOS 18 channels.
    case broadcast
    /// Creating and deleting broadcast channels.
    case channelManagement
}

extension APNsCredentials {
    /// Where the app's requests to `host` go: the credentials' override for it, else the environment's host. Broadcasts
    /// without an override of their own go where pushes go (`baseURL`, else the environment's push host). Pure.
    func endpoint(_ host: APNsHost) throws -> APNsEndpoint {
        let override: String? = switch host {
        case .push: baseURL
        case .broadcast: broadcastBaseURL ?? baseURL
        case .channelManagement: channelManagementBaseURL
        }
        if let override { return try APNsEndpoint(baseURL: override, trustedCAPEM: caCertificatePEM) }
        switch (environment, host) {
        case (.production, .push), (.production, .broadcast): return .production
        case (.sandbox, .push), (.sandbox, .broadcast): return .sandbox
        case (.production, .channelManagement): return .channelManagementProduction
        case (.sandbox, .channelManagement): return .channelManagementSandbox
        }
    }

    /// Provider tokens signed with the app's key.
    func providerTokens(now: @escaping @Sendable () -> Date) throws -> APNsProviderTokens {
        APNsProviderTokens(signingKey: try APNsSigningKey(teamID: teamID, keyID: keyID, p8PEM: privateKeyPEM), now: now)
    }
}
