import ArgumentParser
import Foundation
import NIOPosix

extension Bench {
    /// An idle server: `liveline serve --dev` as the README's first command runs it (SQLite, the built-in emulators),
    /// left alone, its CPU over a minute at rest: first empty, then with many instances registered through the API.
    struct Idle: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "idle",
            abstract: "Measure the CPU a `liveline serve --dev` child process uses at rest, empty and with instances registered.",
            discussion: """
                The server runs as `liveline serve --dev` does (SQLite in a fresh data directory, the demo app, the \
                built-in APNs and FCM emulators, each on a free port). It is left --settle seconds after it answers \
                /healthz, then its CPU time (all its threads, from /proc) and its threads' context switches (how often \
                it woke) are read over --seconds. Then --instances instances are registered on one activity through \
                PUT /v1/activities/idle/instances/{deviceId} with an app's publishable key (each a device of its own, \
                from --connections keep-alive connections; every answer must be 2xx), counted back through \
                GET /v1/activities/idle, and after --settle seconds more the server is measured again at rest.
                """
        )

        @Option(help: "Seconds each measurement at rest lasts.") var seconds = 60
        @Option(help: "Instances registered on one activity before the second measurement (0: only the empty server).")
        var instances = 100_000
        @Option(help: "HTTP/1.1 keep-alive connections the registrations come from.") var connections = 64
        @Option(help: "Seconds the server is left before each measurement.") var settle = 5
        @Option(name: .customLong("server"), help: "The liveline executable to run as the server under test (default: this one).")
        var executable: String?

        func validate() throws {
            guard seconds >= 1, connections >= 1 else { throw ValidationError("--seconds and --connections must be positive.") }
            guard instances >= 0, settle >= 0 else { throw ValidationError("--instances and --settle must not be negative.") }
        }

        func run() async throws {
            try await Bench.withScratchDirectory { root in
                let server = try await ServerUnderTest(
                    executable: Bench.serverExecutable(executable), directory: root.appendingPathComponent("server"), dev: true
                )
                do {
                    try await measure(server)
                } catch {
                    if !server.process.isRunning { Bench.say("The server exited: \(server.logTail())") }
                    await server.stop()
                    throw error
                }
                Bench.say("  server peak memory (VmHWM)  \(Bench.megabytes(server.peakResidentBytes()))")
                await server.stop()
            }
        }

        private func measure(_ server: ServerUnderTest) async throws {
            Bench.say(
                "liveline bench idle: liveline serve --dev (SQLite, the built-in APNs and FCM emulators), server pid \(server.pid) "
                    + "(\(Bench.allocator(process: server.pid))), \(seconds) s at rest each time"
            )
            try await Task.sleep(for: .seconds(settle))
            Bench.say("  at rest, empty              \(try await rest(server).text)")
            guard instances > 0 else { return }

            let app = try await server.createApp(name: "Idle", bundleID: "com.example.idle")
            let load = try await HTTPLoad.connect(
                host: "127.0.0.1", port: server.port, connections: connections, eventLoop: MultiThreadedEventLoopGroup.singleton.next()
            )
            let publishable = "Bearer \(app.publishableKey)"
            let registered = try await load.run(count: instances) { index in
                LoadRequest(
                    method: .PUT, uri: BenchRequests.registrationPath(activityID: Self.activityID, deviceID: BenchRequests.deviceID(index)),
                    authorization: publishable, body: BenchRequests.registrationBody(pushToken: BenchRequests.pushToken(index))
                )
            }
            await load.close()
            Bench.say("  registrations               \(Bench.describe(registered, count: instances))")
            guard registered.succeeded == instances else {
                throw ValidationError("Not every registration was accepted: \(registered.errorText)")
            }
            let counted = try await server.instanceCounts(activityID: Self.activityID, secretKey: app.secretKey)["total"] ?? 0
            guard counted == instances else {
                throw ValidationError("GET /v1/activities/\(Self.activityID) counts \(counted) instances, not \(instances).")
            }
            Bench.say("  instances on the activity   \(BenchRequests.grouped(counted)) (GET /v1/activities/\(Self.activityID))")
            try await Task.sleep(for: .seconds(settle))
            let full = try await rest(server)
            Bench.say("  at rest, \(BenchRequests.grouped(instances)) instances".padding(toLength: 30, withPad: " ", startingAt: 0) + full.text)
        }

        /// The activity the instances are registered on.
        static let activityID = "idle"

        /// The server's CPU and wake-ups over ``seconds``, at rest.
        private func rest(_ server: ServerUnderTest) async throws -> AtRest {
            let cpuBefore = server.cpuSeconds()
            let switchesBefore = ThreadSwitches.read(server.pid)
            let started = ContinuousClock.now
            try await Task.sleep(for: .seconds(seconds))
            guard server.process.isRunning else { throw ValidationError("The server exited: \(server.logTail())") }
            let elapsed = (ContinuousClock.now - started).seconds
            return AtRest(
                cpuSeconds: server.cpuSeconds() - cpuBefore, seconds: elapsed,
                contextSwitches: ThreadSwitches.read(server.pid).flatMap { now in switchesBefore.map { now - $0 } }
            )
        }
    }

    /// What a server used over some seconds at rest.
    struct AtRest: Equatable {
        var cpuSeconds: Double
        var seconds: Double
        /// Its threads' context switches meanwhile (each a wake-up of one of them, or a thread preempted); nil when /proc
        /// could not tell.
        var contextSwitches: Int?

        /// The share of one core the server used: what issue 17 asks to stay under 1 %.
        var shareOfACore: Double { seconds > 0 ? cpuSeconds / seconds : 0 }

        /// `0.42 % of a core (0.25 s of CPU in 60.0 s), its threads switched in 13.2 times a second`.
        var text: String {
            var text = String(format: "%.2f %% of a core (%.2f s of CPU in %.1f s)", shareOfACore * 100, cpuSeconds, seconds)
            if let contextSwitches, seconds > 0 {
                text += String(format: ", its threads switched in %.1f times a second", Double(contextSwitches) / seconds)
            }
            return text
        }
    }

    /// The context switches of every thread of a process so far, from each `/proc/PID/task/TID/status`.
    enum ThreadSwitches {
        /// The sum over the process's threads now; nil when /proc cannot tell. A thread that ended meanwhile takes its
        /// count with it, so read it while the threads stay (at rest).
        static func read(_ pid: Int32) -> Int? {
            Bench.threadFiles(of: pid, "status").map { statuses in statuses.reduce(0) { $0 + (count(inStatus: $1) ?? 0) } }
        }

        /// `voluntary_ctxt_switches` plus `nonvoluntary_ctxt_switches` of one `/proc/…/status` text; nil when it has
        /// neither.
        static func count(inStatus status: String) -> Int? {
            var total: Int?
            for line in status.split(separator: "\n") {
                let parts = line.split(separator: ":", maxSplits: 1)
                guard parts.count == 2, parts[0] == "voluntary_ctxt_switches" || parts[0] == "nonvoluntary_ctxt_switches",
                    let value = Int(parts[1].trimmingCharacters(in: .whitespaces))
                else { continue }
                total = (total ?? 0) + value
            }
            return total
        }
    }
}
