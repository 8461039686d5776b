import Crypto
import Foundation
import LivelineCore
import Synchronization
import _CryptoExtras

/// An HTTP answer of the FCM listener, before it is written.
struct FCMAnswer: Sendable {
    var status: Int
    var body: [UInt8]
    /// The `Retry-After` seconds of an injected 429 or 503.
    var retryAfter: Int?
    /// Wait this long before answering (an injected delay).
    var delayMilliseconds: Int = 0
}

/// A refused `messages:send`: Google's error JSON with FCM's `errorCode` detail.
struct FCMRefusal: Error, Sendable {
    var status: Int
    /// FCM's error code for the `FcmError` detail, or `nil` for errors that carry none (401).
    var errorCode: String?
    var message: String
    /// A `google.rpc.ErrorInfo` reason (401s).
    var errorInfoReason: String?
    /// A `google.rpc.BadRequest` field violation, `(field, description)` (400s).
    var fieldViolation: (field: String, description: String)?

    /// A request FCM cannot accept as written: its field violation names `field`, or `message` for the request as a
    /// whole (as Google's "Invalid JSON payload received" answers do). Only a token that is not of a registration
    /// token's form is answered with the `FcmError` detail alone (``notARegistrationToken``).
    static func invalidArgument(_ message: String, field: String = "message") -> FCMRefusal {
        FCMRefusal(
            status: 400, errorCode: "INVALID_ARGUMENT", message: message, errorInfoReason: nil,
            fieldViolation: (field, message)
        )
    }

    static func unauthenticated(_ message: String, reason: String) -> FCMRefusal {
        FCMRefusal(status: 401, errorCode: nil, message: message, errorInfoReason: reason, fieldViolation: nil)
    }

    /// A service account sending for a project it has no rights in: Google's IAM refusal, 403 `PERMISSION_DENIED`
    /// without FCM's detail (`SENDER_ID_MISMATCH` is about a token of another project, not the caller's project).
    static func permissionDenied(projectID: String) -> FCMRefusal {
        FCMRefusal(
            status: 403, errorCode: nil,
            message: "Permission 'cloudmessaging.messages.create' denied on resource '//cloudresourcemanager.googleapis.com/projects/\(projectID)' (or it may not exist).",
            errorInfoReason: "IAM_PERMISSION_DENIED", fieldViolation: nil
        )
    }
    /// A token of an iOS app or a web push registration, which FCM sends through APNs or web push with the project's
    /// APNs certificate or web push key: the emulated projects have neither. Google's `ErrorCode` reference: "A message
    /// targeted to an iOS device or a web push registration could not be sent."
    static let thirdPartyAuthError = FCMRefusal(
        status: 401, errorCode: "THIRD_PARTY_AUTH_ERROR", message: "Auth error from APNS or Web Push Service", errorInfoReason: nil,
        fieldViolation: nil
    )
    static let senderIDMismatch = FCMRefusal(
        status: 403, errorCode: "SENDER_ID_MISMATCH", message: "SenderId mismatch", errorInfoReason: nil, fieldViolation: nil
    )
    /// A token that cannot be an FCM registration token at all, answered as Google's error page shows: 400
    /// `INVALID_ARGUMENT` with FCM's detail alone, no field violation (a well-formed token FCM does not know is 404
    /// ``unregistered``).
    static let notARegistrationToken = FCMRefusal(
        status: 400, errorCode: "INVALID_ARGUMENT", message: "The registration token is not a valid FCM registration token",
        errorInfoReason: nil, fieldViolation: nil
    )
    static let unregistered = FCMRefusal(
        status: 404, errorCode: "UNREGISTERED", message: "Requested entity was not found.", errorInfoReason: nil,
        fieldViolation: nil
    )

    /// Google's canonical status name for an HTTP status.
    static func googleStatus(_ status: Int) -> String {
        switch status {
        case 400: "INVALID_ARGUMENT"
        case 401: "UNAUTHENTICATED"
        case 403: "PERMISSION_DENIED"
        case 404: "NOT_FOUND"
        case 429: "RESOURCE_EXHAUSTED"
        case 503: "UNAVAILABLE"
        default: "INTERNAL"
        }
    }

