import Foundation
import LivelineCore
import LivelineStore

/// How records look on the wire. Dates are ISO-8601 UTC strings.
enum Representation {
    static func date(_ date: Date?) -> JSONValue { date.map { .string(APIDate.iso8601($0)) } ?? .null }
    static func epoch(_ seconds: Int64?) -> JSONValue { seconds.map { .string(APIDate.iso8601(epochSeconds: $0)) } ?? .null }
    static func optional(_ string: String?) -> JSONValue { string.map(JSONValue.string) ?? .null }

    static func activity(_ record: ActivityRecord) -> JSONValue {
        var counts: [String: JSONValue] = [:]
        var total = 0
        for state in InstanceState.allCases {
            let count = record.instanceCounts[state] ?? 0
            counts[state.rawValue] = .integer(Int64(count))
            total += count
        }
        counts["total"] = .integer(Int64(total))
        var channel = JSONValue.null
        if let stored = record.channel { channel = channelDetails(stored, broadcastSequence: record.broadcastSequence) }
        let json: [String: JSONValue] = [
            "activityId": .string(record.activityID),
            "state": .string(record.state.rawValue),
            "attributesType": optional(record.attributesType),
            "attributes": record.attributes ?? .null,
            "contentState": record.contentState ?? .null,
            "sequence": .integer(record.sequence),
            "lastEvent": optional(record.event?.rawValue),
            "lastAcceptedAt": date(record.sequenceAt),
            "alert": record.alert?.apiJSON ?? .null,
            "startAlert": record.startAlert?.apiJSON ?? .null,
            "staleDate": epoch(record.staleDate),
            "relevanceScore": record.relevanceScore.map(JSONValue.number) ?? .null,
            "priority": record.priority.map { .integer(Int64($0)) } ?? .null,
            "dismissalDate": epoch(record.dismissalDate),
            "instances": .object(counts),
            "createdAt": date(record.createdAt),
            "updatedAt": date(record.updatedAt),
            "endedAt": date(record.endedAt),
            "endReason": optional(record.endReason?.rawValue),
            "minUpdateInterval": record.minUpdateInterval.flatMap { $0 > 0 ? JSONValue.number($0) : nil } ?? .null,
            "delivery": .string(record.delivery.rawValue),
            "channelId": optional(record.channel?.id),
            "channel": channel,
        ]
        return .object(json)
    }

    /// A broadcast activity's channel: Apple's id, what it stores, where it stands, and the sequence its last broadcast
    /// carried (or gave up on).
    static func channelDetails(_ channel: BroadcastChannel, broadcastSequence: Int64) -> JSONValue {
        .object([
            "channelId": .string(channel.id),
            "messageStoragePolicy": .string(channel.storagePolicy.rawValue),
            "status": .string(channel.status.rawValue),
            "broadcastSequence": .integer(broadcastSequence),
            "createdAt": date(channel.createdAt),
            "deletedAt": date(channel.deletedAt),
        ])
    }

    static func instance(_ record: InstanceRecord) -> JSONValue {
        .object([
            "activityId": .string(record.activityID),
            "deviceId": .string(record.deviceID),
            "platform": .string(record.platform.rawValue),
            "pushToken": .string(record.pushToken),
            "userId": optional(record.userID),
            "state": .string(record.state.rawValue),
            "frequentPushesEnabled": record.frequentPushesEnabled.map(JSONValue.bool) ?? .null,
            "deliveredSequence": .integer(record.deliveredSequence),
            "channelId": optional(record.channelID),
            "createdAt": date(record.createdAt),
            "updatedAt": date(record.updatedAt),
        ])
    }

    /// An instance as a caller with `scope` may see it: whole for the secret key; for the publishable key (a phone) its
    /// ``instanceReceipt(_:)``.
    static func instance(_ record: InstanceRecord, for scope: APIKeyScope) -> JSONValue {
        scope == .secret ? instance(record) : instanceReceipt(record)
    }

    /// What a phone (the publishable key) is answered about an instance: its ids and state, without its push token and
    /// user id. The publishable key ships inside the app, so whoever extracts it could otherwise read any device's
    /// token and user by naming the device; only the secret key reads those.
    static func instanceReceipt(_ record: InstanceRecord) -> JSONValue {
        // A list of what is shown, not of what is hidden: a field added to the instance stays the secret key's.
        only(
            instance(record),
            ["activityId", "deviceId", "platform", "state", "frequentPushesEnabled", "deliveredSequence", "channelId", "createdAt", "updatedAt"]
        )
    }

    /// A device as a caller with `scope` may see it: whole for the secret key; for the publishable key (a phone) its
    /// ``deviceReceipt(_:)``.
    static func device(_ record: DeviceRecord, for scope: APIKeyScope) -> JSONValue {
        scope == .secret ? device(record) : deviceReceipt(record)
    }

