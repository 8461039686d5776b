import Foundation
import LivelineCore

extension APNsEmulatorCore {
    /// A call to Liveline that a change on a phone asks for, and where its outcome is kept.
    struct PendingRegistration: Sendable {
        enum Subject: Sendable {
            /// `lastRegistration` of the phone with this id.
            case phone(String)
            /// `lastRegistration` of the activity with this update token.
            case activity(String)
        }
        var target: LivelineRegistrationTarget
        var request: RegistrationRequest
        var subject: Subject
    }

    /// Why a phone cannot be created.
    enum PhoneError: Error, Equatable {
        case phoneExists(String)
        case noAttributesTypes
    }

    /// Creates a simulated iPhone with one push-to-start token per attributes type; its app registers with Liveline
    /// when `registerWith` is given.
    func createPhone(
        id: String?, deviceID: String?, userID: String?, tags: JSONValue?, bundleID: String, attributesTypes: [String],
        registerWith: LivelineRegistrationTarget?, osVersion: String = SimulatedIPhone.defaultOSVersion
    ) throws(PhoneError) -> SimulatedPhoneDisplay {
        guard !attributesTypes.isEmpty else { throw .noAttributesTypes }
        let id = id ?? "iphone-" + String(APNsEmulator.randomToken().prefix(12))
        let now = clock()
        let created = state.withLock { state -> (SimulatedPhoneDisplay, PendingRegistration?)? in
            guard state.phones[id] == nil else { return nil }
            var tokens: [String: String] = [:]
            for type in attributesTypes {
                let token = APNsEmulator.randomToken()
                tokens[type] = token
                state.pushToStart[token] = PushToStartToken(phoneID: id, attributesType: type)
            }
            let phone = SimulatedIPhone(
                id: id, deviceID: deviceID ?? id, userID: userID, tags: tags, bundleID: bundleID, order: state.nextPhoneOrder,
                pushToStartTokens: tokens, registerWith: registerWith, osVersion: osVersion
            )
            state.nextPhoneOrder += 1
            state.bundles.insert(bundleID)
            state.phones[id] = phone
            let registration = registerWith.map { PendingRegistration(target: $0, request: phone.deviceRegistration, subject: .phone(id)) }
            return (Self.display(phone, state: state, now: now), registration)
        }
        guard let created else { throw .phoneExists(id) }
        let (display, registration) = created
        changed()
        if let registration { submit(registration) }
        return display
    }

    /// The phone issues a new push-to-start token for `attributesType`; the old one answers 410 `Unregistered` from
    /// now on. `nil` when there is no such phone or the phone has no token for that type.
    func rotatePushToStartToken(phoneID: String, attributesType: String) -> SimulatedPhoneDisplay? {
        let now = clock()
        let rotated = state.withLock { state -> (SimulatedPhoneDisplay, PendingRegistration?)? in
            guard var phone = state.phones[phoneID], let old = phone.pushToStartTokens[attributesType] else { return nil }
            state.pushToStart[old]?.revokedAt = now
            let token = APNsEmulator.randomToken()
            state.pushToStart[token] = PushToStartToken(phoneID: phoneID, attributesType: attributesType)
            phone.pushToStartTokens[attributesType] = token
            state.phones[phoneID] = phone
            let registration = phone.registerWith.map {
                PendingRegistration(target: $0, request: phone.deviceRegistration, subject: .phone(phoneID))
            }
            return (Self.display(phone, state: state, now: now), registration)
        }
        guard let rotated else { return nil }
        let (display, registration) = rotated
        changed()
        if let registration { submit(registration) }
        return display
    }