    /// `{"error": {"code", "message", "status", "details": [...]}}`.
    var body: [UInt8] {
        var details: [JSONValue] = []
        if let errorCode {
            details.append(["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": .string(errorCode)])
        }
        if let errorInfoReason {
            details.append([
                "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": .string(errorInfoReason), "domain": "googleapis.com",
                "metadata": ["service": "fcm.googleapis.com", "method": "google.firebase.fcm.v1.FcmService.SendMessage"],
            ])
        }
        if let fieldViolation {
            details.append([
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [["field": .string(fieldViolation.field), "description": .string(fieldViolation.description)]],
            ])
        }
        let error: JSONValue = [
            "code": .integer(Int64(status)), "message": .string(message), "status": .string(Self.googleStatus(status)),
            "details": .array(details),
        ]
        return JSONValue.object(["error": error]).encoded
    }

    /// The code recorded for this refusal: FCM's, or Google's status when there is none.
    var recordedCode: String { errorCode ?? Self.googleStatus(status) }
}

/// The FCM emulator's state — registered service accounts, issued access tokens, simulated Android phones, faults,
/// message history and counts — and the rules by which Google's token endpoint and FCM's `messages:send` answer.
/// The I/O lives in ``FCMEmulator``; this type is called from every event loop.
final class FCMEmulatorCore: Sendable {
    /// The largest `data` FCM accepts: the UTF-8 bytes of every key and value.
    static let maximumDataBytes = 4096
    /// The largest request body Google's front end accepts.
    static let maximumRequestBytes = 1_048_576
    /// The longest time to live FCM supports: 4 weeks.
    static let maximumTimeToLive: Double = 2_419_200
    /// Data keys FCM reserves: the Message reference names "from" and "message_type", and keys starting with
    /// "google" or "gcm" (the error codes' page: "such as from, or gcm, or any value prefixed by google").
    static let reservedDataKeys: Set<String> = ["from", "message_type"]

    struct Device: Sendable, Codable {
        var projectID: String
        var registeredAt: Date
        var order: Int
        /// Who the phone is, as its app registers with Liveline.
        var deviceID: String?
        var userID: String?
        var tags: JSONValue?
        var registerWith: LivelineRegistrationTarget?
        /// The app instance's platform; nil (phones saved before it was kept) is Android.
        var platform: FCMClientPlatform?
        var lastRegistration: RegistrationResult?
        var unregisteredAt: Date?
        var acceptedCount = 0
        var unusableCount = 0
        var lastUnusableReason: String?
        var highPriorityWithoutNotificationCount = 0
        var notifications: [String: AndroidNotificationState] = [:]
        var notificationOrder: [String] = []

        mutating func notification(_ activityID: String) -> AndroidNotificationState {
            if let existing = notifications[activityID] { return existing }
            notificationOrder.append(activityID)
            let created = AndroidNotificationState(activityID: activityID)
            notifications[activityID] = created
            return created
        }

        func display(token: String, now: Date) -> SimulatedAndroidDevice {
            SimulatedAndroidDevice(
                token: token, projectID: projectID, registeredAt: registeredAt, unregisteredAt: unregisteredAt,
                acceptedCount: acceptedCount, unusableCount: unusableCount, lastUnusableReason: lastUnusableReason,
                highPriorityWithoutNotificationCount: highPriorityWithoutNotificationCount,
                notifications: notificationOrder.compactMap { notifications[$0]?.display(now: now) },
                deviceID: deviceID ?? token, userID: userID, tags: tags, registerWith: registerWith, lastRegistration: lastRegistration
            )
        }
    }

    struct IssuedAccessToken: Sendable {
        var clientEmail: String
        var projectID: String
        var expiresAt: Date
    }

    struct State: Sendable {
        var accounts: [String: RegisteredServiceAccount] = [:]
        var accessTokens: [String: IssuedAccessToken] = [:]
        var devices: [String: Device] = [:]
        var nextDeviceOrder = 0
        var faults = FCMFaults.none
        var history: FCMMessageHistory
        var statistics = FCMEmulatorStatistics()
        /// The token endpoint's URI, the audience assertions must name; set once the listener is bound.
        var tokenURI: String?
    }

