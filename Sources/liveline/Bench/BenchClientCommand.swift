import APNs
import ArgumentParser
import Foundation
import LivelineEmulator
import Logging
import NIOCore

extension Bench {
    /// The APNs client alone: no Store, no engine. Its figure is the ceiling the fan-out works under on this machine.
    struct Client: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "client",
            abstract: "Send N Live Activity pushes straight through Liveline's APNs client to the local sink and time them (the ceiling for bench fanout)."
        )

        @Option(help: "How many pushes to send.") var pushes = 100_000
        @OptionGroup var sending: Bench.Sending
        @Option(help: "Where the pushes go: emulator (the strict APNs emulator, in this process) or nginx (a separate nginx process answering 200).")
        var sink: Bench.SinkKind = .nginx

        func validate() throws {
            guard pushes > 0 else { throw ValidationError("--pushes must be positive.") }
        }

        func run() async throws {
            var logger = Logger(label: "liveline.bench")
            logger.logLevel = .warning
            let root = FileManager.default.temporaryDirectory.appendingPathComponent("liveline-bench-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: root) }
            try await Bench.withSink(sink, root: root, logger: logger) { target in
                try await measure(target, logger: logger)
            }
        }

        func measure(_ target: Bench.Target, logger: Logger) async throws {
            let (sink, emulator, key, bundleID) = (target.sink, target.emulator, target.key, target.bundleID)
            let tokens = (0..<pushes).map { index in
                let token = String(format: "%064x", index + 1)
                return emulator?.addDevice(bundleID: bundleID, token: token) ?? token
            }
            let client = try APNsClient(
                endpoint: try APNsEndpoint(baseURL: sink.baseURL, trustedCAPEM: sink.caCertificatePEM),
                tokens: APNsProviderTokens(signingKey: APNsSigningKey(teamID: Bench.teamID, keyID: Bench.keyID, privateKey: key)),
                connections: sending.connections, logger: logger
            )
            // One payload for every token, as the engine builds it once per update.
            let timestamp = Int(Date().timeIntervalSince1970)
            let payload = ByteBuffer(string: #"{"aps":{"timestamp":\#(timestamp),"event":"update","content-state":{"score":"1-0","minute":42}}}"#)
            // Connections open before the clock starts, as the engine's are open after its first pass.
            _ = try await client.send(APNsNotification(deviceToken: tokens[0], topic: bundleID + ".push-type.liveactivity", priority: 5, payload: payload))

            let before = try await sink.received()
            let cpuBefore = Bench.processCPUSeconds()
            let started = ContinuousClock.now
            let calls = stride(from: 0, to: pushes, by: sending.pushesPerCall).map { $0..<min($0 + sending.pushesPerCall, pushes) }
            let concurrentCalls = max(1, sending.inFlight / sending.pushesPerCall)
            let failures = await withTaskGroup(of: Int.self) { group in
                var next = 0
                var failures = 0
                func addCall() {
                    let range = calls[next]
                    next += 1
                    group.addTask {
                        let notifications = tokens[range].map { token in
                            APNsNotification(deviceToken: token, topic: bundleID + ".push-type.liveactivity", priority: 5, payload: payload)
                        }
                        return await client.send(notifications).count { result in
                            guard case .success(let response) = result else { return true }
                            return !response.isSuccess
                        }
                    }
                }
                while next < min(concurrentCalls, calls.count) { addCall() }
                while let failed = await group.next() {
                    failures += failed
                    if next < calls.count { addCall() }
                }
                return failures
            }
            let elapsed = ContinuousClock.now - started
            let cpuSeconds = Bench.processCPUSeconds() - cpuBefore
            let received = try await sink.received() - before
            await client.shutdown()

            let seconds = elapsed.seconds
            Bench.say("""

                liveline bench client: \(pushes) pushes, \(sending.connections) HTTP/2 connections, \(sending.inFlight) in flight, sink \(self.sink.rawValue)
                  all answers in          \(Bench.format(elapsed))
                  pushes per second       \(Int(Double(pushes) / seconds))
                  not answered 200        \(failures)
                  received by the sink    \(received)
                  CPU per push            \(String(format: "%.1f µs", cpuSeconds / Double(pushes) * 1e6)) (this process\(emulator == nil ? "; nginx not counted" : ", sink included"); \(String(format: "%.2f", cpuSeconds / seconds)) cores busy)
                  peak memory (RSS)       \(Bench.peakMemory())
                """)
        }
    }
}
