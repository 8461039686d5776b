import Configuration
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import NIOCore
import Logging
import SystemPackage

/// Everything `liveline serve` can be told, read once at start from (highest first) command-line
/// flags, environment variables and an optional JSON file.
///
/// Every key is listed once in ``LivelineConfiguration/keys``; the README's table is that list.
public struct LivelineConfiguration: Sendable {
    /// The address the HTTP server binds.
    public var host: String
    /// The port the HTTP server binds.
    public var port: Int
    /// Where Liveline keeps its files (the SQLite database by default).
    public var dataDirectory: String
    /// Where the database is: a SQLite file path (or `sqlite:PATH`). Defaults to
    /// `<dataDirectory>/liveline.sqlite`.
    public var database: String?
    /// The bearer token of the admin API; the admin API is off without one.
    public var adminToken: String?
    /// Development mode: creates a demo app on first start and prints its keys.
    public var dev: Bool
    /// The log level.
    public var logLevel: Logger.Level
    /// Runs the built-in APNs emulator for apps without credentials (default: on in dev mode).
    public var emulator: Bool
    /// The emulator's APNs (HTTP/2 + TLS) port.
    public var emulatorPort: Int
    /// The emulator's inspection API port.
    public var emulatorControlPort: Int
    /// The emulator's APNs channel management port (HTTP/2 + TLS; iOS 18 broadcast channels).
    public var emulatorChannelsPort: Int = 8445
    /// The FCM emulator's port (HTTPS: OAuth token endpoint and messages:send).
    public var fcmEmulatorPort: Int = 8444
    /// The FCM emulator's inspection API port.
    public var fcmEmulatorControlPort: Int = 8092
    /// The Liveline base URL the built-in emulators' simulated apps register with (`PUT /v1/devices/…`,
    /// `PUT /v1/activities/…/instances/…`); `nil`: this server itself in dev mode (with the demo app's publishable
    /// key), otherwise none. `"none"` turns it off.
    public var emulatorRegisterWith: String?
    /// The publishable key the simulated apps register with; `nil`: the demo app's, in dev mode.
    public var emulatorPublishableKey: String?
    /// Base64 of the 32-byte key that seals provider secrets at rest; generated into
    /// `<dataDirectory>/master.key` when not given.
    public var masterKey: String?
    /// Default stale dates for updates posted without one.
    public var staleness: StalenessPolicy = StalenessPolicy()
    /// When Liveline ends activities and instances nobody ended, and how long it keeps ended ones.
    public var lifetime: LifetimePolicy = LifetimePolicy()
    /// Apple's priority-10 budget per iOS instance.
    public var budget: PriorityBudget = PriorityBudget()
    /// The least seconds before an FCM push is retried.
    public var fcmRetryFloor: Int = 10
    /// Seconds where the backoff of an FCM push refused with `QUOTA_EXCEEDED` starts (Google: at least a minute).
    public var fcmQuotaRetryFloor: Int = 60
    /// Seconds a delivery engine's claim on an activity lasts from its last renewal: how long the other nodes wait
    /// before they take over the fan-out of a node that died.
    public var claimLease: Int = 30
    /// On a PostgreSQL database, a fan-out of more instances than this is cut into slices of this many that every
    /// node's engines claim and send together; 0: each activity's fan-out is sent by the one engine that claimed it.
    /// (On SQLite, one node, a fan-out is never shared.)
    public var sliceSize: Int = 10_000
    /// How long a client connection may take to send a request's headers and body, how long it may idle, and how
    /// many may be open at once.
    public var connections: ConnectionLimits = ConnectionLimits()
    /// Seconds a remotely started instance may stay `starting` (its phone has not registered the activity's own token)
    /// before its activity lists it as unconfirmed.
    public var startConfirmationTimeout: TimeInterval = 120
    /// The scheduling niceness (0 – 19) of the threads the delivery engine runs on, so the HTTP API is served first on
    /// a busy machine; 0 runs the engine at the API's priority.
    public var engineNiceness: Int = 10
    /// Activities the delivery engine works on at the same time (``DispatcherConfiguration/workers``); nil: the store's
    /// default (``DispatcherConfiguration/workersOnSQLite``, ``DispatcherConfiguration/workersSharingADatabase``).
    public var engineWorkers: Int?
    /// Pushes the delivery engine hands to a connection in one call (``DispatcherConfiguration/pushesPerCall``).
    public var enginePushesPerCall = DispatcherConfiguration().pushesPerCall
    /// Pushes in flight at once per activity (``DispatcherConfiguration/pushesInFlight``).
    public var enginePushesInFlight = DispatcherConfiguration().pushesInFlight
    /// Results written to the Store per progress write (``DispatcherConfiguration/progressBatchSize``).
    public var engineProgressBatch = DispatcherConfiguration().progressBatchSize
    /// PostgreSQL: how many connections run writes.
    public var databaseWriters = SQLStore.defaultPostgresWriters
    /// How many connections run reads.
    public var databaseReaders = SQLStore.defaultReaders
    /// PostgreSQL: how long `liveline serve` waits at its start for a database that does not answer yet (nothing
    /// listening, a server still starting) before it gives up; zero gives up at the first failure.
    public var databaseStartupWait: Duration = DatabaseStartupWait.defaultLimit
    /// The defaults of iOS 18 broadcast channels (an app's own come first).
    public var broadcast: BroadcastSettings = BroadcastSettings()
    /// How webhooks are delivered.
    public var webhooks = WebhookSettings()

