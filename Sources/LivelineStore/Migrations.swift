/// A numbered step of the database schema. Applied in order, each once, inside a transaction.
public struct Migration: Sendable {
    /// The schema version this step produces.
    public var version: Int
    /// What the step does, for logs.
    public var name: String
    /// The statements, in order.
    public var statements: [String]
}

/// The SQLite schema, step by step. Never edit a released step: add a new one.
enum SQLiteMigrations {
    static let all: [Migration] = [
        Migration(
            version: 1,
            name: "apps, keys, activities and instances",
            statements: [
                """
                CREATE TABLE apps (
                    id TEXT PRIMARY KEY,
                    name TEXT NOT NULL,
                    bundle_id TEXT NOT NULL,
                    android_package TEXT,
                    created_at INTEGER NOT NULL
                )
                """,
                """
                CREATE TABLE api_keys (
                    id TEXT PRIMARY KEY,
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    scope TEXT NOT NULL,
                    hash BLOB NOT NULL,
                    created_at INTEGER NOT NULL,
                    revoked_at INTEGER
                )
                """,
                "CREATE INDEX api_keys_by_app ON api_keys(app_id)",
                """
                CREATE TABLE activities (
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    activity_id TEXT NOT NULL,
                    attributes_type TEXT,
                    attributes TEXT,
                    state TEXT NOT NULL,
                    sequence INTEGER NOT NULL DEFAULT 0,
                    event TEXT,
                    sequence_at INTEGER,
                    content_state TEXT,
                    alert TEXT,
                    stale_date INTEGER,
                    relevance_score REAL,
                    priority INTEGER,
                    dismissal_date INTEGER,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    ended_at INTEGER,
                    PRIMARY KEY (app_id, activity_id)
                ) WITHOUT ROWID
                """,
                "CREATE INDEX activities_by_state ON activities(app_id, state, activity_id)",
                """
                CREATE TABLE instances (
                    app_id TEXT NOT NULL,
                    activity_id TEXT NOT NULL,
                    device_id TEXT NOT NULL,
                    platform TEXT NOT NULL,
                    push_token TEXT NOT NULL,
                    user_id TEXT,
                    state TEXT NOT NULL,
                    frequent_pushes INTEGER,
                    delivered_sequence INTEGER NOT NULL DEFAULT 0,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (app_id, activity_id, device_id),
                    FOREIGN KEY (app_id, activity_id) REFERENCES activities(app_id, activity_id) ON DELETE CASCADE
                ) WITHOUT ROWID
                """,
            ]
        ),
        Migration(
            version: 2,
            name: "delivery: timestamps, claims, progress, timeline and credentials",
            statements: [
                // The aps.timestamp of the current sequence: strictly increasing per activity.
                "ALTER TABLE activities ADD COLUMN timestamp_seconds INTEGER",
                // Fan-out progress and its lease: the sequence every instance has, who works on it, until when.
                "ALTER TABLE activities ADD COLUMN dispatched_sequence INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE activities ADD COLUMN claim_owner TEXT",
                "ALTER TABLE activities ADD COLUMN claim_expires_at INTEGER",
                "ALTER TABLE activities ADD COLUMN next_dispatch_at INTEGER",
                "CREATE INDEX activities_pending ON activities(next_dispatch_at) WHERE dispatched_sequence < sequence",
                """
                CREATE TABLE deliveries (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    app_id TEXT NOT NULL,
                    activity_id TEXT NOT NULL,
                    device_id TEXT NOT NULL,
                    platform TEXT NOT NULL,
                    sequence INTEGER NOT NULL,
                    event TEXT NOT NULL,
                    priority INTEGER NOT NULL,
                    status TEXT NOT NULL,
                    provider_id TEXT,
                    reason TEXT,
                    latency_ms REAL,
                    attempt INTEGER NOT NULL,
                    attempted_at INTEGER NOT NULL
                )
                """,
                "CREATE INDEX deliveries_by_activity ON deliveries(app_id, activity_id, id)",
                "CREATE INDEX deliveries_by_time ON deliveries(attempted_at)",
                """
                CREATE TABLE app_credentials (
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    provider TEXT NOT NULL,
                    settings TEXT NOT NULL,
                    sealed_secret BLOB NOT NULL,
                    healthy INTEGER NOT NULL DEFAULT 1,
                    health_reason TEXT,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (app_id, provider)
                ) WITHOUT ROWID
                """,
            ]
        ),
        Migration(
            version: 3,
            name: "content-state contracts: schemas per attributes type, remembered shapes",
            statements: [
                """
                CREATE TABLE attributes_type_schemas (
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    attributes_type TEXT NOT NULL,
                    schema TEXT NOT NULL,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (app_id, attributes_type)
                ) WITHOUT ROWID
                """,
                // For activities without a schema: the kinds of the content state's fields, first seen first.
                "ALTER TABLE activities ADD COLUMN content_shape TEXT",
            ]
        ),
        Migration(
            version: 4,
            name: "lifetime: end reasons; indexes for the sweeper",
            statements: [
                "ALTER TABLE activities ADD COLUMN end_reason TEXT",
                "UPDATE activities SET end_reason = 'caller' WHERE state = 'ended'",
                "CREATE INDEX activities_by_age ON activities(state, created_at)",
                "CREATE INDEX activities_ended ON activities(state, ended_at)",
                "CREATE INDEX instances_by_age ON instances(state, created_at)",
            ]
        ),
        Migration(
            version: 5,
            name: "rate shaping: minimum update interval, the last sequence sent and when",
            statements: [
                "ALTER TABLE activities ADD COLUMN min_update_interval REAL",
                "ALTER TABLE activities ADD COLUMN last_sent_sequence INTEGER",
                "ALTER TABLE activities ADD COLUMN last_sent_at INTEGER",
            ]
        ),
        Migration(
            version: 6,
            name: "priority budget: priority-10 pushes per instance in the last hour, warnings",
            statements: [
                // Seconds since 1970 of the instance's priority-10 pushes in the last hour, comma-separated.
                "ALTER TABLE instances ADD COLUMN priority10_sent TEXT",
                "ALTER TABLE activities ADD COLUMN budget_warned_at INTEGER",
            ]
        ),
        Migration(
            version: 7,
            name: "per-app priority budget",
            statements: [
                "ALTER TABLE apps ADD COLUMN budget_hourly INTEGER",
                "ALTER TABLE apps ADD COLUMN budget_hourly_frequent INTEGER",
            ]
        ),
        Migration(
            version: 8,
            name: "delivery timeline without a time index",
            statements: [
                // Rows are appended in time order, so the oldest are the lowest ids: pruning by age walks the table
                // from its start instead, and each recorded attempt writes one index fewer.
                "DROP INDEX IF EXISTS deliveries_by_time",
            ]
        ),
        Migration(
            version: 9,
            name: "delivery timeline in segments",
            statements: [
                // One row per recorded batch of attempts (a JSON array, oldest first) instead of one per attempt:
                // a fan-out's timeline costs the one writer a row per batch. An attempt's id is the segment's id times
                // 4096 plus its place; `first_index` rises when pruning trims a segment's oldest attempts.
                """
                CREATE TABLE delivery_segments (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    app_id TEXT NOT NULL,
                    activity_id TEXT NOT NULL,
                    first_index INTEGER NOT NULL,
                    attempt_count INTEGER NOT NULL,
                    newest_attempt_at INTEGER NOT NULL,
                    attempts TEXT NOT NULL
                )
                """,
                "CREATE INDEX delivery_segments_by_activity ON delivery_segments(app_id, activity_id, id)",
                // Attempts recorded before, one segment each, in their order.
                """
                INSERT INTO delivery_segments (app_id, activity_id, first_index, attempt_count, newest_attempt_at, attempts)
                SELECT app_id, activity_id, 0, 1, attempted_at,
                    json_array(json_array(device_id, platform, sequence, event, priority, status, provider_id, reason, latency_ms,
                        attempt, attempted_at))
                FROM deliveries ORDER BY id
                """,
                "DROP TABLE deliveries",
            ]
        ),
        Migration(
            version: 10,
            name: "pending activities in the order they are claimed",
            statements: [
                // A claim takes the pending activity due first (due now when `next_dispatch_at` is NULL), oldest change
                // first. The index holds exactly that order, so a claim reads the first entries instead of sorting every
                // pending activity: after a burst of 20,000 updates, claims sorted 20,000 rows each and held the writer.
                """
                CREATE INDEX activities_due ON activities(COALESCE(next_dispatch_at, 0), updated_at)
                WHERE dispatched_sequence < sequence
                """,
                "DROP INDEX activities_pending",
            ]
        ),
        Migration(
            version: 11,
            name: "devices: installations, their tags and push-to-start tokens",
            statements: [
                // An installation of the app; `tags` is the JSON object of its string tags as last registered, and
                // `device_tags` holds the same tags one row each, for targeting by tag. Times in epoch milliseconds.
                """
                CREATE TABLE devices (
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    device_id TEXT NOT NULL,
                    platform TEXT NOT NULL,
                    user_id TEXT,
                    tags TEXT NOT NULL DEFAULT '{}',
                    fcm_token TEXT,
                    fcm_token_dropped_at INTEGER,
                    fcm_token_drop_reason TEXT,
                    os_version TEXT,
                    locale TEXT,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (app_id, device_id)
                ) WITHOUT ROWID
                """,
                "CREATE INDEX devices_by_user ON devices(app_id, user_id, device_id) WHERE user_id IS NOT NULL",
                """
                CREATE TABLE device_tags (
                    app_id TEXT NOT NULL,
                    device_id TEXT NOT NULL,
                    key TEXT NOT NULL,
                    value TEXT NOT NULL,
                    PRIMARY KEY (app_id, key, value, device_id)
                ) WITHOUT ROWID
                """,
                "CREATE INDEX device_tags_by_device ON device_tags(app_id, device_id)",
                // One per device and attributes type; `dropped_at` is set when APNs rejected the token (NULL: usable).
                """
                CREATE TABLE push_to_start_tokens (
                    app_id TEXT NOT NULL,
                    device_id TEXT NOT NULL,
                    attributes_type TEXT NOT NULL,
                    token TEXT NOT NULL,
                    updated_at INTEGER NOT NULL,
                    dropped_at INTEGER,
                    drop_reason TEXT,
                    PRIMARY KEY (app_id, device_id, attributes_type)
                ) WITHOUT ROWID
                """,
            ]
        ),
        Migration(
            version: 12,
            name: "remote starts: their audiences and their alert",
            statements: [
                "ALTER TABLE activities ADD COLUMN start_alert TEXT",
                // A start's audience, kept as asked: the delivery engine admits its devices as `starting` instances a page
                // at a time (`admitted_after` is the last device id admitted), so accepting a start writes one row
                // whatever the audience's size.
                """
                CREATE TABLE start_audiences (
                    app_id TEXT NOT NULL,
                    activity_id TEXT NOT NULL,
                    sequence INTEGER NOT NULL,
                    attributes_type TEXT NOT NULL,
                    audience TEXT NOT NULL,
                    admitted_after TEXT,
                    admitted INTEGER NOT NULL DEFAULT 0,
                    created_at INTEGER NOT NULL,
                    PRIMARY KEY (app_id, activity_id, sequence),
                    FOREIGN KEY (app_id, activity_id) REFERENCES activities(app_id, activity_id) ON DELETE CASCADE
                ) WITHOUT ROWID
                """,
                // Remotely started instances not yet confirmed, oldest first: the activity's `unconfirmed` list.
                "CREATE INDEX instances_starting ON instances(app_id, activity_id, updated_at) WHERE state = 'starting'",
            ]
        ),
        Migration(
            version: 13,
            name: "idempotency keys",
            statements: [
                // One row per accepted request that carried an `Idempotency-Key`, per app: the request's SHA-256 and the
                // response replayed to its retries. Written in the transaction that accepts the request; pruned by the
                // lifetime sweeper 24 hours on (by the index on `created_at`).
                """
                CREATE TABLE idempotency_keys (
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    key TEXT NOT NULL,
                    request_hash BLOB NOT NULL,
                    status INTEGER NOT NULL,
                    body BLOB NOT NULL,
                    created_at INTEGER NOT NULL,
                    PRIMARY KEY (app_id, key)
                ) WITHOUT ROWID
                """,
                "CREATE INDEX idempotency_keys_by_age ON idempotency_keys(created_at)",
            ]
        ),
        Migration(
            version: 14,
            name: "broadcast channels",
            statements: [
                // How the activity's iPhones are reached ('token' or 'broadcast'), and its APNs channel: id, storage policy
                // (0 or 1, Apple's numbers), status ('active', 'unregistered', 'deleted'), and the sequence its last
                // broadcast carried (or gave up on).
                "ALTER TABLE activities ADD COLUMN delivery TEXT NOT NULL DEFAULT 'token'",
                "ALTER TABLE activities ADD COLUMN channel_id TEXT",
                "ALTER TABLE activities ADD COLUMN channel_storage_policy INTEGER",
                "ALTER TABLE activities ADD COLUMN channel_status TEXT",
                "ALTER TABLE activities ADD COLUMN channel_created_at INTEGER",
                "ALTER TABLE activities ADD COLUMN channel_deleted_at INTEGER",
                "ALTER TABLE activities ADD COLUMN broadcast_sequence INTEGER NOT NULL DEFAULT 0",
                // The channels an app holds at APNs (Apple allows 10,000 per app and environment), counted per app; and
                // the ended ones the sweeper deletes.
                "CREATE INDEX activities_live_channels ON activities(app_id) WHERE channel_id IS NOT NULL AND channel_deleted_at IS NULL",
                """
                CREATE INDEX activities_channels_to_delete ON activities(ended_at)
                WHERE state = 'ended' AND channel_id IS NOT NULL AND channel_deleted_at IS NULL
                """,
                // The app's defaults for activities that do not say: delivery ('token' or 'broadcast') and the storage
                // policy of their channels (0 or 1).
                "ALTER TABLE apps ADD COLUMN default_delivery TEXT",
                "ALTER TABLE apps ADD COLUMN default_channel_storage_policy INTEGER",
                // An instance that takes the activity's broadcasts (an iPhone subscribed to the channel) instead of pushes
                // to a token of its own.
                "ALTER TABLE instances ADD COLUMN channel_id TEXT",
            ]
        ),
        Migration(
            version: 15,
            name: "lifecycle events",
            statements: [
                // The outbox of lifecycle events: each written in the transaction of the change that causes it. `id` is
                // the feed's position, and the public id is made from it (no second, random key to index on every write).
                // Ids only rise with time, so pruning by age walks the oldest ids: no index on `created_at` either.
                """
                CREATE TABLE events (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    type TEXT NOT NULL,
                    activity_id TEXT,
                    device_id TEXT,
                    data TEXT NOT NULL,
                    created_at INTEGER NOT NULL
                )
                """,
                "CREATE INDEX events_by_app ON events(app_id, id)",
                // When a remote start still unconfirmed was reported (`instance.start_unconfirmed`, once).
                "ALTER TABLE instances ADD COLUMN unconfirmed_reported_at INTEGER",
            ]
        ),
        Migration(
            version: 16,
            name: "webhooks",
            statements: [
                // An app's webhook endpoints: URL, event types (a JSON array; empty: every type), the sealed signing
                // secret, and the feed position up to which events have been turned into deliveries.
                """
                CREATE TABLE webhooks (
                    id TEXT PRIMARY KEY,
                    app_id TEXT NOT NULL REFERENCES apps(id) ON DELETE CASCADE,
                    url TEXT NOT NULL,
                    event_types TEXT NOT NULL,
                    enabled INTEGER NOT NULL,
                    sealed_secret BLOB NOT NULL,
                    scanned_position INTEGER NOT NULL,
                    created_at INTEGER NOT NULL,
                    disabled_at INTEGER,
                    disabled_reason TEXT
                ) WITHOUT ROWID
                """,
                "CREATE INDEX webhooks_by_app ON webhooks(app_id, id)",
                // One event to one endpoint: pending until the endpoint answers 2xx (delivered) or the retries run out
                // (failed). Sent in order per activity (`ordering_key`).
                """
                CREATE TABLE webhook_deliveries (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    webhook_id TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
                    event_position INTEGER NOT NULL,
                    event_id TEXT NOT NULL,
                    ordering_key TEXT NOT NULL,
                    payload TEXT NOT NULL,
                    status TEXT NOT NULL,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    next_attempt_at INTEGER NOT NULL,
                    last_status_code INTEGER,
                    last_error TEXT,
                    last_latency_ms REAL,
                    last_attempt_at INTEGER,
                    created_at INTEGER NOT NULL,
                    finished_at INTEGER
                )
                """,
                "CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_attempt_at) WHERE status = 'pending'",
                "CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries(webhook_id, id)",
                "CREATE INDEX webhook_deliveries_order ON webhook_deliveries(webhook_id, ordering_key, id) WHERE status = 'pending'",
            ]
        ),
        Migration(
            version: 17,
            name: "fan-out slices",
            statements: [FanOutSliceSchema.sqlite]
        ),
        Migration(
            version: 18,
            name: "priority-10 pushes as a tally",
            statements: [
                // An instance's priority-10 pushes of the last hour as one integer (`Priority10Tally`): counts per
                // quarter of an hour, which a fan-out rewrites in place, where the list of times in `priority10_sent`
                // grew with every push. Rows written before keep their list, read until their first tally is written.
                "ALTER TABLE instances ADD COLUMN priority10_tally INTEGER"
            ]
        ),
        Migration(
            version: 19,
            name: "activities by state, led by the state",
            statements: [
                // `(app_id, state, activity_id)` matched a read by key (`app_id = ? AND activity_id = ?`) as well as the
                // primary key did, in PostgreSQL's estimates, for an app its statistics did not know yet: it then read
                // every one of the app's activities in the index to find one (0.7 – 5 ms a read, against 0.05). Led by
                // the state, only reads that name a state can use it; the listing by app and state reads it as before.
                "DROP INDEX activities_by_state",
                "CREATE INDEX activities_by_state ON activities(state, app_id, activity_id)",
            ]
        ),
        Migration(
            version: 20,
            name: "activities under a lease",
            statements: [
                // The engine asks when its next activity is due after every wake-up (`nextClaimable`): an activity
                // under a lease is due when both its lease and its dispatch time have passed, so the question read every
                // pending activity. The leased ones are a handful (one an engine's worker, and those of a node that
                // died): with this index the question reads them, and the first unleased one in `activities_due`.
                "CREATE INDEX activities_claimed ON activities(claim_expires_at) WHERE claim_expires_at IS NOT NULL",
            ]
        ),
        Migration(
            version: 21,
            name: "webhook deliveries' first attempts",
            statements: [
                // A delivery's retry period runs from its first attempt, not from when it was queued: a later event of an
                // activity waits behind the earlier one, and that wait ate its retries. Deliveries tried before this
                // step keep their queueing time as their start (the period they had).
                "ALTER TABLE webhook_deliveries ADD COLUMN first_attempt_at INTEGER",
                "UPDATE webhook_deliveries SET first_attempt_at = created_at WHERE attempts > 0",
            ]
        ),
        Migration(
            version: 22,
            name: "the store's secrets",
            statements: [
                // Secrets of the database itself, the same for every process that opens it: `public_numbers`, the key
                // of the numbers apps see in place of the counters all apps share (`PublicNumbers`), made when a store
                // first opens the database.
                "CREATE TABLE store_secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL)",
            ]
        ),
        Migration(
            version: 23,
            name: "broadcasts' priority-10 tally",
            statements: [
                // An activity's broadcasts at priority 10 over the last hour (`Priority10Tally`, packed): they draw down
                // the budget of every iPhone subscribed to its channel.
                "ALTER TABLE activities ADD COLUMN broadcast_priority10_tally INTEGER NOT NULL DEFAULT 0",
            ]
        ),
        Migration(
            version: 24,
            name: "finished webhook deliveries by when they finished",
            statements: [
                // The sweeper forgets finished deliveries (and the events they carry) after the events' retention.
                "CREATE INDEX webhook_deliveries_finished ON webhook_deliveries(finished_at) WHERE status <> 'pending'",
            ]
        ),
        Migration(
            version: 25,
            name: "who sets a device's audience fields",
            statements: [
                // `app` (its publishable key may set userId and tags) or `backend` (only its secret key): AudienceSource.
                "ALTER TABLE apps ADD COLUMN audience_from TEXT NOT NULL DEFAULT 'app'",
            ]
        ),
        Migration(
            version: 26,
            name: "a fan-out's progress as marks of runs",
            statements: DeliveryMarkSchema.sqlite
        ),
        Migration(
            version: 27,
            name: "the sequence a slice's pass sent its whole range",
            statements: [FanOutSliceSchema.completedSequence(integer: "INTEGER")]
        ),
        Migration(
            version: 28,
            name: "the sweeper's index of instances by state and hour of registration",
            statements: InstanceAgeIndex.statements(hourExpression: InstanceAgeIndex.hour)
        ),
    ]
}

