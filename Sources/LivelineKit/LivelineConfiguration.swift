import Foundation

/// The platform a device registers as: `"ios"` (ActivityKit tokens, hexadecimal) or `"android"` (FCM tokens).
public enum LivelinePlatform: String, Sendable, Hashable, Codable {
    /// An iPhone or iPad: push-to-start tokens per attributes type and per-activity update tokens.
    case ios
    /// An Android phone: the FCM registration token stands in for every activity's token.
    case android
}

/// How long LivelineKit waits before sending a call again after a transport error, 408, 429 or 5xx: exponential
/// backoff with full jitter. Attempt `n` (from 1) waits a random time in `0 ..< min(maximumDelay, initialDelay ·
/// multiplier^(n-1))`, and never less than the server's `Retry-After`.
public struct LivelineRetryPolicy: Sendable, Hashable {
    /// The ceiling of the first retry's delay, in seconds.
    public var initialDelay: TimeInterval
    /// The largest ceiling any retry's delay may have, in seconds.
    public var maximumDelay: TimeInterval
    /// How much the ceiling grows with each failed attempt.
    public var multiplier: Double

    /// Creates a policy. Delays are clamped to be at least 0 and `maximumDelay` at least `initialDelay`.
    public init(initialDelay: TimeInterval, maximumDelay: TimeInterval, multiplier: Double = 2) {
        self.initialDelay = max(0, initialDelay)
        self.maximumDelay = max(self.initialDelay, maximumDelay)
        self.multiplier = max(1, multiplier)
    }

    /// 1 second, doubling, at most 5 minutes.
    public static let standard = LivelineRetryPolicy(initialDelay: 1, maximumDelay: 300)

    /// The ceiling of the delay after `attempt` failed attempts (1 for the first failure).
    public func ceiling(afterAttempt attempt: Int) -> TimeInterval {
        let exponent = Double(max(0, attempt - 1))
        // pow grows past any sensible ceiling long before it overflows; min keeps it finite.
        let grown = initialDelay * pow(multiplier, min(exponent, 64))
        return min(maximumDelay, grown.isFinite ? grown : maximumDelay)
    }

    /// The delay after `attempt` failed attempts: `random` (in `0..<1`) times the ceiling — full jitter — but never
    /// less than `retryAfter` (the server's `Retry-After`, in seconds) when it gave one.
    public func delay(afterAttempt attempt: Int, retryAfter: TimeInterval? = nil, random: Double) -> TimeInterval {
        let unit = min(max(random, 0), 1)
        let jittered = ceiling(afterAttempt: attempt) * unit
        guard let retryAfter else { return jittered }
        return max(jittered, retryAfter)
    }
}

/// What a ``LivelineClient`` needs: where Liveline is, the app's publishable key, this installation's device id, and
/// where the outbox is kept.
public struct LivelineConfiguration: Sendable, Hashable {
    /// Liveline's base URL, without `/v1` (e.g. `https://liveline.example.com`).
    public var serverURL: URL
    /// The app's publishable key (`pk_…`), sent as `Authorization: Bearer <key>`. It can only register devices and
    /// instances and report events, so it may ship inside the app.
    public var publishableKey: String
    /// This installation's id: chosen by the app once (for example a UUID kept in the keychain) and reused.
    public var deviceID: String
    /// A directory LivelineKit owns; the outbox file (`liveline-outbox.json`) is written there.
    public var storageDirectory: URL
    /// The platform registrations name.
    public var platform: LivelinePlatform
    /// How failed calls are retried.
    public var retry: LivelineRetryPolicy

    /// Creates a configuration.
    public init(
        serverURL: URL, publishableKey: String, deviceID: String, storageDirectory: URL, platform: LivelinePlatform = .ios,
        retry: LivelineRetryPolicy = .standard
    ) {
        self.serverURL = serverURL
        self.publishableKey = publishableKey
        self.deviceID = deviceID
        self.storageDirectory = storageDirectory
        self.platform = platform
        self.retry = retry
    }

    /// The outbox file inside ``storageDirectory``.
    public var outboxFile: URL { storageDirectory.appendingPathComponent("liveline-outbox.json") }
}

/// Why LivelineKit could not do what was asked.
public enum LivelineError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The storage directory could not be created or the outbox file could not be read.
    case storage(String)
    /// The outbox file exists but is not an outbox LivelineKit wrote.
    case unreadableOutbox(String)
    /// ``Liveline/configure(_:)`` was called again with a different configuration.
    case alreadyConfigured
    /// The configuration's key is not the app's publishable key (`pk_…`): a secret key must never ship in an app.
    case notAPublishableKey

    /// A sentence saying what went wrong.
    public var description: String {
        switch self {
        case .storage(let why): "LivelineKit storage: \(why)"
        case .unreadableOutbox(let why): "The LivelineKit outbox file cannot be read: \(why)"
        case .alreadyConfigured: "Liveline is already configured with another configuration."
        case .notAPublishableKey: "publishableKey must be the app's publishable key (pk_…); a secret key must never ship in an app."
        }
    }
}
