import Crypto
import Foundation
import LivelineCore
import Synchronization

/// A request as it arrived on an HTTP/2 stream.
struct APNsRequest: Sendable {
    var headers: [ReceivedPush.Header]
    /// The body, kept up to ``APNsEmulatorCore/keptBodyBytes``.
    var body: [UInt8]
    /// The body's full length (it may exceed `body.count`).
    var bodyLength: Int
}

/// What one connection remembers about provider tokens.
struct ConnectionTokenState: Sendable {
    var token: String?
    var issuedAt: Double?
}

/// How to answer a request.
struct APNsOutcome: Sendable {
    enum Answer: Sendable, Hashable {
        /// Answer with `status`, the response headers (`apns-id`, or `apns-request-id` and others), a JSON body.
        case respond(status: Int, headers: [ReceivedPush.Header], body: [UInt8]?, retryAfter: Int?)
        case drop
    }
    var answer: Answer
    /// Wait this long before answering.
    var delayMilliseconds: Int
    /// The `goAwayAfterRequests` fault in force when the request arrived.
    var goAwayAfterRequests: Int?
}

/// The emulator's state: registered keys, bundle ids and devices (each a simulated phone), faults,
/// push history and counts; and the rules by which APNs answers a request. The I/O lives in
/// ``APNsConnectionHandler`` and the control API; this type is called from every event loop.
final class APNsEmulatorCore: Sendable {
    /// The largest payload APNs accepts for a token push.
    static let maximumPayloadBytes = 4096
    /// The most anonymous subscribers one control-API call adds.
    static let maximumSubscribersPerCall = 200_000
    /// Bodies are kept (for the history) up to this size; longer ones are only counted.
    static let keptBodyBytes = 64 * 1024
    /// A provider token older than this is refused as `ExpiredProviderToken`.
    static let providerTokenLifetime: TimeInterval = 3600
    /// A connection may move to a new provider token only if it was issued this long after the last.
    static let providerTokenRefreshInterval: TimeInterval = 20 * 60
    static let topicSuffix = ".push-type.liveactivity"
    static let maximumCachedTokenChecks = 4096

    struct Device: Sendable, Codable {
        var bundleID: String
        var sequence: Int
        var unregisteredAt: Date?
        var activity = LiveActivityState()
        /// Times of accepted priority-10 pushes within the last hour.
        var priority10 = RecentTimes()
        /// For an update token a push-to-start push made: the phone, the Liveline activity id, whether the start
        /// asked for the token, and the last instance registration.
        var phoneID: String?
        var activityID: String?
        var inputPushTokenRequested: Bool?
        var lastRegistration: RegistrationResult?
        /// For a Live Activity a start push subscribed to a broadcast channel (`input-push-channel`, iOS 18): the
        /// channel id. Such a device applies the channel's broadcasts.
        var channelID: String?
    }

    struct State: Sendable {
        var keys: [String: RegisteredSigningKey] = [:]
        /// Counts key registrations, so a verdict made with an older key set is not cached.
        var keyGeneration = 0
        var bundles: Set<String> = []
        var devices: [String: Device] = [:]
        var nextDeviceSequence = 0
        /// Simulated iPhones by id, and their push-to-start tokens (current and rotated away).
        var phones: [String: SimulatedIPhone] = [:]
        var nextPhoneOrder = 0
        var pushToStart: [String: PushToStartToken] = [:]
        var tokenChecks: [String: ProviderTokenCheck] = [:]
        var faults = APNsFaults.none
        /// Broadcast channels by id, deleted ones included (flagged).
        var channels: [String: BroadcastChannel] = [:]
        var nextChannelOrder = 0
        /// A broadcast held back by the `reorderBroadcasts` fault, per channel: applied after the next one.
        var heldBroadcasts: [String: HeldBroadcast] = [:]
        var history: PushHistory
        var statistics = EmulatorStatistics()
        /// Per Live Activity update token, the pushes accepted (200) for each `aps.timestamp`, whether the phone
        /// applied or ignored them (``APNsEmulator/acceptedPushCounts(token:)``). Memory only.
        var acceptedByTimestamp: [String: [Double: Int]] = [:]
    }

