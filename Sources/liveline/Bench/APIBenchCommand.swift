import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix

extension Bench {
    /// The HTTP API alone: registrations and accepted updates through HTTP/1.1 keep-alive connections to a
    /// `liveline serve` child process, as phones and a backend send them.
    struct API: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "api",
            abstract: "Time registrations and accepted updates through the HTTP API of a `liveline serve` child process.",
            discussion: """
                Registrations: PUT /v1/activities/{activityId}/instances/{deviceId} with the publishable key, each a new \
                device, --per-activity of them on each activity. Updates: POST /v1/activities/{activityId}/updates with \
                the secret key, each to a different activity that no instance watches, so no push follows: the figure is \
                the accept path (validation, the durable commit, the answer). Each of them creates its activity, which \
                the Store writes as delivered (nobody can watch it yet), so it leaves the engine nothing to do. Each \
                connection sends its next request when the previous one is answered; any answer other than 2xx is an \
                error. Right after the updates, --after-seconds of updates to yet other activities go out at 100 a \
                second, each due on time, and their latency is printed: whether the API answers promptly right after a \
                burst (with --watched, while the engine pushes the burst's updates).

                First, --healthz requests GET /healthz on the same connections: the server's answer to the simplest \
                request, through the same HTTP stack and load generator, on this machine now; the registrations and \
                updates cannot run faster, and read against it a figure says more than it does alone.

                With --watched, the updates go instead to the activities the registrations made (update i to the ith \
                activity; at most one update each), so every update is fanned out: the server's APNs client is pointed \
                at an nginx sink (as `bench fanout` does), and the bench also reports when the sink had every push.
                """
        )

        @Option(help: "GET /healthz requests timed first, on the same connections: the ceiling of the others (0 skips them).")
        var healthz = 50_000
        @Option(help: "Instances to register.") var registrations = 100_000
        @Option(name: .customLong("per-activity"), help: "Instances registered on each activity.") var perActivity = 100
        @Option(help: "Updates to post, each to a different activity.") var updates = 50_000
        @Option(help: "HTTP/1.1 keep-alive connections.") var connections = 64
        @Option(name: .customLong("after-seconds"), help: "Seconds of paced updates (100 a second) right after the burst.")
        var afterSeconds = 5
        @Flag(help: "Post the updates to the registered activities, so each is pushed to its instances (through an nginx sink).")
        var watched = false
        @Option(
            name: .customLong("disk-syncs"),
            help: "Times of the disk's own syncs while the registrations, the updates and the paced updates run, this many a second (a 4 KB block written in place beside the server's data, then fdatasync): the floor of a durable write's latency, printed after each; 0 for none."
        )
        var diskSyncs = 20
        @Option(
            name: .customLong("sink-round-trip-ms"),
            help: "(with --watched) Milliseconds the sink's answers take to come back, as from an APNs that far away: a proxy in front of nginx holds every byte for half of it each way; 0 for none."
        )
        var sinkRoundTripMilliseconds = 0
        @OptionGroup var server: Bench.ServerOptions

        func validate() throws {
            guard healthz >= 0, registrations >= 0, updates >= 0, afterSeconds >= 0, diskSyncs >= 0, sinkRoundTripMilliseconds >= 0 else {
                throw ValidationError(
                    "--healthz, --registrations, --updates, --after-seconds, --disk-syncs and --sink-round-trip-ms must not be negative."
                )
            }
            if sinkRoundTripMilliseconds > 0, !watched {
                throw ValidationError("--sink-round-trip-ms needs --watched: without it nothing is pushed.")
            }
            guard perActivity >= 1, connections >= 1 else { throw ValidationError("--per-activity and --connections must be positive.") }
            if watched, updates > (registrations + perActivity - 1) / perActivity {
                throw ValidationError("--watched posts at most one update to each registered activity: --updates must not exceed registrations / per-activity.")
            }
        }

        func run() async throws {
            // One event loop (thread) for all the load, so it takes little of the machine from the server.
            let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
            try await Bench.withScratchDirectory { root in
                guard watched else {
                    return try await measure(root: root, eventLoop: eventLoop, sink: nil)
                }
                try await Bench.withSink(
                    .nginx, root: root, logger: Logger(label: "liveline.bench"), roundTrip: .milliseconds(Int64(sinkRoundTripMilliseconds))
                ) { target in
                    try await measure(root: root, eventLoop: eventLoop, sink: target)
                }
            }
        }

        /// Registrations, the burst of updates and the paced updates after it; with `sink`, the app pushes to it.
        private func measure(root: URL, eventLoop: any EventLoop, sink target: Bench.Target?) async throws {
            try await Bench.withServers(server, directory: root) { nodes in
                let server = nodes.first
                let app = try await server.createApp(name: "Bench", bundleID: target?.bundleID ?? "com.example.bench")
                if let target {
                    try await server.setAPNs(
                        appID: app.id, baseURL: target.sink.baseURL, caCertificatePEM: target.sink.caCertificatePEM, signingKey: target.key
                    )
                }
                let load = try await HTTPLoad.connect(host: "127.0.0.1", ports: nodes.ports, connections: connections, eventLoop: eventLoop)
                Bench.say(
                    "liveline bench api: \(connections) HTTP/1.1 keep-alive connections\(nodes.count > 1 ? " spread round-robin over the nodes" : ""), "
                        + "\(self.server.storeText), \(nodes.pidText)"
                        + (sinkRoundTripMilliseconds > 0 ? ", the sink \(sinkRoundTripMilliseconds) ms away (round trip)" : "")
                )
                if let text = nodes.databaseCPUText { Bench.say("  \(text)") }

                let perActivity = self.perActivity
                let publishable = "Bearer \(app.publishableKey)"
                var meter = Bench.CPUMeter(nodes: nodes)
                func spent() -> Bench.CPUSpent { meter.spent() }
                if healthz > 0 {
                    let answered = try await load.run(count: healthz) { _ in
                        LoadRequest(method: .GET, uri: "/healthz", authorization: publishable, body: nil)
                    }
                    Bench.say("  GET /healthz (the ceiling)        \(Bench.describe(answered, count: healthz))")
                    printCPU("a request", requests: healthz, spent())
                }
                // The disk's own syncs beside each timed part: a 201 or 202 is answered once its commit is synced.
                let probe = try DiskSyncProbe.started(in: root, perSecond: diskSyncs)
                defer { probe?.stop() }
                func sayDiskSyncs() throws {
                    guard let syncs = try probe?.take(), !syncs.isEmpty else { return }
                    Bench.say("    disk syncs meanwhile: \(syncs.count), \(LatencySummary(sortedNanoseconds: syncs.sorted()).text)")
                }
                let registered = try await load.run(count: registrations) { index in
                    LoadRequest(
                        method: .PUT,
                        uri: BenchRequests.registrationPath(
                            activityID: BenchRequests.activityID(forInstance: index, perActivity: perActivity), deviceID: BenchRequests.deviceID(index)
                        ),
                        authorization: publishable, body: BenchRequests.registrationBody(pushToken: BenchRequests.pushToken(index))
                    )
                }
                Bench.say("  registrations (\(perActivity) an activity)   \(Bench.describe(registered, count: registrations))")
                printCPU("a registration", requests: registrations, spent())
                try sayDiskSyncs()

                let secret = "Bearer \(app.secretKey)"
                let watched = self.watched
                let pushesBefore = try await target?.sink.received() ?? 0
                let burstStarted = ContinuousClock.now
                _ = spent()
                _ = try probe?.take()
                let accepted = try await load.run(count: updates) { index in
                    LoadRequest(
                        method: .POST,
                        uri: BenchRequests.updatePath(
                            activityID: watched ? BenchRequests.activityID(forInstance: index * perActivity, perActivity: perActivity) : "update-\(index)"
                        ),
                        authorization: secret, body: BenchRequests.updateBody(score: "\(index)-0", minute: index % 90)
                    )
                }
                let burstEnded = ContinuousClock.now
                Bench.say("  updates (\(watched ? "watched" : "distinct") activities)    \(Bench.describe(accepted, count: updates))")
                printCPU("an update", requests: updates, spent())
                try sayDiskSyncs()
                // Counting the sink's pushes in the background, while the paced updates go out.
                let expected = updates * perActivity
                let delivered: Task<Duration?, any Error>? = target.map { target in
                    Task {
                        let deadline = ContinuousClock.now + .seconds(600)
                        while try await target.sink.received() - pushesBefore < expected {
                            guard ContinuousClock.now < deadline else { return nil }
                            try await Task.sleep(for: .milliseconds(20))
                        }
                        return ContinuousClock.now - burstStarted
                    }
                }

                // The engine's backlog: the updates were accepted faster than the engine sends (or, with nothing watching
                // them, marks done) their activities. Watched from the burst's end, beside the paced updates (read after
                // them, the figure could not be under their seconds). Each question is a scrape of /metrics, which counts
                // every activity and instance (on PostgreSQL at 20,000 of each, 11 – 15 ms of its CPU a count, several
                // counts a scrape): asked every 100 ms, those scrapes took half the statement time of a watched burst's
                // catch-up. So, with every update watched, the sink's count (which costs the server nothing) is awaited
                // first, since the engine cannot be done before every push has reached it; and the scrapes are spaced by
                // their own cost.
                let backlog = Task { () async throws -> (pending: Int?, took: Duration) in
                    if let delivered { _ = try await delivered.value }
                    let deadline = burstEnded + .seconds(600)
                    var asked = ContinuousClock.now
                    var pending = await server.activitiesPendingDelivery()
                    while let left = pending, left > 0, ContinuousClock.now < deadline {
                        try await Task.sleep(for: Self.pauseBetweenScrapes(lastTook: ContinuousClock.now - asked))
                        asked = ContinuousClock.now
                        pending = await server.activitiesPendingDelivery()
                    }
                    return (pending, ContinuousClock.now - burstEnded)
                }
                defer { backlog.cancel() }

                if afterSeconds > 0 {
                    _ = try probe?.take()
                    let paced = load.startPaced(perSecond: 100) { index in
                        LoadRequest(
                            method: .POST, uri: BenchRequests.updatePath(activityID: "after-\(index)"), authorization: secret,
                            body: BenchRequests.updateBody(score: "\(index)-1", minute: index % 90)
                        )
                    }
                    try await Task.sleep(for: .seconds(afterSeconds))
                    let after = try await paced.stop()
                    Bench.say("  right after the updates, 100 /s  \(Bench.describe(after, count: after.latencies.count))")
                    try sayDiskSyncs()
                }
                let (pending, took) = try await backlog.value
                switch pending {
                case 0?:
                    Bench.say("  engine caught up                 \(String(format: "%.2f", took.seconds)) s after the burst ended (no activity pending delivery)")
                case let left?:
                    Bench.say("  engine caught up                 not within 10 minutes (\(BenchRequests.grouped(left)) activities pending delivery)")
                case nil:
                    Bench.say("  engine caught up                 unknown (/metrics could not be read)")
                }
                if let delivered {
                    if let took = try await delivered.value {
                        Bench.say("  every push at the sink           \(BenchRequests.grouped(expected)) pushes, \(String(format: "%.2f", took.seconds)) s after the burst began")
                    } else {
                        Bench.say("  every push at the sink           not within 10 minutes")
                    }
                }
                await load.close()
            }
        }

        /// How long `bench api` waits before scraping /metrics again for the engine's backlog, the last scrape having
        /// taken `lastTook`: nine times that, so that the scrapes take at most a tenth of the time they watch, and at
        /// least 100 ms (the precision of the printed catch-up).
        static func pauseBetweenScrapes(lastTook: Duration) -> Duration {
            max(.milliseconds(100), lastTook * 9)
        }

        /// Says ``Bench/cpuLine(_:requests:_:)``'s line and the servers' CPU by part (``Bench/partsLine(_:per:unit:)``), if
        /// any.
        private func printCPU(_ what: String, requests: Int, _ spent: Bench.CPUSpent) {
            if let line = Bench.cpuLine(what, requests: requests, spent) { Bench.say(line) }
            if let line = Bench.partsLine(spent.parts, per: requests, unit: "request") { Bench.say(line) }
        }
    }
}
