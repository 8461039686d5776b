import Foundation
import Testing

@testable import LivelineKit

/// The outbox's pure rules: coalescing, in-flight revisions, order, backoff. No clock, no sockets.
@Suite("LivelineKit outbox")
struct OutboxTests {
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    func attempt(_ operation: LivelineOperation) -> LivelineOutbox.Attempt {
        LivelineOutbox.Attempt(key: operation.key, revision: operation.revision)
    }

    @Test("The newest token wins per activity; device fields merge; push-to-start tokens merge per type")
    func coalescing() {
        var outbox = LivelineOutbox()
        outbox.record(.registerActivity(activityID: "match-42", attributesType: "MatchAttributes", pushToken: "aa"))
        outbox.record(.registerActivity(activityID: "match-42", attributesType: nil, pushToken: "bb"))
        outbox.record(.registerActivity(activityID: "order-7", attributesType: nil, pushToken: "cc"))
        outbox.record(.registerDevice(LivelineDeviceRegistration(userID: "user-1", tags: ["team": "red"])))
        outbox.record(.registerDevice(LivelineDeviceRegistration(pushToStartTokens: ["MatchAttributes": "01"])))
        outbox.record(.registerDevice(LivelineDeviceRegistration(locale: "en-US", pushToStartTokens: ["OrderAttributes": "02"])))
        outbox.record(.registerDevice(LivelineDeviceRegistration(userID: "user-2", pushToStartTokens: ["MatchAttributes": "03"])))

        #expect(outbox.operations.count == 3)
        #expect(outbox.operation(.activity("match-42"))?.kind
            == .registerActivity(activityID: "match-42", attributesType: "MatchAttributes", pushToken: "bb"))
        #expect(outbox.operation(.activity("match-42"))?.revision == 1)
        #expect(outbox.operation(.activity("order-7"))?.revision == 0)
        #expect(outbox.operation(.device)?.kind == .registerDevice(LivelineDeviceRegistration(
            userID: "user-2", tags: ["team": "red"], locale: "en-US",
            pushToStartTokens: ["MatchAttributes": "03", "OrderAttributes": "02"]
        )))
        #expect(outbox.operation(.device)?.revision == 3)
    }

    @Test("A channel subscription and a token registration of one activity coalesce: the newer one is sent; events wait for either")
    func channelSubscriptions() {
        var outbox = LivelineOutbox()
        outbox.record(.registerActivity(activityID: "match-42", attributesType: "MatchAttributes", pushToken: "aa"))
        outbox.record(.subscribeActivity(activityID: "match-42", attributesType: nil, channelID: "c1"))
        #expect(outbox.operations.count == 1)
        #expect(outbox.operation(.activity("match-42"))?.kind == .subscribeActivity(activityID: "match-42", attributesType: nil, channelID: "c1"))
        outbox.record(.subscribeActivity(activityID: "match-42", attributesType: "MatchAttributes", channelID: "c2"))
        outbox.record(.subscribeActivity(activityID: "match-42", attributesType: nil, channelID: "c3"))
        #expect(outbox.operation(.activity("match-42"))?.kind
            == .subscribeActivity(activityID: "match-42", attributesType: "MatchAttributes", channelID: "c3"))
        outbox.record(.report(activityID: "match-42", event: .dismissed, idempotencyKey: "k"))
        // The event waits for the activity's registration, of either kind.
        #expect(outbox.next(at: t0)?.key == .activity("match-42"))
        #expect(outbox.next(at: t0, excluding: [attempt(outbox.operation(.activity("match-42"))!)]) == nil)
    }

    @Test("Events: one per activity and type; the same event keeps its idempotency key, another value replaces it")
    func events() {
        var outbox = LivelineOutbox()
        outbox.record(.report(activityID: "a", event: .dismissed, idempotencyKey: "k1"))
        outbox.record(.report(activityID: "a", event: .dismissed, idempotencyKey: "k2"))
        outbox.record(.report(activityID: "a", event: .ended, idempotencyKey: "k3"))
        outbox.record(.report(activityID: "b", event: .dismissed, idempotencyKey: "k4"))
        outbox.record(.report(activityID: "a", event: .frequentPushes(enabled: true), idempotencyKey: "k5"))
        outbox.record(.report(activityID: "a", event: .frequentPushes(enabled: false), idempotencyKey: "k6"))
        #expect(outbox.operations.count == 4)
        #expect(outbox.operation(.event(activityID: "a", type: "dismissed"))?.kind
            == .report(activityID: "a", event: .dismissed, idempotencyKey: "k1"))
        #expect(outbox.operation(.event(activityID: "a", type: "dismissed"))?.revision == 0)
        #expect(outbox.operation(.event(activityID: "a", type: "frequentPushes"))?.kind
            == .report(activityID: "a", event: .frequentPushes(enabled: false), idempotencyKey: "k6"))
    }

    @Test("Order: device, then instance registrations, then events; an event waits for its activity's registration")
    func order() throws {
        var outbox = LivelineOutbox()
        outbox.record(.report(activityID: "a", event: .ended, idempotencyKey: "k1"))
        outbox.record(.report(activityID: "b", event: .dismissed, idempotencyKey: "k2"))
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "aa"))
        outbox.record(.registerActivity(activityID: "c", attributesType: nil, pushToken: "cc"))
        outbox.record(.registerDevice(LivelineDeviceRegistration(userID: "u")))

        var sent: [LivelineOperation.Key] = []
        while let next = outbox.next(at: t0) {
            sent.append(next.key)
            let removed = outbox.complete(attempt(next))
            #expect(removed)
        }
        #expect(sent == [.device, .activity("a"), .activity("c"), .event(activityID: "a", type: "ended"), .event(activityID: "b", type: "dismissed")])
        #expect(outbox.operations.isEmpty)

        // While a's registration waits (even in backoff), its event is held back and not counted as due.
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "dd"))
        outbox.record(.report(activityID: "a", event: .dismissed, idempotencyKey: "k3"))
        let registration = try #require(outbox.next(at: t0))
        outbox.fail(attempt(registration), retryAt: t0 + 10, reason: "offline")
        #expect(outbox.next(at: t0) == nil)
        #expect(outbox.nextDue(at: t0) == t0 + 10)
        #expect(outbox.next(at: t0, ignoringBackoff: true)?.key == .activity("a"))
        #expect(outbox.next(at: t0 + 10)?.key == .activity("a"))
    }

    @Test("A newer token merged while the older is in flight survives the older's success and is sent next")
    func inFlight() throws {
        var outbox = LivelineOutbox()
        outbox.record(.registerActivity(activityID: "a", attributesType: "T", pushToken: "aa"))
        let first = try #require(outbox.next(at: t0))
        var attempted: Set<LivelineOutbox.Attempt> = [attempt(first)]
        #expect(outbox.next(at: t0, excluding: attempted) == nil)
        // The rotation arrives while "aa" is on the wire.
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "bb"))
        let removedOlder = outbox.complete(attempt(first))
        #expect(!removedOlder)
        let second = try #require(outbox.next(at: t0, excluding: attempted))
        #expect(second.kind == .registerActivity(activityID: "a", attributesType: "T", pushToken: "bb"))
        attempted.insert(attempt(second))
        let removedNewer = outbox.complete(attempt(second))
        #expect(removedNewer)
        #expect(outbox.operations.isEmpty)

        // The same for a refusal: the older revision's rejection leaves the newer one.
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "cc"))
        let third = try #require(outbox.next(at: t0))
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "dd"))
        let rejectedOlder = outbox.reject(attempt(third))
        #expect(!rejectedOlder)
        #expect(outbox.operation(.activity("a"))?.kind == .registerActivity(activityID: "a", attributesType: nil, pushToken: "dd"))
    }

    @Test("A failure counts an attempt and waits; a newer call clears the wait but keeps the count")
    func failure() throws {
        var outbox = LivelineOutbox()
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "aa"))
        let first = try #require(outbox.next(at: t0))
        let failed = outbox.fail(attempt(first), retryAt: t0 + 4, reason: "HTTP 503")
        let waiting = try #require(failed)
        #expect(waiting.attempts == 1 && waiting.notBefore == t0 + 4 && waiting.lastError == "HTTP 503")
        #expect(outbox.next(at: t0 + 3) == nil)
        #expect(outbox.nextDue(at: t0) == t0 + 4)
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "bb"))
        let rotated = try #require(outbox.operation(.activity("a")))
        #expect(rotated.notBefore == nil && rotated.attempts == 1 && rotated.revision == 1)
        #expect(outbox.next(at: t0)?.kind == .registerActivity(activityID: "a", attributesType: nil, pushToken: "bb"))
        // The same call again changes nothing.
        outbox.record(.registerActivity(activityID: "a", attributesType: nil, pushToken: "bb"))
        #expect(outbox.operation(.activity("a"))?.revision == 1)
        // A loaded outbox (a new process) clears every wait and keeps the counts.
        let again = try #require(outbox.next(at: t0))
        outbox.fail(attempt(again), retryAt: t0 + 60, reason: "offline")
        #expect(outbox.next(at: t0) == nil)
        outbox.clearWaits()
        #expect(outbox.next(at: t0)?.attempts == 2)
    }

    @Test("The outbox survives encoding")
    func codable() throws {
        var outbox = LivelineOutbox()
        outbox.record(.registerDevice(LivelineDeviceRegistration(userID: "u", tags: ["a": "b"], pushToStartTokens: ["T": "01"])))
        outbox.record(.registerActivity(activityID: "a", attributesType: "T", pushToken: "aa"))
        outbox.record(.report(activityID: "a", event: .frequentPushes(enabled: true), idempotencyKey: "k"))
        let first = try #require(outbox.next(at: t0))
        outbox.fail(attempt(first), retryAt: t0 + 2, reason: "offline")
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .secondsSince1970
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        #expect(try decoder.decode(LivelineOutbox.self, from: encoder.encode(outbox)) == outbox)
    }
}

