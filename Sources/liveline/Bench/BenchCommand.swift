import ArgumentParser
import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineStore
import Logging
import NIOCore

struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure Liveline on this machine.", subcommands: [FanOut.self, API.self, Idle.self, Broadcast.self, Client.self]
    )

    /// Prints one line of a benchmark's report at once. Swift's `print` buffers standard output when it is a file or a
    /// pipe, so a run written to a log (or through `tee`) showed nothing until it ended; each line is one `write`.
    static func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    /// Where a benchmark's pushes go.
    enum SinkKind: String, ExpressibleByArgument, CaseIterable {
        case emulator, nginx
    }

    /// How pushes are handed to the APNs client: the options both benchmarks share.
    struct Sending: ParsableArguments {
        @Option(help: "HTTP/2 connections to the sink.") var connections = 4
        @Option(name: .customLong("in-flight"), help: "Pushes in flight at once.") var inFlight = 4096
        @Option(name: .customLong("pushes-per-call"), help: "Pushes handed to the APNs client in one call.") var pushesPerCall = 64

        func validate() throws {
            guard connections > 0, inFlight > 0, pushesPerCall > 0 else {
                throw ValidationError("--connections, --in-flight and --pushes-per-call must be positive.")
            }
        }
    }

    /// What a benchmark sends with and to: the running sink, the emulator when it is the sink, and the signing key
    /// and bundle id it trusts.
    struct Target {
        var sink: any BenchSink
        var emulator: APNsEmulator?
        var key: P256.Signing.PrivateKey
        var bundleID: String
    }

    /// The APNs team and key ids the bench signs its provider tokens with (the emulator sink trusts them; nginx checks
    /// no token).
    static let teamID = "BENCHTEAM1"
    static let keyID = "BENCHKEY01"

    /// Starts the sink (the strict emulator in this process, trusting a fresh key for the bench team, or a separate
    /// nginx), runs `body` against it and stops it, whether `body` succeeds or throws: never an nginx left behind. With
    /// a `roundTrip`, the sink answers from that far away (``DistantSink``).
    static func withSink(
        _ kind: SinkKind, root: URL, logger: Logger, roundTrip: TimeAmount = .zero, _ body: (Target) async throws -> Void
    ) async throws {
        let key = P256.Signing.PrivateKey()
        let bundleID = "com.example.bench"
        var target: Target
        switch kind {
        case .emulator:
            let strict = try APNsEmulator(
                configuration: APNsEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path), logger: logger
            )
            let ports = try await strict.start()
            strict.registerSigningKey(teamID: Bench.teamID, keyID: Bench.keyID, publicKey: key.publicKey)
            strict.registerBundleID(bundleID)
            target = Target(sink: EmulatorSink(emulator: strict, baseURL: "https://127.0.0.1:\(ports.apnsPort)"), emulator: strict, key: key, bundleID: bundleID)
        case .nginx:
            target = Target(sink: try await NginxSink(directory: root.appendingPathComponent("nginx")), emulator: nil, key: key, bundleID: bundleID)
        }
        if roundTrip > .zero {
            do {
                target.sink = try await DistantSink(target.sink, roundTrip: roundTrip)
            } catch {
                try? await target.sink.shutdown()
                throw error
            }
        }
        do {
            try await body(target)
        } catch {
            try? await target.sink.shutdown()
            throw error
        }
        try await target.sink.shutdown()
    }

    struct FanOut: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "fanout",
            abstract: "Register N iOS instances on one activity, post one update, and time until the local APNs sink has all N pushes.",
            discussion: """
                By default (--path api) the server under test is `liveline serve` in its own process, with APNs pointed at the \
                sink: the instances are registered and the updates posted through its HTTP API. --path direct registers into \
                the Store and accepts the update in this process instead (no HTTP, no separate server).
                """
        )

        @Option(help: "How many instances watch the activity.") var instances = 100_000
        @Option(help: "api: through the HTTP API of a `liveline serve` child process; direct: into the Store in this process.")
        var path: Bench.PathKind = .api
        @OptionGroup var server: Bench.ServerOptions
        @Option(name: .customLong("http-connections"), help: "(api) HTTP/1.1 keep-alive connections registering the instances.")
        var httpConnections = 64
        @Option(name: .customLong("side-connections"), help: "(api) HTTP/1.1 keep-alive connections posting the side updates.")
        var sideConnections = 16
        @Option(name: .customLong("h2load-requests"), help: "(api, nginx sink) Requests of the h2load reference run before and after the rounds; 0 for none.")
        var h2loadRequests = 200_000
        @Flag(
            name: .customLong("h2load-each-round"),
            help: "(api, nginx sink) Also run the plain h2load reference after every round, and read each round against the runs either side of it: the machine's own swing, round by round."
        )
        var h2loadEachRound = false
        @Flag(
            name: .customLong("registrations-in-id-order"),
            help: "(api) Register the instances in the order of their device ids (device-0000000 first), as this bench did before 2026-12-05; by default they register in a shuffled order, the same in every run, as phones do."
        )
        var registrationsInIDOrder = false
        @Option(help: "(api) Seconds to wait between rounds, to let the server finish recording the last one (the API does not say when it has).")
        var pause = 1
        @Flag(
            name: .customLong("end"),
            help: "(api) The last round ends the activity (POST /v1/activities/bench/end) instead of updating it: timed as the others until the sink has every end push, then until the API counts every instance ended."
        )
        var endsActivity = false
        @OptionGroup(title: "Direct path (the server's own settings apply with --path api)") var sending: Bench.Sending
        @Option(name: .customLong("progress-batch"), help: "(direct) Results recorded per progress transaction.")
        var progressBatch = DispatcherConfiguration().progressBatchSize
        @Option(name: .customLong("progress-behind"), help: "(direct) Progress batches the sends may run ahead of the Store.")
        var progressBehind = DispatcherConfiguration().progressBatchesBehind
        @Option(name: .customLong("side-accepts"), help: "Updates to other activities accepted per second during the fan-out; their latency is the accept latency reported.")
        var sideAccepts = 100
        @Flag(
            name: .customLong("side-deliveries"),
            help: "(api, nginx sink) Give each side activity one phone, and time each side update from its post until the sink has its push: fairness to other activities during the fan-out."
        )
        var sideDeliveries = false
        @Option(
            name: .customLong("disk-syncs"),
            help: "(api) Times of the disk's own syncs during the rounds, this many a second (a 4 KB block written in place beside the server's data, then fdatasync): the floor of a durable accept's latency, printed beside the side accepts; 0 for none."
        )
        var diskSyncs = 20
        @Option(help: "Where the pushes go: nginx (a separate nginx process answering 200; apt-get install nginx-light; default with --path api) or emulator (the strict APNs emulator, in this process; default with --path direct).")
        var sink: Bench.SinkKind?
        @Option(help: "Fan-outs to run one after another over the same instances, each a new update; each round's figures are printed.")
        var rounds = 1
        @Option(
            name: .customLong("sink-round-trip-ms"),
            help: "Milliseconds the sink's answers take to come back, as from an APNs that far away: a proxy in front of the sink holds every byte for half of it each way (no h2load reference then); 0 for none."
        )
        var sinkRoundTripMilliseconds = 0
        @Option(name: .customLong("data-dir"), help: "Where to put the benchmark's files: the SQLite file, or the server's data directory, and the sink's (a fresh temporary directory by default).")
        var dataDirectory: String?

        func validate() throws {
            guard instances >= 1 else { throw ValidationError("--instances must be at least 1.") }
            guard rounds >= 1 else { throw ValidationError("--rounds must be at least 1.") }
            guard httpConnections >= 1, sideConnections >= 1, h2loadRequests >= 0, pause >= 0, sideAccepts >= 0, diskSyncs >= 0,
                sinkRoundTripMilliseconds >= 0
            else {
                throw ValidationError(
                    "--http-connections and --side-connections must be positive; --h2load-requests, --pause, --side-accepts, --disk-syncs and --sink-round-trip-ms not negative."
                )
            }
        }

        /// The sink asked for, or the path's default.
        var sinkKind: Bench.SinkKind { sink ?? (path == .api ? .nginx : .emulator) }

        func run() async throws {
            var logger = Logger(label: "liveline.bench")
            logger.logLevel = .warning
            let root = dataDirectory.map(URL.init(fileURLWithPath:))
                ?? FileManager.default.temporaryDirectory.appendingPathComponent("liveline-bench-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            defer { if dataDirectory == nil { try? FileManager.default.removeItem(at: root) } }
            // Interrupted, the bench stops the server and nginx and removes its temporary directory.
            BenchChildren.shared.removeOnInterrupt(dataDirectory == nil ? root.path : nil)
            BenchChildren.shared.stopOnInterrupt()

            // The sink: an HTTP/2 + TLS endpoint on loopback that counts what it receives.
            try await Bench.withSink(sinkKind, root: root, logger: logger, roundTrip: .milliseconds(Int64(sinkRoundTripMilliseconds))) { target in
                switch path {
                case .api: try await measureThroughAPI(target, root: root)
                case .direct: try await measure(target, root: root, logger: logger)
                }
            }
        }

        /// Registers the instances, runs the fan-out against `sink` and prints the figures.
        func measure(_ target: Bench.Target, root: URL, logger: Logger) async throws {
            let (sink, emulator, key, bundleID) = (target.sink, target.emulator, target.key, target.bundleID)
            let store = try await SQLStore.open(path: root.appendingPathComponent("liveline.sqlite").path, logger: logger)
            let appID = "app_bench"
            try await store.createApp(AppRecord(id: appID, name: "Bench", bundleID: bundleID, androidPackage: nil, createdAt: Date()), keys: [])
            let sealer = try CredentialSealer(masterKey: CredentialSealer.newMasterKey())
            let credentials = APNsCredentials(
                teamID: Bench.teamID, keyID: Bench.keyID, privateKeyPEM: key.pemRepresentation, environment: .sandbox,
                baseURL: sink.baseURL, caCertificatePEM: sink.caCertificatePEM
            )
            try await store.saveCredentials(try credentials.stored(appID: appID, sealer: sealer, at: Date()))

            Bench.say("Registering \(instances) instances…")
            let setupStart = ContinuousClock.now
            for index in 0..<instances {
                var token = String(format: "%064x", index + 1)
                if let emulator { token = emulator.addDevice(bundleID: bundleID, token: token) }
                _ = try await store.registerInstance(
                    InstanceRegistration(appID: appID, activityID: "bench", deviceID: String(format: "device-%07d", index), platform: .ios,
                                         pushToken: token, attributesType: "BenchAttributes", attributes: [:], userID: nil),
                    at: Date()
                )
            }
            Bench.say("  done in \(Bench.format(ContinuousClock.now - setupStart)).")

            var configuration = DispatcherConfiguration()
            configuration.pushesInFlight = sending.inFlight
            configuration.pushesPerCall = sending.pushesPerCall
            configuration.progressBatchSize = progressBatch
            configuration.progressBatchesBehind = progressBehind
            configuration.workers = 2
            let directory = APNsTransportDirectory(store: store, sealer: sealer, connectionsPerApp: sending.connections, logger: logger)
            let dispatcher = Dispatcher(store: store, transports: directory, configuration: configuration, logger: logger)
            // The engine runs beside the rounds and is cancelled when they are done (or one fails).
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await dispatcher.run() }
                try await Task.sleep(for: .milliseconds(200))
                for round in 1...rounds {
                    try await fanOut(
                        round: round, target: target, store: store, appID: appID, dispatcher: dispatcher
                    )
                }
                group.cancelAll()
                try await group.waitForAll()
            }
            await directory.shutdown()
            try await store.close()
        }

        /// Accepts one update to the bench activity and times its fan-out until the sink has every push and the engine
        /// has recorded every instance's progress; prints the round's figures.
        private func fanOut(round: Int, target: Bench.Target, store: SQLStore, appID: String, dispatcher: Dispatcher) async throws {
            let sink = target.sink
            let before = try await sink.received()
            let cpuBefore = Bench.processCPUSeconds()
            let started = ContinuousClock.now
            let accepted = try await store.acceptUpdate(
                ActivityUpdate(appID: appID, activityID: "bench", contentState: ["score": .string("\(round)-0"), "minute": 42]), at: Date()
            )
            let firstAccept = ContinuousClock.now - started
            dispatcher.wake()

            // Accept latency while the fan-out runs: updates to other activities at a steady rate, as a busy backend might
            // keep sending them, each committed durably while the fan-out's progress is written. Each is sent on time
            // whether or not the ones before it have been answered, so a slow accept does not lighten the load.
            var acceptLatencies: [Duration] = [firstAccept]
            let (elapsed, cpuSeconds) = try await withThrowingTaskGroup(of: Duration.self) { group in
                var side = 0
                var nextAccept = ContinuousClock.now
                while try await sink.received() - before < instances {
                    while sideAccepts > 0, ContinuousClock.now >= nextAccept {
                        side += 1
                        nextAccept = nextAccept.advanced(by: .seconds(1) / sideAccepts)
                        let update = ActivityUpdate(appID: appID, activityID: "side-\(side % 50)", contentState: ["n": .integer(Int64(side))])
                        group.addTask {
                            let t0 = ContinuousClock.now
                            _ = try await store.acceptUpdate(update, at: Date())
                            return ContinuousClock.now - t0
                        }
                    }
                    try await Task.sleep(for: .milliseconds(2))
                    if ContinuousClock.now - started > .seconds(600) { throw ValidationError("The sink did not receive every push within 10 minutes.") }
                }
                // Timed when the sink has every push; the accepts still running are then waited for.
                let timing = (ContinuousClock.now - started, Bench.processCPUSeconds() - cpuBefore)
                for try await latency in group { acceptLatencies.append(latency) }
                return timing
            }
            // Then until the engine has recorded every instance's progress and released the activity.
            while try await store.activityWithoutInstanceCounts(appID: appID, activityID: "bench")?.dispatchedSequence != accepted.sequence {
                try await Task.sleep(for: .milliseconds(2))
                if ContinuousClock.now - started > .seconds(600) { throw ValidationError("The engine did not record every push within 10 minutes.") }
            }
            let recorded = ContinuousClock.now - started
            let sinkAnswers = await sink.answers()

            acceptLatencies.sort()
            let seconds = elapsed.seconds
            Bench.say("""

                liveline bench fanout: \(instances) instances, \(sending.connections) HTTP/2 connections, \(sending.inFlight) in flight, sink \(sinkKind.rawValue), direct, \(Bench.allocator(process: getpid()))\(rounds > 1 ? ", round \(round) of \(rounds)" : "")
                  all pushes received in  \(Bench.format(elapsed))
                  all progress recorded   \(Bench.format(recorded))
                  pushes per second       \(Int(Double(instances) / seconds))
                  accept latency p50      \(Bench.format(Bench.percentile(acceptLatencies, 0.50)))   (\(acceptLatencies.count) accepts during the fan-out)
                  accept latency p99      \(Bench.format(Bench.percentile(acceptLatencies, 0.99)))
                  CPU per push            \(String(format: "%.1f µs", cpuSeconds / Double(instances) * 1e6)) (this process: \(target.emulator == nil ? "sender, engine and store; nginx not counted" : "sender, engine, store and sink"); \(String(format: "%.2f", cpuSeconds / seconds)) cores busy)
                  peak memory (RSS)       \(Bench.peakMemory())
                  sink answers            \(sinkAnswers)
                """)
        }
    }
}

