import Foundation
import LivelineTestSupport
import Synchronization
import Testing

@testable import LivelineKit

/// A transport whose answers the test chooses, recording every request; it can hold requests until released.
final class ScriptedTransport: LivelineTransport {
    struct NoAnswer: Error {}

    private struct State {
        var requests: [LivelineHTTPRequest] = []
        var answer: @Sendable (LivelineHTTPRequest) -> LivelineHTTPResponse? = { _ in LivelineHTTPResponse(status: 200, headers: [:], body: Data()) }
        var holding = false
        var held: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    var requests: [LivelineHTTPRequest] { state.withLock { $0.requests } }

    /// Answers each request with `answer` (`nil`: a transport error).
    func answer(_ answer: @escaping @Sendable (LivelineHTTPRequest) -> LivelineHTTPResponse?) {
        state.withLock { $0.answer = answer }
    }

    /// Holds requests (after recording them) until ``release()``.
    func hold() { state.withLock { $0.holding = true } }

    func release() {
        let held = state.withLock { state in
            state.holding = false
            defer { state.held = [] }
            return state.held
        }
        for continuation in held { continuation.resume() }
    }

    func send(_ request: LivelineHTTPRequest, to serverURL: URL) async throws -> LivelineHTTPResponse {
        let holding = state.withLock { state in
            state.requests.append(request)
            return state.holding
        }
        if holding {
            await withCheckedContinuation { continuation in
                let stillHolding = state.withLock { state in
                    if state.holding { state.held.append(continuation) }
                    return state.holding
                }
                if !stillHolding { continuation.resume() }
            }
        }
        guard let response = state.withLock({ $0.answer })(request) else { throw NoAnswer() }
        return response
    }
}

/// Polls `condition` every 10 ms for up to `seconds`. The bound is generous: these tests share the process and its two cores with
/// the end-to-end fan-outs, and under the whole suite a first request took more than 5 s to be sent. What they check is
/// what happens, not how fast.
func eventually(_ seconds: Double = 60, _ condition: () async -> Bool) async -> Bool {
    let deadline = Date() + seconds
    while Date() < deadline {
        if await condition() { return true }
        try? await Task.sleep(nanoseconds: 10_000_000)
    }
    return await condition()
}

func requestBody(_ request: LivelineHTTPRequest) -> NSDictionary? {
    try? JSONSerialization.jsonObject(with: request.body) as? NSDictionary
}

func kitConfiguration(_ directory: URL, retry: LivelineRetryPolicy = LivelineRetryPolicy(initialDelay: 0.05, maximumDelay: 0.2)) -> LivelineConfiguration {
    LivelineConfiguration(
        serverURL: URL(string: "http://127.0.0.1:9")!, publishableKey: "pk_test", deviceID: "install-1", storageDirectory: directory,
        retry: retry
    )
}

func makeClient(_ configuration: LivelineConfiguration, _ transport: ScriptedTransport, random: Double = 0.5) throws -> LivelineClient {
    let keys = Mutex(0)
    return try LivelineClient(
        configuration: configuration, transport: transport, clock: { Date() }, random: { random },
        idempotencyKeys: { keys.withLock { $0 += 1; return "key-\($0)" } }
    )
}

/// The client actor over a scripted transport: persistence, in-flight rotation, retries, refusals, tracking.
@Suite("LivelineKit client")
struct ClientTests {
    @Test("A client recreated on the same storage directory sends what the first one left, newest token, in order")
    func persistence() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-persist")
        defer { try? FileManager.default.removeItem(at: directory) }
        // Offline, with a long backoff: every call fails once and waits. The answers are held until every call is
        // recorded: a call merged into an operation after its failure makes it due again (newer data is tried at
        // once), and the device's registration then failed twice whenever the first send finished between the calls.
        let offline = ScriptedTransport()
        offline.answer { _ in nil }
        offline.hold()
        var first: LivelineClient? = try makeClient(kitConfiguration(directory, retry: LivelineRetryPolicy(initialDelay: 600, maximumDelay: 600)), offline)
        let events = await first!.events()
        await first!.registerDevice(userID: "user-1", locale: "en-US")
        await first!.setPushToStartToken(Data([0xab, 0xcd]), attributesType: "MatchAttributes")
        await first!.registerActivity(id: "match-42", attributesType: "MatchAttributes", pushToken: Data([0x01]))
        await first!.registerActivity(id: "match-42", attributesType: "MatchAttributes", pushToken: "0202")
        await first!.report(.dismissed, activityID: "match-42")
        offline.release()
        var iterator = events.makeAsyncIterator()
        guard case .willRetry(let waiting, let at, let reason)? = await iterator.next() else {
            Issue.record("expected a retry")
            return
        }
        // Full jitter with random 0.5: half the 600 s ceiling.
        #expect(waiting.key == .device && reason.hasPrefix("transport") && at > Date() + 290)
        // Both registrations have failed once (and been written back); the event waits behind its activity's.
        #expect(await eventually { await first!.pendingOperations().prefix(2).allSatisfy { $0.attempts == 1 } })
        let left = await first!.pendingOperations()
        #expect(left.map(\.key) == [.device, .activity("match-42"), .event(activityID: "match-42", type: "dismissed")])
        let file = try Data(contentsOf: kitConfiguration(directory).outboxFile)
        #expect(String(decoding: file, as: UTF8.self).contains("0202"))
        first = nil

