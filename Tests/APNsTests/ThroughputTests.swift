import Foundation
import LivelineTestSupport
import Logging
import NIOCore
import Testing

@testable import APNs

/// A throughput run against the local test server. It checks that every push is answered, and prints the rate; it
/// asserts no speed (that is the job of the engine's benchmark, in a release build). In a debug build both the client
/// and the test server run unspecialized swift-nio-http2 code and are one to two orders of magnitude slower than in
/// release, so the printed rate says little there.
///
/// `APNS_THROUGHPUT_COUNT` overrides the number of pushes (default 2,000); `APNS_THROUGHPUT_CONCURRENCY` the
/// number of pushes in flight (default 200).
@Suite("Throughput", .timeLimit(.minutes(5)), .tags(.slow), .unlessSkippingSlowTests)
struct ThroughputTests {
    @Test("many pushes over 4 connections, all answered")
    func throughput() async throws {
        let environment = ProcessInfo.processInfo.environment
        let total = environment["APNS_THROUGHPUT_COUNT"].flatMap(Int.init) ?? 2_000
        let concurrency = environment["APNS_THROUGHPUT_CONCURRENCY"].flatMap(Int.init) ?? 200
        let server = try await TestAPNsServer.start(maxConcurrentStreams: 1000, recordRequests: false)
        var logger = Logger(label: "apns-throughput")
        logger.logLevel = .critical
        let client = try APNsClient(
            endpoint: server.endpoint,
            tokens: APNsProviderTokens(signingKey: makeSigningKey()),
            connections: 4,
            logger: logger
        )
        // One payload for every push, as the engine does per update.
        let payload = ByteBuffer(string: payloadJSON)
        let tokens = (0..<1000).map { String(format: "%064x", $0) }

        // Warm up: open the connections.
        for _ in 0..<8 {
            _ = try await client.send(makeNotification(payload: payload))
        }

        let clock = ContinuousClock()
        let start = clock.now
        let succeeded = try await withThrowingTaskGroup(of: Bool.self) { group in
            var sent = 0
            var succeeded = 0
            func addOne() {
                let token = tokens[sent % tokens.count]
                sent += 1
                group.addTask {
                    try await client.send(
                        APNsNotification(deviceToken: token, topic: topic, priority: 10, payload: payload)
                    ).isSuccess
                }
            }
            while sent < min(concurrency, total) {
                addOne()
            }
            while let ok = try await group.next() {
                if ok { succeeded += 1 }
                if sent < total {
                    addOne()
                }
            }
            return succeeded
        }
        let elapsed = clock.now - start
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        print(
            "APNs throughput: \(total) pushes in \(String(format: "%.2f", seconds)) s = \(Int(Double(total) / seconds)) pushes/s (concurrency \(concurrency), 4 connections; debug builds are far slower than release)"
        )
        #expect(succeeded == total)
        #expect(server.requestCount == total + 8)
        await client.shutdown()
        try await server.shutdown()
    }
}