    let clock: @Sendable () -> Date
    let clockSkew: TimeInterval
    let state: Mutex<State>
    /// Makes the simulated apps' calls to Liveline.
    let registrar: LivelineRegistrar?
    /// Called after a phone or a device changed (the emulator saves its phones then).
    let changed: @Sendable () -> Void
    /// How many live (not deleted) channels one bundle id may have.
    let maximumChannelsPerApp: Int
    /// The anonymous Live Activities the control API subscribed, per channel id (memory only; never persisted).
    /// Kept apart from ``state`` so a broadcast applied to many of them does not hold the registry lock.
    let audiences = Mutex<[String: [LiveActivityState]]>([:])

    init(
        pushHistoryLimit: Int, clockSkew: TimeInterval, registrar: LivelineRegistrar? = nil,
        changed: @escaping @Sendable () -> Void = {}, maximumChannelsPerApp: Int = 10_000,
        clock: @escaping @Sendable () -> Date
    ) {
        self.clock = clock
        self.maximumChannelsPerApp = maximumChannelsPerApp
        self.clockSkew = clockSkew
        self.registrar = registrar
        self.changed = changed
        self.state = Mutex(State(history: PushHistory(capacity: pushHistoryLimit)))
    }

    // MARK: Registry

    func registerSigningKey(teamID: String, keyID: String, publicKey: P256.Signing.PublicKey) {
        state.withLock {
            $0.keys[keyID] = RegisteredSigningKey(teamID: teamID, keyID: keyID, publicKey: publicKey)
            $0.keyGeneration += 1
            $0.tokenChecks.removeAll()
        }
    }

    func registerBundleID(_ bundleID: String) {
        _ = state.withLock { $0.bundles.insert(bundleID) }
    }

    func addDevice(bundleID: String, token: String) {
        state.withLock {
            $0.bundles.insert(bundleID)
            $0.devices[token] = Device(bundleID: bundleID, sequence: $0.nextDeviceSequence)
            $0.nextDeviceSequence += 1
        }
        changed()
    }

    /// Marks the token unregistered from now on; `false` when no such device exists.
    func expireDevice(token: String) -> Bool {
        let now = clock()
        let found = state.withLock {
            guard $0.devices[token] != nil else { return false }
            if $0.devices[token]!.unregisteredAt == nil { $0.devices[token]!.unregisteredAt = now }
            return true
        }
        if found { changed() }
        return found
    }

    /// The user swipes the activity away; `false` when no such device exists.
    func dismissActivity(token: String) -> Bool {
        let found = state.withLock {
            guard $0.devices[token] != nil else { return false }
            $0.devices[token]!.activity.dismissedByUser = true
            return true
        }
        if found { changed() }
        return found
    }

    var faults: APNsFaults {
        get { state.withLock { $0.faults } }
        set { state.withLock { $0.faults = newValue } }
    }

    func pushes(token: String?, limit: Int) -> [ReceivedPush] {
        state.withLock { $0.history.newest(limit: limit) { token == nil || $0.token == token } }
    }

    /// The newest `limit` broadcasts on `channelID`, newest last.
    func pushes(channelID: String, limit: Int) -> [ReceivedPush] {
        state.withLock { $0.history.newest(limit: limit) { $0.channelID == channelID } }
    }

    func display(token: String) -> DisplayedActivity? {
        let now = clock()
        return state.withLock { state in state.devices[token].map { Self.display(token: token, device: $0, now: now) } }
    }

    /// Every device, in the order they were added.
    func displays() -> [DisplayedActivity] {
        let now = clock()
        return state.withLock { state in
            state.devices.sorted { $0.value.sequence < $1.value.sequence }.map {
                Self.display(token: $0.key, device: $0.value, now: now)
            }
        }
    }

    var statistics: EmulatorStatistics { state.withLock { $0.statistics } }

    func acceptedPushCounts(token: String) -> [Double: Int] {
        state.withLock { $0.acceptedByTimestamp[token] ?? [:] }
    }

    func acceptedPushCounts() -> [String: [Double: Int]] {
        state.withLock { $0.acceptedByTimestamp }
    }