    let clock: @Sendable () -> Date
    let accessTokenLifetime: TimeInterval
    let assertionClockSkew: TimeInterval
    let state: Mutex<State>
    /// Makes the simulated apps' calls to Liveline.
    let registrar: LivelineRegistrar?
    /// Called after a phone changed (the emulator saves its phones then).
    let changed: @Sendable () -> Void

    init(
        messageHistoryLimit: Int, accessTokenLifetime: TimeInterval, assertionClockSkew: TimeInterval,
        registrar: LivelineRegistrar? = nil, changed: @escaping @Sendable () -> Void = {},
        clock: @escaping @Sendable () -> Date
    ) {
        self.registrar = registrar
        self.changed = changed
        self.clock = clock
        self.accessTokenLifetime = accessTokenLifetime
        self.assertionClockSkew = assertionClockSkew
        self.state = Mutex(State(history: FCMMessageHistory(capacity: messageHistoryLimit)))
    }

    // MARK: Registry

    var tokenURI: String? {
        get { state.withLock { $0.tokenURI } }
        set { state.withLock { $0.tokenURI = newValue } }
    }

    func registerServiceAccount(_ account: RegisteredServiceAccount) {
        state.withLock { $0.accounts[account.clientEmail] = account }
    }

    func addDevice(
        projectID: String, token: String, deviceID: String? = nil, userID: String? = nil, tags: JSONValue? = nil,
        registerWith: LivelineRegistrationTarget? = nil, platform: FCMClientPlatform = .android
    ) {
        let now = clock()
        state.withLock {
            $0.devices[token] = Device(
                projectID: projectID, registeredAt: now, order: $0.nextDeviceOrder, deviceID: deviceID, userID: userID, tags: tags,
                registerWith: registerWith, platform: platform == .android ? nil : platform
            )
            $0.nextDeviceOrder += 1
        }
        changed()
        if let registerWith {
            let request = RegistrationRequest.androidDevice(deviceID: deviceID ?? token, userID: userID, tags: tags, fcmToken: token)
            submit(request, to: registerWith) { state, result in state.devices[token]?.lastRegistration = result }
        }
    }

    /// Hands a registration to the registrar; `record` keeps its outcome.
    func submit(
        _ request: RegistrationRequest, to target: LivelineRegistrationTarget,
        record: @escaping @Sendable (inout State, RegistrationResult) -> Void
    ) {
        guard let registrar else { return }
        registrar.submit(request, to: target) { [weak self] result in
            guard let self else { return }
            self.state.withLock { record(&$0, result) }
            self.changed()
        }
    }

    // MARK: Persistence

    /// What the phone file holds: every Android phone with its notifications.
    struct SavedPhones: Codable {
        var version = 1
        var devices: [String: Device]
        var nextDeviceOrder: Int
    }

    func encodePhones() throws -> Data {
        let saved = state.withLock { SavedPhones(devices: $0.devices, nextDeviceOrder: $0.nextDeviceOrder) }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try encoder.encode(saved)
    }

    /// Replaces the phones with those of a phone file.
    func loadPhones(_ data: Data) throws {
        let saved = try JSONDecoder().decode(SavedPhones.self, from: data)
        state.withLock {
            $0.devices = saved.devices
            $0.nextDeviceOrder = saved.nextDeviceOrder
        }
    }

    /// Marks the token unregistered from now on; `false` when no such device exists.
    func unregisterDevice(token: String) -> Bool {
        let now = clock()
        let found = state.withLock {
            guard $0.devices[token] != nil else { return false }
            if $0.devices[token]!.unregisteredAt == nil { $0.devices[token]!.unregisteredAt = now }
            return true
        }
        if found { changed() }
        return found
    }

    /// The user swipes the activity's notification away (or blocks it before it shows); `false` when no such device.
    func dismissNotification(token: String, activityID: String) -> Bool {
        let found = state.withLock {
            guard $0.devices[token] != nil else { return false }
            var notification = $0.devices[token]!.notification(activityID)
            notification.dismissedByUser = true
            $0.devices[token]!.notifications[activityID] = notification
            return true
        }
        if found { changed() }
        return found
    }

