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
        @Option(
            name: .customLong("h2load-requests"),
            help: "(nginx sink) Requests of the h2load reference runs before and after the pushes (plain, and shaped as pushes); 0 for none."
        )
        var h2loadRequests = 200_000

        func validate() throws {
            guard pushes > 0 else { throw ValidationError("--pushes must be positive.") }
            guard h2loadRequests >= 0 else { throw ValidationError("--h2load-requests must not be negative.") }
        }

        func run() async throws {
            var logger = Logger(label: "liveline.bench")
            logger.logLevel = .warning
            let root = FileManager.default.temporaryDirectory.appendingPathComponent("liveline-bench-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: root) }
            try await Bench.withSink(sink, root: root, logger: logger) { target in
                try await measure(target, root: root, logger: logger)
            }
        }

        func measure(_ target: Bench.Target, root: URL, logger: Logger) async throws {
            let (sink, emulator, key, bundleID) = (target.sink, target.emulator, target.key, target.bundleID)
            // The reference of the same run, as `bench fanout` takes it: h2load to the same nginx, plain and shaped as
            // these pushes (each to a device path, with APNs' headers).
            if h2loadRequests > 0, sink is NginxSink, Bench.findExecutable("h2load") == nil {
                Bench.say("  h2load not found (Debian: apt-get install nghttp2-client): no reference in this run")
            }
            let shaped = Bench.H2loadShape.pushes(devices: pushes, headers: Bench.pushHeaders(bundleID: bundleID, signingKey: key))
            let plainBefore = try await Bench.h2load(sink, requests: h2loadRequests, directory: root)
            let shapedBefore = try await Bench.h2load(sink, requests: h2loadRequests, directory: root, shape: shaped)
            let tokens = (0..<pushes).map { index in
                let token = BenchRequests.pushToken(index)
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
            let plainAfter = try await Bench.h2load(sink, requests: h2loadRequests, directory: root)
            let shapedAfter = try await Bench.h2load(sink, requests: h2loadRequests, directory: root, shape: shaped)

            let seconds = elapsed.seconds
            let rate = Double(pushes) / seconds
            // Each reference: its runs before and after, and the client's rate against their mean.
            var references = ""
            for (label, before, after, isShaped) in [
                ("h2load → nginx         ", plainBefore, plainAfter, false), ("h2load shaped as pushes", shapedBefore, shapedAfter, true),
            ] {
                guard let mean = BenchRequests.mean([before, after].compactMap { $0 }) else { continue }
                let runs = [before, after].map { $0.map { BenchRequests.grouped(Int($0)) } ?? "-" }
                references += "\n  \(label) \(runs[0]) requests/s before, \(runs[1]) after: the client \(BenchRequests.ratio(rate, to: mean, shaped: isShaped))"
            }
            Bench.say("""

                liveline bench client: \(pushes) pushes, \(sending.connections) HTTP/2 connections, \(sending.inFlight) in flight, sink \(self.sink.rawValue), \(Bench.allocator(process: getpid()))
                  all answers in          \(Bench.format(elapsed))
                  pushes per second       \(Int(rate))\(references)
                  not answered 200        \(failures)
                  received by the sink    \(received)
                  CPU per push            \(String(format: "%.1f µs", cpuSeconds / Double(pushes) * 1e6)) (this process\(emulator == nil ? "; nginx not counted" : ", sink included"); \(String(format: "%.2f", cpuSeconds / seconds)) cores busy)
                  peak memory (RSS)       \(Bench.peakMemory())
                """)
        }
    }
}