    /// How webhooks are delivered.
    public struct WebhookSettings: Sendable, Hashable {
        /// Allows webhook URLs on loopback and private networks, and http (local development); off by default,
        /// on by default in dev mode.
        public var allowsPrivateNetworks = false
        /// Seconds a delivery is retried before it fails and its endpoint is disabled.
        public var retryFor: TimeInterval = 24 * 3600
        public init() {}
    }
    /// Serves `GET /metrics` (Prometheus' text format) and records the metrics it shows.
    public var metricsEnabled: Bool = true
    /// The least time between two counts of the Store's rows for `GET /metrics`' state gauges (a scrape sooner shows
    /// the last count); zero counts at every scrape.
    public var metricsCountInterval: Duration = .seconds(5)
    /// How the logs are written: plain text lines, or one JSON object per line.
    public var logFormat: LogFormat = .text

    /// A configuration key: its name in JSON files, its environment variable and its flag.
    public struct Key: Sendable {
        public var name: String
        public var environment: String
        public var flag: String?
        public var defaultValue: String
        public var summary: String
    }

    /// Every configuration key, documented once.
    public static let keys: [Key] = [
        Key(name: "liveline.host", environment: "LIVELINE_HOST", flag: "--host", defaultValue: "127.0.0.1",
            summary: "Address the HTTP API listens on."),
        Key(name: "liveline.port", environment: "LIVELINE_PORT", flag: "--port", defaultValue: "8080",
            summary: "Port the HTTP API listens on."),
        Key(name: "liveline.dataDirectory", environment: "LIVELINE_DATA_DIRECTORY", flag: "--data-dir", defaultValue: "./.liveline",
            summary: "Directory for Liveline's files; created if missing."),
        Key(name: "liveline.database", environment: "LIVELINE_DATABASE", flag: "--database / --database-url", defaultValue: "<data dir>/liveline.sqlite",
            summary: "Where the data is: a SQLite file (a path or sqlite:PATH), or a PostgreSQL database (postgres://user:password@host:5432/db, `?sslmode=disable|prefer|require`), which several nodes may share."),
        Key(name: "liveline.databasePool.writers", environment: "LIVELINE_DATABASE_POOL_WRITERS", flag: nil, defaultValue: "8",
            summary: "PostgreSQL: connections for writes (each write is one transaction on one of them), besides up to 3 more for registrations and updates."),
        Key(name: "liveline.databasePool.readers", environment: "LIVELINE_DATABASE_POOL_READERS", flag: nil, defaultValue: "3",
            summary: "Read connections (SQLite or PostgreSQL): a fan-out's pages, the API's reads and the sweepers' run side by side. PostgreSQL opens two more, with their planner settings: one for the API's reads of activities and schemas by key (every update and end reads its activity), one for the delivery engine's reads by key and its question of when the next activity is due."),
        Key(name: "liveline.databaseStartupWait", environment: "LIVELINE_DATABASE_STARTUP_WAIT", flag: nil, defaultValue: "60",
            summary: "PostgreSQL: seconds `liveline serve` waits at its start for a database that is not reachable yet (nothing listening, a server still starting), trying again with growing pauses; 0 gives up at once. A wrong password or a missing database fails at once."),
        Key(name: "liveline.adminToken", environment: "LIVELINE_ADMIN_TOKEN", flag: "--admin-token-file", defaultValue: "(none: admin API off)",
            summary: "Bearer token for /admin/v1. The flag reads it from a file so it stays out of `ps`."),
        Key(name: "liveline.dev", environment: "LIVELINE_DEV", flag: "--dev", defaultValue: "false",
            summary: "Development mode: create a demo app on first start and print its keys."),
        Key(name: "liveline.emulator", environment: "LIVELINE_EMULATOR", flag: "--emulator / --no-emulator", defaultValue: "same as dev",
            summary: "Run the built-in APNs and FCM emulators; apps without credentials push to them, never to Apple or Google."),
        Key(name: "liveline.emulatorPort", environment: "LIVELINE_EMULATOR_PORT", flag: "--emulator-port", defaultValue: "8443",
            summary: "The built-in emulator's APNs port (HTTP/2 + TLS)."),
        Key(name: "liveline.emulatorControlPort", environment: "LIVELINE_EMULATOR_CONTROL_PORT", flag: "--emulator-control-port", defaultValue: "8091",
            summary: "The built-in emulator's inspection API port (simulated phones, pushes, faults)."),
        Key(name: "liveline.emulatorChannelsPort", environment: "LIVELINE_EMULATOR_CHANNELS_PORT", flag: "--emulator-channels-port",
            defaultValue: "8445",
            summary: "The built-in emulator's APNs channel management port (HTTP/2 + TLS), standing in for api-manage-broadcast (iOS 18 broadcast channels)."),
        Key(name: "liveline.fcmEmulatorPort", environment: "LIVELINE_FCM_EMULATOR_PORT", flag: "--fcm-emulator-port", defaultValue: "8444",
            summary: "The built-in FCM emulator's port (HTTPS: OAuth token endpoint and messages:send)."),
        Key(name: "liveline.fcmEmulatorControlPort", environment: "LIVELINE_FCM_EMULATOR_CONTROL_PORT", flag: "--fcm-emulator-control-port", defaultValue: "8092",
            summary: "The built-in FCM emulator's inspection API port (simulated Android phones, messages, faults)."),
        Key(name: "liveline.emulatorRegisterWith", environment: "LIVELINE_EMULATOR_REGISTER_WITH", flag: "--emulator-register-with",
            defaultValue: "this server with --dev, else none",
            summary: "Liveline base URL the built-in emulators' simulated phones register with, as the real app would (PUT /v1/devices/…, PUT /v1/activities/…/instances/…); 'none' turns it off."),
        Key(name: "liveline.emulatorPublishableKey", environment: "LIVELINE_EMULATOR_PUBLISHABLE_KEY", flag: "--emulator-publishable-key",
            defaultValue: "the demo app's, with --dev",
            summary: "The publishable key (pk_…) the simulated phones register with. The demo app's is kept in <data dir>/emulator/register-with.json when --dev creates it."),
        Key(name: "liveline.masterKey", environment: "LIVELINE_MASTER_KEY", flag: nil, defaultValue: "<data dir>/master.key (generated)",
            summary: "Base64 of 32 bytes; seals APNs keys and FCM service accounts at rest (AES-GCM). Keep it out of the database's backups."),
        Key(name: "liveline.staleness.first", environment: "LIVELINE_STALENESS_FIRST", flag: nil, defaultValue: "3600",
            summary: "Seconds until a first update without a staleDate goes stale."),
        Key(name: "liveline.staleness.minimum", environment: "LIVELINE_STALENESS_MINIMUM", flag: nil, defaultValue: "120",
            summary: "Later updates without a staleDate go stale after twice the time since the previous one, at least this many seconds …"),
        Key(name: "liveline.staleness.maximum", environment: "LIVELINE_STALENESS_MAXIMUM", flag: nil, defaultValue: "14400",
            summary: "… and at most this many."),
        Key(name: "liveline.claimLease", environment: "LIVELINE_CLAIM_LEASE", flag: nil, defaultValue: "30",
            summary: "Seconds an engine's claim on an activity lasts unless renewed: with several nodes, how soon the others take over a dead node's fan-out."),
        Key(name: "liveline.sliceSize", environment: "LIVELINE_SLICE_SIZE", flag: nil, defaultValue: "10000",
            summary: "PostgreSQL: a fan-out of more instances is cut into slices of this many, sent by every node's engines together; 0 for none."),
        Key(name: "liveline.fcmRetryFloor", environment: "LIVELINE_FCM_RETRY_FLOOR", flag: nil, defaultValue: "10",
            summary: "Seconds an FCM push waits at least before a retry (UNAVAILABLE, INTERNAL), however short the backoff or Retry-After."),
        Key(name: "liveline.fcmQuotaRetryFloor", environment: "LIVELINE_FCM_QUOTA_RETRY_FLOOR", flag: nil, defaultValue: "60",
            summary: "The same for QUOTA_EXCEEDED (Google: exponential backoff from at least a minute; a project's quota refills in the following minute)."),
        Key(name: "liveline.budget.hourly", environment: "LIVELINE_BUDGET_HOURLY", flag: nil, defaultValue: "10",
            summary: "Priority-10 pushes per iOS instance per hour (counted per quarter of an hour: a push counts for 60 to 75 minutes); updates beyond it go at priority 5 (alerts and ends always at 10)."),
        Key(name: "liveline.budget.hourlyWithFrequentPushes", environment: "LIVELINE_BUDGET_HOURLY_WITH_FREQUENT_PUSHES", flag: nil,
            defaultValue: "40", summary: "The same for an instance whose app reported frequent updates enabled."),
        Key(name: "liveline.lifetime.endAfter", environment: "LIVELINE_LIFETIME_END_AFTER", flag: nil, defaultValue: "27900",
            summary: "Seconds after its first instance registered (or, without one, after its creation) that Liveline ends an activity nobody ended, with its last state (iOS ends them at 8 hours)."),
        Key(name: "liveline.lifetime.instancesEndAfter", environment: "LIVELINE_LIFETIME_INSTANCES_END_AFTER", flag: nil, defaultValue: "43200",
            summary: "Seconds after registering that an instance is marked ended (the platform has ended it)."),
        Key(name: "liveline.lifetime.retention", environment: "LIVELINE_LIFETIME_RETENTION", flag: nil, defaultValue: "604800",
            summary: "Seconds an ended activity is kept, with its instances and timeline, before it is purged."),
        Key(name: "liveline.connections.headerTimeout", environment: "LIVELINE_CONNECTIONS_HEADER_TIMEOUT", flag: nil, defaultValue: "10",
            summary: "Seconds from a request's first byte until its header block must be complete; then the connection is closed without an answer."),
        Key(name: "liveline.connections.bodyTimeout", environment: "LIVELINE_CONNECTIONS_BODY_TIMEOUT", flag: nil, defaultValue: "30",
            summary: "Seconds from a request's complete headers until its body must have arrived; then it is answered 408 request_timeout and the connection closed."),
        Key(name: "liveline.connections.idleTimeout", environment: "LIVELINE_CONNECTIONS_IDLE_TIMEOUT", flag: nil, defaultValue: "60",
            summary: "Seconds a keep-alive connection may stay open with no request in flight and nothing arriving."),
        Key(name: "liveline.connections.maximum", environment: "LIVELINE_CONNECTIONS_MAXIMUM", flag: nil, defaultValue: "10000",
            summary: "Connections open at once; beyond it new ones wait in the listen backlog until one closes (keep it under the open-file limit)."),
        Key(name: "liveline.engine.niceness", environment: "LIVELINE_ENGINE_NICENESS", flag: nil, defaultValue: "10",
            summary: "Scheduling niceness (0-19) of the delivery engine's threads (Linux; its own event loops on SQLite, and the push connections' event loops): during a fan-out the API and the Store's writer are served first. 0 turns it off (the engine then runs on Swift's cooperative pool)."),
        Key(name: "liveline.engine.workers", environment: "LIVELINE_ENGINE_WORKERS", flag: nil,
            defaultValue: "\(DispatcherConfiguration.workersOnSQLite) on SQLite, \(DispatcherConfiguration.workersSharingADatabase) on PostgreSQL",
            summary: "Activities the delivery engine works on at once (1-256): with many activities of a few phones each, about how many it sends to at a time. On PostgreSQL each costs the database round trips and CPU."),
        Key(name: "liveline.engine.pushesPerCall", environment: "LIVELINE_ENGINE_PUSHES_PER_CALL", flag: nil, defaultValue: "64",
            summary: "Pushes the delivery engine hands to the push connections at a time (1-10000). Larger calls cost less CPU a push but make the flow burstier (accepts wait longer on a busy machine); a call's results come back together, once its slowest push (retries included) is done."),
        Key(name: "liveline.engine.pushesInFlight", environment: "LIVELINE_ENGINE_PUSHES_IN_FLIGHT", flag: nil,
            defaultValue: "\(DispatcherConfiguration().pushesInFlight)",
            summary: "Pushes in flight at once per activity (at least pushesPerCall, at most 100000): about as many as the streams of an app's four push connections; other activities' pushes on the same app's connections queue behind them."),
        Key(name: "liveline.engine.progressBatch", environment: "LIVELINE_ENGINE_PROGRESS_BATCH", flag: nil, defaultValue: "250",
            summary: "Delivery results the engine records in one Store write (1-10000). Larger batches cost fewer commits; on SQLite an accepted write waits for a few hundred instances of one at most (the writer commits it in parts when one arrives)."),
        Key(name: "liveline.starts.confirmationTimeout", environment: "LIVELINE_STARTS_CONFIRMATION_TIMEOUT", flag: nil, defaultValue: "120",
            summary: "Seconds a remotely started instance may stay 'starting' (its phone has not registered the activity's token) before GET /v1/activities/{id} lists it as unconfirmed."),
        Key(name: "liveline.events.retention", environment: "LIVELINE_EVENTS_RETENTION", flag: nil, defaultValue: "604800",
            summary: "Seconds lifecycle events stay in the event feed (GET /v1/events)."),
        Key(name: "liveline.webhooks.allowPrivateNetworks", environment: "LIVELINE_WEBHOOKS_ALLOW_PRIVATE_NETWORKS", flag: nil,
            defaultValue: "same as dev",
            summary: "Allow webhook URLs on loopback and private networks, and http:// (local development). Off in production so a tenant cannot make the server call into its own network."),
        Key(name: "liveline.webhooks.retryFor", environment: "LIVELINE_WEBHOOKS_RETRY_FOR", flag: nil, defaultValue: "86400",
            summary: "Seconds a webhook delivery is retried (exponential backoff, jitter, Retry-After) before it fails and the endpoint is disabled."),
        Key(name: "liveline.broadcast.defaultDelivery", environment: "LIVELINE_BROADCAST_DEFAULT_DELIVERY", flag: nil, defaultValue: "token",
            summary: "How activities are delivered when neither the request nor the app says: 'token' or 'broadcast' (iOS 18 channels)."),
        Key(name: "liveline.broadcast.messageStoragePolicy", environment: "LIVELINE_BROADCAST_MESSAGE_STORAGE_POLICY", flag: nil,
            defaultValue: "mostRecent",
            summary: "What new broadcast channels store when neither the request nor the app says: 'mostRecent' (Apple's policy 1) or 'none' (0)."),
        Key(name: "liveline.broadcast.maximumChannels", environment: "LIVELINE_BROADCAST_MAXIMUM_CHANNELS", flag: nil, defaultValue: "10000",
            summary: "The most broadcast channels an app holds at once (Apple allows 10,000 per app and environment)."),
        Key(name: "liveline.logLevel", environment: "LIVELINE_LOG_LEVEL", flag: "--log-level", defaultValue: "info",
            summary: "trace, debug, info, notice, warning, error or critical."),
        Key(name: "liveline.logFormat", environment: "LIVELINE_LOG_FORMAT", flag: "--log-format", defaultValue: "text",
            summary: "text (swift-log's lines) or json (one JSON object per line: timestamp, level, label, message, source and the metadata, such as request.id)."),
        Key(name: "liveline.metrics.enabled", environment: "LIVELINE_METRICS_ENABLED", flag: nil, defaultValue: "true",
            summary: "Serve GET /metrics (Prometheus text format, no API key: keep the port private or filter the path at the proxy); false answers 404 there."),
        Key(name: "liveline.metrics.countInterval", environment: "LIVELINE_METRICS_COUNT_INTERVAL", flag: nil, defaultValue: "5",
            summary: "Seconds between two counts of the Store's activities and instances for GET /metrics' gauges (each reads every row); a scrape sooner shows the last count. 0: every scrape."),
    ]