/// The retry schedule and the meaning of answers: pure, with the random number given.
@Suite("LivelineKit retry schedule and wire")
struct RetryScheduleTests {
    @Test("Exponential ceilings up to the maximum; full jitter scales the ceiling; Retry-After is a floor")
    func schedule() {
        let policy = LivelineRetryPolicy(initialDelay: 1, maximumDelay: 300)
        #expect((1...10).map { policy.ceiling(afterAttempt: $0) } == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300])
        #expect(policy.ceiling(afterAttempt: 1_000) == 300)
        #expect(policy.delay(afterAttempt: 3, random: 0) == 0)
        #expect(policy.delay(afterAttempt: 3, random: 0.5) == 2)
        #expect(policy.delay(afterAttempt: 3, random: 0.999_999) < 4)
        #expect(policy.delay(afterAttempt: 3, retryAfter: 30, random: 0.5) == 30)
        #expect(policy.delay(afterAttempt: 9, retryAfter: 30, random: 0.5) == 128)
        #expect(LivelineRetryPolicy.standard == LivelineRetryPolicy(initialDelay: 1, maximumDelay: 300, multiplier: 2))
        let clamped = LivelineRetryPolicy(initialDelay: 5, maximumDelay: 1, multiplier: 0.5)
        #expect(clamped.maximumDelay == 5 && clamped.multiplier == 1)
    }