        // Back online, a new process: the outbox is read and sent without any call.
        let online = ScriptedTransport()
        let second = try makeClient(kitConfiguration(directory), online)
        #expect(await eventually { await second.pendingOperations().isEmpty })
        let sent = online.requests
        try #require(sent.count == 3)
        #expect(sent.map { "\($0.method) \($0.path)" } == [
            "PUT /v1/devices/install-1", "PUT /v1/activities/match-42/instances/install-1",
            "POST /v1/activities/match-42/instances/install-1/events",
        ])
        #expect(requestBody(sent[0]) == ["platform": "ios", "userId": "user-1", "locale": "en-US", "pushToStartTokens": ["MatchAttributes": "abcd"]] as NSDictionary)
        #expect(requestBody(sent[1]) == ["platform": "ios", "pushToken": "0202", "attributesType": "MatchAttributes"] as NSDictionary)
        #expect(requestBody(sent[2]) == ["type": "dismissed"] as NSDictionary)
        // The idempotency key recorded by the first client is the one sent.
        guard case .report(_, _, let key) = left[2].kind else { Issue.record("not an event"); return }
        #expect(sent[2].headers["Idempotency-Key"] == key)
        #expect(try LivelineClient.loadOutbox(kitConfiguration(directory)).operations.isEmpty)
        // Persisted waits are cleared when loaded; attempt counts are kept.
        try FileManager.default.removeItem(at: kitConfiguration(directory).outboxFile)
        let third = try makeClient(kitConfiguration(directory, retry: LivelineRetryPolicy(initialDelay: 600, maximumDelay: 600)), offline)
        await third.registerActivity(id: "a", attributesType: nil, pushToken: "aa")
        #expect(await eventually { await third.pendingOperations().first?.attempts == 1 })
        let reloaded = try LivelineClient.loadOutbox(kitConfiguration(directory))
        #expect(reloaded.operations.count == 1 && reloaded.operations[0].attempts == 1 && reloaded.operations[0].notBefore == nil)
    }

    @Test("A rotation arriving while the older token is in flight is sent afterwards")
    func rotationInFlight() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-inflight")
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport = ScriptedTransport()
        transport.hold()
        let client = try makeClient(kitConfiguration(directory), transport)
        await client.registerActivity(id: "a", attributesType: "T", pushToken: "aa")
        #expect(await eventually { transport.requests.count == 1 })
        await client.registerActivity(id: "a", attributesType: "T", pushToken: "bb")
        transport.release()
        #expect(await eventually { await client.pendingOperations().isEmpty })
        #expect(transport.requests.map { requestBody($0)?["pushToken"] as? String } == ["aa", "bb"])
    }

    @Test("429 waits at least Retry-After, then succeeds; a 4xx is dropped with the server's code; events follow")
    func retryAndReject() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-retry")
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport = ScriptedTransport()
        let calls = Mutex(0)
        transport.answer { request in
            let call = calls.withLock { $0 += 1; return $0 }
            if call == 1 { return LivelineHTTPResponse(status: 429, headers: ["retry-after": "1"], body: Data()) }
            if request.path.contains("/activities/bad/") {
                return LivelineHTTPResponse(
                    status: 422, headers: [:], body: Data(#"{"error":{"code":"invalid_push_token","message":"not hex","field":"pushToken"}}"#.utf8)
                )
            }
            return LivelineHTTPResponse(status: 201, headers: [:], body: Data())
        }
        let client = try makeClient(kitConfiguration(directory), transport)
        let events = await client.events()
        let other = await client.events()
        let started = Date()
        await client.registerActivity(id: "good", attributesType: nil, pushToken: "aa")
        var iterator = events.makeAsyncIterator()
        guard case .willRetry(let operation, let at, let reason)? = await iterator.next() else {
            Issue.record("expected a retry")
            return
        }
        #expect(operation.attempts == 1 && reason == "HTTP 429")
        #expect(at.timeIntervalSince(started) >= 1)
        guard case .sent(let sent, let status)? = await iterator.next() else {
            Issue.record("expected sent")
            return
        }
        #expect(sent.key == .activity("good") && status == 201)
        #expect(Date().timeIntervalSince(started) >= 1)

        await client.registerActivity(id: "bad", attributesType: nil, pushToken: "zz")
        await client.report(.ended, activityID: "bad")
        guard case .rejected(let rejected, let rejectedStatus, let code, let message)? = await iterator.next() else {
            Issue.record("expected a rejection")
            return
        }
        #expect(rejected.key == .activity("bad") && rejectedStatus == 422 && code == "invalid_push_token" && message == "not hex")
        // The event went after the refused registration (and was refused too: the stand-in refuses all of "bad").
        guard case .rejected(let event, _, _, _)? = await iterator.next() else {
            Issue.record("expected the event's rejection")
            return
        }
        #expect(event.key == .event(activityID: "bad", type: "ended"))
        #expect(await client.pendingOperations().isEmpty)
        #expect(transport.requests.count == 4)
        // Every subscriber hears every event.
        var otherIterator = other.makeAsyncIterator()
        guard case .willRetry? = await otherIterator.next() else {
            Issue.record("the second subscriber missed the retry")
            return
        }
    }

    @Test("flush sends at once what waits in backoff")
    func flush() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-flush")
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport = ScriptedTransport()
        transport.answer { _ in nil }
        let client = try makeClient(kitConfiguration(directory, retry: LivelineRetryPolicy(initialDelay: 600, maximumDelay: 600)), transport)
        await client.registerDevice(userID: "u")
        #expect(await eventually { await client.pendingOperations().first?.attempts == 1 })
        transport.answer { _ in LivelineHTTPResponse(status: 200, headers: [:], body: Data()) }
        await client.flush()
        #expect(await client.pendingOperations().isEmpty)
        #expect(transport.requests.count == 2)
    }

    @Test("An unreadable outbox file is an error, not an empty outbox")
    func unreadable() throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-unreadable")
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data("not json".utf8).write(to: kitConfiguration(directory).outboxFile)
        #expect(throws: LivelineError.self) { try makeClient(kitConfiguration(directory), ScriptedTransport()) }
    }

    @Test("A device registration refused for its user id sends its push-to-start token again on its own")
    func tokenOutlivesARefusedField() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-token-alone")
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport = ScriptedTransport()
        let calls = Mutex(0)
        transport.answer { request in
            // The first attempt fails on the way, so that the token merges into the waiting registration.
            guard calls.withLock({ $0 += 1; return $0 }) > 1 else { return nil }
            let body = requestBody(request)
            if body?["userId"] != nil {
                return LivelineHTTPResponse(
                    status: 422, headers: [:], body: Data(#"{"error":{"code":"invalid_id","message":"no","field":"userId"}}"#.utf8)
                )
            }
            return LivelineHTTPResponse(status: 201, headers: [:], body: Data())
        }
        let client = try makeClient(kitConfiguration(directory), transport)
        await client.registerDevice(userID: "alice@example.com")
        await client.setPushToStartToken("abcd", attributesType: "MatchAttributes")
        #expect(await eventually {
            let pending = await client.pendingOperations()
            return transport.requests.count == 3 && pending.isEmpty
        })
        let merged = try #require(transport.requests.dropFirst().first.flatMap(requestBody))
        #expect(merged["userId"] as? String == "alice@example.com" && merged["pushToStartTokens"] != nil)
        let retried = try #require(transport.requests.last.flatMap(requestBody))
        #expect(retried["userId"] == nil)
        #expect((retried["pushToStartTokens"] as? NSDictionary)?["MatchAttributes"] as? String == "abcd")
        // A refusal of the tokens themselves is not sent again.
        #expect(LivelineClient.tokensAlone(LivelineDeviceRegistration(pushToStartTokens: ["A": "zz"]), refusedField: "pushToStartTokens.A") == nil)
        #expect(LivelineClient.tokensAlone(LivelineDeviceRegistration(userID: "u", pushToStartTokens: ["A": "zz"]), refusedField: "pushToStartTokens.A") == nil)
        #expect(LivelineClient.tokensAlone(LivelineDeviceRegistration(pushToStartTokens: ["A": "zz"]), refusedField: "userId") == nil)
    }

    @Test("A secret key is refused before anything is sent: it would work on these routes, and ship inside the app")
    func secretKeyRefused() throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-secret")
        defer { try? FileManager.default.removeItem(at: directory) }
        var configuration = kitConfiguration(directory)
        configuration.publishableKey = "sk_" + String(repeating: "A", count: 48)
        let transport = ScriptedTransport()
        #expect(throws: LivelineError.notAPublishableKey) { try makeClient(configuration, transport) }
        #expect(transport.requests.isEmpty)
    }
}

