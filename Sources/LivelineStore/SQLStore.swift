import Foundation
import LivelineCore
import Logging
import NIOCore
import SQLiteNIO
import Synchronization

/// The Store on a SQL database: one SQLite file (the embedded default) or a PostgreSQL server shared by several nodes.
///
/// One set of logic, written once, runs on both. On SQLite, writes go through one ``SQLiteWriter``, on a thread of its
/// own, which commits the writes that arrive together as one transaction with one sync (group commit); reads go to a
/// few ``SQLiteReaders`` that see the last committed state and run side by side. Every statement is prepared once per
/// connection and reused. On PostgreSQL, each write is a serializable transaction on one of a pool of connections
/// (``PostgresWriter``), run again when the server reports a serialization failure: the logic, written for SQLite's
/// one writer, keeps its meaning with many writers on many nodes.
public final class SQLStore: Store, DispatchStore {
    let writer: any StoreWriter
    let reader: any StoreReader
    /// The database the store is on.
    public let dialect: SQLDialect
    /// Whether ``close()`` was called.
    private let closed = Mutex(false)
    /// Where this store keeps its data, for logs: the SQLite file's path, or the PostgreSQL server and database
    /// (never a password).
    public let location: String

    /// This process, among the nodes that share a database: the holder of its housekeeping lease.
    let nodeID = "node-" + UUID().uuidString.lowercased()

    /// Read connections a store opens unless told otherwise: a fan-out's pages, the API's reads and the sweepers'
    /// never wait for one another on a 2-core machine.
    public static let defaultReaders = 3

    /// Wake-ups between the nodes that share the database: `nil` on SQLite, which one process uses.
    public let nodeWakeChannel: NodeWakeChannel?

    /// On PostgreSQL, the reads of an activity by its key (every update and end reads its activity before it is
    /// written) that are asked for together, sent as one statement (``CoalescedReads``); `nil` on SQLite, where a read
    /// is a call into the library on a thread that waits for nothing else.
    let activityReads: CoalescedReads<ActivityKey, ActivityRecord>?

    /// Keys (of activities, of schemas) read in one coalesced statement, at most.
    static let keysPerRead = 500

    /// On PostgreSQL, the reads of an attributes type's schema (every update and end of an activity a phone registered
    /// reads the schema of its attributes type, to check the content state) that are asked for together, sent as one
    /// statement (``CoalescedReads``), as ``activityReads`` are; `nil` on SQLite.
    let schemaReads: CoalescedReads<SchemaKey, StoredSchema>?

    /// The database's secret for ``PublicNumbers`` (read, or made, by ``migrate(logger:)``), and each app's numbers.
    private let publicNumberKeys = Mutex<(secret: [UInt8]?, apps: [String: PublicNumbers])>((nil, [:]))

    init(
        dialect: SQLDialect, location: String, writer: any StoreWriter, reader: any StoreReader,
        nodeWakeChannel: NodeWakeChannel? = nil
    ) {
        self.nodeWakeChannel = nodeWakeChannel
        self.dialect = dialect
        self.location = location
        self.writer = writer
        self.reader = reader
        // One batch at a time: they go to the readers' connection opened with their settings (``keyedReadSettings``) for
        // the API's requests (``ReadLane/requests``).
        activityReads =
            dialect == .postgres
            ? CoalescedReads(concurrency: 1, maximumBatch: Self.keysPerRead) { keys in
                try await Self.activities(keys, on: reader)
            }
            : nil
        schemaReads =
            dialect == .postgres
            ? CoalescedReads(concurrency: 1, maximumBatch: Self.keysPerRead) { keys in
                try await Self.schemas(keys, on: reader)
            }
            : nil
    }

    /// Opens (creating if needed) the SQLite database at `path` and brings its schema up to date.
    public static func open(
        path: String, readers: Int = defaultReaders, logger: Logger = Logger(label: "liveline.store")
    ) async throws -> SQLStore {
        // The writer first: it creates the file and switches it to WAL before any reader opens it.
        let writer = try SQLiteWriter(path: path)
        let reader: SQLiteReaders
        do {
            reader = try SQLiteReaders(path: path, count: readers)
        } catch {
            try? await writer.close()
            throw error
        }
        let store = SQLStore(dialect: .sqlite, location: path, writer: writer, reader: reader)
        do {
            try await store.migrate(logger: logger)
        } catch {
            try? await store.close()
            throw error
        }
        return store
    }

    /// Write connections a PostgreSQL store opens unless told otherwise.
    public static let defaultPostgresWriters = 8

    /// Opens the PostgreSQL database at `url` and brings its schema up to date (nodes starting at once take turns).
    /// `writers` and `readers` are the sizes of its two connection pools; the writers' opens up to 3 more for registrations
    /// and updates (``PostgresPool/groupConnectionCount(of:)``) and up to 4 more for the delivery engine's writes (opened
    /// with their settings, ``engineSettings``: ``PostgresPool/bookkeepingConnectionCount(of:)``) and as many for its
    /// claims; the readers' two more, opened with their planner settings (``keyedReadSettings``), one for each
    /// ``ReadLane``: the API's reads of activities and schemas by key, and the engine's reads of its rows by key and its
    /// question of when the next activity is due.
    public static func open(
        postgres url: PostgresDatabaseURL, writers: Int = defaultPostgresWriters, readers: Int = defaultReaders,
        logger: Logger = Logger(label: "liveline.store")
    ) async throws -> SQLStore {
        let writer = try await PostgresPool(url: url, count: writers, bookkeepingUnder: engineSettings, logger: logger)
        let reader: PostgresPool
        do {
            reader = try await PostgresPool(url: url, count: readers, groupsWrites: false, readsUnder: keyedReadSettings, logger: logger)
        } catch {
            try? await writer.close()
            throw error
        }
        let store = SQLStore(
            dialect: .postgres, location: url.description, writer: writer, reader: reader,
            nodeWakeChannel: NodeWakeChannel(url: url, logger: logger)
        )
        do {
            try await store.migrate(logger: logger)
        } catch {
            try? await store.close()
            throw error
        }
        return store
    }

    /// The schema version the database is at.
    public func schemaVersion() async throws -> Int {
        let rows = try await reader.query("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations")
        return rows.first?.column("v")?.integer ?? 0
    }

    /// The schema steps of this store's database.
    var migrations: [Migration] {
        switch dialect {
        case .sqlite: SQLiteMigrations.all
        case .postgres: PostgresMigrations.all
        }
    }