/// The lifetime sweeper's index of instances (``SQLStore/endInstances(registeredBefore:at:)``): by state, then by the
/// hour they registered in (`created_at / 3600000`), then, within an hour, in the order of the primary key (SQLite's
/// `WITHOUT ROWID` table) or of the rows (PostgreSQL). It was `(state, created_at)`: the end of an activity, which moves
/// every instance's entry from `active` to `ended`, in the order of device ids, found each entry at a random place of
/// the index by its registration time, and so wrote a page of it for nearly every instance: over a bench's 100,000
/// instances, 812 MB of SQLite's WAL and 4.2 s of its writer against 52 MB and 0.83 s (133 MB and 1.1 s with the
/// registrations spread over eight hours), the same statements replayed in `sqlite3`. Within an hour the entries now
/// follow the device ids, as the end's batches do. The sweeper reads whole hours and keeps the instances registered
/// before its cutoff; the counts by state still read the index alone.
enum InstanceAgeIndex {
    /// The index's unit of registration time: an hour, in the milliseconds of `created_at`.
    static let millisecondsPerHour = 3_600_000

    /// The hour an instance registered in, as SQL on its row (the index's expression, which the sweeper's query repeats).
    static let hour = "created_at / \(millisecondsPerHour)"

    static func statements(hourExpression: String) -> [String] {
        [
            "DROP INDEX instances_by_age",
            "CREATE INDEX instances_by_age ON instances(state, \(hourExpression))",
        ]
    }
}