    static func display(token: String, device: Device, now: Date) -> DisplayedActivity {
        let activity = device.activity.atTime(now)
        let hourAgo = now - 3600
        return DisplayedActivity(
            token: token, bundleID: device.bundleID, unregisteredAt: device.unregisteredAt,
            contentState: activity.contentState, timestamp: activity.timestamp, staleDate: activity.staleDate,
            isStale: activity.isStale(at: now), relevanceScore: activity.relevanceScore,
            attributesType: activity.attributesType, attributes: activity.attributes, startedAt: activity.startedAt,
            ended: activity.ended, endedAt: activity.endedAt, dismissalDate: activity.dismissalDate,
            dismissed: activity.isDismissed(at: now), alertCount: activity.alertCount, lastAlert: activity.lastAlert,
            appliedCount: activity.appliedCount, ignoredCount: activity.ignoredCount, lastEvent: activity.lastEvent,
            lastIgnoredReason: activity.lastIgnoredReason,
            priority10LastHour: device.priority10.count(after: hourAgo)
        )
    }

    // MARK: Answering a request

    /// An APNs error answer, before it is recorded.
    struct Rejection: Error {
        var status: Int
        var reason: String
        var timestamp: Int64?

        init(_ status: Int, _ reason: String, timestamp: Int64? = nil) {
            self.status = status
            self.reason = reason
            self.timestamp = timestamp
        }

        var body: [UInt8] {
            var members: [String: JSONValue] = ["reason": .string(reason)]
            if let timestamp { members["timestamp"] = .integer(timestamp) }
            return JSONValue.object(members).encoded
        }
    }

    /// Why a request is not accepted.
    enum Refusal: Error {
        /// Answer with an APNs error.
        case reject(Rejection)
        /// Close the connection instead of answering (an injected fault).
        case drop
    }

    /// What a request's checks need from the shared state, read under one lock.
    struct Snapshot {
        var tokenCheck: ProviderTokenCheck?
        var faults: APNsFaults
        var topicRegistered: Bool
        var device: (bundleID: String, unregisteredAt: Date?)?
    }

