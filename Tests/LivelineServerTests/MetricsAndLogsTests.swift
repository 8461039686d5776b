import CoreMetrics
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import LivelineCore
import LivelineDispatch
@testable import LivelineServer
import LivelineStore
import LivelineTestSupport
import Logging
import NIOConcurrencyHelpers
import Prometheus
import Testing

/// Lines a test's logger wrote.
final class CapturedLog: Sendable {
    private let lines = NIOLockedValueBox<[String]>([])

    var text: String { lines.withLockedValue { $0.joined() } }
    var all: [String] { lines.withLockedValue { $0 } }

    /// A logger at trace level that writes JSON lines here.
    func logger(label: String = "liveline") -> Logger {
        var logger = Logger(label: label) { label in
            var handler = JSONLogHandler(label: label) { [self] line in self.lines.withLockedValue { $0.append(line) } }
            handler.logLevel = .trace
            return handler
        }
        logger.logLevel = .trace
        return logger
    }
}

/// A text stream that keeps what was written to it, a line a write.
final class TextLines: TextOutputStream, Sendable {
    private let written = NIOLockedValueBox<[String]>([])

    var lines: [String] { written.withLockedValue { $0 } }

    func write(_ string: String) {
        written.withLockedValue { $0.append(string) }
    }
}

/// Runs `body` against a router on a real SQLite file, with `metrics` (its own registry by default) and `logger`.
func withMeteredLiveline<T: Sendable>(
    metrics: LivelineMetrics? = LivelineMetrics(), adminToken: String? = nil, logger: Logger = Logger(label: "test"),
    _ body: @Sendable (API, any Store) async throws -> T
) async throws -> T {
    let directory = try TemporaryDirectory()
    let store = try await SQLStore.open(path: directory.databasePath)
    let router = LivelineApplication.makeRouter(
        store: store, clock: TestClock(testStart).wallClock, adminToken: adminToken, metrics: metrics
    )
    let app = Application(router: router, logger: logger)
    do {
        let result = try await app.test(.router) { client in try await body(API(client: client), store) }
        try await store.close()
        return result
    } catch {
        try? await store.close()
        throw error
    }
}

/// The metric lines of a Prometheus text exposition (no comments).
func samples(_ exposition: String) -> [String] {
    exposition.split(separator: "\n").map(String.init).filter { !$0.hasPrefix("#") }
}

