import APNs
import Foundation
import LivelineCore
import NIOCore

extension APNsPushTransport: BroadcastTransport {
    /// Publishes one broadcast through the app's APNs client (the push host and connections, or the broadcast host's
    /// when the credentials name one; no device token, no topic), and turns Apple's answer into a ``BroadcastOutcome``. A refused provider token gets one more try with
    /// the fresh one, as a push does.
    public func broadcast(_ broadcast: OutgoingBroadcast) async -> BroadcastOutcome {
        let request = APNsBroadcast(
            bundleID: broadcast.bundleID, channelID: broadcast.channelID, priority: broadcast.priority, expiration: broadcast.expiration,
            payload: broadcast.payload
        )
        var retriedWithFreshToken = false
        while true {
            let response: APNsResponse
            do {
                response = try await (broadcastClient ?? client).send(request)
            } catch let error as APNsInvalidNotificationError {
                return .rejected(reason: error.description, requestID: nil)
            } catch {
                return .retryable(reason: FailureText.of(error), retryAfter: nil, requestID: nil)
            }
            switch Self.broadcastOutcome(response, retriedWithFreshToken: retriedWithFreshToken) {
            case .some(let outcome):
                return outcome
            case .none:
                retriedWithFreshToken = true
            }
        }
    }

    /// What one broadcast answer means for the engine; `nil`: send again with a fresh provider token. Pure.
    static func broadcastOutcome(_ response: APNsResponse, retriedWithFreshToken: Bool) -> BroadcastOutcome? {
        if response.isSuccess { return .delivered(requestID: response.requestID) }
        let reason = response.reason?.rawValue ?? "HTTP \(response.status)"
        if response.reason == .channelNotRegistered { return .channelNotRegistered(reason: reason, requestID: response.requestID) }
        switch response.disposition ?? .terminal {
        case .invalidToken, .terminal:
            return .rejected(reason: reason, requestID: response.requestID)
        case .retryable:
            return .retryable(reason: reason, retryAfter: response.retryAfter, requestID: response.requestID)
        case .credentials:
            let tokenProblem = response.reason == .expiredProviderToken || response.reason == .invalidProviderToken
            // Sent again only when a new token replaced the refused one (as a device push is): with the same token, a
            // second refusal is certain, and one request more.
            if tokenProblem, response.providerTokenReplaced, !retriedWithFreshToken { return nil }
            return .credentialsRejected(reason: reason, requestID: response.requestID)
        }
    }
}

extension APNsChannelManagementError {
    /// The engine's kind of failure for Apple's answer.
    var managementError: ChannelManagementError {
        let reason = self.reason?.rawValue ?? "HTTP \(status)"
        if self.reason == .cannotCreateChannelConfig { return ChannelManagementError(.limitReached, reason) }
        switch disposition {
        case .credentials: return ChannelManagementError(.credentials, reason)
        case .retryable: return ChannelManagementError(.unavailable, reason)
        case .invalidToken, .terminal: return ChannelManagementError(.refused, reason)
        }
    }
}