    /// Creates a configuration with the defaults.
    public init(
        host: String = "127.0.0.1", port: Int = 8080, dataDirectory: String = "./.liveline", database: String? = nil,
        adminToken: String? = nil, dev: Bool = false, logLevel: Logger.Level = .info, masterKey: String? = nil,
        emulator: Bool? = nil, emulatorPort: Int = 8443, emulatorControlPort: Int = 8091
    ) {
        self.emulator = emulator ?? dev
        self.emulatorPort = emulatorPort
        self.emulatorControlPort = emulatorControlPort
        self.masterKey = masterKey
        self.host = host
        self.port = port
        self.dataDirectory = dataDirectory
        self.database = database
        self.adminToken = adminToken
        self.dev = dev
        self.logLevel = logLevel
    }

    /// Reads the configuration from `reader` (keys as in ``keys``).
    public init(reader: ConfigReader) throws {
        let defaults = LivelineConfiguration()
        let scoped = reader.scoped(to: "liveline")
        self.init(
            host: try scoped.checkedString("host", default: defaults.host),
            port: try scoped.checkedInt("port", default: defaults.port),
            dataDirectory: try scoped.checkedString("dataDirectory", default: defaults.dataDirectory),
            database: try scoped.checkedString("database", isSecret: true),
            adminToken: try scoped.checkedString("adminToken", isSecret: true),
            dev: try scoped.checkedBool("dev", default: false),
            logLevel: .info,
            masterKey: try scoped.checkedString("masterKey", isSecret: true),
            emulator: try scoped.checkedBool("emulator"),
            emulatorPort: try scoped.checkedInt("emulatorPort", default: 8443),
            emulatorControlPort: try scoped.checkedInt("emulatorControlPort", default: 8091)
        )
        emulatorChannelsPort = try scoped.checkedInt("emulatorChannelsPort", default: 8445)
        databaseWriters = try scoped.checkedInt("databasePool.writers", default: databaseWriters)
        databaseReaders = try scoped.checkedInt("databasePool.readers", default: databaseReaders)
        guard databaseWriters >= 1, databaseReaders >= 1 else {
            throw ConfigurationError("databasePool.writers and databasePool.readers must be at least 1.")
        }
        let startupWait = try scoped.checkedInt("databaseStartupWait", default: Int(DatabaseStartupWait.defaultLimit.components.seconds))
        guard (0...3600).contains(startupWait) else {
            throw ConfigurationError("databaseStartupWait must be between 0 and 3600 seconds; got \(startupWait).")
        }
        databaseStartupWait = .seconds(startupWait)
        fcmEmulatorPort = try scoped.checkedInt("fcmEmulatorPort", default: 8444)
        fcmEmulatorControlPort = try scoped.checkedInt("fcmEmulatorControlPort", default: 8092)
        emulatorRegisterWith = try scoped.checkedString("emulatorRegisterWith")
        emulatorPublishableKey = try scoped.checkedString("emulatorPublishableKey")
        if let url = emulatorRegisterWith, url != "none", !(url.hasPrefix("http://") || url.hasPrefix("https://")) {
            throw ConfigurationError("emulatorRegisterWith must be an http:// or https:// base URL, or 'none'; got '\(url)'.")
        }
        for (name, value) in [
            ("emulatorPort", emulatorPort), ("emulatorControlPort", emulatorControlPort), ("fcmEmulatorPort", fcmEmulatorPort),
            ("fcmEmulatorControlPort", fcmEmulatorControlPort), ("emulatorChannelsPort", emulatorChannelsPort),
        ] where !(0...65535).contains(value) {
            throw ConfigurationError("\(name) must be between 0 and 65535; got \(value).")
        }
        let defaultStaleness = StalenessPolicy()
        staleness = StalenessPolicy(
            first: Int64(try scoped.checkedInt("staleness.first", default: Int(defaultStaleness.first))),
            minimum: Int64(try scoped.checkedInt("staleness.minimum", default: Int(defaultStaleness.minimum))),
            maximum: Int64(try scoped.checkedInt("staleness.maximum", default: Int(defaultStaleness.maximum)))
        )
        guard staleness.first > 0, staleness.minimum > 0, staleness.maximum >= staleness.minimum else {
            throw ConfigurationError("staleness.first and staleness.minimum must be positive and staleness.maximum at least staleness.minimum.")
        }
        // A first stale time outside the bounds would be moved to the nearer one (StalenessPolicy), not honoured.
        guard (staleness.minimum...staleness.maximum).contains(staleness.first) else {
            throw ConfigurationError(
                "staleness.first (\(staleness.first) s) must be between staleness.minimum (\(staleness.minimum) s) and staleness.maximum (\(staleness.maximum) s)."
            )
        }
        fcmRetryFloor = try scoped.checkedInt("fcmRetryFloor", default: 10)
        fcmQuotaRetryFloor = try scoped.checkedInt("fcmQuotaRetryFloor", default: 60)
        claimLease = try scoped.checkedInt("claimLease", default: 30)
        guard (3...3600).contains(claimLease) else { throw ConfigurationError("claimLease must be between 3 and 3600 seconds.") }
        sliceSize = try scoped.checkedInt("sliceSize", default: 10_000)
        guard sliceSize == 0 || (100...10_000_000).contains(sliceSize) else {
            throw ConfigurationError("sliceSize must be 0 (no shared fan-outs) or between 100 and 10000000 instances.")
        }
        guard (0...3600).contains(fcmRetryFloor) else { throw ConfigurationError("fcmRetryFloor must be between 0 and 3600 seconds.") }
        guard (0...3600).contains(fcmQuotaRetryFloor) else {
            throw ConfigurationError("fcmQuotaRetryFloor must be between 0 and 3600 seconds.")
        }
        let defaultBudget = PriorityBudget()
        let hourly = try scoped.checkedInt("budget.hourly", default: defaultBudget.hourly)
        let frequent = try scoped.checkedInt("budget.hourlyWithFrequentPushes", default: defaultBudget.hourlyWithFrequentPushes)
        guard hourly >= 0, frequent >= hourly else {
            throw ConfigurationError("budget.hourly must not be negative, and budget.hourlyWithFrequentPushes at least budget.hourly.")
        }
        budget = PriorityBudget(hourly: hourly, hourlyWithFrequentPushes: frequent)
        let defaultLifetime = LifetimePolicy()
        lifetime = LifetimePolicy(
            endAfter: TimeInterval(try scoped.checkedInt("lifetime.endAfter", default: Int(defaultLifetime.endAfter))),
            instancesEndAfter: TimeInterval(try scoped.checkedInt("lifetime.instancesEndAfter", default: Int(defaultLifetime.instancesEndAfter))),
            retention: TimeInterval(try scoped.checkedInt("lifetime.retention", default: Int(defaultLifetime.retention)))
        )
        guard lifetime.endAfter > 0, lifetime.instancesEndAfter > 0, lifetime.retention > 0 else {
            throw ConfigurationError("lifetime.endAfter, lifetime.instancesEndAfter and lifetime.retention must be positive.")
        }
        let defaultConnections = ConnectionLimits()
        let headerTimeout = try scoped.checkedInt("connections.headerTimeout", default: Int(defaultConnections.headerTimeout.nanoseconds / 1_000_000_000))
        let bodyTimeout = try scoped.checkedInt("connections.bodyTimeout", default: Int(defaultConnections.bodyTimeout.nanoseconds / 1_000_000_000))
        let idleTimeout = try scoped.checkedInt("connections.idleTimeout", default: Int(defaultConnections.idleTimeout.nanoseconds / 1_000_000_000))
        let maximumConnections = try scoped.checkedInt("connections.maximum", default: defaultConnections.maximumConnections)
        guard [headerTimeout, bodyTimeout, idleTimeout].allSatisfy({ (1...3600).contains($0) }) else {
            throw ConfigurationError("connections.headerTimeout, connections.bodyTimeout and connections.idleTimeout must be between 1 and 3600 seconds.")
        }
        guard maximumConnections >= 1 else { throw ConfigurationError("connections.maximum must be at least 1; got \(maximumConnections).") }
        connections = ConnectionLimits(
            headerTimeout: .seconds(Int64(headerTimeout)), bodyTimeout: .seconds(Int64(bodyTimeout)), idleTimeout: .seconds(Int64(idleTimeout)),
            maximumConnections: maximumConnections
        )
        engineNiceness = try scoped.checkedInt("engine.niceness", default: 10)
        guard (0...19).contains(engineNiceness) else {
            throw ConfigurationError("engine.niceness must be between 0 and 19; got \(engineNiceness).")
        }
        engineWorkers = try scoped.checkedInt("engine.workers")
        if let engineWorkers, !(1...256).contains(engineWorkers) {
            throw ConfigurationError("engine.workers must be between 1 and 256; got \(engineWorkers).")
        }
        let engineDefaults = DispatcherConfiguration()
        enginePushesPerCall = try scoped.checkedInt("engine.pushesPerCall", default: engineDefaults.pushesPerCall)
        guard (1...10_000).contains(enginePushesPerCall) else {
            throw ConfigurationError("engine.pushesPerCall must be between 1 and 10000; got \(enginePushesPerCall).")
        }
        enginePushesInFlight = try scoped.checkedInt("engine.pushesInFlight", default: max(engineDefaults.pushesInFlight, enginePushesPerCall))
        guard (enginePushesPerCall...100_000).contains(enginePushesInFlight) else {
            throw ConfigurationError(
                "engine.pushesInFlight must be at least engine.pushesPerCall (\(enginePushesPerCall)) and at most 100000; got \(enginePushesInFlight)."
            )
        }
        engineProgressBatch = try scoped.checkedInt("engine.progressBatch", default: engineDefaults.progressBatchSize)
        guard (1...10_000).contains(engineProgressBatch) else {
            throw ConfigurationError("engine.progressBatch must be between 1 and 10000; got \(engineProgressBatch).")
        }
        let confirmation = try scoped.checkedInt("starts.confirmationTimeout", default: 120)
        guard (1...86_400).contains(confirmation) else {
            throw ConfigurationError("starts.confirmationTimeout must be between 1 and 86400 seconds; got \(confirmation).")
        }
        startConfirmationTimeout = TimeInterval(confirmation)
        lifetime.startConfirmationTimeout = startConfirmationTimeout
        let eventRetention = try scoped.checkedInt("events.retention", default: Int(LifetimePolicy().eventRetention))
        guard (60...(366 * 24 * 3600)).contains(eventRetention) else {
            throw ConfigurationError("events.retention must be between 60 seconds and a year; got \(eventRetention).")
        }
        lifetime.eventRetention = TimeInterval(eventRetention)
        webhooks.allowsPrivateNetworks = try scoped.checkedBool("webhooks.allowPrivateNetworks", default: dev)
        let retryFor = try scoped.checkedInt("webhooks.retryFor", default: Int(webhooks.retryFor))
        guard (10...(7 * 24 * 3600)).contains(retryFor) else {
            throw ConfigurationError("webhooks.retryFor must be between 10 seconds and 7 days; got \(retryFor).")
        }
        webhooks.retryFor = TimeInterval(retryFor)
        let deliveryName = try scoped.checkedString("broadcast.defaultDelivery", default: ActivityDelivery.token.rawValue)
        guard let defaultDelivery = ActivityDelivery(rawValue: deliveryName) else {
            throw ConfigurationError("broadcast.defaultDelivery must be 'token' or 'broadcast'; got '\(deliveryName)'.")
        }
        let policyName = try scoped.checkedString("broadcast.messageStoragePolicy", default: ChannelStoragePolicy.mostRecent.rawValue)
        guard let storagePolicy = ChannelStoragePolicy(rawValue: policyName) else {
            throw ConfigurationError("broadcast.messageStoragePolicy must be 'mostRecent' or 'none'; got '\(policyName)'.")
        }
        let maximumChannels = try scoped.checkedInt("broadcast.maximumChannels", default: Limits.maximumChannelsPerApp)
        guard (1...Limits.maximumChannelsPerApp).contains(maximumChannels) else {
            throw ConfigurationError("broadcast.maximumChannels must be between 1 and \(Limits.maximumChannelsPerApp); got \(maximumChannels).")
        }
        broadcast.defaultDelivery = defaultDelivery
        broadcast.storagePolicy = storagePolicy
        broadcast.maximumChannels = maximumChannels
        let level = try scoped.checkedString("logLevel", default: "info")
        guard let logLevel = Logger.Level(rawValue: level.lowercased()) else {
            throw ConfigurationError("logLevel must be one of trace, debug, info, notice, warning, error, critical; got '\(level)'.")
        }
        self.logLevel = logLevel
        let format = try scoped.checkedString("logFormat", default: LogFormat.text.rawValue)
        guard let logFormat = LogFormat(rawValue: format.lowercased()) else {
            throw ConfigurationError("logFormat must be 'text' or 'json'; got '\(format)'.")
        }
        self.logFormat = logFormat
        metricsEnabled = try scoped.checkedBool("metrics.enabled", default: true)
        let countInterval = try scoped.checkedInt("metrics.countInterval", default: 5)
        guard (0...3600).contains(countInterval) else {
            throw ConfigurationError("metrics.countInterval must be between 0 and 3600 seconds; got \(countInterval).")
        }
        metricsCountInterval = .seconds(countInterval)
        guard (0...65535).contains(port) else { throw ConfigurationError("port must be between 0 and 65535; got \(port).") }
        if let adminToken, adminToken.utf8.count < 16 {
            throw ConfigurationError("The admin token must be at least 16 characters.")
        }
    }

