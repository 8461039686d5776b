import Foundation
import LivelineCore

/// What a registration does to a stored device, decided without a database: the device afterwards and the rows a
/// Store must write for it. Every Store implementation applies the same rule.
public struct DeviceRegistrationOutcome: Sendable, Hashable {
    /// The device after the registration.
    public var device: DeviceRecord
    /// Push-to-start tokens to save (new, or replacing their type's token and its drop).
    public var savedPushToStartTokens: [PushToStartToken]
    /// Attributes types whose push-to-start token is removed.
    public var removedPushToStartTypes: [String]
    /// Whether the tag set changed (the tag rows are replaced).
    public var tagsChanged: Bool
    /// Whether the device row itself changed (user, tags, FCM token, OS version, locale).
    public var deviceRowChanged: Bool

    /// Whether anything changed; when nothing did, nothing is written and `updatedAt` stays.
    public var changed: Bool { deviceRowChanged || !savedPushToStartTokens.isEmpty || !removedPushToStartTypes.isEmpty }
}

extension DeviceRegistration {
    /// The device this registration creates: only the tokens it gives, no drops.
    public func newDevice(at now: Date) -> DeviceRecord {
        DeviceRecord(
            appID: appID, deviceID: deviceID, platform: platform, userID: userID.applied(to: nil), tags: tags ?? [:],
            pushToStartTokens: pushToStartTokens.compactMap { type, token in
                token.map { PushToStartToken(attributesType: type, token: $0, updatedAt: now) }
            }.sorted { $0.attributesType < $1.attributesType },
            fcmToken: fcmToken.applied(to: nil), osVersion: osVersion.applied(to: nil), locale: locale.applied(to: nil),
            createdAt: now, updatedAt: now
        )
    }

    /// What this registration does to `device`, registered before with the same platform (the caller checks).
    ///
    /// Fields left out keep; push-to-start tokens merge per attributes type, and one given again (the same token or a
    /// new one) is saved afresh, usable, unless it is already stored and usable; a new FCM token clears the drop.
    /// `updatedAt` moves to `now` only when something changed.
    public func applied(to device: DeviceRecord, at now: Date) -> DeviceRegistrationOutcome {
        var device = device
        var saved: [PushToStartToken] = []
        var removed: [String] = []
        for (attributesType, token) in pushToStartTokens.sorted(by: { $0.key < $1.key }) {
            let index = device.pushToStartTokens.firstIndex { $0.attributesType == attributesType }
            guard let token else {
                if let index {
                    device.pushToStartTokens.remove(at: index)
                    removed.append(attributesType)
                }
                continue
            }
            if let index, device.pushToStartTokens[index].token == token, device.pushToStartTokens[index].isUsable { continue }
            let fresh = PushToStartToken(attributesType: attributesType, token: token, updatedAt: now)
            if let index { device.pushToStartTokens[index] = fresh } else { device.pushToStartTokens.append(fresh) }
            saved.append(fresh)
        }
        device.pushToStartTokens.sort { $0.attributesType < $1.attributesType }

        var rowChanged = false
        var tagsChanged = false
        if let tags, tags != device.tags {
            device.tags = tags
            tagsChanged = true
            rowChanged = true
        }
        switch fcmToken {
        case .keep:
            break
        case .set(let token) where token == device.fcmToken && device.fcmTokenDroppedAt == nil:
            break
        case .clear where device.fcmToken == nil:
            break
        case .set, .clear:
            device.fcmToken = fcmToken.applied(to: device.fcmToken)
            device.fcmTokenDroppedAt = nil
            device.fcmTokenDropReason = nil
            rowChanged = true
        }
        let fields: [(WritableKeyPath<DeviceRecord, String?>, FieldUpdate<String>)] = [
            (\.userID, userID), (\.osVersion, osVersion), (\.locale, locale),
        ]
        for (field, update) in fields {
            let value = update.applied(to: device[keyPath: field])
            if value != device[keyPath: field] {
                device[keyPath: field] = value
                rowChanged = true
            }
        }
        var outcome = DeviceRegistrationOutcome(
            device: device, savedPushToStartTokens: saved, removedPushToStartTypes: removed, tagsChanged: tagsChanged,
            deviceRowChanged: rowChanged
        )
        if outcome.changed { outcome.device.updatedAt = now }
        return outcome
    }
}
