import Foundation
import LivelineCore
import SQLiteNIO

/// Devices: an app's installations, their tags (the `tags` JSON column for reading, one `device_tags` row each for
/// targeting) and their push-to-start tokens (one `push_to_start_tokens` row per attributes type).
///
/// The two child tables carry no foreign key: deleting a device deletes its rows here, in the same transaction. Apps
/// are never deleted by the Store; `devices` cascades from `apps` should that change, and the child tables would then
/// be deleted with it explicitly, as here.
extension SQLStore: DeviceStore {
    public func putDevice(_ registration: DeviceRegistration, at now: Date) async throws -> (device: DeviceRecord, created: Bool) {
        let r = registration
        return try await transaction { db in
            let nowMillis = Self.millis(now)
            guard let device = try Self.device(appID: r.appID, deviceID: r.deviceID, on: db) else {
                if try db.query("SELECT 1 FROM apps WHERE id = ?", [.text(r.appID)]).isEmpty { throw StoreError.appNotFound }
                let created = r.newDevice(at: Self.date(nowMillis))
                try db.query(
                    """
                    INSERT INTO devices (app_id, device_id, platform, user_id, tags, fcm_token, os_version, locale, created_at, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                    [.text(r.appID), .text(r.deviceID), .text(r.platform.rawValue), Self.text(created.userID), Self.tagsJSON(created.tags),
                     Self.text(created.fcmToken), Self.text(created.osVersion), Self.text(created.locale), .integer(nowMillis),
                     .integer(nowMillis)]
                )
                try Self.insertTags(created.tags, appID: r.appID, deviceID: r.deviceID, on: db)
                for token in created.pushToStartTokens {
                    try Self.savePushToStartToken(token, appID: r.appID, deviceID: r.deviceID, on: db)
                }
                return (created, true)
            }
            guard device.platform == r.platform else { throw StoreError.platformMismatch(registered: device.platform) }
            let outcome = r.applied(to: device, at: Self.date(nowMillis))
            let updated = outcome.device
            for attributesType in outcome.removedPushToStartTypes {
                try db.query(
                    "DELETE FROM push_to_start_tokens WHERE app_id = ? AND device_id = ? AND attributes_type = ?",
                    [.text(r.appID), .text(r.deviceID), .text(attributesType)]
                )
            }
            for token in outcome.savedPushToStartTokens {
                try Self.savePushToStartToken(token, appID: r.appID, deviceID: r.deviceID, on: db)
                if let previous = device.pushToStartTokens.first(where: { $0.attributesType == token.attributesType })?.token,
                    previous != token.token
                {
                    try Self.moveUnsentStarts(appID: r.appID, deviceID: r.deviceID, from: previous, to: token.token, nowMillis: nowMillis, on: db)
                }
            }
            if outcome.tagsChanged {
                try db.query("DELETE FROM device_tags WHERE app_id = ? AND device_id = ?", [.text(r.appID), .text(r.deviceID)])
                try Self.insertTags(updated.tags, appID: r.appID, deviceID: r.deviceID, on: db)
            }
            if outcome.changed {
                try db.query(
                    """
                    UPDATE devices SET user_id = ?, tags = ?, fcm_token = ?, fcm_token_dropped_at = ?, fcm_token_drop_reason = ?,
                        os_version = ?, locale = ?, updated_at = ?
                    WHERE app_id = ? AND device_id = ?
                    """,
                    [Self.text(updated.userID), Self.tagsJSON(updated.tags), Self.text(updated.fcmToken),
                     updated.fcmTokenDroppedAt.map { .integer(Self.millis($0)) } ?? .null, Self.text(updated.fcmTokenDropReason),
                     Self.text(updated.osVersion), Self.text(updated.locale), .integer(nowMillis), .text(r.appID), .text(r.deviceID)]
                )
            }
            return (updated, false)
        }
    }

    public func device(appID: String, deviceID: String) async throws -> DeviceRecord? {
        try await reader.read { db in try Self.device(appID: appID, deviceID: deviceID, on: db) }
    }

    public func devices(appID: String, filter: DeviceFilter, cursor: String?, limit: Int) async throws -> Page<DeviceRecord> {
        let after = try cursor.map(Self.decodeCursor)
        var sql: String
        var binds: [SQLiteData] = [.text(appID)]
        var remainingTags = filter.tags[...]
        if let userID = filter.userID {
            // A user has few devices: walk them in device-id order and check the tags on each.
            sql = "SELECT d.* FROM devices AS d INDEXED BY devices_by_user WHERE d.app_id = ? AND d.user_id = ?"
            binds.append(.text(userID))
            if let after {
                sql += " AND d.device_id > ?"
                binds.append(.text(after))
            }
            sql += Self.tagConditions(remainingTags, binds: &binds)
            sql += " ORDER BY d.device_id"
        } else if let first = remainingTags.popFirst() {
            // Walk the first tag's index entries in device-id order (CROSS JOIN keeps that table outermost): a rare tag
            // reads its few devices, not the whole app, and the page ends after `limit` of them.
            sql = """
                SELECT d.* FROM device_tags AS t CROSS JOIN devices AS d ON d.app_id = t.app_id AND d.device_id = t.device_id
                WHERE t.app_id = ? AND t.key = ? AND t.value = ?
                """
            binds += [.text(first.key), .text(first.value)]
            if let after {
                sql += " AND t.device_id > ?"
                binds.append(.text(after))
            }
            sql += Self.tagConditions(remainingTags, binds: &binds)
            sql += " ORDER BY t.device_id"
        } else {
            sql = "SELECT d.* FROM devices AS d WHERE d.app_id = ?"
            if let after {
                sql += " AND d.device_id > ?"
                binds.append(.text(after))
            }
            sql += " ORDER BY d.device_id"
        }
        sql += " LIMIT \(limit + 1)"
        let query = sql
        let bound = binds
        return try await reader.read { db in
            let rows = try db.query(query, bound)
            var items = try rows.prefix(limit).map(Self.deviceWithoutTokens(from:))
            if !items.isEmpty {
                // The page's push-to-start tokens in one query.
                let placeholders = Array(repeating: "?", count: items.count).joined(separator: ",")
                let tokens = try db.query(
                    """
                    SELECT * FROM push_to_start_tokens WHERE app_id = ? AND device_id IN (\(placeholders))
                    ORDER BY device_id, attributes_type
                    """,
                    [.text(appID)] + items.map { .text($0.deviceID) }
                )
                var byDevice: [String: [PushToStartToken]] = [:]
                for row in tokens {
                    let deviceID = try row.string("device_id")
                    byDevice[deviceID, default: []].append(try Self.pushToStartToken(from: row))
                }
                for index in items.indices { items[index].pushToStartTokens = byDevice[items[index].deviceID] ?? [] }
            }
            let next = rows.count > limit ? items.last.map { Self.encodeCursor($0.deviceID) } : nil
            return Page(items: items, nextCursor: next)
        }
    }

    public func deleteDevice(appID: String, deviceID: String, at now: Date) async throws -> Bool {
        try await transaction { db in
            let binds: [SQLiteData] = [.text(appID), .text(deviceID)]
            try db.query("DELETE FROM push_to_start_tokens WHERE app_id = ? AND device_id = ?", binds)
            try db.query("DELETE FROM device_tags WHERE app_id = ? AND device_id = ?", binds)
            let deleted = !(try db.query("DELETE FROM devices WHERE app_id = ? AND device_id = ? RETURNING device_id", binds)).isEmpty
            guard deleted else { return false }
            // Its remote starts that have not gone out are withdrawn: they would go to the tokens just deleted. (The
            // state is a literal, so that the partial index of starting instances serves the search.)
            let withdrawn = try db.query(
                """
                UPDATE instances SET state = 'ended', updated_at = ?, delivered_sequence = \(Self.effectiveDelivered("instances."))
                WHERE app_id = ? AND state = 'starting' AND device_id = ? AND delivered_sequence = 0
                RETURNING activity_id, platform
                """,
                [.integer(Self.millis(now))] + binds
            )
            for row in withdrawn {
                try Self.record(
                    NewEvent(
                        .instanceEnded, appID: appID, activityID: try row.string("activity_id"), deviceID: deviceID,
                        data: ["platform": .string(try row.string("platform")), "reportedBy": "backend", "reason": "device_deleted"]
                    ),
                    at: now, on: db
                )
            }
            return true
        }
    }

    public func dropDeviceToken(appID: String, deviceID: String, token: String, reason: String, at now: Date) async throws {
        try await transaction(
            statements: Self.dropDeviceTokenStatements(appID: appID, deviceID: deviceID, token: token, reason: reason, at: now),
            durability: .bookkeeping
        )
    }

    /// The statements that drop whichever of a device's tokens (push-to-start for any type, or FCM) equals `token`; a
    /// token rotated since is left alone, and a first drop's time and reason are kept. Also run by the engine, inside
    /// its progress transaction, for the tokens a start was refused at.
    static func dropDeviceTokenStatements(
        appID: String, deviceID: String, token: String, reason: String, at now: Date
    ) -> [(sql: String, binds: [SQLiteData])] {
        let binds: [SQLiteData] = [.integer(Self.millis(now)), .text(reason), .text(appID), .text(deviceID), .text(token)]
        return [
            (
                """
                UPDATE push_to_start_tokens SET dropped_at = ?, drop_reason = ?
                WHERE app_id = ? AND device_id = ? AND token = ? AND dropped_at IS NULL
                """,
                binds
            ),
            (
                """
                UPDATE devices SET fcm_token_dropped_at = ?, fcm_token_drop_reason = ?
                WHERE app_id = ? AND device_id = ? AND fcm_token = ? AND fcm_token_dropped_at IS NULL
                """,
                binds
            ),
        ]
    }

    /// `AND EXISTS` conditions on the device `d` carrying each of `tags`, their values appended to `binds`.
    static func tagConditions(_ tags: ArraySlice<DeviceTag>, binds: inout [SQLiteData]) -> String {
        var sql = ""
        for tag in tags {
            sql += """
                 AND EXISTS (SELECT 1 FROM device_tags AS o
                    WHERE o.app_id = d.app_id AND o.key = ? AND o.value = ? AND o.device_id = d.device_id)
                """
            binds += [.text(tag.key), .text(tag.value)]
        }
        return sql
    }

    // MARK: Rows

    /// One device with its push-to-start tokens, read on `db`.
    static func device(appID: String, deviceID: String, on db: any SQLConnection) throws -> DeviceRecord? {
        let binds: [SQLiteData] = [.text(appID), .text(deviceID)]
        guard var device = try db.query("SELECT * FROM devices WHERE app_id = ? AND device_id = ?", binds).first
            .map(Self.deviceWithoutTokens(from:))
        else { return nil }
        device.pushToStartTokens = try db.query(
            "SELECT * FROM push_to_start_tokens WHERE app_id = ? AND device_id = ? ORDER BY attributes_type", binds
        ).map(Self.pushToStartToken(from:))
        return device
    }

    static func savePushToStartToken(_ token: PushToStartToken, appID: String, deviceID: String, on db: any SQLConnection) throws {
        try db.query(
            """
            INSERT INTO push_to_start_tokens (app_id, device_id, attributes_type, token, updated_at, dropped_at, drop_reason)
            VALUES (?, ?, ?, ?, ?, NULL, NULL)
            ON CONFLICT (app_id, device_id, attributes_type)
            DO UPDATE SET token = excluded.token, updated_at = excluded.updated_at, dropped_at = NULL, drop_reason = NULL
            """,
            [.text(appID), .text(deviceID), .text(token.attributesType), .text(token.token), .integer(millis(token.updatedAt))]
        )
    }

    /// Moves the remote starts of a device's iPhone that have not gone out yet from its push-to-start token `previous` to
    /// the token that replaced it, and makes their activities pending, so each start goes to the token the phone has now:
    /// APNs refuses the rotated one, and a start sent there is lost (PROTOCOLS.md: keep the newest token; old ones start
    /// failing). A start already sent is left alone: the phone's app registers the update token of the activity it made.
    static func moveUnsentStarts(appID: String, deviceID: String, from previous: String, to token: String, nowMillis: Int, on db: any SQLConnection) throws {
        let moved = try db.query(
            """
            UPDATE instances SET push_token = ?, updated_at = ?
            WHERE app_id = ? AND device_id = ? AND platform = 'ios' AND state = 'starting' AND delivered_sequence = 0 AND push_token = ?
            RETURNING activity_id
            """,
            [.text(token), .integer(nowMillis), .text(appID), .text(deviceID), .text(previous)]
        )
        for row in moved {
            try markPending(appID: appID, activityID: try row.string("activity_id"), in: db)
        }
    }

    static func insertTags(_ tags: [String: String], appID: String, deviceID: String, on db: any SQLConnection) throws {
        for (key, value) in tags.sorted(by: { $0.key < $1.key }) {
            try db.query(
                "INSERT INTO device_tags (app_id, device_id, key, value) VALUES (?, ?, ?, ?)",
                [.text(appID), .text(deviceID), .text(key), .text(value)]
            )
        }
    }

    static func tagsJSON(_ tags: [String: String]) -> SQLiteData {
        .text(JSONValue.object(tags.mapValues(JSONValue.string)).encodedString)
    }

    static func deviceWithoutTokens(from row: StoreRow) throws -> DeviceRecord {
        DeviceRecord(
            appID: try row.string("app_id"),
            deviceID: try row.string("device_id"),
            platform: Platform(rawValue: try row.string("platform")) ?? .ios,
            userID: row.column("user_id")?.string,
            tags: try row.json("tags")?.objectValue?.compactMapValues(\.stringValue) ?? [:],
            pushToStartTokens: [],
            fcmToken: row.column("fcm_token")?.string,
            fcmTokenDroppedAt: row.column("fcm_token_dropped_at")?.integer.map(date),
            fcmTokenDropReason: row.column("fcm_token_drop_reason")?.string,
            osVersion: row.column("os_version")?.string,
            locale: row.column("locale")?.string,
            createdAt: try row.date("created_at"),
            updatedAt: try row.date("updated_at")
        )
    }

    static func pushToStartToken(from row: StoreRow) throws -> PushToStartToken {
        PushToStartToken(
            attributesType: try row.string("attributes_type"),
            token: try row.string("token"),
            updatedAt: try row.date("updated_at"),
            droppedAt: row.column("dropped_at")?.integer.map(date),
            dropReason: row.column("drop_reason")?.string
        )
    }
}
