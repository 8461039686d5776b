import Foundation

/// How an ``APNsEmulator`` listens, where it keeps its files and which clock it reads.
public struct APNsEmulatorConfiguration: Sendable {
    /// The address both listeners bind to.
    public var host: String = "127.0.0.1"
    /// The APNs listener's port (HTTP/2 over TLS, Apple's protocol); `0` picks a free port.
    public var apnsPort: Int = 0
    /// The channel management listener's port (HTTP/2 over TLS, like the APNs listener; Apple's
    /// `api-manage-broadcast(.sandbox).push.apple.com`); `0` picks a free port.
    public var channelsPort: Int = 0
    /// How many live (not deleted) broadcast channels one bundle id may have; creating one more is answered
    /// 400 `CannotCreateChannelConfig`. Apple allows 10,000 per app and environment.
    public var maximumChannelsPerApp: Int = 10_000
    /// The control and inspection API's port (HTTP/1.1, JSON); `0` picks a free port.
    public var controlPort: Int = 0
    /// The directory for the emulator's files. The CA certificate that clients must trust is
    /// written to `<dataDirectory>/ca.pem`; its private key to `ca-key.pem`, so a restarted
    /// emulator keeps the same CA and clients need not be reconfigured.
    public var dataDirectory: String
    /// How many received pushes the history keeps (a ring buffer: the oldest are dropped first).
    public var pushHistoryLimit: Int = 10_000
    /// The clock for provider-token ages, stale and dismissal dates, hourly budgets and the
    /// `timestamp` of 410 answers. Tests inject one to move time without sleeping.
    public var now: @Sendable () -> Date = { Date() }
    /// How far in the future a provider token's `iat` may lie before the token is refused as
    /// `InvalidProviderToken`. Apple does not document a tolerance; a few seconds keep a sender
    /// that rounds its clock from failing at random.
    public var providerTokenClockSkew: TimeInterval = 5

    /// Where simulated iPhones created without their own setting register with Liveline (`nil`: they do not).
    public var registerWith: LivelineRegistrationTarget?
    /// Keeps the simulated iPhones and devices in `<dataDirectory>/apns-phones.json`: loaded at creation, written on
    /// change and at shutdown, so a restarted emulator shows them as they were.
    public var persistsPhones = false
    /// The bundle id of a phone created without one.
    public var defaultBundleID = "com.example.liveline.demo"

    /// A configuration with every default and the given data directory.
    public init(dataDirectory: String) {
        self.dataDirectory = dataDirectory
    }
}