    /// Every issued access token stops working (as after a revocation): later sends get 401.
    func revokeAccessTokens() {
        state.withLock { $0.accessTokens.removeAll() }
    }

    var faults: FCMFaults {
        get { state.withLock { $0.faults } }
        set { state.withLock { $0.faults = newValue } }
    }

    var statistics: FCMEmulatorStatistics { state.withLock { $0.statistics } }

    func messages(token: String?, limit: Int) -> [ReceivedFCMMessage] {
        state.withLock { $0.history.newest(limit: limit) { token == nil || $0.token == token } }
    }

    func device(token: String) -> SimulatedAndroidDevice? {
        let now = clock()
        return state.withLock { $0.devices[token]?.display(token: token, now: now) }
    }

    func devices() -> [SimulatedAndroidDevice] {
        let now = clock()
        return state.withLock { state in
            state.devices.sorted { $0.value.order < $1.value.order }.map { $0.value.display(token: $0.key, now: now) }
        }
    }

    // MARK: POST /token

    /// Answers an OAuth token request: a JWT bearer grant whose assertion a registered service account signed.
    func handleTokenRequest(contentType: String?, body: [UInt8]) -> FCMAnswer {
        let now = clock()
        let (accounts, audience) = state.withLock { ($0.accounts, $0.tokenURI ?? "") }
        let result = Self.grant(contentType: contentType, body: body, accounts: accounts, audience: audience, now: now, skew: assertionClockSkew)
        switch result {
        case .failure(let refusal):
            state.withLock {
                $0.statistics.tokenRequests += 1
                $0.statistics.tokenRefusals[refusal.error, default: 0] += 1
            }
            return FCMAnswer(status: refusal.status, body: refusal.body)
        case .success(let account):
            let token = "ya29.emulator." + Self.randomText(count: 64)
            let lifetime = Int64(accessTokenLifetime.rounded(.down))
            state.withLock { state in
                state.statistics.tokenRequests += 1
                state.statistics.tokensIssued += 1
                if state.accessTokens.count >= 1024 { state.accessTokens = state.accessTokens.filter { $0.value.expiresAt > now } }
                state.accessTokens[token] = IssuedAccessToken(
                    clientEmail: account.clientEmail, projectID: account.projectID, expiresAt: now + Double(lifetime)
                )
            }
            let body: JSONValue = ["access_token": .string(token), "expires_in": .integer(lifetime), "token_type": "Bearer"]
            return FCMAnswer(status: 200, body: body.encoded)
        }
    }

    static func grant(
        contentType: String?, body: [UInt8], accounts: [String: RegisteredServiceAccount], audience: String, now: Date,
        skew: TimeInterval
    ) -> Result<RegisteredServiceAccount, OAuthRefusal> {
        guard let contentType, contentType.lowercased().hasPrefix("application/x-www-form-urlencoded") else {
            return .failure(OAuthRefusal("invalid_request", "The request must be application/x-www-form-urlencoded."))
        }
        guard let fields = AssertionVerifier.formFields(body) else {
            return .failure(OAuthRefusal("invalid_request", "The form body is malformed or repeats a parameter."))
        }
        guard let grantType = fields["grant_type"] else {
            return .failure(OAuthRefusal("invalid_request", "Missing required parameter: grant_type"))
        }
        guard grantType == "urn:ietf:params:oauth:grant-type:jwt-bearer" else {
            return .failure(OAuthRefusal("unsupported_grant_type", "Invalid grant_type: \(grantType)"))
        }
        guard let assertion = fields["assertion"], !assertion.isEmpty else {
            return .failure(OAuthRefusal("invalid_request", "Missing required parameter: assertion"))
        }
        return AssertionVerifier.verify(assertion, accounts: accounts, audience: audience, now: now, skew: skew)
    }

    // MARK: POST /v1/projects/{project}/messages:send

