import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Prometheus
import Testing

@Suite("Delivery engine metrics")
struct DeliveryMetricsEngineTests {
    @Test("each push attempt is counted where the engine records it: delivered, invalidated, retried, with latency", arguments: StoreKind.available)
    func countsAttempts(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "metered", devices: 0..<10)
            let transport = ScriptedTransport()
            transport.answer(token(3), with: [.invalidToken(reason: "Unregistered", providerID: nil)])
            transport.answer(token(5), with: [
                .retryable(reason: "ServiceUnavailable", retryAfter: nil, providerID: nil),
                .retryable(reason: "connection reset by peer: 80f6d2a4", retryAfter: nil, providerID: nil),
            ])
            let registry = PrometheusCollectorRegistry()
            let dispatcher = Dispatcher(
                store: store, transports: transport, configuration: fastConfiguration(),
                metrics: DeliveryMetrics(factory: PrometheusMetricsFactory(registry: registry))
            )
            let task = Task { try await dispatcher.run() }
            defer { task.cancel() }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "metered", contentState: ["n": 1]), at: Date())
            dispatcher.wake()
            #expect(try await eventually { try await allCaughtUp(store, "metered") })
            task.cancel()
            _ = await task.result
            let lines = registry.emitToString().split(separator: "\n").map(String.init)
            #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="delivered",reason="none"} 9"#), "\(lines)")
            #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="invalidated",reason="Unregistered"} 1"#))
            #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="retrying",reason="ServiceUnavailable"} 1"#))
            #expect(lines.contains(#"liveline_pushes_total{platform="ios",status="retrying",reason="other"} 1"#))
            #expect(lines.contains(#"liveline_push_latency_seconds_count{platform="ios"} 12"#))
            // No app, activity, device or token in any label.
            #expect(!lines.contains { $0.contains(appID) || $0.contains("metered") || $0.contains("80f6d2a4") || $0.contains("device-") })
        }
    }
}