@Suite("Metrics at /metrics")
struct MetricsTests {
    @Test("after a registration and an update: the HTTP, Store and state families, route templates, no ids")
    func exposesFamilies() async throws {
        let metrics = LivelineMetrics()
        try await withMeteredLiveline(metrics: metrics) { api, store in
            let app = try await createApp(store)
            #expect(try await api.json(.put, "/v1/activities/order-1234/instances/device-7", key: app.publishableKey, registerBody).status == .created)
            #expect(try await api.json(.post, "/v1/activities/order-1234/updates", key: app.secretKey, ["contentState": ["eta": 5]]).status == .accepted)
            #expect(try await api.call(.get, "/v1/nowhere/at-all", key: app.secretKey).status == .notFound)

            let reply = try await api.call(.get, "/metrics")
            #expect(reply.status == .ok)
            #expect(reply.headers[.contentType] == "text/plain; version=0.0.4; charset=utf-8")
            let text = try #require(reply.json.stringValue)
            for family in [
                "liveline_http_requests_total counter", "liveline_http_request_duration_seconds histogram", "liveline_activities gauge",
                "liveline_instances gauge", "liveline_activities_pending_delivery gauge",
            ] {
                #expect(text.contains("# TYPE \(family)"), "\(family)")
            }
            let lines = samples(text)
            #expect(
                lines.contains(
                    #"liveline_http_requests_total{method="PUT",route="/v1/activities/{activityId}/instances/{deviceId}",status_class="2xx"} 1"#
                )
            )
            #expect(lines.contains(#"liveline_http_requests_total{method="POST",route="/v1/activities/{activityId}/updates",status_class="2xx"} 1"#))
            #expect(lines.contains(#"liveline_http_requests_total{method="GET",route="unmatched",status_class="4xx"} 1"#))
            #expect(
                lines.contains {
                    $0.hasPrefix(#"liveline_http_request_duration_seconds_count{method="POST",route="/v1/activities/{activityId}/updates",status_class="2xx"}"#)
                        && $0.hasSuffix(" 1")
                }
            )
            #expect(lines.contains(#"liveline_activities{state="active"} 1.0"#))
            #expect(lines.contains(#"liveline_activities{state="ended"} 0.0"#))
            #expect(lines.contains(#"liveline_instances{state="active"} 1.0"#))
            #expect(lines.contains(#"liveline_instances{state="invalidated"} 0.0"#))
            // No engine in this router: the update waits for delivery.
            #expect(lines.contains("liveline_activities_pending_delivery 1.0"))
            // Tenant data stays out of the labels.
            for secret in ["order-1234", "device-7", app.id, app.secretKey, app.publishableKey, "nowhere"] {
                #expect(!text.contains(secret), "\(secret) in /metrics")
            }
        }
    }

    @Test("a second scrape counts the scrape before it, and gauges follow the Store")
    func secondScrape() async throws {
        try await withMeteredLiveline { api, store in
            let app = try await createApp(store)
            _ = try await api.call(.get, "/metrics")
            #expect(try await api.json(.put, "/v1/activities/o1/instances/d1", key: app.publishableKey, registerBody).status == .created)
            #expect(try await api.call(.delete, "/v1/activities/o1", key: app.secretKey).status.code < 500)
            let text = try #require(try await api.call(.get, "/metrics").json.stringValue)
            #expect(samples(text).contains(#"liveline_http_requests_total{method="GET",route="/metrics",status_class="2xx"} 1"#))
            let activities = samples(text).filter { $0.hasPrefix("liveline_activities{") }
            #expect(activities.count == 2, "\(activities)")
        }
    }

    @Test("metrics off: /metrics is an unknown path (404 not_found), and /healthz still answers")
    func off() async throws {
        try await withMeteredLiveline(metrics: nil) { api, _ in
            let reply = try await api.call(.get, "/metrics")
            #expect(reply.status == .notFound)
            #expect(reply.errorCode == "not_found")
            #expect(try await api.call(.get, "/healthz").status == .ok)
        }
    }

    @Test("metrics off through the configuration: makeApplication serves no /metrics")
    func offByConfiguration() async throws {
        let reader = try await LivelineConfiguration.reader(flags: [:], file: nil, environment: ["LIVELINE_METRICS_ENABLED": "false"])
        let configuration = try LivelineConfiguration(reader: reader)
        #expect(configuration.metricsEnabled == false)
        let defaults = try LivelineConfiguration(reader: try await LivelineConfiguration.reader(flags: [:], file: nil, environment: [:]))
        #expect(defaults.metricsEnabled)
        let directory = try TemporaryDirectory()
        let store = try await SQLStore.open(path: directory.databasePath)
        let app = LivelineApplication.makeApplication(configuration: configuration, store: store, logger: Logger(label: "test"))
        do {
            try await app.test(.router) { client in
                let reply = try await API(client: client).call(.get, "/metrics")
                #expect(reply.status == .notFound)
            }
            try await store.close()
        } catch {
            try? await store.close()
            throw error
        }
    }

    @Test("route labels: the template in the OpenAPI document's spelling, unmatched otherwise; bounded methods and classes")
    func labels() {
        #expect(HTTPRequestMetrics.routeLabel("/v1/activities/:activityId") == "/v1/activities/{activityId}")
        #expect(HTTPRequestMetrics.routeLabel("v1/activities/:activityId/instances/:deviceId") == "/v1/activities/{activityId}/instances/{deviceId}")
        #expect(HTTPRequestMetrics.routeLabel(nil) == "unmatched")
        #expect(HTTPRequestMetrics.routeLabel("NotFound") == "unmatched")
        #expect(HTTPRequestMetrics.methodLabel(.get) == "GET")
        #expect(HTTPRequestMetrics.methodLabel(HTTPRequest.Method("QUERY")!) == "other")
        #expect(HTTPRequestMetrics.statusClass(202) == "2xx")
        #expect(HTTPRequestMetrics.statusClass(503) == "5xx")
        #expect(HTTPRequestMetrics.statusClass(999) == "other")
    }
}