    /// Answers a `messages:send` request as FCM does, applies an accepted message to the simulated phone, and records
    /// the request.
    func handleSend(projectID: String, authorization: [String], contentType: String?, body: [UInt8]) -> FCMAnswer {
        let now = clock()
        let bearer = authorization.count == 1 ? Self.bearerToken(authorization[0]) : nil
        let (issued, faults) = state.withLock { state in (bearer.flatMap { state.accessTokens[$0] }, state.faults) }
        var token: String?
        var answer: FCMAnswer
        var refusal: FCMRefusal?
        var accepted: ValidatedMessage?
        var messageName: String?
        do throws(FCMRefusal) {
            try Self.authorize(authorization: authorization, bearer: bearer, issued: issued, projectID: projectID, now: now)
            // Faults apply once the access token was accepted.
            if Self.happens(faults.internalErrorRate) {
                throw FCMRefusal(status: 500, errorCode: "INTERNAL", message: "Internal error encountered.")
            }
            if Self.happens(faults.unavailableRate) {
                throw FCMRefusal(status: 503, errorCode: "UNAVAILABLE", message: "The service is currently unavailable.")
            }
            if Self.happens(faults.quotaExceededRate) {
                throw FCMRefusal(status: 429, errorCode: "QUOTA_EXCEEDED", message: "Quota exceeded for this project or device.")
            }
            if let contentType, !contentType.lowercased().hasPrefix("application/json") {
                throw .invalidArgument("Invalid JSON payload received. The content type must be application/json, not \(contentType).")
            }
            let message = try Self.validate(body: body, token: &token)
            guard Self.isRegistrationTokenForm(message.token) else { throw .notARegistrationToken }
            let device = state.withLock { state in
                state.devices[message.token].map { (projectID: $0.projectID, unregisteredAt: $0.unregisteredAt, platform: $0.platform) }
            }
            guard let device, device.unregisteredAt == nil else { throw .unregistered }
            guard device.projectID == projectID else { throw .senderIDMismatch }
            guard (device.platform ?? .android) == .android else { throw .thirdPartyAuthError }
            if message.validateOnly {
                // Checked, not delivered: FCM answers with a placeholder name.
                messageName = "projects/\(projectID)/messages/fake_message_id"
            } else {
                accepted = message
                messageName = "projects/\(projectID)/messages/0:\(Int64(now.timeIntervalSince1970 * 1000))%\(Self.randomHex(count: 16))"
            }
            answer = FCMAnswer(status: 200, body: JSONValue.object(["name": .string(messageName!)]).encoded)
        } catch {
            refusal = error
            answer = FCMAnswer(status: error.status, body: error.body)
            if error.status == 429 || error.status == 503, error.errorCode == "QUOTA_EXCEEDED" || error.errorCode == "UNAVAILABLE" {
                answer.retryAfter = faults.retryAfterSeconds
            }
        }
        if issued != nil { answer.delayMilliseconds = faults.delayMilliseconds }
        if token == nil {
            // Refused before the body was read: still record whom it was for, when the body says.
            token = (try? JSONValue(parsing: body))?.objectValue?["message"]?.objectValue?["token"]?.stringValue
        }

        var record = ReceivedFCMMessage(
            receivedAt: now, projectID: projectID, token: token, body: String(decoding: body, as: UTF8.self),
            status: answer.status, errorCode: refusal?.recordedCode, errorMessage: refusal?.message, messageName: messageName,
            verdict: nil
        )
        let decoded = accepted.map { AndroidNotificationState.decode($0.data) }
        let registration = state.withLock { state -> (RegistrationRequest, LivelineRegistrationTarget, token: String, activityID: String)? in
            var registration: (RegistrationRequest, LivelineRegistrationTarget, token: String, activityID: String)?
            if let accepted, let decoded, state.devices[accepted.token] != nil {
                state.devices[accepted.token]!.acceptedCount += 1
                let verdict: PhoneVerdict
                switch decoded {
                case .success(let update):
                    var notification = state.devices[accepted.token]!.notification(update.activityID)
                    verdict = notification.apply(update, now: now)
                    state.devices[accepted.token]!.notifications[update.activityID] = notification
                    // The app posted the notification for a start: it registers the instance, as on iOS.
                    let device = state.devices[accepted.token]!
                    if verdict.isApplied, update.event == "start", let target = device.registerWith {
                        let request = RegistrationRequest.instance(
                            activityID: update.activityID, deviceID: device.deviceID ?? accepted.token, platform: "android",
                            pushToken: accepted.token, attributesType: nil
                        )
                        registration = (request, target, accepted.token, update.activityID)
                    }
                case .failure(let unusable):
                    verdict = .ignored(unusable.message)
                    state.devices[accepted.token]!.unusableCount += 1
                    state.devices[accepted.token]!.lastUnusableReason = unusable.message
                    if let activityID = unusable.activityID {
                        var notification = state.devices[accepted.token]!.notification(activityID)
                        notification.ignoredCount += 1
                        notification.lastIgnoredReason = unusable.message
                        state.devices[accepted.token]!.notifications[activityID] = notification
                    }
                }
                record.verdict = verdict
                if accepted.highPriority, !verdict.isApplied {
                    state.devices[accepted.token]!.highPriorityWithoutNotificationCount += 1
                }
                if verdict.isApplied { state.statistics.applied += 1 } else { state.statistics.ignored += 1 }
            }
            state.statistics.sendRequests += 1
            state.statistics.byStatus[answer.status, default: 0] += 1
            if answer.status == 200 { state.statistics.accepted += 1 }
            if let refusal { state.statistics.byErrorCode[refusal.recordedCode, default: 0] += 1 }
            state.history.append(record)
            return registration
        }
        if accepted != nil { changed() }
        if let registration {
            let (request, target, token, activityID) = registration
            submit(request, to: target) { state, result in state.devices[token]?.notifications[activityID]?.lastRegistration = result }
        }
        return answer
    }