/// A fan-out's progress without a row write a push (docs/progress-marks.md): the activity's pass counter, raised by
/// every claim, and the pass an instance joined in (set by every write that creates it or gives it a new token or
/// makes it deliverable again); the sequence a pass that sent everything settled, with its pass; and the marks of the
/// runs of instances a pass sent, `[from_device, through_device]` of one platform: every instance of that platform in
/// the range whose `joined_pass` is below the mark's `pass`, and that was deliverable when its page was read, was sent
/// `sequence` at `priority` at `sent_at` (seconds). The same in both dialects.
enum DeliveryMarkSchema {
    static let sqlite = statements(text: "TEXT", integer: "INTEGER", withoutRowID: " WITHOUT ROWID")
    static let postgres = statements(text: #"TEXT COLLATE "C""#, integer: "BIGINT", withoutRowID: "")

    private static func statements(text: String, integer: String, withoutRowID: String) -> [String] {
        [
            "ALTER TABLE activities ADD COLUMN pass_counter \(integer) NOT NULL DEFAULT 0",
            "ALTER TABLE activities ADD COLUMN settled_sequence \(integer) NOT NULL DEFAULT 0",
            "ALTER TABLE activities ADD COLUMN settled_pass \(integer) NOT NULL DEFAULT 0",
            "ALTER TABLE instances ADD COLUMN joined_pass \(integer) NOT NULL DEFAULT 0",
            """
            CREATE TABLE delivery_marks (
                app_id \(text) NOT NULL,
                activity_id \(text) NOT NULL,
                platform \(text) NOT NULL,
                sequence \(integer) NOT NULL,
                through_device \(text) NOT NULL,
                pass \(integer) NOT NULL,
                from_device \(text) NOT NULL,
                priority \(integer) NOT NULL,
                sent_at \(integer) NOT NULL,
                PRIMARY KEY (app_id, activity_id, platform, sequence, through_device, pass),
                FOREIGN KEY (app_id, activity_id) REFERENCES activities(app_id, activity_id) ON DELETE CASCADE
            )\(withoutRowID)
            """,
            // The last mark of a sequence starting at or before a device (``SQLStore/markedFor(_:sequence:)``).
            "CREATE INDEX delivery_marks_by_start ON delivery_marks(app_id, activity_id, platform, sequence, from_device)",
        ]
    }
}

/// The slices of a shared fan-out (``DispatchStore/planSlices(appID:activityID:owner:below:platforms:size:now:)``):
/// one activity's pending instances cut into ranges of device ids, `(after_device, through_device]`, each claimed and
/// sent by whichever engine takes it, and marked with its outcome once sent. The same table in both dialects.
enum FanOutSliceSchema {
    static let sqlite = table(text: "TEXT", integer: "INTEGER")
    static let postgres = table(text: #"TEXT COLLATE "C""#, integer: "BIGINT")

    private static func table(text: String, integer: String) -> String {
        """
        CREATE TABLE fanout_slices (
            app_id \(text) NOT NULL,
            activity_id \(text) NOT NULL,
            slice \(integer) NOT NULL,
            after_device \(text),
            through_device \(text),
            claim_owner \(text),
            claim_expires_at \(integer),
            outcome \(text),
            created_at \(integer) NOT NULL,
            PRIMARY KEY (app_id, activity_id, slice),
            FOREIGN KEY (app_id, activity_id) REFERENCES activities(app_id, activity_id) ON DELETE CASCADE
        )
        """
    }

    /// A later column (SQLite step 27, PostgreSQL 19): the sequence the slice's pass sent to every instance of its range
    /// that waited, for every platform, with nothing left to retry (``DispatchStore/finishSlice(_:owner:outcome:completed:)``);
    /// `NULL` when it did not, or when a node from before the column sent the slice. When every slice has one, the
    /// activity's holder settles without reading what waits.
    static func completedSequence(integer: String) -> String {
        "ALTER TABLE fanout_slices ADD COLUMN completed_sequence \(integer)"
    }
}