@Suite("Delivery metrics")
struct DeliveryMetricsTests {
    @Test("push attempts by platform, status and a bounded reason; latency per platform; broadcasts by status")
    func pushes() {
        let registry = PrometheusCollectorRegistry()
        let metrics = DeliveryMetrics(factory: LivelineMetrics.prometheusFactory(registry: registry))
        metrics.recordPush(platform: .ios, status: .delivered, reason: nil, latencyMilliseconds: 12)
        metrics.recordPush(platform: .ios, status: .delivered, reason: nil, latencyMilliseconds: 30)
        metrics.recordPush(platform: .ios, status: .invalidated, reason: "Unregistered", latencyMilliseconds: 8)
        metrics.recordPush(platform: .ios, status: .retrying, reason: "connection reset by peer (errno 104)", latencyMilliseconds: 1)
        metrics.recordPush(platform: .android, status: .retrying, reason: "QUOTA_EXCEEDED", latencyMilliseconds: 40)
        metrics.recordPush(platform: .android, status: .rejected, reason: "HTTP 400", latencyMilliseconds: 40)
        metrics.recordBroadcast(status: .delivered)
        let lines = samples(registry.emitToString())
        #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="delivered",reason="none"} 2"#))
        #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="invalidated",reason="Unregistered"} 1"#))
        #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="retrying",reason="other"} 1"#))
        #expect(lines.contains(#"liveline_pushes_total{platform="android",status="retrying",reason="QUOTA_EXCEEDED"} 1"#))
        #expect(lines.contains(#"liveline_pushes_total{platform="android",status="rejected",reason="HTTP 400"} 1"#))
        #expect(lines.contains(#"liveline_push_latency_seconds_count{platform="ios"} 4"#))
        #expect(lines.contains(#"liveline_push_latency_seconds_count{platform="android"} 2"#))
        #expect(lines.contains(#"liveline_broadcasts_total{status="delivered"} 1"#))
        #expect(lines.contains(#"liveline_broadcasts_total{status="retrying"} 0"#))
    }

    @Test("reason labels stay within a fixed set")
    func reasons() {
        #expect(DeliveryMetrics.reasonLabel(nil) == "none")
        #expect(DeliveryMetrics.reasonLabel("") == "none")
        #expect(DeliveryMetrics.reasonLabel("BadDeviceToken") == "BadDeviceToken")
        #expect(DeliveryMetrics.reasonLabel("ChannelNotRegistered") == "ChannelNotRegistered")
        #expect(DeliveryMetrics.reasonLabel("UNREGISTERED") == "UNREGISTERED")
        #expect(DeliveryMetrics.reasonLabel("HTTP 503") == "HTTP 503")
        #expect(DeliveryMetrics.reasonLabel("HTTP 5030") == "other")
        #expect(DeliveryMetrics.reasonLabel("token 80f6d2a4 refused") == "other")
    }
}

@Suite("Structured logs and request ids")
struct LogsTests {
    @Test("a JSON log line parses, with timestamp, level, label, message, source and flattened string metadata")
    func jsonLine() throws {
        let log = CapturedLog()
        var logger = log.logger(label: "liveline.test")
        logger[metadataKey: "request.id"] = "r-1"
        logger.info(
            "Pushed \"quoted\"\nand a new line",
            metadata: [
                "count": "\(3)", "nested": ["inner": "x", "deeper": ["leaf": "y"]], "list": ["a", "b"], "level": "shadowed",
            ]
        )
        let lines = log.all
        #expect(lines.count == 1)
        let line = try #require(lines.first)
        #expect(line.hasSuffix("}\n"))
        #expect(line.dropLast().contains("\n") == false)
        let object = try #require(try JSONValue(parsing: Array(line.utf8)).objectValue)
        #expect(object["level"] == "info")
        #expect(object["label"] == "liveline.test")
        #expect(object["message"] == "Pushed \"quoted\"\nand a new line")
        #expect(object["source"] == "LivelineServerTests")
        #expect(object["request.id"] == "r-1")
        #expect(object["count"] == "3")
        #expect(object["nested.inner"] == "x")
        #expect(object["nested.deeper.leaf"] == "y")
        #expect(object["list"]?.stringValue != nil)
        #expect(object["metadata.level"] == "shadowed")
        let timestamp = try #require(object["timestamp"]?.stringValue)
        #expect(timestamp.wholeMatch(of: /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z/) != nil, "\(timestamp)")
        #expect(line.hasPrefix(#"{"timestamp":"#))
    }

    @Test("timestamps are UTC ISO 8601 with milliseconds")
    func timestamp() {
        #expect(JSONLogHandler.iso8601(Date(timeIntervalSince1970: 1_795_255_200.042)) == "2026-11-21T10:00:00.042Z")
        #expect(JSONLogHandler.iso8601(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00.000Z")
    }