    /// The phone's Live Activity showing Liveline activity `activityID` (its `attributes.liveline.activityId`; the newest
    /// such activity) gets a new update token, as ActivityKit's `pushTokenUpdates` yields one: the activity, with what
    /// it shows, moves to the new token; the old token answers 410 `Unregistered` from now on; and the app registers the
    /// new token with Liveline (`PUT /v1/activities/{activityId}/instances/{deviceId}`) when the phone has
    /// `registerWith`.
    func rotateActivityToken(
        phoneID: String, activityID: String
    ) throws(APNsEmulator.ActivityTokenRotationError) -> SimulatedPhoneDisplay {
        let now = clock()
        let rotated = state.withLock { state -> Result<(SimulatedPhoneDisplay, PendingRegistration?), APNsEmulator.ActivityTokenRotationError> in
            guard var phone = state.phones[phoneID] else { return .failure(.noPhone(phoneID)) }
            guard let index = phone.activityTokens.lastIndex(where: { state.devices[$0]?.activityID == activityID }) else {
                return .failure(.noActivity(activityID))
            }
            let old = phone.activityTokens[index]
            guard Self.isHexToken(old), var device = state.devices[old] else { return .failure(.noUpdateToken(activityID)) }
            let token = APNsEmulator.randomToken()
            device.sequence = state.nextDeviceSequence
            state.nextDeviceSequence += 1
            device.unregisteredAt = nil
            device.lastRegistration = nil
            state.devices[token] = device
            if state.devices[old]?.unregisteredAt == nil { state.devices[old]?.unregisteredAt = now }
            phone.activityTokens[index] = token
            state.phones[phoneID] = phone
            let registration = phone.registerWith.map { target in
                PendingRegistration(
                    target: target,
                    request: .instance(
                        activityID: activityID, deviceID: phone.deviceID, platform: "ios", pushToken: token,
                        attributesType: device.activity.attributesType
                    ),
                    subject: .activity(token)
                )
            }
            return .success((Self.display(phone, state: state, now: now), registration))
        }
        switch rotated {
        case .failure(let error):
            throw error
        case .success(let (display, registration)):
            changed()
            if let registration { submit(registration) }
            return display
        }
    }

    func phone(id: String) -> SimulatedPhoneDisplay? {
        let now = clock()
        return state.withLock { state in state.phones[id].map { Self.display($0, state: state, now: now) } }
    }

    /// Every simulated iPhone, in the order they were created.
    func phones() -> [SimulatedPhoneDisplay] {
        let now = clock()
        return state.withLock { state in
            state.phones.values.sorted { $0.order < $1.order }.map { Self.display($0, state: state, now: now) }
        }
    }

    static func display(_ phone: SimulatedIPhone, state: State, now: Date) -> SimulatedPhoneDisplay {
        let activities = phone.activityTokens.compactMap { token -> PhoneLiveActivity? in
            guard let device = state.devices[token] else { return nil }
            return PhoneLiveActivity(
                updateToken: token, activityID: device.activityID, attributesType: device.activity.attributesType ?? "",
                inputPushTokenRequested: device.inputPushTokenRequested ?? false, lastRegistration: device.lastRegistration,
                state: display(token: token, device: device, now: now), channelID: device.channelID
            )
        }
        return SimulatedPhoneDisplay(
            id: phone.id, deviceID: phone.deviceID, userID: phone.userID, tags: phone.tags, bundleID: phone.bundleID,
            pushToStartTokens: phone.pushToStartTokens, activities: activities, registerWith: phone.registerWith,
            lastRegistration: phone.lastRegistration, ignoredStartCount: phone.ignoredStartCount,
            lastIgnoredStartReason: phone.lastIgnoredStartReason, osVersion: phone.version
        )
    }