    /// Brings the schema up to date, in one transaction. On PostgreSQL, nodes starting at once take turns: the first
    /// applies the missing steps under a transaction-scoped advisory lock, the others then find nothing to do.
    func migrate(logger: Logger) async throws {
        let migrations = self.migrations
        let dialect = self.dialect
        let secret = try await transaction { db in
            if dialect == .postgres {
                // At READ COMMITTED, not the writes' SERIALIZABLE: a serializable transaction reads the snapshot taken
                // when its first statement began, that is before the lock was granted, so a node that waited for it
                // would not see the steps the node before it committed, run them again and fail ("relation already
                // exists"). At READ COMMITTED each statement after the lock sees them; the lock orders the DDL.
                try db.query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                try db.query("SELECT pg_advisory_xact_lock(\(PostgresDialect.migrationLockKey))")
            }
            let integer = dialect == .sqlite ? "INTEGER" : "BIGINT"
            try db.query(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version \(integer) PRIMARY KEY, name TEXT NOT NULL, applied_at \(integer) NOT NULL)"
            )
            let rows = try db.query("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations")
            let current = rows.first?.column("v")?.integer ?? 0
            let latest = migrations.last?.version ?? 0
            if current > latest { throw StoreError.schemaTooNew(found: current, supported: latest) }
            for migration in migrations where migration.version > current {
                logger.info("Applying database migration", metadata: ["version": "\(migration.version)", "name": "\(migration.name)"])
                for statement in migration.statements {
                    try db.query(statement)
                }
                try db.query(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    [.integer(migration.version), .text(migration.name), .integer(Self.millis(Date()))]
                )
            }
            // The secret of the apps' public numbers: made once per database, the same for every node that shares it.
            try db.query(
                "INSERT INTO store_secrets (name, value) VALUES ('public_numbers', ?) ON CONFLICT (name) DO NOTHING",
                [.blob(ByteBuffer(bytes: CredentialSealer.newMasterKey()))]
            )
            guard let secret = try db.query("SELECT value FROM store_secrets WHERE name = 'public_numbers'").first?.column("value")?.blob,
                secret.readableBytes == 32
            else { throw CorruptRow(column: "store_secrets.value") }
            return Array(buffer: secret)
        }
        publicNumberKeys.withLock { $0.secret = secret }
    }

    /// The numbers the app `appID` sees in place of the database's shared counters.
    public func publicNumbers(appID: String) -> PublicNumbers {
        publicNumberKeys.withLock { keys in
            if let numbers = keys.apps[appID] { return numbers }
            guard let secret = keys.secret else { preconditionFailure("the store was not opened (migrate(logger:) reads the secret)") }
            let numbers = PublicNumbers(secret: secret, appID: appID)
            keys.apps[appID] = numbers
            return numbers
        }
    }

    /// Runs `body` as one write transaction (shared, through group commit, with the writes that arrive with it):
    /// its changes commit together, or not at all when it throws.
    func transaction<T: Sendable>(
        durability: Durability = .full, isolation: WriteIsolation = .serializable, _ body: @escaping @Sendable (any SQLConnection) throws -> T
    ) async throws -> T {
        try await writer.write(durability: durability, isolation: isolation, body)
    }

    /// Runs `statements` in one write transaction, with PostgreSQL's `settings` for it (``SQLConnection/setLocal(_:)``).
    func transaction(
        statements: [(sql: String, binds: [SQLiteData])], durability: Durability = .full, isolation: WriteIsolation = .serializable,
        settings: [(name: String, value: String)] = []
    ) async throws {
        try await transaction(parts: [statements], durability: durability, isolation: isolation, settings: settings)
    }

    /// Runs the statements of `parts` as one write, with PostgreSQL's `settings`; a ``Durability/bookkeeping`` write may
    /// commit part by part (``StoreWriter/writeStatements(parts:durability:isolation:settings:)``), so each part must be
    /// whole on its own.
    func transaction(
        parts: [[(sql: String, binds: [SQLiteData])]], durability: Durability, isolation: WriteIsolation = .serializable,
        settings: [(name: String, value: String)] = []
    ) async throws {
        try await writer.writeStatements(parts: parts, durability: durability, isolation: isolation, settings: settings)
    }

    /// Runs one statement as a write of its own.
    func write(
        _ sql: String, _ binds: [SQLiteData], durability: Durability = .full, isolation: WriteIsolation = .serializable
    ) async throws -> [StoreRow] {
        try await writer.write(durability: durability, isolation: isolation) { db in try db.query(sql, binds) }
    }

    public func ping() async throws {
        _ = try await reader.query("SELECT 1")
    }

    public func close() async throws {
        // Closing again is harmless: the connections and their threads are gone already.
        guard closed.withLock({ closed in defer { closed = true }; return !closed }) else { return }
        if dialect == .postgres {
            // The housekeeping lease this node holds goes with it, so that another node sweeps at its next look, not
            // once the lease has run out (up to five minutes after every node was restarted). Best effort: a node that
            // cannot say so leaves the lease to run out, as a dead node's does.
            _ = try? await write("DELETE FROM housekeeping_lease WHERE id = 1 AND owner = ?", [.text(nodeID)])
        }
        try await writer.close()
        try await reader.close()
    }

    // MARK: Apps and keys

    public func createApp(_ app: AppRecord, keys: [APIKeyRecord]) async throws {
        try await transaction { db in
            let existing = try db.query("SELECT 1 FROM apps WHERE id = ?", [.text(app.id)])
            if !existing.isEmpty { throw StoreError.duplicateApp }
            _ = try db.query(
                "INSERT INTO apps (id, name, bundle_id, android_package, created_at, audience_from) VALUES (?, ?, ?, ?, ?, ?)",
                [.text(app.id), .text(app.name), .text(app.bundleID), Self.text(app.androidPackage), .integer(Self.millis(app.createdAt)),
                 .text(app.audienceFrom.rawValue)]
            )
            for key in keys { try Self.insert(key, into: db) }
        }
    }

    public func apps() async throws -> [AppRecord] {
        try await reader.query("SELECT * FROM apps ORDER BY created_at, id").map(Self.app(from:))
    }

    public func app(id: String) async throws -> AppRecord? {
        try await reader.query("SELECT * FROM apps WHERE id = ?", [.text(id)]).first.map(Self.app(from:))
    }

    public func replaceKeys(appID: String, with keys: [APIKeyRecord]) async throws {
        let dialect = dialect
        try await transaction { db in
            let existing = try db.query("SELECT 1 FROM apps WHERE id = ?", [.text(appID)])
            if existing.isEmpty { throw StoreError.appNotFound }
            let now = keys.first?.createdAt ?? Date()
            _ = try db.query(
                "UPDATE api_keys SET revoked_at = ? WHERE app_id = ? AND revoked_at IS NULL",
                [.integer(Self.millis(now)), .text(appID)]
            )
            for key in keys { try Self.insert(key, into: db) }
            try Self.tellNodes(.keysRevoked(appID: appID), dialect: dialect, on: db)
        }
    }

    public func deleteApp(id: String, leavingChannels: Bool) async throws -> AppDeletion? {
        let dialect = dialect
        return try await transaction { db in
            let binds: [SQLiteData] = [.text(id)]
            guard let app = try db.query("SELECT * FROM apps WHERE id = ?", binds).first.map(Self.app(from:)) else { return nil }
            // Read in this transaction, so that a channel created since the caller deleted the others is counted.
            let held = try db.query(Self.heldChannelsSQL, binds).map { try $0.string("channel_id") }
            if !held.isEmpty, !leavingChannels { throw StoreError.channelsHeld(count: held.count) }
            let activities = try db.query("SELECT COUNT(*) AS n FROM activities WHERE app_id = ?", binds).first?.column("n")?.integer ?? 0
            let devices = try db.query("SELECT COUNT(*) AS n FROM devices WHERE app_id = ?", binds).first?.column("n")?.integer ?? 0
            if dialect == .postgres,
                let highest = try db.query("SELECT MAX(id) AS highest FROM events WHERE app_id = ?", binds).first?.column("highest")?.integer
            {
                // Were the app's the newest events, the next ones (of other apps) would take positions the feed has
                // already given out, under the positions the other apps' webhooks have scanned up to.
                try Self.keepFeedAbove(highest, on: db)
            }
            // The tables without a foreign key to the app (`events` on PostgreSQL since its step 17; on SQLite its key
            // would have removed them); the others go with its row (`ON DELETE CASCADE`). A registration, update or end
            // that commits while this (serializable) deletion runs holds or changes a row the cascade deletes, so the
            // deletion fails to serialize and runs again, seeing that write's event.
            for table in ["delivery_segments", "device_tags", "push_to_start_tokens", "events"] {
                try db.execute("DELETE FROM \(table) WHERE app_id = ?", binds)
            }
            try db.execute("DELETE FROM apps WHERE id = ?", binds)
            try Self.tellNodes(.appDeleted(appID: id), dialect: dialect, on: db)
            return AppDeletion(app: app, activities: activities, devices: devices, channelsLeft: held)
        }
    }

    /// On PostgreSQL, tells every node sharing the database of `notice` when (and only if) the transaction writing
    /// it commits (``AppNotice``). On SQLite there are no other nodes; a one-shot command beside a server is not heard.
    private static func tellNodes(_ notice: AppNotice, dialect: SQLDialect, on db: any SQLConnection) throws {
        guard dialect == .postgres, let wire = notice.wire else { return }
        try db.execute("SELECT pg_notify(?, ?)", [.text(AppNotice.channel), .text(wire)])
    }

    public func apiKey(id: String) async throws -> APIKeyRecord? {
        let rows = try await reader.query("SELECT * FROM api_keys WHERE id = ? AND revoked_at IS NULL", [.text(id)])
        guard let row = rows.first else { return nil }
        return APIKeyRecord(
            id: try row.string("id"),
            appID: try row.string("app_id"),
            scope: APIKeyScope(rawValue: try row.string("scope")) ?? .publishable,
            hash: Array(buffer: row.column("hash")?.blob ?? ByteBuffer()),
            createdAt: try row.date("created_at")
        )
    }

    private static func insert(_ key: APIKeyRecord, into db: any SQLConnection) throws {
        _ = try db.query(
            "INSERT INTO api_keys (id, app_id, scope, hash, created_at) VALUES (?, ?, ?, ?, ?)",
            [.text(key.id), .text(key.appID), .text(key.scope.rawValue), .blob(ByteBuffer(bytes: key.hash)), .integer(millis(key.createdAt))]
        )
    }

    // MARK: Lifecycle

    public func registerInstance(_ registration: InstanceRegistration, at now: Date) async throws -> RegistrationResult {
        let r = registration
        // On PostgreSQL the registration reads the activity's row under a lock that it may upgrade no further
        // (`FOR NO KEY UPDATE`): it rewrites the row when the activity has a state (to make it pending for the new
        // phone), and two registrations that both held a share lock and both wanted to write deadlocked, PostgreSQL
        // failing one of them, again and again while phones joined a live activity together. Registrations of one
        // activity so take turns, as updates and ends of it do; the instances' foreign keys take only key-share locks,
        // which this one does not block. Serializable, concurrent registrations to one activity failed one another on
        // the index pages their new instances share. Registrations and updates arriving together share a commit
        // (``WriteIsolation/grouped(key:)``): the activity's row first, then the device's instance.
        // On PostgreSQL, registrations queued together run as one set (``RegistrationWrite``) where they can.
        return try await writer.write(
            durability: .full, isolation: .grouped(key: WriteIsolation.groupKey(r.appID, r.activityID, r.deviceID)),
            member: RegistrationWrite(registration: r, now: now)
        ) { db in
            let nowMillis = Self.millis(now)
            let key: [SQLiteData] = [.text(r.appID), .text(r.activityID)]
            // The activity's row, and the device's instance under an exclusive lock on PostgreSQL: two registrations of
            // one device (a new token and a retry of the old one) take turns, the second deciding on what the first
            // wrote. Both reads go out together (one round trip on PostgreSQL), the activity's lock first.
            let found = try db.queries([
                ("SELECT state, attributes_type, sequence, channel_id, pass_counter FROM activities WHERE app_id = ? AND activity_id = ?"
                    + db.rowLock("FOR NO KEY UPDATE"), key),
                (db.dialect == .postgres ? Self.instanceReadLocking : Self.instanceRead, key + [.text(r.deviceID)]),
            ])
            let activity = found[0].first
            let existing = try found[1].first.map(Self.instance(from:))
            // A phone subscribed to a channel names the activity's own.
            if let channelID = r.channelID, activity?.column("channel_id")?.string != channelID { throw StoreError.channelMismatch }
            if let activity {
                if try activity.string("state") == ActivityState.ended.rawValue {
                    // An ended activity takes no new instance and no new token, but for an iPhone it started remotely whose
                    // app registers its update token only now: its push-to-start token took the start and can take
                    // nothing else, so the end reaches that phone only at the token registered here.
                    guard let existing, Self.startedAwaitingItsToken(existing, registration: r) else { throw StoreError.activityEnded }
                }
                if activity.column("attributes_type")?.string == nil, r.attributesType != nil {
                    // Attributes come from the first registration that carries them.
                    try db.execute(
                        "UPDATE activities SET attributes_type = ?, attributes = ?, updated_at = ? WHERE app_id = ? AND activity_id = ?",
                        [Self.text(r.attributesType), Self.json(r.attributes), .integer(nowMillis), .text(r.appID), .text(r.activityID)]
                    )
                }
            } else {
                try db.execute(
                    """
                    INSERT INTO activities (app_id, activity_id, attributes_type, attributes, state, sequence, created_at, updated_at)
                    VALUES (?, ?, ?, ?, ?, 0, ?, ?)
                    """,
                    [.text(r.appID), .text(r.activityID), Self.text(r.attributesType), Self.json(r.attributes),
                     .text(ActivityState.active.rawValue), .integer(nowMillis), .integer(nowMillis)]
                )
            }
            // Whether the activity has an accepted state for a new instance or token to be caught up on.
            let hasState = (activity?.column("sequence")?.integer ?? 0) > 0
            // The pass the instance joins in (``DeliveryMark``): under the activity's lock, which a claim raising the
            // counter waits for on PostgreSQL (and SQLite's one writer orders them), so that a pass either reads this
            // instance or is later than this value.
            let joinedPass = activity?.column("pass_counter")?.integer ?? 0
            guard var instance = existing else {
                var statements: [(sql: String, binds: [SQLiteData])] = [(
                    """
                    INSERT INTO instances (app_id, activity_id, device_id, platform, push_token, user_id, state, created_at, updated_at,
                        priority10_tally, channel_id, joined_pass)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                    [.text(r.appID), .text(r.activityID), .text(r.deviceID), .text(r.platform.rawValue), .text(r.pushToken),
                     Self.text(r.userID), .text(InstanceState.active.rawValue), .integer(nowMillis), .integer(nowMillis),
                     Self.emptyPriority10Tally(for: r.platform, at: nowMillis), Self.text(r.channelID), .integer(joinedPass)]
                )]
                // A newcomer to an activity with accepted state is caught up (a channel subscriber by the channel); a new
                // activity has none yet.
                let catchUp = hasState && r.channelID == nil
                if catchUp { statements.append(Self.markPendingStatement(appID: r.appID, activityID: r.activityID)) }
                statements.append(Self.eventStatement(Self.registrationEvent(r, confirmedStart: false), at: now))
                // The new instance, the activity's row and the event: rows of their own, none read by another.
                try db.executeTogether(statements)
                return RegistrationResult(change: .created, instance: Self.newInstance(r, nowMillis: nowMillis), needsDelivery: catchUp)
            }
            // A device id is one installation: its platform never changes (as for devices; the instance's priority-10
            // tally and its pushes are the platform's).
            if instance.platform != r.platform { throw StoreError.platformMismatch(registered: instance.platform) }
            let newUserID = r.userID ?? instance.userID
            // A subscription to the channel counts as a token of its own: it replaces the token (or the push-to-start
            // token of a remote start), and a token replaces it.
            let tokenChanged = instance.pushToken != r.pushToken || instance.channelID != r.channelID
            let wasStarting = instance.state == .starting
            // The push service refused the token, and the phone registers it again: it vouches for it (Apple: stop
            // sending "until the device registers a token with a later timestamp"), as for a dropped push-to-start
            // token. A refusal that was not the token's fault (a build of the app on APNs' other environment, the
            // service's `BadDeviceToken`) so heals when the phones next register.
            let reRegistered = instance.state == .invalidated
            // A new token, the phone confirming a remotely started instance (an Android phone registers the FCM token
            // its start went to), or a refused token registered again.
            let registered = tokenChanged || wasStarting || reRegistered
            let newState = registered ? instance.state.applying(.tokenRegistered) : instance.state
            guard tokenChanged || instance.userID != newUserID || newState != instance.state else {
                return RegistrationResult(change: .unchanged, instance: instance)
            }
            instance.pushToken = r.pushToken
            instance.channelID = r.channelID
            instance.userID = newUserID
            instance.state = newState
            instance.updatedAt = Self.date(nowMillis)
            if tokenChanged && !wasStarting {
                // A new token has received nothing yet: it gets the latest state at once. (A remotely started iPhone's
                // new token belongs to the activity its start created, which shows what the start carried.)
                instance.deliveredSequence = 0
            }
            // A registration that makes the instance deliverable again, or gives it a token, joins it to the activity's
            // current pass: marks of passes before speak for it no longer (it was not, or not at this token, sent
            // them). What they counted goes into its row first: its delivered sequence (read with them above) and its
            // priority-10 pushes (the budget is the Live Activity's, whatever its token).
            if registered {
                if instance.platform == .ios, instance.joinedPass < Int64(joinedPass) {
                    let since = Int64(nowMillis / 1000) - Priority10Tally.windowSeconds
                    let marks = try db.query(Self.priority10MarksQuery, key + [.integer(Int(since))]).map(Self.mark(from:))
                    instance.priority10 = Priority10MarkIndex(marks).counting(instance.priority10, for: instance)
                }
                instance.joinedPass = Int64(joinedPass)
            }
            try db.execute(
                """
                UPDATE instances SET platform = ?, push_token = ?, user_id = ?, state = ?, delivered_sequence = ?, updated_at = ?,
                    channel_id = ?, joined_pass = ?, priority10_tally = ?
                WHERE app_id = ? AND activity_id = ? AND device_id = ?
                """,
                [.text(r.platform.rawValue), .text(r.pushToken), Self.text(newUserID), .text(newState.rawValue),
                 .integer(Int(instance.deliveredSequence)), .integer(nowMillis), Self.text(r.channelID),
                 .integer(Int(instance.joinedPass)), instance.platform == .ios ? .integer(Int(instance.priority10.packed)) : .null,
                 .text(r.appID), .text(r.activityID), .text(r.deviceID)]
            )
            let behind = instance.deliveredSequence < Int64(activity?.column("sequence")?.integer ?? 0)
            let needsDelivery = registered && newState.receivesPushes && behind && r.channelID == nil
            if needsDelivery { try Self.markPending(appID: r.appID, activityID: r.activityID, in: db) }
            // A remote start confirmed is the phone's first registration; a new token on a watching instance, a rotation;
            // a refused token registered again, a registration.
            if registered {
                try Self.record(
                    NewEvent(
                        tokenChanged && !wasStarting ? .instanceTokenRotated : .instanceRegistered,
                        appID: r.appID, activityID: r.activityID, deviceID: r.deviceID,
                        data: Self.registrationData(r, confirmedStart: wasStarting)
                    ),
                    at: now, on: db
                )
            }
            return RegistrationResult(change: .updated, instance: instance, needsDelivery: needsDelivery)
        }
    }

    /// Whether `instance` is an iPhone started remotely that has not registered a token of its own yet, and `registration`
    /// is its app registering the update token of the Live Activity the start created (the same platform, a token, no
    /// channel).
    static func startedAwaitingItsToken(_ instance: InstanceRecord, registration: InstanceRegistration) -> Bool {
        instance.state == .starting && instance.platform == .ios && registration.platform == .ios && registration.channelID == nil
            && !registration.pushToken.isEmpty
    }

    // An update only reads and writes its activity's row, which it locks first on PostgreSQL (``head(appID:activityID:withState:locking:on:)``):
    // updates of one activity run one after another, and updates of different activities never fail each other.
    public func acceptUpdate(_ update: ActivityUpdate, at now: Date) async throws -> AcceptedSequence {
        try await transaction(isolation: .grouped(key: WriteIsolation.groupKey(update.appID, update.activityID))) { db in
            try Self.acceptUpdate(update, at: now, on: db)
        }
    }

    public func acceptUpdate(
        _ update: ActivityUpdate, at now: Date, idempotency: IdempotencyClaim<AcceptedSequence>?
    ) async throws -> IdempotentOutcome<AcceptedSequence> {
        // Besides its activity's row, an update with an Idempotency-Key inserts the key's record, which a concurrent
        // retry of the same request waits for: two groups that each hold the other's key would wait in a cycle, which
        // PostgreSQL breaks as a deadlock (the group runs again). Retries of one request go to one activity, so they
        // queue on its row first.
        guard idempotency != nil else {
            // Without a key to remember, updates queued together run as one set on PostgreSQL (``UpdateWrite``).
            return try await writer.write(
                durability: .full, isolation: .grouped(key: WriteIsolation.groupKey(update.appID, update.activityID)),
                member: UpdateWrite(update: update, now: now)
            ) { db in .performed(try Self.acceptUpdate(update, at: now, on: db)) }
        }
        return try await transaction(isolation: .grouped(key: WriteIsolation.groupKey(update.appID, update.activityID))) { db in
            try Self.idempotently(idempotency, appID: update.appID, at: now, on: db) { try Self.acceptUpdate(update, at: now, on: db) }
        }
    }

    /// The state `update` makes after `head` at `now` (Core's rule), or the Store's refusal.
    static func nextState(_ update: ActivityUpdate, after head: ActivityHead?, at now: Date) throws(StoreError) -> LiveActivityState {
        do throws(NextStateRefusal) {
            return try LiveActivityState.update(
                activityID: update.activityID, after: head, contentState: update.contentState, staleDate: update.staleDate,
                relevanceScore: update.relevanceScore, alert: update.alert, now: now
            )
        } catch {
            throw storeError(error)
        }
    }

    /// The values an accepted update writes in its activity's row, in this order: `sequence`, `event`, `sequence_at`,
    /// `timestamp_seconds`, `content_state`, `alert`, `stale_date`, `relevance_score`, `priority`, `updated_at`,
    /// `content_shape` and `min_update_interval` (the last two are kept when nil).
    static func updatedActivityValues(_ update: ActivityUpdate, next: LiveActivityState, nowMillis: Int) -> [SQLiteData] {
        [.integer(Int(next.sequence)), .text(next.event.rawValue), .integer(nowMillis), .integer(Int(next.timestamp)),
         json(next.contentState), json(next.alert?.json), integer(next.staleDate), real(next.relevanceScore),
         integer(update.priority.map(Int64.init)), .integer(nowMillis), shape(update.contentShape), real(update.minUpdateInterval)]
    }

    /// When an activity whose update was just accepted is due, as SQL over its row (old values) with two binds of the
    /// update's `minUpdateInterval`: at once (`NULL`), whatever retry time a pass left for the sequence before, so that a
    /// phone left for a later pass holds no one back; or, when its updates are rate shaped and a state went out, when
    /// the next may go (the last send plus the interval: the engine would only hand a claim back until then).
    static let updatedDispatchTime = dispatchTime(interval: "COALESCE(?, min_update_interval)", lastSentAt: "last_sent_at")

    /// ``updatedDispatchTime`` over the given SQL for the activity's interval (seconds) and last send (milliseconds).
    static func dispatchTime(interval: String, lastSentAt: String) -> String {
        "CASE WHEN \(interval) > 0 AND \(lastSentAt) IS NOT NULL THEN \(lastSentAt) + CAST(\(interval) * 1000 AS BIGINT) ELSE NULL END"
    }

    /// The event of an accepted update: the activity's start when it had no state before, an update otherwise.
    static func updateEvent(_ update: ActivityUpdate, after head: ActivityHead?, next: LiveActivityState) -> NewEvent {
        NewEvent(
            (head?.sequence ?? 0) == 0 ? .activityStarted : .activityUpdated, appID: update.appID, activityID: update.activityID,
            data: ["sequence": .integer(next.sequence), "via": "update"]
        )
    }

    /// Accepts an update on the writer, inside its transaction: the activity's next state, its row and the event.
    ///
    /// An activity the update creates is written as delivered (`dispatched_sequence` at its sequence), where every other
    /// accepted change leaves its activity pending for the engine: there is nobody to send it to and nothing else behind
    /// it. An instance, a start audience, a channel and a fan-out's slices each name an activity that exists, so none can
    /// be older than this row. A phone that registers afterwards is caught up as on any activity with accepted state
    /// (``markPending(appID:activityID:in:)``; a registration set's `catchingUp`): its registration either finds this row
    /// committed, or collides with its insert and runs again. Left pending, each such activity cost the engine a claim
    /// that found nothing behind and a rewrite of the row to say so: on PostgreSQL, about as much as the insert itself.
    static func acceptUpdate(_ update: ActivityUpdate, at now: Date, on db: any SQLConnection) throws -> AcceptedSequence {
        let head = try Self.head(appID: update.appID, activityID: update.activityID, withState: false, locking: true, on: db)
        let next = try nextState(update, after: head, at: now)
        let nowMillis = Self.millis(now)
        let values = updatedActivityValues(update, next: next, nowMillis: nowMillis)
        // The row is locked (or new), so nothing after depends on these statements' answers: on PostgreSQL they go out
        // as one statement without waiting, and a failure fails the write at its commit.
        let activityRow: (sql: String, binds: [SQLiteData])
        if head != nil {
            activityRow = (
                """
                UPDATE activities SET sequence = ?, event = ?, sequence_at = ?, timestamp_seconds = ?, content_state = ?, alert = ?,
                    stale_date = ?, relevance_score = ?, priority = ?, updated_at = ?, content_shape = COALESCE(?, content_shape),
                    min_update_interval = COALESCE(?, min_update_interval), next_dispatch_at = \(Self.updatedDispatchTime)
                WHERE app_id = ? AND activity_id = ?
                """,
                values + [Self.real(update.minUpdateInterval), Self.real(update.minUpdateInterval), .text(update.appID), .text(update.activityID)]
            )
        } else {
            // Created by its first update: nothing to deliver yet (see above).
            activityRow = (
                """
                INSERT INTO activities (app_id, activity_id, state, created_at, sequence, event, sequence_at, timestamp_seconds,
                    content_state, alert, stale_date, relevance_score, priority, updated_at, content_shape, min_update_interval,
                    dispatched_sequence)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """,
                [.text(update.appID), .text(update.activityID), .text(ActivityState.active.rawValue), .integer(nowMillis)] + values
                    + [.integer(Int(next.sequence))]
            )
        }
        // The activity's row and the event: rows of their own, neither read by the other.
        try db.executeTogether([activityRow, eventStatement(updateEvent(update, after: head, next: next), at: now)])
        return AcceptedSequence(
            activityID: update.activityID, sequence: next.sequence, event: .update, acceptedAt: Self.date(nowMillis), needsDelivery: head != nil
        )
    }

    public func endActivity(_ end: ActivityEnd, at now: Date) async throws -> AcceptedSequence {
        try await transaction { db in try Self.endActivity(end, at: now, on: db) }
    }

    public func endActivity(
        _ end: ActivityEnd, at now: Date, idempotency: IdempotencyClaim<AcceptedSequence>?
    ) async throws -> IdempotentOutcome<AcceptedSequence> {
        try await transaction { db in
            try Self.idempotently(idempotency, appID: end.appID, at: now, on: db) { try Self.endActivity(end, at: now, on: db) }
        }
    }

    /// Ends the activity on the writer, inside its transaction.
    static func endActivity(_ end: ActivityEnd, at now: Date, on db: any SQLConnection) throws -> AcceptedSequence {
        guard let head = try Self.head(appID: end.appID, activityID: end.activityID, withState: true, on: db) else {
            throw StoreError.activityNotFound
        }
        let next: LiveActivityState?
        do throws(NextStateRefusal) {
            next = try LiveActivityState.end(
                activityID: end.activityID, after: head, contentState: end.contentState, staleDate: end.staleDate,
                relevanceScore: end.relevanceScore, alert: end.alert, dismissalDate: end.dismissalDate, now: now
            )
        } catch {
            throw Self.storeError(error)
        }
        let nowMillis = Self.millis(now)
        // Without a final state (an activity that never had one), the end is only the next sequence.
        let (sequence, timestamp) = next.map { ($0.sequence, $0.timestamp) } ?? head.next(now: now)
        try db.query(
            """
            UPDATE activities SET state = ?, sequence = ?, event = ?, sequence_at = ?, timestamp_seconds = ?,
                content_state = ?, alert = ?, dismissal_date = ?, stale_date = ?, relevance_score = ?, priority = ?,
                updated_at = ?, ended_at = ?, end_reason = ?, next_dispatch_at = NULL
            WHERE app_id = ? AND activity_id = ?
            """,
            [.text(ActivityState.ended.rawValue), .integer(Int(sequence)), .text(LiveActivityEvent.end.rawValue), .integer(nowMillis),
             .integer(Int(timestamp)), Self.json(next?.contentState), Self.json(next?.alert?.json), Self.integer(next?.dismissalDate),
             Self.integer(next?.staleDate), Self.real(next?.relevanceScore), Self.integer(end.priority.map(Int64.init)),
             .integer(nowMillis), .integer(nowMillis), .text(end.reason.rawValue), .text(end.appID), .text(end.activityID)]
        )
        try record(
            NewEvent(
                .activityEnded, appID: end.appID, activityID: end.activityID,
                data: ["sequence": .integer(sequence), "endReason": .string(end.reason.rawValue)]
            ),
            at: now, on: db
        )
        return AcceptedSequence(activityID: end.activityID, sequence: sequence, event: .end, acceptedAt: Self.date(nowMillis))
    }

    /// Reads, on the writer (inside its transaction), what the activity's next state depends on; `nil` when there is no
    /// such activity yet. Only an end needs the current state (`withState`): an update reads and parses no JSON.
    /// `locking`: on PostgreSQL the row is read `FOR UPDATE`, for a write at ``WriteIsolation/lockingRows`` that
    /// changes it.
    static func head(
        appID: String, activityID: String, withState: Bool, locking: Bool = false, on db: any SQLConnection
    ) throws -> ActivityHead? {
        let select =
            withState
            ? """
            SELECT state, sequence, timestamp_seconds, content_state, stale_date, relevance_score
            FROM activities WHERE app_id = ? AND activity_id = ?
            """
            : "SELECT state, sequence, timestamp_seconds FROM activities WHERE app_id = ? AND activity_id = ?"
        let rows = try db.query(select + (locking ? db.rowLock("FOR UPDATE") : ""), [.text(appID), .text(activityID)])
        guard let row = rows.first else { return nil }
        return ActivityHead(
            state: ActivityState(rawValue: try row.string("state")) ?? .ended,
            sequence: Int64(row.column("sequence")?.integer ?? 0),
            timestamp: row.column("timestamp_seconds")?.integer.map(Int64.init),
            contentState: try row.json("content_state"),
            staleDate: row.column("stale_date")?.integer.map(Int64.init),
            relevanceScore: row.column("relevance_score")?.double
        )
    }

    /// The instance a registration of a device new to its activity creates at `nowMillis`.
    static func newInstance(_ r: InstanceRegistration, nowMillis: Int) -> InstanceRecord {
        InstanceRecord(
            appID: r.appID, activityID: r.activityID, deviceID: r.deviceID, platform: r.platform, pushToken: r.pushToken,
            userID: r.userID, state: .active, frequentPushesEnabled: nil, deliveredSequence: 0,
            createdAt: date(nowMillis), updatedAt: date(nowMillis), channelID: r.channelID
        )
    }

    /// The `instance.registered` event of a registration (`confirmedStart`: the phone confirming a remote start).
    static func registrationEvent(_ r: InstanceRegistration, confirmedStart: Bool) -> NewEvent {
        NewEvent(
            .instanceRegistered, appID: r.appID, activityID: r.activityID, deviceID: r.deviceID,
            data: registrationData(r, confirmedStart: confirmedStart)
        )
    }

    /// The `data` of an `instance.registered` or `instance.token_rotated` event.
    static func registrationData(_ registration: InstanceRegistration, confirmedStart: Bool) -> JSONValue {
        var data: [String: JSONValue] = ["platform": .string(registration.platform.rawValue)]
        if let channelID = registration.channelID { data["channelId"] = .string(channelID) }
        if confirmedStart { data["confirmedStart"] = true }
        return .object(data)
    }

    /// A refusal of Core's next-state rules as the Store's error.
    static func storeError(_ refusal: NextStateRefusal) -> StoreError {
        switch refusal {
        case .activityEnded: .activityEnded
        }
    }

    /// The read of ``activities(_:on:)``.
    static let activitiesByKey = """
        SELECT a.* FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, activity_id)
        JOIN activities a ON a.app_id = k.app_id AND a.activity_id = k.activity_id
        """

    /// The planner settings of the reads of activities by key (``activities(_:on:)``: every update and end reads its
    /// activity) on PostgreSQL: one plan kept (``PostgresHandle/keptPlans``), made without the values, and no sequential
    /// scans, hash joins, merge joins or sorts, so that the plan is the lookup by primary key the read was written for,
    /// whatever the table held when it was made. The readers' pool keeps a connection opened with them for each
    /// ``ReadLane``, where such a read is its statement alone: this read on the API's, the engine's reads by key and
    /// its question of when the next activity is due on the engine's (they hold ``dueSettings``; that question binds
    /// nothing and keeps its plan under any).
    ///
    /// Planned for its values, as the other readers' statements are (``PostgresHandle/plansForValues``), the read took
    /// 0.19 ms to plan and 0.08 ms to run: over 10,000 updates through the API (`pg_stat_statements`), 1,750 reads took
    /// 336 ms planning and 133 ms running. Left to choose (`plan_cache_mode` `auto`), PostgreSQL kept planning it for
    /// its values: for a few keys, that plan looks cheaper than one made for an array of unknown length.
    static let keyedReadSettings: [(name: String, value: String)] =
        [PostgresHandle.keptPlans, ("enable_hashjoin", "off"), ("enable_mergejoin", "off")] + dueSettings

    public func activityWithoutInstanceCounts(appID: String, activityID: String) async throws -> ActivityRecord? {
        if let activityReads { return try await activityReads.value(for: ActivityKey(appID: appID, activityID: activityID)) }
        return try await reader.query(
            "SELECT * FROM activities WHERE app_id = ? AND activity_id = ?", [.text(appID), .text(activityID)]
        ).first.map(Self.activity(from:))
    }

    /// The activities of `keys` that exist, read in one statement on PostgreSQL (it binds arrays), under
    /// ``keyedReadSettings``.
    static func activities(_ keys: [ActivityKey], on reader: any StoreReader) async throws -> [ActivityKey: ActivityRecord] {
        try await readByKeys(
            activitiesByKey, [PostgresArray.text(keys.map(\.appID)), PostgresArray.text(keys.map(\.activityID))], on: reader
        ) { row in
            let record = try activity(from: row)
            return (ActivityKey(appID: record.appID, activityID: record.activityID), record)
        }
    }

    /// The rows `sql` reads, run under ``keyedReadSettings``: on PostgreSQL on the readers' connection opened with them
    /// for the delivery engine (``ReadLane/delivery``), where it keeps one plan made without the values. For the
    /// engine's reads of one activity's rows by key (its pending instances, whether its fan-out is worth slicing, its
    /// app's credentials), which it asks for every activity it claims: planned for their values, over 5,000 activities
    /// of one instance each (`pg_stat_statements`, a watched burst of `bench api`), the pending instances' reads took
    /// 1,354 ms planning and 208 ms running, the look for slices 1,064 and 117, the credentials 265 and 65. Their one
    /// plan is the walk of the primary key they were written for, whatever the activity holds: no sorts, sequential
    /// scans, hash or merge joins (`PostgresPlanTests.engineReadsKeepTheirPlan`).
    func readKeepingPlan(_ sql: String, _ binds: [SQLiteData]) async throws -> [StoreRow] {
        try await Self.readKeepingPlan(sql, binds, in: .delivery, on: reader)
    }

    /// The rows `sql` reads on `reader` in `lane`, under ``keyedReadSettings`` (``readKeepingPlan(_:_:)``).
    static func readKeepingPlan(
        _ sql: String, _ binds: [SQLiteData], in lane: ReadLane, on reader: any StoreReader
    ) async throws -> [StoreRow] {
        try await reader.read(under: keyedReadSettings, in: lane) { db in
            try db.query(sql, binds, settings: keyedReadSettings)
        }
    }

    /// The rows `sql` reads (a statement by keys bound as arrays) for the API's requests (``ReadLane/requests``), run
    /// under ``keyedReadSettings``, each made a value and filed under its key by `make`.
    static func readByKeys<Key: Hashable, Value>(
        _ sql: String, _ binds: [SQLiteData], on reader: any StoreReader, _ make: (StoreRow) throws -> (Key, Value)
    ) async throws -> [Key: Value] {
        let rows = try await readKeepingPlan(sql, binds, in: .requests, on: reader)
        var found: [Key: Value] = [:]
        found.reserveCapacity(rows.count)
        for row in rows {
            let (key, value) = try make(row)
            found[key] = value
        }
        return found
    }

    public func activity(appID: String, activityID: String) async throws -> ActivityRecord? {
        guard var record = try await activityWithoutInstanceCounts(appID: appID, activityID: activityID) else { return nil }
        let counts = try await reader.query(
            "SELECT state, COUNT(*) AS n FROM instances WHERE app_id = ? AND activity_id = ? GROUP BY state",
            [.text(appID), .text(activityID)]
        )
        for count in counts {
            if let state = InstanceState(rawValue: try count.string("state")) {
                record.instanceCounts[state] = count.column("n")?.integer ?? 0
            }
        }
        return record
    }

    public func activities(appID: String, filter: ActivityFilter, cursor: String?, limit: Int) async throws -> Page<ActivityRecord> {
        var sql = "SELECT * FROM activities WHERE app_id = ?"
        var binds: [SQLiteData] = [.text(appID)]
        if let state = filter.state {
            sql += " AND state = ?"
            binds.append(.text(state.rawValue))
        }
        if let attributesType = filter.attributesType {
            sql += " AND attributes_type = ?"
            binds.append(.text(attributesType))
        }
        if let cursor {
            sql += " AND activity_id > ?"
            binds.append(.text(try Self.decodeCursor(cursor)))
        }
        sql += " ORDER BY activity_id LIMIT \(limit + 1)"
        let rows = try await reader.query(sql, binds)
        var items = try rows.prefix(limit).map(Self.activity(from:))
        if !items.isEmpty {
            // Instance counts for the whole page in one query.
            let placeholders = Array(repeating: "?", count: items.count).joined(separator: ",")
            let counts = try await reader.query(
                "SELECT activity_id, state, COUNT(*) AS n FROM instances WHERE app_id = ? AND activity_id IN (\(placeholders)) GROUP BY activity_id, state",
                [.text(appID)] + items.map { .text($0.activityID) }
            )
            var byActivity: [String: [InstanceState: Int]] = [:]
            for count in counts {
                if let state = InstanceState(rawValue: try count.string("state")) {
                    byActivity[try count.string("activity_id"), default: [:]][state] = count.column("n")?.integer ?? 0
                }
            }
            for index in items.indices { items[index].instanceCounts = byActivity[items[index].activityID] ?? [:] }
        }
        let next = rows.count > limit ? items.last.map { Self.encodeCursor($0.activityID) } : nil
        return Page(items: items, nextCursor: next)
    }

    public func instances(appID: String, activityID: String, cursor: String?, limit: Int) async throws -> Page<InstanceRecord> {
        var sql = "SELECT \(Self.instanceColumns) FROM instances WHERE app_id = ? AND activity_id = ?"
        var binds: [SQLiteData] = [.text(appID), .text(activityID)]
        if let cursor {
            sql += " AND device_id > ?"
            binds.append(.text(try Self.decodeCursor(cursor)))
        }
        sql += " ORDER BY device_id LIMIT \(limit + 1)"
        let rows = try await reader.query(sql, binds)
        let items = try Self.instances(from: rows.prefix(limit))
        let next = rows.count > limit ? items.last.map { Self.encodeCursor($0.deviceID) } : nil
        return Page(items: items, nextCursor: next)
    }

    public func recordInstanceEvent(
        appID: String, activityID: String, deviceID: String, event: InstanceEvent, at now: Date
    ) async throws -> InstanceRecord {
        try await transaction { db in
            try Self.recordInstanceEvent(appID: appID, activityID: activityID, deviceID: deviceID, event: event, at: now, on: db)
        }
    }

    public func recordInstanceEvent(
        appID: String, activityID: String, deviceID: String, event: InstanceEvent, at now: Date,
        idempotency: IdempotencyClaim<InstanceRecord>?
    ) async throws -> IdempotentOutcome<InstanceRecord> {
        try await transaction { db in
            try Self.idempotently(idempotency, appID: appID, at: now, on: db) {
                try Self.recordInstanceEvent(appID: appID, activityID: activityID, deviceID: deviceID, event: event, at: now, on: db)
            }
        }
    }

    /// Applies a device-reported event on the writer, inside its transaction.
    static func recordInstanceEvent(
        appID: String, activityID: String, deviceID: String, event: InstanceEvent, at now: Date, on db: any SQLConnection
    ) throws -> InstanceRecord {
        guard var instance = try db.query(
            Self.instanceRead, [.text(appID), .text(activityID), .text(deviceID)]
        ).first.map(Self.instance(from:)) else { throw StoreError.instanceNotFound }
        let newState = instance.state.applying(event)
        guard newState != instance.state else { return instance }
        instance.state = newState
        instance.updatedAt = Self.date(Self.millis(now))
        // What it was sent goes into its row: the marks and the settled sequence speak only for instances sent to.
        _ = try db.query(
            "UPDATE instances SET state = ?, updated_at = ?, delivered_sequence = ? WHERE app_id = ? AND activity_id = ? AND device_id = ?",
            [.text(newState.rawValue), .integer(Self.millis(now)), .integer(Int(instance.deliveredSequence)), .text(appID),
             .text(activityID), .text(deviceID)]
        )
        switch event {
        case .dismissedOnDevice, .endedOnDevice:
            try record(
                NewEvent(
                    event == .dismissedOnDevice ? .instanceDismissed : .instanceEnded, appID: appID, activityID: activityID, deviceID: deviceID,
                    data: ["platform": .string(instance.platform.rawValue), "reportedBy": "phone"]
                ),
                at: now, on: db
            )
        case .tokenRegistered, .tokenInvalidated, .endDelivered:
            break
        }
        return instance
    }

    public func setFrequentPushes(
        appID: String, activityID: String, deviceID: String, enabled: Bool, at now: Date
    ) async throws -> InstanceRecord {
        try await transaction { db in
            try Self.setFrequentPushes(appID: appID, activityID: activityID, deviceID: deviceID, enabled: enabled, at: now, on: db)
        }
    }

    public func setFrequentPushes(
        appID: String, activityID: String, deviceID: String, enabled: Bool, at now: Date,
        idempotency: IdempotencyClaim<InstanceRecord>?
    ) async throws -> IdempotentOutcome<InstanceRecord> {
        try await transaction { db in
            try Self.idempotently(idempotency, appID: appID, at: now, on: db) {
                try Self.setFrequentPushes(appID: appID, activityID: activityID, deviceID: deviceID, enabled: enabled, at: now, on: db)
            }
        }
    }

    /// Records the "frequent updates" setting on the writer, inside its transaction.
    static func setFrequentPushes(
        appID: String, activityID: String, deviceID: String, enabled: Bool, at now: Date, on db: any SQLConnection
    ) throws -> InstanceRecord {
        guard var instance = try db.query(
            Self.instanceRead, [.text(appID), .text(activityID), .text(deviceID)]
        ).first.map(Self.instance(from:)) else { throw StoreError.instanceNotFound }
        guard instance.frequentPushesEnabled != enabled else { return instance }
        instance.frequentPushesEnabled = enabled
        instance.updatedAt = Self.date(Self.millis(now))
        _ = try db.query(
            "UPDATE instances SET frequent_pushes = ?, updated_at = ? WHERE app_id = ? AND activity_id = ? AND device_id = ?",
            [.integer(enabled ? 1 : 0), .integer(Self.millis(now)), .text(appID), .text(activityID), .text(deviceID)]
        )
        return instance
    }

    /// Makes an activity with accepted state pending again, so a newly registered token is caught up.
    /// An instance's columns as the API shows them: its row's, with the delivered sequence its marks and its activity's
    /// settled sequence say (``effectiveDelivered(_:)``).
    static let instanceColumns = "*, \(effectiveDelivered("instances.")) AS effective_delivered"

    /// One instance by key (``instanceColumns``); its text made once, as the registrations read it for every request.
    /// Binds: the app, the activity, the device.
    static let instanceRead = "SELECT \(instanceColumns) FROM instances WHERE app_id = ? AND activity_id = ? AND device_id = ?"

    /// ``instanceRead`` under an exclusive lock on the row (PostgreSQL).
    static let instanceReadLocking = instanceRead + " FOR UPDATE"

    static func markPending(appID: String, activityID: String, in db: any SQLConnection) throws {
        let statement = markPendingStatement(appID: appID, activityID: activityID)
        try db.execute(statement.sql, statement.binds)
    }

    /// The statement of ``markPending(appID:activityID:in:)``.
    static func markPendingStatement(appID: String, activityID: String) -> (sql: String, binds: [SQLiteData]) {
        (
            "UPDATE activities SET dispatched_sequence = 0, next_dispatch_at = NULL WHERE app_id = ? AND activity_id = ? AND sequence > 0",
            [.text(appID), .text(activityID)]
        )
    }

    // MARK: Row mapping

    static func millis(_ date: Date) -> Int { Int((date.timeIntervalSince1970 * 1000).rounded()) }
    static func date(_ millis: Int) -> Date { Date(timeIntervalSince1970: TimeInterval(millis) / 1000) }
    static func text(_ value: String?) -> SQLiteData { value.map { .text($0) } ?? .null }
    static func integer(_ value: Int64?) -> SQLiteData { value.map { .integer(Int($0)) } ?? .null }
    static func real(_ value: Double?) -> SQLiteData { value.map { .float($0) } ?? .null }
    static func json(_ value: JSONValue?) -> SQLiteData { value.map { .text($0.encodedString) } ?? .null }
    static func shape(_ shape: JSONShape?) -> SQLiteData { json(shape.map { .object($0.kinds.mapValues(JSONValue.string)) }) }

    static func encodeCursor(_ key: String) -> String {
        Data(key.utf8).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    static func decodeCursor(_ cursor: String) throws -> String {
        var base64 = cursor.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        guard cursor.utf8.count <= 256, let data = Data(base64Encoded: base64), let key = String(data: data, encoding: .utf8),
            Identifier.isWellFormed(key)
        else { throw StoreError.invalidCursor }
        return key
    }

    static func app(from row: StoreRow) throws -> AppRecord {
        AppRecord(
            id: try row.string("id"), name: try row.string("name"), bundleID: try row.string("bundle_id"),
            androidPackage: row.column("android_package")?.string, createdAt: try row.date("created_at"),
            budget: BudgetOverride(
                hourly: row.column("budget_hourly")?.integer, hourlyWithFrequentPushes: row.column("budget_hourly_frequent")?.integer
            ),
            broadcastDefaults: BroadcastDefaults(
                delivery: row.column("default_delivery")?.string.flatMap(ActivityDelivery.init(rawValue:)),
                storagePolicy: row.column("default_channel_storage_policy")?.integer.map { $0 == 0 ? .none : .mostRecent }
            ),
            // A value this build does not know (written by a newer one) is read as the stricter.
            audienceFrom: row.column("audience_from")?.string.map { AudienceSource(rawValue: $0) ?? .backend } ?? .app
        )
    }

    static func activity(from row: StoreRow) throws -> ActivityRecord {
        ActivityRecord(
            appID: try row.string("app_id"),
            activityID: try row.string("activity_id"),
            attributesType: row.column("attributes_type")?.string,
            attributes: try row.json("attributes"),
            state: ActivityState(rawValue: try row.string("state")) ?? .ended,
            sequence: Int64(row.column("sequence")?.integer ?? 0),
            event: row.column("event")?.string.map(LiveActivityEvent.init(rawValue:)),
            sequenceAt: row.column("sequence_at")?.integer.map(date),
            timestampSeconds: row.column("timestamp_seconds")?.integer.map(Int64.init),
            dispatchedSequence: Int64(row.column("dispatched_sequence")?.integer ?? 0),
            contentState: try row.json("content_state"),
            alert: try row.json("alert").flatMap(LiveActivityAlert.init(json:)),
            staleDate: row.column("stale_date")?.integer.map(Int64.init),
            relevanceScore: row.column("relevance_score")?.double,
            priority: row.column("priority")?.integer,
            dismissalDate: row.column("dismissal_date")?.integer.map(Int64.init),
            createdAt: try row.date("created_at"),
            updatedAt: try row.date("updated_at"),
            endedAt: row.column("ended_at")?.integer.map(date),
            instanceCounts: [:],
            endReason: row.column("end_reason")?.string.flatMap(EndReason.init(rawValue:)),
            minUpdateInterval: row.column("min_update_interval")?.double,
            lastSentSequence: row.column("last_sent_sequence")?.integer.map(Int64.init),
            lastSentAt: row.column("last_sent_at")?.integer.map(date),
            budgetWarnedAt: row.column("budget_warned_at")?.integer.map(date),
            contentShape: try row.json("content_shape")?.objectValue.map { JSONShape(kinds: $0.compactMapValues(\.stringValue)) },
            startAlert: try row.json("start_alert").flatMap(LiveActivityAlert.init(json:)),
            delivery: row.column("delivery")?.string.flatMap(ActivityDelivery.init(rawValue:)) ?? .token,
            channel: channel(from: row),
            broadcastSequence: Int64(row.column("broadcast_sequence")?.integer ?? 0),
            broadcastPriority10: Priority10Tally(packed: Int64(row.column("broadcast_priority10_tally")?.integer ?? 0))
        )
    }

    /// The channel columns of an `activities` row.
    static func channel(from row: StoreRow) -> BroadcastChannel? {
        guard let id = row.column("channel_id")?.string else { return nil }
        return BroadcastChannel(
            id: id,
            storagePolicy: row.column("channel_storage_policy")?.integer == 0 ? .none : .mostRecent,
            status: row.column("channel_status")?.string.flatMap(ChannelStatus.init(rawValue:)) ?? .active,
            createdAt: row.column("channel_created_at")?.integer.map(date) ?? Date(timeIntervalSince1970: 0),
            deletedAt: row.column("channel_deleted_at")?.integer.map(date)
        )
    }

    static func instance(from row: StoreRow) throws -> InstanceRecord {
        try instance(from: row, at: InstanceColumns(row.columns))
    }

    /// The instances of an answer's rows, each column found by name once for all of them (a fan-out reads its
    /// instances a page of a thousand at a time: by name, each row cost 14 lookups in a dictionary).
    static func instances(from rows: some Collection<StoreRow>) throws -> [InstanceRecord] {
        guard let first = rows.first else { return [] }
        let columns = InstanceColumns(first.columns)
        return try rows.map { row in
            try instance(from: row, at: row.columns === columns.columns ? columns : InstanceColumns(row.columns))
        }
    }

    private static func instance(from row: StoreRow, at column: InstanceColumns) throws -> InstanceRecord {
        func string(_ index: Int?, _ name: String) throws -> String {
            guard case .text(let value) = row.column(at: index) else { throw CorruptRow(column: name) }
            return value
        }
        func date(_ index: Int?, _ name: String) throws -> Date {
            guard let value = row.column(at: index)?.integer else { throw CorruptRow(column: name) }
            return Self.date(value)
        }
        return InstanceRecord(
            appID: try string(column.appID, "app_id"),
            activityID: try string(column.activityID, "activity_id"),
            deviceID: try string(column.deviceID, "device_id"),
            platform: Platform(rawValue: try string(column.platform, "platform")) ?? .ios,
            pushToken: try string(column.pushToken, "push_token"),
            userID: row.column(at: column.userID)?.string,
            state: InstanceState(rawValue: try string(column.state, "state")) ?? .invalidated,
            frequentPushesEnabled: row.column(at: column.frequentPushes)?.integer.map { $0 != 0 },
            deliveredSequence: Int64(row.column(at: column.effectiveDelivered ?? column.deliveredSequence)?.integer ?? 0),
            createdAt: try date(column.createdAt, "created_at"),
            updatedAt: try date(column.updatedAt, "updated_at"),
            priority10: priority10Tally(packed: row.column(at: column.priority10Tally), times: row.column(at: column.priority10Sent)),
            channelID: row.column(at: column.channelID)?.string,
            joinedPass: Int64(row.column(at: column.joinedPass)?.integer ?? 0)
        )
    }
}

/// Where the columns of an instance's row are in the rows of one answer (which share their ``StoreRow/Columns``).
struct InstanceColumns {
    let columns: StoreRow.Columns
    let appID, activityID, deviceID, platform, pushToken, userID, state, frequentPushes, deliveredSequence: Int?
    let createdAt, updatedAt, priority10Tally, priority10Sent, channelID, joinedPass: Int?
    /// The delivered sequence with the activity's settled sequence and its marks (``SQLStore/effectiveDelivered(_:)``),
    /// when a read selects it: in place of the row's own.
    let effectiveDelivered: Int?

    init(_ columns: StoreRow.Columns) {
        self.columns = columns
        appID = columns.index(of: "app_id")
        activityID = columns.index(of: "activity_id")
        deviceID = columns.index(of: "device_id")
        platform = columns.index(of: "platform")
        pushToken = columns.index(of: "push_token")
        userID = columns.index(of: "user_id")
        state = columns.index(of: "state")
        frequentPushes = columns.index(of: "frequent_pushes")
        deliveredSequence = columns.index(of: "delivered_sequence")
        createdAt = columns.index(of: "created_at")
        updatedAt = columns.index(of: "updated_at")
        priority10Tally = columns.index(of: "priority10_tally")
        priority10Sent = columns.index(of: "priority10_sent")
        channelID = columns.index(of: "channel_id")
        joinedPass = columns.index(of: "joined_pass")
        effectiveDelivered = columns.index(of: "effective_delivered")
    }
}

extension SQLStore {
    /// An instance's priority-10 tally from its row; a row last written before the tally (schema step 18 on SQLite, 6
    /// on PostgreSQL) has its list of times instead.
    static func priority10Tally(from row: StoreRow) -> Priority10Tally {
        priority10Tally(packed: row.column("priority10_tally"), times: row.column("priority10_sent"))
    }

    /// The tally from the row's `priority10_tally` (`packed`) and `priority10_sent` (`times`) values.
    static func priority10Tally(packed: SQLiteData?, times: SQLiteData?) -> Priority10Tally {
        if let packed = packed?.integer { return Priority10Tally(packed: Int64(packed)) }
        return Priority10Tally(times: Priority10Times.decode(times?.string))
    }

    /// A new instance's tally: for an iPhone, none counted as of now, which SQLite keeps in the 8 bytes every later
    /// tally takes, so that recording pushes rewrites the row in place; nothing for an Android phone (no budget).
    static func emptyPriority10Tally(for platform: Platform?, at nowMillis: Int) -> SQLiteData {
        platform == .ios ? .integer(Int(Priority10Tally.empty(at: Int64(nowMillis / 1000)).packed)) : .null
    }
}

/// A column the schema promises was missing or of the wrong type.
struct CorruptRow: Error, CustomStringConvertible {
    var column: String
    var description: String { "column \(column) is missing or has an unexpected type" }
}

extension StoreRow {
    func string(_ name: String) throws -> String {
        guard let data = column(name), case .text(let value) = data else { throw CorruptRow(column: name) }
        return value
    }

    func date(_ name: String) throws -> Date {
        guard let value = column(name)?.integer else { throw CorruptRow(column: name) }
        return SQLStore.date(value)
    }

    func json(_ name: String) throws -> JSONValue? {
        guard let data = column(name), case .text(let text) = data else { return nil }
        return try JSONValue(parsing: text.utf8)
    }
}