    /// `Bearer <token>` (the scheme case-insensitive), or `nil`.
    static func bearerToken(_ header: String) -> String? {
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        return token.isEmpty ? nil : token
    }

    private static func authorize(
        authorization: [String], bearer: String?, issued: IssuedAccessToken?, projectID: String, now: Date
    ) throws(FCMRefusal) {
        guard !authorization.isEmpty else {
            throw .unauthenticated(
                "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
                reason: "CREDENTIALS_MISSING"
            )
        }
        guard bearer != nil, let issued else {
            throw .unauthenticated(
                "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
                reason: "ACCESS_TOKEN_TYPE_UNSUPPORTED"
            )
        }
        guard now < issued.expiresAt else {
            throw .unauthenticated(
                "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
                reason: "ACCESS_TOKEN_EXPIRED"
            )
        }
        guard issued.projectID == projectID else { throw .permissionDenied(projectID: projectID) }
    }

    /// A `messages:send` body that passed FCM's checks.
    struct ValidatedMessage: Sendable {
        /// The target registration token.
        var token: String
        /// The data an Android app receives (`android.data` when present, else `data`).
        var data: [String: String]
        /// Whether `android.priority` is high (data messages are normal priority unless they say so).
        var highPriority: Bool
        /// `validate_only`: check, do not deliver.
        var validateOnly: Bool
    }