    @Test("a text line is what StreamLogHandler writes: the logger's, the provider's and the line's metadata, sorted, later ones winning")
    func textLines() {
        struct Failure: Error, CustomStringConvertible { var description: String { "boom" } }
        let provider = Logger.MetadataProvider { ["task": "t1", "shared": "from the provider"] }
        let ours = TextLines()
        let theirs = TextLines()
        var text = TextLogHandler(label: "liveline.test", stream: ours, metadataProvider: provider)
        var stream = StreamLogHandler(label: "liveline.test", stream: theirs, metadataProvider: provider)
        text.logLevel = .debug
        stream.logLevel = .debug
        #expect(text.logLevel == .debug)
        for key in ["request.id", "shared", "a"] {
            text[metadataKey: key] = "\(key) from the logger"
            stream[metadataKey: key] = "\(key) from the logger"
        }
        #expect(text[metadataKey: "a"] == "a from the logger")
        let events = [
            LogEvent(level: .info, message: "plain", metadata: nil, source: "Tests", file: #file, function: #function, line: #line),
            LogEvent(level: .notice, message: "explicit", metadata: ["a": "from the line", "z": "1"], source: "Tests", file: #file, function: #function, line: #line),
            LogEvent(level: .error, message: "failed", error: Failure(), metadata: ["b": "2"], source: "Tests", file: #file, function: #function, line: #line),
            LogEvent(level: .trace, message: "below the level", metadata: nil, source: "Tests", file: #file, function: #function, line: #line),
        ]
        for event in events {
            if event.level >= text.logLevel { text.log(event: event) }
            if event.level >= stream.logLevel { stream.log(event: event) }
        }
        // Everything but the timestamp (the first word) is the same.
        let withoutTimestamps = { (lines: [String]) in lines.map { $0.split(separator: " ", maxSplits: 1).last.map(String.init) ?? "" } }
        #expect(ours.lines.count == 3)
        #expect(withoutTimestamps(ours.lines) == withoutTimestamps(theirs.lines))
        #expect(ours.lines.first?.contains("a=a from the logger request.id=request.id from the logger shared=from the provider task=t1 [Tests] plain") == true)

        // No metadata at all: StreamLogHandler's line without any.
        let bare = TextLines()
        TextLogHandler(label: "bare", stream: bare, metadataProvider: nil).log(event: events[0])
        #expect(bare.lines.first?.hasSuffix(" info bare: [Tests] plain\n") == true)
    }

    @Test("control characters are escaped")
    func escaping() throws {
        var out = ""
        JSONLogHandler.escape("a\u{01}b\\c\t", into: &out)
        #expect(out == #""a\u0001b\\c\t""#)
        #expect(try JSONValue(parsing: Array(out.utf8)) == "a\u{01}b\\c\t")
    }

    @Test("the log format is configured by key, env and value check")
    func configuration() async throws {
        let json = try LivelineConfiguration(reader: try await LivelineConfiguration.reader(flags: [:], file: nil, environment: ["LIVELINE_LOG_FORMAT": "json"]))
        #expect(json.logFormat == .json)
        let plain = try LivelineConfiguration(reader: try await LivelineConfiguration.reader(flags: [:], file: nil, environment: [:]))
        #expect(plain.logFormat == .text)
        let xml = try await LivelineConfiguration.reader(flags: [:], file: nil, environment: ["LIVELINE_LOG_FORMAT": "xml"])
        #expect(throws: ConfigurationError.self) { try LivelineConfiguration(reader: xml) }
        #expect(LivelineConfiguration.keys.contains { $0.name == "liveline.logFormat" && $0.flag == "--log-format" })
        #expect(LivelineConfiguration.keys.contains { $0.name == "liveline.metrics.enabled" && $0.environment == "LIVELINE_METRICS_ENABLED" })
    }

    @Test("X-Request-Id: a usable one is echoed; none or an unusable one gets a new UUID")
    func requestID() async throws {
        try await withMeteredLiveline { api, store in
            let app = try await createApp(store)
            let given = try await api.call(.get, "/healthz", headers: [RequestIDMiddleware<BasicRequestContext>.headerName: "checkout-7f3a:42"])
            #expect(given.headers[RequestIDMiddleware<BasicRequestContext>.headerName] == "checkout-7f3a:42")
            let none = try await api.call(.get, "/v1/activities/x", key: app.secretKey)
            let generated = try #require(none.headers[RequestIDMiddleware<BasicRequestContext>.headerName])
            #expect(UUID(uuidString: generated) != nil)
            // Errors carry it too.
            #expect(none.status == .notFound)
            // Too long, not ASCII, or with spaces, which could forge fields in a text log line.
            for unusable in [String(repeating: "a", count: 129), "caf\u{e9}", "x http.status=200 [fake] Forged"] {
                let reply = try await api.call(.get, "/healthz", headers: [RequestIDMiddleware<BasicRequestContext>.headerName: unusable])
                let id = try #require(reply.headers[RequestIDMiddleware<BasicRequestContext>.headerName])
                #expect(id != unusable)
                #expect(UUID(uuidString: id) != nil)
            }
            let two = try await (api.call(.get, "/healthz"), api.call(.get, "/healthz"))
            #expect(two.0.headers[RequestIDMiddleware<BasicRequestContext>.headerName] != two.1.headers[RequestIDMiddleware<BasicRequestContext>.headerName])
        }
        #expect(RequestIDMiddleware<BasicRequestContext>.requestID(given: String(repeating: "z", count: 128)) == String(repeating: "z", count: 128))
        #expect(RequestIDMiddleware<BasicRequestContext>.requestID(given: "") != "")
        #expect(RequestIDMiddleware<BasicRequestContext>.requestID(given: "a\nb") != "a\nb")
    }

    @Test("a request's log lines carry its request.id, and no API key, admin token or Authorization value")
    func noSecretsInLogs() async throws {
        let log = CapturedLog()
        let adminToken = "admin-token-0123456789abcdef"
        let secrets = try await withMeteredLiveline(adminToken: adminToken, logger: log.logger()) { api, store in
            let app = try await createApp(store)
            let id = "trace-me-1"
            #expect(
                try await api.json(
                    .put, "/v1/activities/o1/instances/d1", key: app.publishableKey, registerBody
                ).status == .created
            )
            let reply = try await api.call(
                .post, "/v1/activities/o1/updates", key: app.secretKey, body: #"{"contentState": {"eta": 1}}"#,
                headers: [RequestIDMiddleware<BasicRequestContext>.headerName: id]
            )
            #expect(reply.status == .accepted)
            // Refused keys and tokens, and the admin API.
            #expect(try await api.call(.get, "/v1/activities/o1", key: app.secretKey + "x").status == .unauthorized)
            #expect(try await api.call(.get, "/admin/v1/apps", key: adminToken).status == .ok)
            #expect(try await api.call(.get, "/admin/v1/apps", key: "Basic " + adminToken).status == .unauthorized)
            return [app.secretKey, app.publishableKey, adminToken, String(app.secretKey.dropFirst(3))]
        }
        let text = log.text
        #expect(text.contains("Request answered"))
        #expect(text.contains(#""request.id":"trace-me-1""#))
        #expect(text.contains(#""http.route":"/v1/activities/{activityId}/updates""#))
        for secret in secrets {
            #expect(!text.contains(secret), "a secret is in the log")
        }
        #expect(!text.lowercased().contains("bearer"))
        #expect(!text.lowercased().contains("authorization"))
        for line in log.all {
            #expect((try? JSONValue(parsing: Array(line.utf8)))?.objectValue != nil, "not JSON: \(line)")
        }
    }
}

/// A Store that only counts, and counts how often it was asked; each count takes `pause`.
private final class CountingStore: MetricsStore, Sendable {
    private let asked = NIOLockedValueBox(0)
    let pause: Duration
    var counts: Int { asked.withLockedValue { $0 } }

    init(pause: Duration = .zero) { self.pause = pause }

    func stateCounts() async throws -> StoreStateCounts {
        let made = asked.withLockedValue { asked in
            asked += 1
            return asked
        }
        if pause > .zero { try await Task.sleep(for: pause) }
        return StoreStateCounts(activities: ["active": made], instances: [:], pendingActivities: made)
    }
}

@Suite("GET /metrics' Store counts")
struct StoreGaugesTests {
    @Test("the Store is counted at most once an interval: scrapes within it, and scrapes during a count, keep the last count")
    func countedOnceAnInterval() async throws {
        let store = CountingStore(pause: .milliseconds(200))
        let now = NIOLockedValueBox(ContinuousClock.now)
        let gauges = StoreGauges(
            store: store, factory: LivelineMetrics().factory, countingInterval: .seconds(5), now: { now.withLockedValue { $0 } }
        )
        // Eight scrapes at once: one count.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<8 { group.addTask { try await gauges.update() } }
            try await group.waitForAll()
        }
        #expect(store.counts == 1)
        now.withLockedValue { $0 = $0.advanced(by: .seconds(4)) }
        try await gauges.update()
        #expect(store.counts == 1, "4 s after the last count")
        now.withLockedValue { $0 = $0.advanced(by: .seconds(1)) }
        try await gauges.update()
        #expect(store.counts == 2, "5 s after it")

        let everyScrape = StoreGauges(store: store, factory: LivelineMetrics().factory, countingInterval: .zero)
        try await everyScrape.update()
        try await everyScrape.update()
        #expect(store.counts == 4, "an interval of 0 counts at every scrape")
    }
}
