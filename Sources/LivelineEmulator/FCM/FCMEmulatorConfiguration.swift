import Foundation

/// How an ``FCMEmulator`` listens, where it keeps its files and which clock it reads.
public struct FCMEmulatorConfiguration: Sendable {
    /// The address both listeners bind to.
    public var host: String = "127.0.0.1"
    /// The FCM listener's port (HTTPS: HTTP/2 or HTTP/1.1 by ALPN; OAuth `POST /token` and
    /// `POST /v1/projects/<project>/messages:send`); `0` picks a free port.
    public var fcmPort: Int = 0
    /// The control and inspection API's port (HTTP/1.1, JSON); `0` picks a free port.
    public var controlPort: Int = 0
    /// The directory for the emulator's files: the CA certificate clients must trust (`ca.pem`, shared with the APNs
    /// emulator when both use one directory) and the demo service account (`fcm-service-account.json`).
    public var dataDirectory: String
    /// How many received messages the history keeps (a ring buffer: the oldest are dropped first).
    public var messageHistoryLimit: Int = 10_000
    /// How long an issued access token is valid (`expires_in`). Google's last an hour.
    public var accessTokenLifetime: TimeInterval = 3600
    /// How far in the future an assertion's `iat` may lie before it is refused. Google does not document a
    /// tolerance; a few seconds keep a sender whose clock rounds from failing at random.
    public var assertionClockSkew: TimeInterval = 30
    /// The project a device registered without one belongs to (the demo service account's project).
    public var defaultProjectID: String = "liveline-demo"
    /// The clock for assertion times, access-token expiry and stale and dismissal dates. Tests inject one to move
    /// time without sleeping.
    public var now: @Sendable () -> Date = { Date() }

    /// Where simulated Android phones registered without their own setting register with Liveline (`nil`: they do
    /// not).
    public var registerWith: LivelineRegistrationTarget?
    /// Keeps the simulated Android phones and their notifications in `<dataDirectory>/fcm-phones.json`: loaded at
    /// creation, written on change and at shutdown.
    public var persistsPhones = false

    /// A configuration with every default and the given data directory.
    public init(dataDirectory: String) {
        self.dataDirectory = dataDirectory
    }
}