    /// A reader over flag values (highest), the environment, then `file` (a JSON document with a
    /// top-level `liveline` object), if given.
    public static func reader(flags: [String: ConfigValue], file: String?, environment: [String: String]? = nil) async throws -> ConfigReader {
        var providers: [any ConfigProvider] = [
            InMemoryProvider(name: "flags", values: Dictionary(uniqueKeysWithValues: flags.map { (AbsoluteConfigKey(stringLiteral: $0.key), $0.value) }))
        ]
        // The database URL may hold a password.
        let secrets: SecretsSpecifier<String, String> = .specific(["LIVELINE_ADMIN_TOKEN", "LIVELINE_MASTER_KEY", "LIVELINE_DATABASE"])
        providers.append(
            EnvironmentVariablesProvider(environmentVariables: environment ?? ProcessInfo.processInfo.environment, secretsSpecifier: secrets)
        )
        if let file {
            try checkFileKeys(file)
            providers.append(try await FileProvider<JSONSnapshot>(filePath: FilePath(file)))
        }
        return ConfigReader(providers: providers)
    }

    /// Refuses a configuration file whose `liveline` object holds a key Liveline does not know (`"prot": 8080`), which
    /// would otherwise be ignored in silence; other top-level members are left to whatever else reads the file.
    static func checkFileKeys(_ file: String) throws {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw ConfigurationError("Cannot read the configuration file \(file).")
        }
        let document: Any
        do {
            document = try JSONSerialization.jsonObject(with: data)
        } catch {
            throw ConfigurationError("The configuration file \(file) is not valid JSON.")
        }
        guard let top = document as? [String: Any] else {
            throw ConfigurationError("The configuration file \(file) must be a JSON object with a \"liveline\" object.")
        }
        guard let liveline = top["liveline"] else { return }
        guard let object = liveline as? [String: Any] else {
            throw ConfigurationError("\"liveline\" in the configuration file \(file) must be a JSON object.")
        }
        let known = Set(keys.map(\.name))
        func unknown(_ object: [String: Any], under prefix: String) -> [String] {
            object.flatMap { member, value -> [String] in
                let name = prefix + "." + member
                if known.contains(name) { return [] }
                if let nested = value as? [String: Any], known.contains(where: { $0.hasPrefix(name + ".") }) {
                    return unknown(nested, under: name)
                }
                return [name]
            }
        }
        let names = unknown(object, under: "liveline").sorted()
        guard names.isEmpty else {
            throw ConfigurationError(
                "Unknown key\(names.count == 1 ? "" : "s") in the configuration file \(file): \(names.joined(separator: ", ")). "
                    + "`liveline config` lists the keys."
            )
        }
    }

    /// Where the database setting points: a SQLite file, or a PostgreSQL database.
    public enum DatabaseLocation: Sendable, Equatable {
        case sqlite(path: String)
        case postgres(PostgresDatabaseURL)
    }

    /// The delivery engine's workers: ``engineWorkers`` when set, else the default for the database
    /// ``databaseLocation`` names (``DispatcherConfiguration/workersOnSQLite`` or
    /// ``DispatcherConfiguration/workersSharingADatabase``).
    public func deliveryWorkers() throws -> Int {
        if let engineWorkers { return engineWorkers }
        switch try databaseLocation {
        case .sqlite: return DispatcherConfiguration.workersOnSQLite
        case .postgres: return DispatcherConfiguration.workersSharingADatabase
        }
    }

    /// The name of the SQLite file in the data directory that holds the data when no database is set.
    public static let sqliteFileName = "liveline.sqlite"

    /// The database the setting points at (a SQLite file in the data directory when it is not set).
    public var databaseLocation: DatabaseLocation {
        get throws {
            guard let database, !database.isEmpty else {
                return .sqlite(path: (dataDirectory as NSString).appendingPathComponent(Self.sqliteFileName))
            }
            // A URL's scheme is case-insensitive (RFC 3986): `Postgres://…` is PostgreSQL, not a file of that name.
            let lowered = database.lowercased()
            if lowered.hasPrefix("postgres://") || lowered.hasPrefix("postgresql://") {
                do {
                    return .postgres(try PostgresDatabaseURL(database))
                } catch let invalid as PostgresDatabaseURL.Invalid {
                    throw ConfigurationError("database: \(invalid.description)")
                }
            }
            if lowered.hasPrefix("sqlite://") { return .sqlite(path: String(database.dropFirst("sqlite://".count))) }
            if lowered.hasPrefix("sqlite:") { return .sqlite(path: String(database.dropFirst("sqlite:".count))) }
            // Any other `scheme://` is a database Liveline does not speak (mysql://, a typo), never a file path: taken
            // as one, it became a SQLite file named after the URL, password and all, and the log showed it.
            if let scheme = database.range(of: "://").map({ database[..<$0.lowerBound] }), !scheme.isEmpty,
                scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+.-".contains($0)) })
            {
                throw ConfigurationError(
                    "database: '\(scheme)://' is not a database Liveline uses: give postgres://user@host:5432/db, sqlite:PATH or a file path."
                )
            }
            return .sqlite(path: database)
        }
    }
}

