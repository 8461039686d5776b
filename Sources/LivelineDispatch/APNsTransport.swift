import APNs
import Foundation
import LivelineCore
import LivelineStore
import Logging
import NIOCore
import NIOPosix

/// Sends Live Activity pushes through an ``APNsClient`` and turns Apple's answers into ``PushOutcome``s.
///
/// A 403 InvalidProviderToken or ExpiredProviderToken gets one more try (the client has already replaced
/// the refused provider token); if APNs refuses that too, the outcome is `.credentialsRejected`.
public struct APNsPushTransport: PushTransport {
    public let client: APNsClient

    /// A transport over `client`.
    public init(client: APNsClient) { self.client = client }

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
            return .done(.retryable(reason: "\(error)", retryAfter: nil, providerID: nil))
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
            if tokenProblem, !retriedWithFreshToken { return .retryWithFreshToken }
            return .done(.credentialsRejected(reason: reason, providerID: response.apnsID))
        }
    }
}

/// Builds and keeps one ``APNsClient`` per app from its stored (sealed) credentials; an app without
/// credentials uses `fallback` (the local emulator) when there is one.
public actor APNsTransportDirectory: PushTransportDirectory {
    /// Credentials for an app that has none stored: the built-in emulator's, or nil.
    public typealias Fallback = @Sendable (_ appID: String, _ bundleID: String) async throws -> APNsCredentials?

    private let store: any CredentialStore & AppStore
    private let sealer: CredentialSealer
    private let fallback: Fallback?
    private let connections: Int
    private let now: @Sendable () -> Date
    private let logger: Logger
    private var clients: [String: (version: Date?, client: APNsClient)] = [:]
    private var warned: Set<String> = []

    /// Creates the directory.
    public init(
        store: any CredentialStore & AppStore, sealer: CredentialSealer, connectionsPerApp: Int = 4, fallback: Fallback? = nil,
        now: @escaping @Sendable () -> Date = { Date() }, logger: Logger = Logger(label: "liveline.apns")
    ) {
        self.store = store
        self.sealer = sealer
        self.connections = connectionsPerApp
        self.fallback = fallback
        self.now = now
        self.logger = logger
    }

    public func transport(appID: String, platform: Platform) async throws -> (any PushTransport)? {
        guard platform == .ios else { return nil }
        let stored = try await store.credentials(appID: appID, provider: .apns)
        if let cached = clients[appID], cached.version == stored?.updatedAt { return APNsPushTransport(client: cached.client) }
        let credentials: APNsCredentials
        if let stored {
            credentials = try APNsCredentials(stored, sealer: sealer)
        } else if let fallback, let app = try await store.app(id: appID), let emulated = try await fallback(appID, app.bundleID) {
            if !warned.contains(appID) {
                warned.insert(appID)
                logger.warning(
                    "App has no APNs credentials: its pushes go to the built-in APNs emulator, not to Apple",
                    metadata: ["app": "\(appID)", "emulator": "\(emulated.baseURL ?? "")"]
                )
            }
            credentials = emulated
        } else {
            return nil
        }
        let endpoint: APNsEndpoint
        if let baseURL = credentials.baseURL {
            endpoint = try APNsEndpoint(baseURL: baseURL, trustedCAPEM: credentials.caCertificatePEM)
        } else {
            endpoint = credentials.environment == .production ? .production : .sandbox
        }
        let signingKey = try APNsSigningKey(teamID: credentials.teamID, keyID: credentials.keyID, p8PEM: credentials.privateKeyPEM)
        let client = try APNsClient(
            endpoint: endpoint, tokens: APNsProviderTokens(signingKey: signingKey, now: now), connections: connections, logger: logger
        )
        let previous = clients[appID]?.client
        clients[appID] = (stored?.updatedAt, client)
        // The client of the replaced credentials is closed before its replacement is handed out (its pushes in flight
        // finish first). The actor is reentrant: other apps' transports are not held up meanwhile.
        await previous?.shutdown()
        return APNsPushTransport(client: client)
    }

    public func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async {
        do {
            try await store.setCredentialsHealth(appID: appID, provider: .apns, healthy: healthy, reason: reason, at: now())
        } catch {
            logger.error("Recording credentials health failed", metadata: ["app": "\(appID)", "error": "\(error)"])
        }
        if !healthy {
            logger.error("APNs refused the app's credentials; its pushes wait until they are fixed", metadata: ["app": "\(appID)"])
        }
    }

    /// Closes every client's connections.
    public func shutdown() async {
        for (_, entry) in clients { await entry.client.shutdown() }
        clients.removeAll()
    }
}