    /// What FCM checks in a `messages:send` body (the `Message` resource), from "REST Resource: projects.messages".
    /// `token` is set as soon as it is read, for the history.
    static func validate(body: [UInt8], token: inout String?) throws(FCMRefusal) -> ValidatedMessage {
        let root: JSONValue
        do {
            root = try JSONValue(parsing: body)
        } catch {
            throw .invalidArgument("Invalid JSON payload received. \(error).")
        }
        guard let request = root.objectValue else {
            throw .invalidArgument("Invalid JSON payload received. Expected an object, not \(root.kindName).")
        }
        try checkNames(request, allowed: ["message", "validate_only", "validateOnly"], at: nil)
        var validateOnly = false
        for name in ["validate_only", "validateOnly"] {
            guard let value = request[name], value != .null else { continue }
            guard case .bool(let flag) = value else {
                throw .invalidArgument("Invalid value at '\(name)' (TYPE_BOOL), \(value.encodedString).", field: name)
            }
            validateOnly = flag
        }
        guard let messageValue = request["message"], messageValue != .null else {
            throw .invalidArgument("The message is missing.", field: "message")
        }
        guard let message = messageValue.objectValue else {
            throw .invalidArgument("Invalid value at 'message': expected an object, not \(messageValue.kindName).", field: "message")
        }
        try checkNames(
            message,
            allowed: ["name", "data", "notification", "android", "webpush", "apns", "fcm_options", "fcmOptions", "token", "topic", "condition"],
            at: "message"
        )
        let targets = ["token", "topic", "condition"].filter { message[$0] != nil && message[$0] != .null }
        guard !targets.isEmpty else { throw .invalidArgument("Recipient of the message is not set.", field: "message") }
        guard targets.count == 1 else {
            throw .invalidArgument("A message has exactly one target; this one sets \(targets.joined(separator: " and ")).", field: "message")
        }
        guard targets[0] == "token" else {
            throw .invalidArgument(
                "The FCM emulator delivers to registration tokens only; \(targets[0]) messages are not simulated.",
                field: "message.\(targets[0])"
            )
        }
        guard let target = message["token"]?.stringValue, !target.isEmpty else {
            throw .invalidArgument("Invalid value at 'message.token' (TYPE_STRING): a non-empty string is required.", field: "message.token")
        }
        token = target
        var data = try dataMap(message["data"], field: "message.data")
        var highPriority = false
        if let notification = message["notification"], notification != .null, notification.objectValue == nil {
            throw .invalidArgument("Invalid value at 'message.notification': expected an object.", field: "message.notification")
        }
        if let androidValue = message["android"], androidValue != .null {
            guard let android = androidValue.objectValue else {
                throw .invalidArgument("Invalid value at 'message.android': expected an object.", field: "message.android")
            }
            try checkNames(
                android,
                allowed: [
                    "collapse_key", "collapseKey", "priority", "ttl", "restricted_package_name", "restrictedPackageName", "data",
                    "notification", "fcm_options", "fcmOptions", "direct_boot_ok", "directBootOk", "bandwidth_constrained_ok",
                    "bandwidthConstrainedOk", "restricted_satellite_ok", "restrictedSatelliteOk",
                ],
                at: "message.android"
            )
            if let priority = android["priority"], priority != .null {
                guard let text = priority.stringValue, ["high", "normal", "HIGH", "NORMAL"].contains(text) else {
                    throw .invalidArgument(
                        "Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), \(priority.encodedString): expected high or normal.",
                        field: "message.android.priority"
                    )
                }
                highPriority = text.lowercased() == "high"
            }
            if let ttl = android["ttl"], ttl != .null {
                guard let text = ttl.stringValue, let seconds = durationSeconds(text) else {
                    throw .invalidArgument(
                        "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), \(ttl.encodedString): a duration is seconds with up to nine fractional digits followed by 's', like \"3600s\" or \"3.5s\".",
                        field: "message.android.ttl"
                    )
                }
                guard seconds >= 0 else {
                    throw .invalidArgument("message.android.ttl must not be negative.", field: "message.android.ttl")
                }
                guard seconds <= maximumTimeToLive else {
                    throw .invalidArgument(
                        "message.android.ttl \(text) exceeds the longest time to live FCM supports, 4 weeks (2419200s).",
                        field: "message.android.ttl"
                    )
                }
            }
            for name in ["collapse_key", "collapseKey", "restricted_package_name", "restrictedPackageName"] {
                if let value = android[name], value != .null, value.stringValue == nil {
                    throw .invalidArgument(
                        "Invalid value at 'message.android.\(name)' (TYPE_STRING), \(value.encodedString).", field: "message.android.\(name)"
                    )
                }
            }
            if let notification = android["notification"], notification != .null, notification.objectValue == nil {
                throw .invalidArgument("Invalid value at 'message.android.notification': expected an object.", field: "message.android.notification")
            }
            // AndroidConfig.data, when present, replaces Message.data for Android devices.
            if let androidData = android["data"], androidData != .null {
                data = try dataMap(androidData, field: "message.android.data")
            }
        }
        return ValidatedMessage(token: target, data: data, highPriority: highPriority, validateOnly: validateOnly)
    }

