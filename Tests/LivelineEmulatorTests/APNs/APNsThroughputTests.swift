import Foundation
import LivelineCore
import LivelineTestSupport
import Testing

@testable import LivelineEmulator

/// The emulator is also the benchmark sink: it must answer many pushes per second over few
/// connections. The rate is printed, not asserted (it depends on the machine and build); what is
/// asserted is that every push under load is answered 200 and counted once.
@Suite("Throughput", .tags(.slow), .unlessSkippingSlowTests)
struct ThroughputTests {
    /// Debug builds spend most of this in swift-nio-http2's unoptimized internals, so the default
    /// run is short. For a real measurement build in release (`swift build -c release
    /// --build-tests -Xswiftc -enable-testing`) and set `LIVELINE_EMULATOR_BENCH_BATCHES`
    /// (batches per connection), `…_CONNECTIONS` and `…_STREAMS` (requests per batch).
    @Test("Sustained pushes over several connections, many streams in flight each")
    func throughput() async throws {
        let environment = ProcessInfo.processInfo.environment
        let connections = environment["LIVELINE_EMULATOR_BENCH_CONNECTIONS"].flatMap { Int($0) } ?? 2
        let batch = environment["LIVELINE_EMULATOR_BENCH_STREAMS"].flatMap { Int($0) } ?? 100
        let batchesPerConnection = environment["LIVELINE_EMULATOR_BENCH_BATCHES"].flatMap { Int($0) } ?? 10
        try await withEmulator(historyLimit: 10_000) { fixture in
            let clients = try await (0..<connections).asyncMap { _ in try await fixture.connect() }
            let start = fixture.clock.seconds
            let requests = (0..<batch).map { fixture.push(payload(timestamp: start + Double($0), contentState: ["eta": .integer(Int64($0))])) }
            // Warm up: the first request on each connection verifies the provider token.
            for client in clients { _ = try await client.sendAll(requests) }

            let clock = ContinuousClock()
            let began = clock.now
            let accepted = try await withThrowingTaskGroup(of: Int.self) { group in
                for client in clients {
                    group.addTask {
                        var accepted = 0
                        for _ in 0..<batchesPerConnection {
                            accepted += try await client.sendAll(requests).count { (try? $0.get().status) == 200 }
                        }
                        return accepted
                    }
                }
                return try await group.reduce(0, +)
            }
            let elapsed = clock.now - began
            let total = connections * batch * batchesPerConnection
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            print("APNs emulator throughput: \(total) pushes in \(String(format: "%.2f", seconds)) s = \(Int(Double(total) / seconds)) req/s")
            #expect(accepted == total)
            #expect(fixture.emulator.statistics.accepted == total + connections * batch)
            #expect(fixture.emulator.pushes(limit: 20_000).count == min(10_000, total + connections * batch))
            for client in clients { await client.close() }
        }
    }
}

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