    /// Answers one request as APNs does, applies an accepted push to the simulated phone, and
    /// records the request. `connection` is the calling connection's provider-token memory.
    func handle(_ request: APNsRequest, connection: inout ConnectionTokenState) -> APNsOutcome {
        let now = clock()
        let headers = RequestHeaders(request.headers)
        if let bundleID = BroadcastRules.bundleID(path: headers.path) {
            return handleBroadcast(request, headers: headers, bundleID: bundleID, now: now, connection: &connection)
        }
        let apnsID = headers.validAPNsID ?? Self.newAPNsID()
        let token = headers.deviceToken ?? ""
        let providerToken = headers.bearerToken
        let bundleID = headers.topicBundleID
        let snapshot = state.withLock { state in
            Snapshot(
                tokenCheck: providerToken.flatMap { state.tokenChecks[$0] }, faults: state.faults,
                topicRegistered: bundleID.map { state.bundles.contains($0) } ?? false,
                device: state.devices[token].map { ($0.bundleID, $0.unregisteredAt) }
                    ?? state.pushToStart[token].flatMap { entry in state.phones[entry.phoneID].map { ($0.bundleID, entry.revokedAt) } }
            )
        }
        var status: Int?
        var reason: String?
        var body: [UInt8]?
        var retryAfter: Int?
        var accepted: (decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>, priority10: Bool)?
        var faultsApplied = false
        do throws(Refusal) {
            accepted = try evaluate(
                request, headers: headers, token: token, snapshot: snapshot, now: now, connection: &connection,
                faultsApplied: &faultsApplied
            )
            status = 200
        } catch {
            switch error {
            case .drop:
                status = nil
            case .reject(let rejection):
                status = rejection.status
                reason = rejection.reason
                body = rejection.body
                if faultsApplied, Self.injectedReasons.contains(rejection.reason) { retryAfter = snapshot.faults.retryAfterSeconds }
            }
        }

        var record = ReceivedPush(
            receivedAt: now, token: token, headers: request.headers,
            payload: String(decoding: request.body, as: UTF8.self), status: status, reason: reason, apnsID: apnsID,
            verdict: nil
        )
        let registration = state.withLock { state -> PendingRegistration? in
            var registration: PendingRegistration?
            if let accepted, state.devices[token] != nil {
                let verdict: PhoneVerdict
                if state.devices[token]!.phoneID != nil, case .success(let push) = accepted.decoded, push.event == "start" {
                    // The phone made this token for an activity a start push began; only a push-to-start token starts one.
                    verdict = .ignored("start sent to an update token")
                    state.devices[token]!.activity.ignoredCount += 1
                    state.devices[token]!.activity.lastIgnoredReason = "start sent to an update token"
                } else {
                    verdict = state.devices[token]!.activity.apply(accepted.decoded, now: now)
                }
                record.verdict = verdict
                if case .success(let push) = accepted.decoded { state.acceptedByTimestamp[token, default: [:]][push.timestamp, default: 0] += 1 }
                if accepted.priority10 { state.devices[token]!.priority10.record(now, keepingAfter: now - 3600) }
                if verdict.isApplied { state.statistics.applied += 1 } else { state.statistics.ignored += 1 }
            } else if let accepted, let entry = state.pushToStart[token] {
                let outcome = Self.pushToStart(accepted.decoded, entry: entry, state: &state, now: now)
                let verdict = outcome.0
                registration = outcome.1
                record.verdict = verdict
                if verdict.isApplied { state.statistics.applied += 1 } else { state.statistics.ignored += 1 }
            }
            state.statistics.totalRequests += 1
            if let status {
                state.statistics.byStatus[status, default: 0] += 1
                if status == 200 { state.statistics.accepted += 1 }
            } else {
                state.statistics.dropped += 1
            }
            if let reason { state.statistics.byReason[reason, default: 0] += 1 }
            state.history.append(record)
            return registration
        }
        if accepted != nil { changed() }
        if let registration { submit(registration) }
        let answer: APNsOutcome.Answer =
            if let status {
                .respond(status: status, headers: [ReceivedPush.Header(name: "apns-id", value: apnsID)], body: body, retryAfter: retryAfter)
            } else { .drop }
        return APNsOutcome(
            answer: answer, delayMilliseconds: faultsApplied ? snapshot.faults.delayMilliseconds : 0,
            goAwayAfterRequests: faultsApplied ? snapshot.faults.goAwayAfterRequests : nil
        )
    }

    /// The reasons of injected 429 and 503 answers, which carry `retry-after` when configured.
    static let injectedReasons: Set<String> = ["TooManyRequests", "ServiceUnavailable"]

    /// Apple's checks, in order; returns the decoded payload of an accepted push.
    private func evaluate(
        _ request: APNsRequest, headers: RequestHeaders, token: String, snapshot: Snapshot, now: Date,
        connection: inout ConnectionTokenState, faultsApplied: inout Bool
    ) throws(Refusal) -> (decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>, priority10: Bool) {
        do throws(Rejection) {
            try headers.checkMethodAndPath()
            try authenticate(headers, cached: snapshot.tokenCheck, now: now, connection: &connection)
        } catch {
            throw .reject(error)
        }
        // Faults apply once the provider token was accepted.
        let faults = snapshot.faults
        faultsApplied = true
        if Self.happens(faults.dropConnectionRate) { throw .drop }
        if Self.happens(faults.internalErrorRate) { throw .reject(Rejection(500, "InternalServerError")) }
        if Self.happens(faults.unavailableRate) { throw .reject(Rejection(503, "ServiceUnavailable")) }
        if Self.happens(faults.tooManyRequestsRate) { throw .reject(Rejection(429, "TooManyRequests")) }
        do throws(Rejection) {
            let bundleID = try headers.checkAPNsHeaders(isRegistered: snapshot.topicRegistered)
            guard Self.isHexToken(token), let device = snapshot.device else { throw Rejection(400, "BadDeviceToken") }
            guard device.bundleID == bundleID else { throw Rejection(400, "DeviceTokenNotForTopic") }
            if let unregisteredAt = device.unregisteredAt {
                throw Rejection(410, "Unregistered", timestamp: Int64((unregisteredAt.timeIntervalSince1970 * 1000).rounded(.down)))
            }
            if request.bodyLength == 0 { throw Rejection(400, "PayloadEmpty") }
            if request.bodyLength > Self.maximumPayloadBytes { throw Rejection(413, "PayloadTooLarge") }
        } catch {
            throw .reject(error)
        }
        return (LiveActivityState.decode(request.body), headers.priority != "5")
    }

