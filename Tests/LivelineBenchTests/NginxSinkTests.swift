import APNs
import Crypto
import Foundation
import Logging
import NIOCore
import Testing

@testable import liveline

/// The nginx sink of `bench fanout --sink nginx`, as a separate nginx process over HTTP/2 and TLS: CI installs nginx
/// (Debian's `nginx-light`) for it.
@Suite struct NginxSinkTests {
    @Test(
        "the nginx sink counts every push, and logs the side phones' apart with the time each arrived",
        .enabled(if: NginxSink.findNginx() != nil, "needs nginx (Debian: apt-get install nginx-light)")
    )
    func countsPushesAndTimesTheSidePhones() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("liveline-nginx-sink-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let sink = try await NginxSink(directory: directory)
        do {
            let client = try APNsClient(
                endpoint: try APNsEndpoint(baseURL: sink.baseURL, trustedCAPEM: sink.caCertificatePEM),
                tokens: APNsProviderTokens(
                    signingKey: APNsSigningKey(teamID: Bench.teamID, keyID: Bench.keyID, privateKey: P256.Signing.PrivateKey())
                ),
                connections: 1, logger: Logger(label: "test")
            )
            let sent = Date().timeIntervalSince1970
            let tokens = [BenchRequests.pushToken(0), BenchRequests.sideToken(4), BenchRequests.pushToken(1), BenchRequests.sideToken(4)]
            let results = await client.send(
                tokens.map {
                    APNsNotification(
                        deviceToken: $0, topic: "com.example.bench.push-type.liveactivity", priority: 5,
                        payload: ByteBuffer(string: #"{"aps":{"event":"update","content-state":{}}}"#)
                    )
                }
            )
            let answered = Date().timeIntervalSince1970
            await client.shutdown()
            #expect(try results.map { try $0.get().status } == [200, 200, 200, 200])
            #expect(try await sink.received() == 4)
            // nginx logs a request once it has answered it: the lines may come a moment after the answers.
            var arrivals = SideArrivals()
            let deadline = ContinuousClock.now + .seconds(5)
            while arrivals.count < 2, ContinuousClock.now < deadline {
                arrivals = try #require(try await sink.sideArrivals())
                try await Task.sleep(for: .milliseconds(10))
            }
            #expect(arrivals.count == 2)
            let times = try #require(arrivals.byPhone[4])
            #expect(arrivals.byPhone.keys.sorted() == [4])
            #expect(times.count == 2)
            // In milliseconds, from the time of nginx's loop turn.
            #expect(times.allSatisfy { $0 >= sent - 0.01 && $0 <= answered + 0.01 })
            // Read again, nothing is counted twice.
            #expect(try await sink.sideArrivals()?.count == 2)
        } catch {
            try? await sink.shutdown()
            throw error
        }
        try await sink.shutdown()
    }
}