extension Bench {
    /// The nearest-rank percentile `p` of sorted durations (``LatencySummary/percentile(_:_:)``'s rule); zero when
    /// there are none.
    static func percentile(_ sorted: [Duration], _ p: Double) -> Duration {
        guard !sorted.isEmpty else { return .zero }
        return sorted[LatencySummary.nearestRank(count: sorted.count, p)]
    }

    static func format(_ duration: Duration) -> String {
        let ms = duration.seconds * 1000
        return ms >= 1000 ? String(format: "%.2f s", ms / 1000) : String(format: "%.2f ms", ms)
    }

    /// User and system CPU time this process has used, in seconds.
    static func processCPUSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
    }

    /// The malloc a process runs on, as its memory map (`/proc/PID/maps`) shows it: `jemalloc`, `mimalloc` or
    /// `tcmalloc` when that library is mapped (linked, or put in front with `LD_PRELOAD`), otherwise `glibc malloc`.
    /// The server's figures depend on it (see "Building for production" in the README), so the benchmarks print it.
    static func allocator(inMaps maps: String) -> String {
        for line in maps.split(separator: "\n") {
            guard let path = line.split(separator: " ", omittingEmptySubsequences: true).last, path.hasPrefix("/") else { continue }
            let file = path.split(separator: "/").last ?? ""
            for name in ["jemalloc", "mimalloc", "tcmalloc"] where file.hasPrefix("lib\(name)") {
                return name
            }
        }
        return "glibc malloc"
    }

    /// The malloc process `process` (a pid) runs on (``allocator(inMaps:)``); `malloc unknown` when /proc cannot tell.
    static func allocator(process: Int32) -> String {
        procFile("/proc/\(process)/maps").map(allocator(inMaps:)) ?? "malloc unknown"
    }

    /// A file of /proc read to its end; nil when it cannot be opened. /proc says its files are empty, and
    /// `String(contentsOfFile:)` then reads one block of 4 KB: a server's memory map is several times longer (a server
    /// on PostgreSQL, whose jemalloc was mapped past the first 4 KB, was reported as running on glibc's malloc), and
    /// `/proc/stat` grows with the machine's cores. Every read of /proc in the benchmarks goes through here.
    static func procFile(_ path: String) -> String? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        return (try? handle.readToEnd()).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The file `name` of every thread of process `pid` (`/proc/PID/task/TID/<name>`, through ``procFile(_:)``), one
    /// text a thread; a thread that ends while they are read is left out. Nil when /proc lists no threads for `pid`.
    static func threadFiles(of pid: Int32, _ name: String) -> [String]? {
        let tasks = "/proc/\(pid)/task"
        guard let threads = try? FileManager.default.contentsOfDirectory(atPath: tasks) else { return nil }
        return threads.compactMap { procFile("\(tasks)/\($0)/\(name)") }
    }

    /// VmHWM from /proc: the most resident memory this process ever had.
    static func peakMemory() -> String {
        megabytes(peakResidentBytes(process: "self"))
    }

    /// The most resident memory (VmHWM) process `process` (a pid, or `self`) ever had, in bytes; nil when /proc cannot
    /// tell.
    static func peakResidentBytes(process: String) -> Int? {
        guard let status = procFile("/proc/\(process)/status"),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
            let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) })
        else { return nil }
        return kilobytes * 1024
    }
}