extension ConfigReader {
    /// The whole number at `key` (relative to this reader's scope), `defaultValue` when no source sets it. A value that
    /// is set but is not a whole number (`LIVELINE_PORT=abc`, an empty variable, `"port": "x"` in the file) is an
    /// error: the reader's own `int(forKey:default:)` would quietly take the default, over every source below it.
    func checkedInt(_ key: String, default defaultValue: Int) throws -> Int {
        try checkedInt(key) ?? defaultValue
    }

    /// The whole number at `key`, nil when no source sets it; one that is set but is not a whole number is an error.
    func checkedInt(_ key: String) throws -> Int? {
        try checked(key, expected: "a whole number") { try requiredInt(forKey: $0) }
    }

    /// The string at `key`, `defaultValue` when no source sets it; a value of another type (`"host": 127001` in the
    /// file) is an error, where the reader's own `string(forKey:)` would quietly take the default.
    func checkedString(_ key: String, default defaultValue: String) throws -> String {
        try checkedString(key) ?? defaultValue
    }

    /// The string at `key`, nil when no source sets it; a value of another type is an error. `isSecret` keeps the
    /// value out of the reader's access log.
    func checkedString(_ key: String, isSecret: Bool = false) throws -> String? {
        try checked(key, expected: "a string") { try requiredString(forKey: $0, isSecret: isSecret) }
    }