    /// What a phone (the publishable key) is answered about a device: its id, platform and dates, without what is
    /// stored for it (user id, tags, tokens, OS version, locale), which a phone registering under a guessed device id
    /// must not read; only the secret key reads those.
    static func deviceReceipt(_ record: DeviceRecord) -> JSONValue {
        only(device(record), ["deviceId", "platform", "createdAt", "updatedAt"])
    }

    /// `object`'s members named in `keys`, and no others.
    private static func only(_ object: JSONValue, _ keys: Set<String>) -> JSONValue {
        .object((object.objectValue ?? [:]).filter { keys.contains($0.key) })
    }

    /// A device: its usable push-to-start tokens apart from the ones APNs rejected, which are kept to show why and when.
    static func device(_ record: DeviceRecord) -> JSONValue {
        var usable: [String: JSONValue] = [:]
        var dropped: [String: JSONValue] = [:]
        for token in record.pushToStartTokens {
            if let droppedAt = token.droppedAt {
                dropped[token.attributesType] = .object([
                    "token": .string(token.token), "reason": optional(token.dropReason), "droppedAt": date(droppedAt),
                ])
            } else {
                usable[token.attributesType] = .object(["token": .string(token.token), "updatedAt": date(token.updatedAt)])
            }
        }
        return .object([
            "deviceId": .string(record.deviceID),
            "platform": .string(record.platform.rawValue),
            "userId": optional(record.userID),
            "tags": .object(record.tags.mapValues(JSONValue.string)),
            "pushToStartTokens": .object(usable),
            "droppedPushToStartTokens": .object(dropped),
            "fcmToken": optional(record.fcmToken),
            "fcmTokenDropped": record.fcmTokenDroppedAt.map { droppedAt -> JSONValue in
                .object(["reason": optional(record.fcmTokenDropReason), "droppedAt": date(droppedAt)])
            } ?? .null,
            "osVersion": optional(record.osVersion),
            "locale": optional(record.locale),
            "createdAt": date(record.createdAt),
            "updatedAt": date(record.updatedAt),
        ])
    }

    static func accepted(_ accepted: AcceptedSequence, warnings: [JSONValue] = []) -> JSONValue {
        var json: [String: JSONValue] = [
            "activityId": .string(accepted.activityID),
            "sequence": .integer(accepted.sequence),
            "event": .string(accepted.event.rawValue),
            "acceptedAt": date(accepted.acceptedAt),
        ]
        if !warnings.isEmpty { json["warnings"] = .array(warnings) }
        return .object(json)
    }

    static func app(_ app: AppRecord) -> JSONValue {
        .object([
            "id": .string(app.id),
            "name": .string(app.name),
            "bundleId": .string(app.bundleID),
            "androidPackage": optional(app.androidPackage),
            "createdAt": date(app.createdAt),
            "budget": .object([
                "hourly": app.budget.hourly.map { .integer(Int64($0)) } ?? .null,
                "hourlyWithFrequentPushes": app.budget.hourlyWithFrequentPushes.map { .integer(Int64($0)) } ?? .null,
            ]),
            "broadcast": .object([
                "defaultDelivery": optional(app.broadcastDefaults.delivery?.rawValue),
                "messageStoragePolicy": optional(app.broadcastDefaults.storagePolicy?.rawValue),
            ]),
            "devices": .object(["audienceFrom": .string(app.audienceFrom.rawValue)]),
        ])
    }

    /// One push attempt of the timeline; its id is the number the app sees for it (``PublicNumbers``).
    static func delivery(_ record: DeliveryRecord, _ numbers: PublicNumbers) -> JSONValue {
        .object([
            "id": .integer(numbers.shown(record.id)),
            "deviceId": .string(record.deviceID),
            "platform": .string(record.platform.rawValue),
            "sequence": .integer(record.sequence),
            "event": .string(record.event.rawValue),
            "priority": .integer(Int64(record.priority)),
            "status": .string(record.status.rawValue),
            "providerId": optional(record.providerID),
            "reason": optional(record.reason),
            "latencyMs": record.latencyMilliseconds.map(JSONValue.number) ?? .null,
            "attempt": .integer(Int64(record.attempt)),
            "attemptedAt": date(record.attemptedAt),
            "channelId": optional(record.channelID),
        ])
    }

    /// Credentials as operators see them: settings and health. The secret never leaves the Store sealed.
    static func credentials(_ stored: StoredCredentials) -> JSONValue {
        var settings = stored.settings.objectValue ?? [:]
        if settings["caCertificate"].map({ $0 != .null }) == true { settings["caCertificate"] = "(set)" }
        return .object([
            "provider": .string(stored.provider.rawValue),
            "settings": .object(settings),
            "healthy": .bool(stored.healthy),
            "healthReason": optional(stored.healthReason),
            "updatedAt": date(stored.updatedAt),
        ])
    }

    static func page<Item>(_ page: Page<Item>, _ render: (Item) -> JSONValue) -> JSONValue {
        .object(["data": .array(page.items.map(render)), "nextCursor": optional(page.nextCursor)])
    }
}
