import Foundation

/// The app's connection to Liveline: registers this device, its push-to-start tokens and each Live Activity's update
/// token, and reports what happens to activities on the phone.
///
/// Every call is first recorded in the outbox — a JSON file in ``LivelineConfiguration/storageDirectory``, written
/// atomically — and only then sent, so nothing is lost when the phone is offline or the app is killed: a client
/// created again on the same directory sends what waits. Calls coalesce (the newest token wins; see
/// ``pendingOperations()``), go out in order (device, instance registrations, events), and are retried with
/// exponential backoff and full jitter on transport errors, 408, 429 (never sooner than `Retry-After`) and 5xx.
/// Any other refusal drops the call and is reported as ``LivelineEvent/rejected(_:status:code:message:)``; a device
/// registration refused for one of the device's fields sends its push-to-start tokens again on their own. The key must
/// be the app's publishable key (`pk_…`).
public actor LivelineClient {
    /// What the client was made with.
    public nonisolated let configuration: LivelineConfiguration
    private let transport: any LivelineTransport
    private let clock: @Sendable () -> Date
    private let random: @Sendable () -> Double
    private let newIdempotencyKey: @Sendable () -> String
    private var outbox: LivelineOutbox
    private var subscribers: [UUID: AsyncStream<LivelineEvent>.Continuation] = [:]
    /// The pass sending now, if any.
    private var currentPass: Task<Void, Never>?
    /// The wait for the next due operation, when one is due later.
    private var timer: Task<Void, Never>?
    private var timerDue: Date?
    private var timerGeneration = 0

    /// Creates a client and loads the outbox a previous client on the same storage directory left; whatever waits
    /// there is sent at once (backoff starts over; attempt counts are kept).
    ///
    /// - Throws: ``LivelineError`` when the key is not a publishable key (`pk_…`), or the storage directory cannot be
    ///   created or the outbox file cannot be read.
    public init(configuration: LivelineConfiguration) throws {
        try self.init(
            configuration: configuration, transport: URLSessionTransport(), clock: { Date() },
            random: { Double.random(in: 0..<1) }, idempotencyKeys: { UUID().uuidString.lowercased() }
        )
    }

    /// Creates a client with its I/O and randomness given (tests stand in for the network and the clock).
    init(
        configuration: LivelineConfiguration, transport: any LivelineTransport, clock: @escaping @Sendable () -> Date,
        random: @escaping @Sendable () -> Double, idempotencyKeys: @escaping @Sendable () -> String
    ) throws {
        // A secret key would work on these routes, and ship inside the app: refused before anything is sent.
        guard configuration.publishableKey.hasPrefix("pk_") else { throw LivelineError.notAPublishableKey }
        self.configuration = configuration
        self.transport = transport
        self.clock = clock
        self.random = random
        self.newIdempotencyKey = idempotencyKeys
        self.outbox = try Self.loadOutbox(configuration)
        if !outbox.operations.isEmpty {
            Task { [weak self] in await self?.schedule() }
        }
    }

    deinit {
        timer?.cancel()
        for continuation in subscribers.values { continuation.finish() }
    }

    // MARK: Calls

    /// Registers this device (`PUT /v1/devices/{deviceId}`). Fields left `nil` keep what the server stores; a waiting
    /// registration merges with this one.
    public func registerDevice(userID: String? = nil, tags: [String: String]? = nil, osVersion: String? = nil, locale: String? = nil) async {
        record(.registerDevice(LivelineDeviceRegistration(userID: userID, tags: tags, osVersion: osVersion, locale: locale)))
    }

    /// Registers the device's push-to-start token for an ActivityKit attributes type (iOS 17.2+), so the backend can
    /// start such activities remotely. A newer token for the same type replaces a waiting one.
    public func setPushToStartToken(_ token: Data, attributesType: String) async {
        await setPushToStartToken(LivelineWire.hex(token), attributesType: attributesType)
    }

    /// Registers a push-to-start token given as hexadecimal text.
    public func setPushToStartToken(_ token: String, attributesType: String) async {
        record(.registerDevice(LivelineDeviceRegistration(pushToStartTokens: [attributesType: token])))
    }

    /// Registers the update token of the Live Activity that shows Liveline activity `id`
    /// (`PUT /v1/activities/{id}/instances/{deviceId}`). A new token for the same activity is a rotation: it replaces
    /// the waiting one, and is sent after one already in flight.
    public func registerActivity(id: String, attributesType: String?, pushToken: Data) async {
        await registerActivity(id: id, attributesType: attributesType, pushToken: LivelineWire.hex(pushToken))
    }

    /// Registers an update token given as text: hexadecimal on iOS, the FCM registration token on Android (sent as is).
    public func registerActivity(id: String, attributesType: String?, pushToken: String) async {
        record(.registerActivity(activityID: id, attributesType: attributesType, pushToken: pushToken))
    }

    /// Registers the Live Activity that shows Liveline activity `id` as a subscriber of its broadcast channel (iOS 18:
    /// started with `pushType: .channel(channelID)`, or remotely into the channel), instead of by an update token.
    /// The channel id is the activity's `channelId` (`GET /v1/activities/{id}/channel`). It replaces a waiting token
    /// registration of the same activity, as a newer one of either kind does.
    public func registerActivity(id: String, attributesType: String?, channelID: String) async {
        record(.subscribeActivity(activityID: id, attributesType: attributesType, channelID: channelID))
    }

    /// Reports what happened to activity `activityID` on this phone. The outbox keeps one event per activity and type,
    /// each sent with a stable `Idempotency-Key`, after the activity's waiting registration.
    public func report(_ event: LivelineActivityEvent, activityID: String) async {
        record(.report(activityID: activityID, event: event, idempotencyKey: newIdempotencyKey()))
    }

    /// Sends every waiting call now, backoff or not, and returns when that pass is over (it stops at the first call
    /// that must be retried).
    public func flush() async {
        await runPass(ignoringBackoff: true)
    }

    /// The calls waiting in the outbox: the device registration first, then instance registrations, then events.
    public func pendingOperations() -> [LivelineOperation] {
        outbox.operations.sorted { ($0.rank, $0.sequence) < ($1.rank, $1.sequence) }
    }

    /// A new stream of what happens to calls from now on: sent, will retry at, rejected. Each call makes another
    /// subscriber; a subscriber that stops listening is dropped. Keeps the newest 256 undelivered events.
    public func events() -> AsyncStream<LivelineEvent> {
        let id = UUID()
        let (stream, continuation) = AsyncStream.makeStream(of: LivelineEvent.self, bufferingPolicy: .bufferingNewest(256))
        subscribers[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.unsubscribe(id) }
        }
        return stream
    }

    // MARK: The outbox

    private func record(_ kind: LivelineOperation.Kind) {
        outbox.record(kind)
        persist()
        schedule()
    }

    private func unsubscribe(_ id: UUID) {
        subscribers[id] = nil
    }

    private func emit(_ event: LivelineEvent) {
        for continuation in subscribers.values { continuation.yield(event) }
    }

    private func persist() {
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            encoder.dateEncodingStrategy = .secondsSince1970
            try encoder.encode(outbox).write(to: configuration.outboxFile, options: .atomic)
        } catch {
            emit(.storageFailed("\(error)"))
        }
    }

    static func loadOutbox(_ configuration: LivelineConfiguration) throws -> LivelineOutbox {
        let manager = FileManager.default
        do {
            try manager.createDirectory(at: configuration.storageDirectory, withIntermediateDirectories: true)
        } catch {
            throw LivelineError.storage("cannot create \(configuration.storageDirectory.path): \(error)")
        }
        guard manager.fileExists(atPath: configuration.outboxFile.path) else { return LivelineOutbox() }
        let data: Data
        do {
            data = try Data(contentsOf: configuration.outboxFile)
        } catch {
            throw LivelineError.storage("cannot read \(configuration.outboxFile.path): \(error)")
        }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        do {
            var outbox = try decoder.decode(LivelineOutbox.self, from: data)
            guard outbox.version == 1 else { throw LivelineError.unreadableOutbox("version \(outbox.version) is not 1") }
            // A new process tries what waits at once, whatever backoff the last one had reached.
            outbox.clearWaits()
            return outbox
        } catch let error as LivelineError {
            throw error
        } catch {
            throw LivelineError.unreadableOutbox("\(error)")
        }
    }

    // MARK: Sending

    /// Waits for a pass in progress, then runs one.
    private func runPass(ignoringBackoff: Bool) async {
        while let running = currentPass { await running.value }
        let pass = Task { await self.performPass(ignoringBackoff: ignoringBackoff) }
        currentPass = pass
        await pass.value
    }

    /// Sends due operations one at a time in the outbox's order until none is left or one must be retried (the server
    /// or the network is failing: the others wait too).
    private func performPass(ignoringBackoff: Bool) async {
        var attempted = Set<LivelineOutbox.Attempt>()
        while let operation = outbox.next(at: clock(), ignoringBackoff: ignoringBackoff, excluding: attempted) {
            let attempt = LivelineOutbox.Attempt(key: operation.key, revision: operation.revision)
            attempted.insert(attempt)
            let outcome: LivelineOutcome
            do {
                let response = try await transport.send(
                    LivelineWire.request(for: operation, configuration: configuration), to: configuration.serverURL
                )
                outcome = LivelineWire.outcome(of: response, now: clock())
            } catch {
                outcome = .retry(reason: "transport: \(error)", retryAfter: nil)
            }
            switch outcome {
            case .sent(let status):
                outbox.complete(attempt)
                persist()
                emit(.sent(operation, status: status))
            case .rejected(let status, let code, let message, let field):
                outbox.reject(attempt)
                // A device registration carries the push-to-start tokens merged with the device's fields: refused for
                // one of those (a user id the server does not take, say), the tokens go again on their own, rather
                // than being lost until iOS hands the app new ones.
                if case .registerDevice(let registration) = operation.kind, let retry = Self.tokensAlone(registration, refusedField: field) {
                    outbox.record(.registerDevice(retry))
                }
                persist()
                emit(.rejected(operation, status: status, code: code, message: message))
            case .retry(let reason, let retryAfter):
                let attempts = (outbox.operation(operation.key)?.attempts ?? operation.attempts) + 1
                let retryAt = clock() + configuration.retry.delay(afterAttempt: attempts, retryAfter: retryAfter, random: random())
                if let waiting = outbox.fail(attempt, retryAt: retryAt, reason: reason) {
                    persist()
                    emit(.willRetry(waiting, at: retryAt, reason: reason))
                }
                currentPass = nil
                schedule()
                return
            }
        }
        currentPass = nil
        schedule()
    }

    /// The push-to-start tokens of a refused device registration, to send again on their own; nil when it carried
    /// nothing else (the tokens themselves were refused) or the refusal was about the tokens.
    static func tokensAlone(_ registration: LivelineDeviceRegistration, refusedField field: String?) -> LivelineDeviceRegistration? {
        guard !registration.pushToStartTokens.isEmpty, field.map({ !$0.hasPrefix("pushToStartTokens") }) ?? false else { return nil }
        let alone = LivelineDeviceRegistration(pushToStartTokens: registration.pushToStartTokens)
        return alone == registration ? nil : alone
    }

    /// Arms the timer for the next due operation (at once when one is due now). While a pass runs it does nothing:
    /// the pass arms it when it ends.
    private func schedule() {
        guard currentPass == nil else { return }
        let now = clock()
        guard let due = outbox.nextDue(at: now) else {
            cancelTimer()
            return
        }
        if timer != nil, let timerDue, timerDue <= due { return }
        cancelTimer()
        timerGeneration += 1
        let generation = timerGeneration
        timerDue = due
        let delay = max(0, due.timeIntervalSince(now))
        timer = Task { [weak self] in
            if delay > 0 {
                do { try await Task.sleep(nanoseconds: UInt64(delay * 1_000_000_000)) } catch { return }
            }
            await self?.timerFired(generation)
        }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
        timerDue = nil
    }

    private func timerFired(_ generation: Int) async {
        guard generation == timerGeneration else { return }
        timer = nil
        timerDue = nil
        await runPass(ignoringBackoff: false)
    }
}