    /// The boolean at `key`, `defaultValue` when no source sets it; one that is set but is not `true` or `false` is
    /// an error (a mistyped `LIVELINE_METRICS_ENABLED=off` must not leave `/metrics` open).
    func checkedBool(_ key: String, default defaultValue: Bool) throws -> Bool {
        try checkedBool(key) ?? defaultValue
    }

    /// The boolean at `key`, nil when no source sets it; one that is set but is not `true` or `false` is an error.
    func checkedBool(_ key: String) throws -> Bool? {
        try checked(key, expected: "true or false") { try requiredBool(forKey: $0) }
    }

    /// The value `read` finds at `key`; nil when no source sets it; a ``ConfigurationError`` naming the key, its
    /// environment variable and what it must be (`expected`) when one sets a value `read` cannot convert.
    private func checked<Value>(_ key: String, expected: String, _ read: (ConfigKey) throws -> Value) throws -> Value? {
        do {
            return try read(ConfigKey(key))
        } catch {
            try Self.rethrowUnlessMissing(error, key: key, expected: expected)
            return nil
        }
    }

    /// Returns when `error` says no source set the key; otherwise throws a ``ConfigurationError`` naming the key, its
    /// environment variable and what it must be. (swift-configuration's errors are not public types: a missing
    /// value is told apart by its description.)
    private static func rethrowUnlessMissing(_ error: any Error, key: String, expected: String) throws {
        if "\(error)".hasPrefix("Missing required config value") { return }
        let name = "liveline." + key
        let environment = LivelineConfiguration.keys.first { $0.name == name }?.environment
        throw ConfigurationError("\(name)\(environment.map { " (\($0))" } ?? "") must be \(expected).")
    }
}

/// A configuration value that cannot be used.
public struct ConfigurationError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