/// A Live Activity made of streams the test feeds.
struct FakeActivity: LivelineTrackableActivity {
    var livelineActivityID: String
    var attributesTypeName: String
    var pushTokenUpdates: AsyncStream<Data>
    var activityStateUpdates: AsyncStream<LivelineActivityState>
}

struct FakePushToStart: LivelinePushToStartSource {
    var attributesTypeName: String
    var pushToStartTokenUpdates: AsyncStream<Data>
}

@Suite("LivelineKit tracking")
struct TrackingTests {
    @Test("track: each token registers (a rotation replaces), ended and dismissed are reported, dismissed stops it")
    func track() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-track")
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport = ScriptedTransport()
        let client = try makeClient(kitConfiguration(directory), transport)
        let (tokens, tokenInput) = AsyncStream.makeStream(of: Data.self)
        let (states, stateInput) = AsyncStream.makeStream(of: LivelineActivityState.self)
        let tracking = Task {
            await client.track(
                FakeActivity(livelineActivityID: "match-42", attributesTypeName: "MatchAttributes", pushTokenUpdates: tokens, activityStateUpdates: states)
            )
        }
        tokenInput.yield(Data([0xaa]))
        #expect(await eventually { transport.requests.count == 1 })
        stateInput.yield(.active)
        stateInput.yield(.stale)
        tokenInput.yield(Data([0xbb]))
        #expect(await eventually { transport.requests.count == 2 })
        stateInput.yield(.ended)
        #expect(await eventually { transport.requests.count == 3 })
        stateInput.yield(.dismissed)
        // Dismissed ends the tracking though the token stream is still open.
        await tracking.value
        #expect(await eventually { await client.pendingOperations().isEmpty })
        let sent = transport.requests.map { request -> String in
            let body = requestBody(request)
            return "\(request.method) \(request.path) \(body?["pushToken"] as? String ?? body?["type"] as? String ?? "")"
        }
        #expect(sent == [
            "PUT /v1/activities/match-42/instances/install-1 aa", "PUT /v1/activities/match-42/instances/install-1 bb",
            "POST /v1/activities/match-42/instances/install-1/events ended",
            "POST /v1/activities/match-42/instances/install-1/events dismissed",
        ])
        #expect(LivelineClient.event(for: .stale) == nil && LivelineClient.event(for: .pending) == nil)
        tokenInput.finish()
    }

    @Test("observePushToStart registers each push-to-start token for its type")
    func pushToStart() async throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-pts")
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport = ScriptedTransport()
        let client = try makeClient(kitConfiguration(directory), transport)
        let (tokens, input) = AsyncStream.makeStream(of: Data.self)
        input.yield(Data([0x01, 0x02]))
        input.finish()
        await client.observePushToStart(FakePushToStart(attributesTypeName: "MatchAttributes", pushToStartTokenUpdates: tokens))
        #expect(await eventually { await client.pendingOperations().isEmpty && transport.requests.count == 1 })
        #expect(requestBody(transport.requests[0]) == ["platform": "ios", "pushToStartTokens": ["MatchAttributes": "0102"]] as NSDictionary)
    }

    @Test("Liveline.configure makes one shared client; another configuration is refused")
    func shared() throws {
        let directory = uniqueTemporaryURL(prefix: "livelinekit-shared")
        defer { try? FileManager.default.removeItem(at: directory) }
        let configuration = kitConfiguration(directory)
        try Liveline.configure(configuration)
        #expect(Liveline.isConfigured)
        #expect(Liveline.client.configuration == configuration)
        try Liveline.configure(configuration)
        var other = configuration
        other.deviceID = "install-2"
        #expect(throws: LivelineError.alreadyConfigured) { try Liveline.configure(other) }
    }
}