    static func happens(_ rate: Double) -> Bool {
        rate > 0 && Double.random(in: 0..<1) < rate
    }

    /// Checks `authorization: bearer <provider token>` and the connection's token history.
    func authenticate(
        _ headers: RequestHeaders, cached: ProviderTokenCheck?, now: Date, connection: inout ConnectionTokenState
    ) throws(Rejection) {
        guard headers.authorizationCount > 0 else { throw Rejection(403, "MissingProviderToken") }
        guard headers.authorizationCount == 1 else { throw Rejection(400, "DuplicateHeaders") }
        guard let token = headers.bearerToken else { throw Rejection(403, "InvalidProviderToken") }
        guard case .valid(let verified) = cached ?? verifyAndCache(token) else { throw Rejection(403, "InvalidProviderToken") }
        let nowSeconds = now.timeIntervalSince1970
        if verified.issuedAt > nowSeconds + clockSkew { throw Rejection(403, "InvalidProviderToken") }
        if nowSeconds - verified.issuedAt > Self.providerTokenLifetime { throw Rejection(403, "ExpiredProviderToken") }
        if connection.token != token {
            if let previous = connection.issuedAt, abs(verified.issuedAt - previous) < Self.providerTokenRefreshInterval {
                throw Rejection(429, "TooManyProviderTokenUpdates")
            }
            connection.token = token
            connection.issuedAt = verified.issuedAt
        }
    }

    /// Verifies a token's signature once; later requests with the same token read the cache.
    private func verifyAndCache(_ token: String) -> ProviderTokenCheck {
        let (keys, generation) = state.withLock { ($0.keys, $0.keyGeneration) }
        let check = ProviderTokenVerifier.check(token, keys: keys)
        state.withLock { state in
            // A key registered meanwhile cleared the cache; do not store a verdict made without it.
            guard state.keyGeneration == generation else { return }
            if state.tokenChecks.count >= Self.maximumCachedTokenChecks { state.tokenChecks.removeAll() }
            state.tokenChecks[token] = check
        }
        return check
    }

    /// A new lowercase UUID, formatted without going through `String(format:)`.
    static func newAPNsID() -> String {
        let uuid = UUID().uuid
        let bytes = [
            uuid.0, uuid.1, uuid.2, uuid.3, uuid.4, uuid.5, uuid.6, uuid.7,
            uuid.8, uuid.9, uuid.10, uuid.11, uuid.12, uuid.13, uuid.14, uuid.15,
        ]
        let hex = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(36)
        for (index, byte) in bytes.enumerated() {
            if index == 4 || index == 6 || index == 8 || index == 10 { text.append(UInt8(ascii: "-")) }
            text.append(hex[Int(byte >> 4)])
            text.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// A device token is a non-empty, even-length string of hex digits (compared case-insensitively).
    static func isHexToken(_ token: String) -> Bool {
        !token.isEmpty && token.utf8.count % 2 == 0
            && token.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) || (0x41...0x46).contains($0) }
    }
}

/// Times in the order they happened, forgetting those older than a horizon; O(1) amortized.
struct RecentTimes: Sendable, Codable {
    private var times: [Date] = []
    private var start = 0

    mutating func record(_ time: Date, keepingAfter horizon: Date) {
        while start < times.count, times[start] <= horizon { start += 1 }
        if start > 1024, start * 2 > times.count {
            times.removeFirst(start)
            start = 0
        }
        times.append(time)
    }

    /// How many recorded times are later than `horizon`.
    func count(after horizon: Date) -> Int {
        // Times are appended in clock order, so the ones after the horizon form a suffix.
        var low = start
        var high = times.count
        while low < high {
            let middle = (low + high) / 2
            if times[middle] > horizon { high = middle } else { low = middle + 1 }
        }
        return times.count - low
    }
}