    /// Applies an accepted push to a push-to-start token, under the state lock: a valid start makes a Live Activity
    /// with a fresh update token (a new device in the registry); anything else is ignored, with the reason.
    static func pushToStart(
        _ decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>, entry: PushToStartToken,
        state: inout State, now: Date
    ) -> (PhoneVerdict, PendingRegistration?) {
        guard var phone = state.phones[entry.phoneID] else { return (.ignored("no such phone"), nil) }
        let shown = Set(
            phone.activityTokens.compactMap { token -> String? in
                guard let device = state.devices[token], !device.activity.atTime(now).isDismissed(at: now) else { return nil }
                return device.activityID
            }
        )
        switch PushToStartRule.evaluate(decoded, tokenAttributesType: entry.attributesType, shownActivityIDs: shown) {
        case .ignored(let why):
            phone.ignoredStartCount += 1
            phone.lastIgnoredStartReason = why
            state.phones[phone.id] = phone
            return (.ignored(why), nil)
        case .start:
            guard case .success(let push) = decoded else { return (.ignored("unreadable"), nil) }
            // iOS 18 subscribes the activity to the channel the start names. Apple: "If you send this payload to a
            // device that doesn't run iOS 18 and later, then the Live Activity will not start."
            if push.inputPushChannel != nil, !phone.supportsBroadcastChannels {
                let why = "input-push-channel needs iOS 18 or later; this phone runs iOS \(phone.version)"
                phone.ignoredStartCount += 1
                phone.lastIgnoredStartReason = why
                state.phones[phone.id] = phone
                return (.ignored(why), nil)
            }
            let channelID = push.inputPushChannel
            // A channel activity gets an update token only when the start asks for one; otherwise it is kept under a
            // local key no token push can reach. Without a channel the phone issues one either way, as iOS 17.2 did.
            let issuesToken = channelID == nil || push.inputPushTokenRequested
            let updateToken = issuesToken ? APNsEmulator.randomToken() : "channel-" + String(APNsEmulator.randomToken().prefix(32))
            var device = Device(bundleID: phone.bundleID, sequence: state.nextDeviceSequence)
            state.nextDeviceSequence += 1
            device.phoneID = phone.id
            device.activityID = push.livelineActivityID
            device.inputPushTokenRequested = push.inputPushTokenRequested
            device.channelID = channelID
            let verdict = device.activity.apply(.success(push), now: now)
            state.devices[updateToken] = device
            phone.activityTokens.append(updateToken)
            state.phones[phone.id] = phone
            var registration: PendingRegistration?
            if let target = phone.registerWith, let activityID = push.livelineActivityID {
                let request: RegistrationRequest =
                    if let channelID, !issuesToken {
                        .channelInstance(
                            activityID: activityID, deviceID: phone.deviceID, channelID: channelID, attributesType: entry.attributesType
                        )
                    } else {
                        .instance(
                            activityID: activityID, deviceID: phone.deviceID, platform: "ios", pushToken: updateToken,
                            attributesType: entry.attributesType
                        )
                    }
                registration = PendingRegistration(target: target, request: request, subject: .activity(updateToken))
            }
            return (verdict, registration)
        }
    }

    /// Hands a registration to the registrar; its outcome lands on the phone or activity.
    func submit(_ registration: PendingRegistration) {
        guard let registrar else { return }
        registrar.submit(registration.request, to: registration.target) { [weak self] result in
            guard let self else { return }
            self.state.withLock { state in
                switch registration.subject {
                case .phone(let id): state.phones[id]?.lastRegistration = result
                case .activity(let token): state.devices[token]?.lastRegistration = result
                }
            }
            self.changed()
        }
    }

    // MARK: Persistence

    /// What the phone file holds: every phone and device with what it shows, and every push-to-start token.
    ///
    /// Broadcast channels (id, bundle id, policy, deleted or not) are kept too, and the iPhones' channel activities
    /// with them (they are devices). The control API's anonymous subscribers are not: they live in memory only.
    struct SavedPhones: Codable {
        var version = 1
        var phones: [String: SimulatedIPhone]
        var pushToStart: [String: PushToStartToken]
        var devices: [String: Device]
        var nextDeviceSequence: Int
        var nextPhoneOrder: Int
        /// Absent in files written before channels existed.
        var channels: [String: BroadcastChannel]?
        var nextChannelOrder: Int?
    }

    func encodePhones() throws -> Data {
        let saved = state.withLock {
            SavedPhones(
                phones: $0.phones, pushToStart: $0.pushToStart, devices: $0.devices, nextDeviceSequence: $0.nextDeviceSequence,
                nextPhoneOrder: $0.nextPhoneOrder, channels: $0.channels, nextChannelOrder: $0.nextChannelOrder
            )
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try encoder.encode(saved)
    }

    /// Replaces the phones and devices with those of a phone file.
    func loadPhones(_ data: Data) throws {
        let saved = try JSONDecoder().decode(SavedPhones.self, from: data)
        state.withLock { state in
            state.phones = saved.phones
            state.pushToStart = saved.pushToStart
            state.devices = saved.devices
            state.nextDeviceSequence = saved.nextDeviceSequence
            state.nextPhoneOrder = saved.nextPhoneOrder
            state.channels = saved.channels ?? [:]
            state.nextChannelOrder = saved.nextChannelOrder ?? state.channels.count
            for channel in state.channels.values { state.bundles.insert(channel.bundleID) }
            for device in saved.devices.values { state.bundles.insert(device.bundleID) }
            for phone in saved.phones.values { state.bundles.insert(phone.bundleID) }
        }
    }
}