    @Test("2xx is sent; transport-level statuses retry with Retry-After; other 4xx are rejected with error.code")
    func outcomes() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        func response(_ status: Int, _ headers: [String: String] = [:], _ body: String = "") -> LivelineHTTPResponse {
            LivelineHTTPResponse(status: status, headers: headers, body: Data(body.utf8))
        }
        #expect(LivelineWire.outcome(of: response(201), now: now) == .sent(status: 201))
        #expect(LivelineWire.outcome(of: response(200), now: now) == .sent(status: 200))
        #expect(LivelineWire.outcome(of: response(429, ["retry-after": "7"]), now: now) == .retry(reason: "HTTP 429", retryAfter: 7))
        #expect(LivelineWire.outcome(of: response(408), now: now) == .retry(reason: "HTTP 408", retryAfter: nil))
        #expect(
            LivelineWire.outcome(of: response(503, [:], #"{"error":{"code":"database_busy","message":"busy"}}"#), now: now)
                == .retry(reason: "HTTP 503 database_busy", retryAfter: nil)
        )
        #expect(
            LivelineWire.outcome(of: response(422, [:], #"{"error":{"code":"invalid_push_token","message":"hex","field":"pushToken"}}"#), now: now)
                == .rejected(status: 422, code: "invalid_push_token", message: "hex", field: "pushToken")
        )
        #expect(LivelineWire.outcome(of: response(404, [:], "not json"), now: now) == .rejected(status: 404, code: "http_404", message: nil))
        let date = Date(timeIntervalSince1970: 1_800_000_000)
        // 1_800_000_000 is Fri, 15 Jan 2027 08:00:00 GMT.
        #expect(LivelineWire.retryAfter("Fri, 15 Jan 2027 08:00:10 GMT", now: date) == 10)
        #expect(LivelineWire.retryAfter("soon", now: date) == nil)
        #expect(LivelineWire.retryAfter("-3", now: date) == nil)
    }

    @Test("Requests: paths, bodies, the publishable key, the idempotency key")
    func requests() throws {
        let configuration = LivelineConfiguration(
            serverURL: URL(string: "http://127.0.0.1:8080")!, publishableKey: "pk_test", deviceID: "install 1",
            storageDirectory: URL(fileURLWithPath: "/tmp")
        )
        func operation(_ kind: LivelineOperation.Kind) -> LivelineOperation {
            LivelineOperation(kind: kind, sequence: 0, revision: 0, attempts: 0, notBefore: nil, lastError: nil)
        }
        func body(_ request: LivelineHTTPRequest) throws -> NSDictionary {
            try #require(try JSONSerialization.jsonObject(with: request.body) as? NSDictionary)
        }
        let device = LivelineWire.request(
            for: operation(.registerDevice(LivelineDeviceRegistration(userID: "u", tags: ["t": "v"], pushToStartTokens: ["T": "0a"]))),
            configuration: configuration
        )
        #expect(device.method == "PUT" && device.path == "/v1/devices/install%201")
        #expect(device.headers["Authorization"] == "Bearer pk_test")
        #expect(try body(device) == ["platform": "ios", "userId": "u", "tags": ["t": "v"], "pushToStartTokens": ["T": "0a"]] as NSDictionary)
        let instance = LivelineWire.request(
            for: operation(.registerActivity(activityID: "match/42", attributesType: "T", pushToken: "ab")), configuration: configuration
        )
        #expect(instance.method == "PUT" && instance.path == "/v1/activities/match%2F42/instances/install%201")
        #expect(try body(instance) == ["platform": "ios", "pushToken": "ab", "attributesType": "T"] as NSDictionary)
        let subscriber = LivelineWire.request(
            for: operation(.subscribeActivity(activityID: "match/42", attributesType: "T", channelID: "dHJ5IG1lIQ==")), configuration: configuration
        )
        #expect(subscriber.method == "PUT" && subscriber.path == "/v1/activities/match%2F42/instances/install%201")
        #expect(try body(subscriber) == ["platform": "ios", "channelId": "dHJ5IG1lIQ==", "attributesType": "T"] as NSDictionary)
        let event = LivelineWire.request(
            for: operation(.report(activityID: "m", event: .frequentPushes(enabled: false), idempotencyKey: "key-1")), configuration: configuration
        )
        #expect(event.method == "POST" && event.path == "/v1/activities/m/instances/install%201/events")
        #expect(event.headers["Idempotency-Key"] == "key-1")
        #expect(try body(event) == ["type": "frequentPushes", "enabled": false] as NSDictionary)
        #expect(LivelineWire.hex(Data([0x00, 0xab, 0x7f, 0xff])) == "00ab7fff")
    }
}
