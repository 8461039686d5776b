import AsyncHTTPClient
import Foundation
import LivelineCore
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// Where a simulated app registers with Liveline, as the real app does through the client SDK: the server's base
/// URL (e.g. `http://127.0.0.1:8080`) and the app's publishable key (`pk_…`), sent as `Authorization: Bearer <key>`.
public struct LivelineRegistrationTarget: Sendable, Hashable, Codable {
    /// Liveline's base URL, without the `/v1` path.
    public var url: String
    /// The app's publishable key.
    public var publishableKey: String

    /// Creates a target.
    public init(url: String, publishableKey: String) {
        self.url = url
        self.publishableKey = publishableKey
    }
}

/// One call a simulated app makes to Liveline's `/v1` API: always a `PUT` with a JSON body.
public struct RegistrationRequest: Sendable, Hashable {
    /// The path below the base URL, e.g. `/v1/devices/phone-1`.
    public var path: String
    /// The JSON body.
    public var body: JSONValue

    /// Creates a request.
    public init(path: String, body: JSONValue) {
        self.path = path
        self.body = body
    }

    /// `PUT /v1/devices/{deviceId}` for an iPhone: its user, tags, push-to-start token per attributes type and iOS
    /// version (`"osVersion"`, when given).
    public static func iosDevice(
        deviceID: String, userID: String?, tags: JSONValue?, pushToStartTokens: [String: String], osVersion: String? = nil
    ) -> RegistrationRequest {
        var body: [String: JSONValue] = [
            "platform": "ios", "pushToStartTokens": .object(pushToStartTokens.mapValues(JSONValue.string)),
        ]
        if let osVersion { body["osVersion"] = .string(osVersion) }
        if let userID { body["userId"] = .string(userID) }
        if let tags { body["tags"] = tags }
        return RegistrationRequest(path: "/v1/devices/\(pathSegment(deviceID))", body: .object(body))
    }

    /// `PUT /v1/devices/{deviceId}` for an Android phone: its FCM registration token, user and tags.
    public static func androidDevice(deviceID: String, userID: String?, tags: JSONValue?, fcmToken: String) -> RegistrationRequest {
        var body: [String: JSONValue] = ["platform": "android", "fcmToken": .string(fcmToken)]
        if let userID { body["userId"] = .string(userID) }
        if let tags { body["tags"] = tags }
        return RegistrationRequest(path: "/v1/devices/\(pathSegment(deviceID))", body: .object(body))
    }

    /// `PUT /v1/activities/{activityId}/instances/{deviceId}`: the device now shows the activity and receives its
    /// pushes at `pushToken` (an iPhone's update token, or an Android phone's FCM token).
    public static func instance(
        activityID: String, deviceID: String, platform: String, pushToken: String, attributesType: String?
    ) -> RegistrationRequest {
        var body: [String: JSONValue] = ["platform": .string(platform), "pushToken": .string(pushToken)]
        if let attributesType { body["attributesType"] = .string(attributesType) }
        return RegistrationRequest(
            path: "/v1/activities/\(pathSegment(activityID))/instances/\(pathSegment(deviceID))", body: .object(body)
        )
    }

    /// `PUT /v1/activities/{activityId}/instances/{deviceId}` for an iPhone whose activity is subscribed to a
    /// broadcast channel (iOS 18) and has no update token: `{"platform": "ios", "channelId", "attributesType"}`.
    public static func channelInstance(
        activityID: String, deviceID: String, channelID: String, attributesType: String?
    ) -> RegistrationRequest {
        var body: [String: JSONValue] = ["platform": "ios", "channelId": .string(channelID)]
        if let attributesType { body["attributesType"] = .string(attributesType) }
        return RegistrationRequest(
            path: "/v1/activities/\(pathSegment(activityID))/instances/\(pathSegment(deviceID))", body: .object(body)
        )
    }

    /// Percent-encodes one path segment (a `/` inside an id is escaped too).
    static func pathSegment(_ text: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "/;?#%")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}

/// How the last registration call went, shown by the control API.
public struct RegistrationResult: Sendable, Hashable, Codable {
    /// The path called.
    public var path: String
    /// The HTTP status of the last attempt, `nil` when no answer came (connection refused, timeout).
    public var status: Int?
    /// Whether Liveline answered 2xx.
    public var succeeded: Bool
    /// How many attempts were made.
    public var attempts: Int
    /// Why the last attempt failed: the transport error, or the start of the answer's body.
    public var error: String?
    /// When the last attempt ended.
    public var finishedAt: Date

    /// Creates a result.
    public init(path: String, status: Int?, succeeded: Bool, attempts: Int, error: String?, finishedAt: Date) {
        self.path = path
        self.status = status
        self.succeeded = succeeded
        self.attempts = attempts
        self.error = error
        self.finishedAt = finishedAt
    }
}