    /// Rejects names a proto message does not have, as Google's JSON parser does.
    private static func checkNames(_ object: [String: JSONValue], allowed: Set<String>, at path: String?) throws(FCMRefusal) {
        if let unknown = object.keys.sorted().first(where: { !allowed.contains($0) }) {
            let place = path.map { " at '\($0)'" } ?? ""
            throw .invalidArgument(
                "Invalid JSON payload received. Unknown name \"\(unknown)\"\(place): Cannot find field.",
                field: path.map { "\($0).\(unknown)" } ?? unknown
            )
        }
    }

    /// A `data` map: an object of string values, no reserved keys, at most 4096 bytes of keys and values.
    private static func dataMap(_ value: JSONValue?, field: String) throws(FCMRefusal) -> [String: String] {
        guard let value, value != .null else { return [:] }
        guard let members = value.objectValue else {
            throw .invalidArgument("Invalid value at '\(field)': expected a map of strings, not \(value.kindName).", field: field)
        }
        var data: [String: String] = [:]
        var size = 0
        for key in members.keys.sorted() {
            guard let text = members[key]!.stringValue else {
                throw .invalidArgument(
                    "Invalid value at '\(field)[\(JSONValue.string(key).encodedString)].value' (TYPE_STRING), \(members[key]!.encodedString): data values must be strings.",
                    field: "\(field).\(key)"
                )
            }
            let lowered = key.lowercased()
            if reservedDataKeys.contains(lowered) || lowered.hasPrefix("google") || lowered.hasPrefix("gcm") {
                throw .invalidArgument(
                    "Invalid data payload key \"\(key)\": from, message_type and keys starting with google or gcm are reserved.",
                    field: "\(field).\(key)"
                )
            }
            data[key] = text
            size += key.utf8.count + text.utf8.count
        }
        guard size <= maximumDataBytes else {
            throw .invalidArgument(
                "Message is too big: the data payload is \(size) bytes (keys and values); FCM accepts at most \(maximumDataBytes).",
                field: field
            )
        }
        return data
    }

    /// The seconds of a `google.protobuf.Duration` in JSON form: `-?digits(.digits{1,9})?s`.
    static func durationSeconds(_ text: String) -> Double? {
        guard text.hasSuffix("s") else { return nil }
        var number = Substring(text.dropLast())
        if number.hasPrefix("-") { number = number.dropFirst() }
        let parts = number.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count <= 2, !parts[0].isEmpty, parts[0].utf8.count <= 12,
            parts.allSatisfy({ $0.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } })
        else { return nil }
        if parts.count == 2 { guard (1...9).contains(parts[1].utf8.count) else { return nil } }
        return Double(text.dropLast())
    }

    private static func happens(_ rate: Double) -> Bool {
        rate > 0 && Double.random(in: 0..<1) < rate
    }

    static func randomText(count: Int) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var generator = SystemRandomNumberGenerator()
        return String(decoding: (0..<count).map { _ in alphabet[Int.random(in: 0..<alphabet.count, using: &generator)] }, as: UTF8.self)
    }

    static func randomHex(count: Int) -> String {
        let alphabet = Array("0123456789abcdef".utf8)
        var generator = SystemRandomNumberGenerator()
        return String(decoding: (0..<count).map { _ in alphabet[Int.random(in: 0..<16, using: &generator)] }, as: UTF8.self)
    }

    /// A new registration token in FCM's shape: an instance id, `:APA91b`, and a long random tail.
    /// Whether `token` has the form of an FCM registration token: letters, digits, `_`, `-` and `:` (as in
    /// ``newRegistrationToken()``'s `<instance id>:APA91b<…>`).
    static func isRegistrationTokenForm(_ token: String) -> Bool {
        !token.isEmpty
            && token.utf8.allSatisfy { byte in
                (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                    || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ":")
            }
    }

    static func newRegistrationToken() -> String {
        randomText(count: 22) + ":APA91b" + randomText(count: 134)
    }
}

extension FCMRefusal {
    init(status: Int, errorCode: String, message: String) {
        self.init(status: status, errorCode: errorCode, message: message, errorInfoReason: nil, fieldViolation: nil)
    }
}