/// Makes the simulated apps' registration calls to Liveline in the background, so the answer to the push that caused
/// them never waits for them.
///
/// Each call runs in a short task of its own, tracked here, retried a few times with doubling backoff (transport
/// errors, 429 and 5xx; never another 4xx); ``shutdown()`` cancels and awaits the ones in flight. Failures are logged
/// and reported to `record`; they never reach the push path.
final class LivelineRegistrar: Sendable {
    /// Attempts per call, and the pause before the second (doubling after).
    struct RetryPolicy: Sendable {
        var attempts = 4
        var firstDelay: Duration = .milliseconds(250)
        var timeout: TimeAmount = .seconds(10)
    }

    private struct Tasks {
        var next = 0
        var running: [Int: Task<Void, Never>] = [:]
        var closed = false
    }

    private let tasks = Mutex(Tasks())
    private let logger: Logger
    private let policy: RetryPolicy
    private let clock: @Sendable () -> Date

    init(logger: Logger, policy: RetryPolicy = RetryPolicy(), clock: @escaping @Sendable () -> Date) {
        self.logger = logger
        self.policy = policy
        self.clock = clock
    }

    /// Sends `request` to `target` in the background; `record` hears the outcome. Ignored after ``shutdown()``.
    func submit(
        _ request: RegistrationRequest, to target: LivelineRegistrationTarget,
        record: @escaping @Sendable (RegistrationResult) -> Void
    ) {
        let logger = self.logger, policy = self.policy, clock = self.clock
        tasks.withLock { tasks in
            guard !tasks.closed else { return }
            let id = tasks.next
            tasks.next += 1
            // Unstructured on purpose (a documented exception): a short-lived task per registration, tracked in
            // `running`, removed when done, cancelled and awaited by shutdown().
            tasks.running[id] = Task {
                let result = await Self.send(request, to: target, policy: policy, clock: clock)
                if result.succeeded {
                    logger.debug("Registered with Liveline", metadata: ["path": "\(result.path)", "status": "\(result.status ?? 0)"])
                } else {
                    logger.warning(
                        "Registration with Liveline failed",
                        metadata: [
                            "url": "\(target.url)", "path": "\(result.path)", "status": "\(result.status.map(String.init) ?? "none")",
                            "attempts": "\(result.attempts)", "error": "\(result.error ?? "")",
                        ]
                    )
                }
                record(result)
                _ = self.tasks.withLock { $0.running.removeValue(forKey: id) }
            }
        }
    }

    /// Waits until no registration is in flight (for tests and a final save).
    func waitUntilIdle() async {
        while true {
            let running = tasks.withLock { Array($0.running.values) }
            if running.isEmpty { return }
            for task in running { await task.value }
        }
    }

    /// Refuses further calls, cancels those in flight and waits for them to end.
    func shutdown() async {
        let running = tasks.withLock { tasks in
            tasks.closed = true
            return Array(tasks.running.values)
        }
        for task in running { task.cancel() }
        for task in running { await task.value }
    }

    /// One registration with its retries.
    static func send(
        _ request: RegistrationRequest, to target: LivelineRegistrationTarget, policy: RetryPolicy,
        clock: @Sendable () -> Date
    ) async -> RegistrationResult {
        var base = target.url
        while base.hasSuffix("/") { base.removeLast() }
        var attempt = 0
        var delay = policy.firstDelay
        while true {
            attempt += 1
            var status: Int?
            var failure: String?
            do {
                var http = HTTPClientRequest(url: base + request.path)
                http.method = .PUT
                http.headers.add(name: "Authorization", value: "Bearer \(target.publishableKey)")
                http.headers.add(name: "Content-Type", value: "application/json")
                http.body = .bytes(ByteBuffer(bytes: request.body.encoded))
                let response = try await HTTPClient.shared.execute(http, timeout: policy.timeout)
                status = Int(response.status.code)
                let body = try await response.body.collect(upTo: 64 * 1024)
                if !(200..<300).contains(Int(response.status.code)) {
                    failure = String(decoding: body.readableBytesView.prefix(500), as: UTF8.self)
                }
            } catch {
                failure = "\(error)"
            }
            let succeeded = status.map { (200..<300).contains($0) } ?? false
            let retryable = status.map { $0 == 429 || $0 >= 500 } ?? true
            if succeeded || !retryable || attempt >= policy.attempts || Task.isCancelled {
                return RegistrationResult(
                    path: request.path, status: status, succeeded: succeeded, attempts: attempt, error: failure, finishedAt: clock()
                )
            }
            try? await Task.sleep(for: delay)
            delay *= 2
        }
    }
}
