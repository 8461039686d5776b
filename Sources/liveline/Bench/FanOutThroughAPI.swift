import APNs
import ArgumentParser
import Crypto
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

extension Bench {
    /// How `bench fanout` reaches Liveline.
    enum PathKind: String, ExpressibleByArgument, CaseIterable {
        /// Through the HTTP API of a `liveline serve` child process, as users do.
        case api
        /// Straight into the Store and the engine in this process (the older measure).
        case direct
    }

    /// Options of the benchmarks that drive a `liveline serve` child over HTTP.
    struct ServerOptions: ParsableArguments {
        @Option(name: .customLong("server"), help: "The liveline executable to run as the server under test (default: this one).")
        var executable: String?
        @Option(
            name: .customLong("database-url"),
            help: "A PostgreSQL database for the server under test (postgres://user@host:port/db; a fresh one: `bash .ci/postgres start` prints a server's URL) instead of a SQLite file in its data directory."
        )
        var databaseURL: String?
        @Option(help: "`liveline serve` processes on the --database-url database, each with its own data directory and port (more than 1 needs --database-url).")
        var nodes = 1

        func validate() throws {
            if let problem = Bench.nodesProblem(nodes: nodes, databaseURL: databaseURL) { throw ValidationError(problem) }
        }

        /// `SQLite` or `PostgreSQL, 2 nodes`: for the benchmark's heading.
        var storeText: String {
            databaseURL == nil ? "SQLite" : "PostgreSQL, \(nodes) node\(nodes == 1 ? "" : "s")"
        }
    }

    /// One load run's line: `100,000 in 10.20 s   9,803 /s   p50 … p99 … max …   errors: none`.
    static func describe(_ result: LoadResult, count: Int) -> String {
        let rate = Double(count) / max(result.elapsed.seconds, 1e-9)
        return "\(BenchRequests.grouped(count)) in \(format(result.elapsed))   \(BenchRequests.grouped(Int(rate))) /s   "
            + "\(result.summary.text)   errors: \(result.errorText)"
    }

    /// Starts the `liveline serve` nodes `options` asks for (one by default) under `directory`, runs `body` against
    /// them and stops them whatever happens, printing each one's peak memory first.
    static func withServers<T>(_ options: ServerOptions, directory: URL, _ body: (ServerNodes) async throws -> T) async throws -> T {
        BenchChildren.shared.stopOnInterrupt()
        let nodes = try await ServerNodes.start(
            executable: serverExecutable(options.executable), directory: directory, databaseURL: options.databaseURL, nodes: options.nodes
        )
        let files = nodes.first.sqlitePath.map(SQLiteFileWatch.init(databasePath:))
        let result: T
        do {
            result = try await body(nodes)
        } catch {
            _ = await files?.stop()
            if !nodes.allRunning { Bench.say("A server exited: \(nodes.exitedLogs())") }
            await nodes.stop()
            throw error
        }
        if let largest = await files?.stop() {
            Bench.say(
                "  server's SQLite, largest    database \(Bench.megabytes(largest.database)), WAL \(Bench.megabytes(largest.wal))"
                    + "   (their files' sizes, every \(SQLiteFileWatch.interval))"
            )
        }
        nodes.printPeakMemory()
        await nodes.stop()
        return result
    }

    /// One server (node 1 of what `options` asks for), as ``withServers(_:directory:_:)``.
    static func withServer<T>(_ options: ServerOptions, directory: URL, _ body: (ServerUnderTest) async throws -> T) async throws -> T {
        try await withServers(options, directory: directory) { try await body($0.first) }
    }

    /// Each node's pushes since `before` (its /metrics counter), nil where either reading is missing.
    static func sentDuring(_ nodes: ServerNodes, since before: [Int?]) async -> [Int?] {
        zip(await nodes.pushesSent(), before).map { now, then in now.flatMap { now in then.map { now - $0 } } }
    }

    /// `  server CPU 12.3 µs/push` lines per node: `node 1 … · node 2 …` when there are several.
    static func perNodeCPU(_ seconds: [Double], per count: Int, unit: String) -> String {
        let each = seconds.map { String(format: "%.1f µs/\(unit)", $0 / Double(max(1, count)) * 1e6) }
        return zip(1..., each).map { "node \($0.0) \($0.1)" }.joined(separator: " · ")
    }

    /// `server 83.5 µs, PostgreSQL 40.2 µs, load generator 20.4 µs (servers: node 1 … · node 2 …)`: CPU seconds spent
    /// over `count` requests, each part's per request: the servers' added up (then each node's when there are several),
    /// PostgreSQL's cluster's when measured, the load generator's.
    static func cpuText(server: [Double], database: Double?, own: Double, per count: Int, unit: String) -> String {
        let per = 1e6 / Double(max(1, count))
        var text = String(format: "server %.1f µs", server.reduce(0, +) * per)
        if let database { text += String(format: ", PostgreSQL %.1f µs", database * per) }
        text += String(format: ", load generator %.1f µs", own * per)
        if server.count > 1 { text += " (servers: \(perNodeCPU(server, per: count, unit: unit)))" }
        return text
    }

    /// What the h2load reference sends (``h2load(_:requests:directory:shape:)``).
    enum H2loadShape: Sendable {
        /// Every request to one path, `/3/device/x`, with none of APNs' headers: the sink at its fastest, the reference
        /// issue 17 set its figure against.
        case plain
        /// Requests shaped as Liveline's pushes: each to the device path of one of the first `devices` bench tokens
        /// (``BenchRequests/pushToken(_:)``) in turn, with `headers` (``pushHeaders(bundleID:signingKey:now:)``: what
        /// Liveline's APNs client sends).
        case pushes(devices: Int, headers: [(name: String, value: String)])
    }

    /// The headers of a Live Activity update as Liveline's APNs client sends them (`APNsConnection`), for the h2load
    /// reference shaped as pushes: a provider token signed with `signingKey` (``teamID``, ``keyID``), the push
    /// type, topic, priority 10 and an expiration eight hours on (no `apns-id`: APNs makes one up).
    static func pushHeaders(bundleID: String, signingKey: P256.Signing.PrivateKey, now: Date = Date()) -> [(name: String, value: String)] {
        let tokens = APNsProviderTokens(signingKey: APNsSigningKey(teamID: Bench.teamID, keyID: Bench.keyID, privateKey: signingKey))
        return [
            ("authorization", "bearer \(tokens.current())"),
            ("apns-push-type", "liveactivity"),
            ("apns-topic", "\(bundleID).push-type.liveactivity"),
            ("apns-priority", "10"),
            ("apns-expiration", String(Int(now.timeIntervalSince1970) + 8 * 3600)),
        ]
    }

    /// h2load's arguments for `requests` requests over 4 connections, 256 streams each (Liveline's own client opens 4),
    /// posting `bodyPath` to `baseURL`: to one path, or (shaped as pushes) to the URIs listed in `urisPath`, with the
    /// headers of `shape`.
    static func h2loadArguments(requests: Int, bodyPath: String, baseURL: String, shape: H2loadShape, urisPath: String) -> [String] {
        let common = ["-n", String(requests), "-c", "4", "-m", "256", "-d", bodyPath]
        switch shape {
        case .plain:
            return common + [baseURL + "/3/device/x"]
        case .pushes(_, let headers):
            return common + ["-i", urisPath] + headers.flatMap { ["-H", "\($0.name): \($0.value)"] }
        }
    }

    /// h2load against the nginx sink: the reference rate of this machine at this hour, in requests a second; nil when
    /// h2load is not installed or the sink is not nginx.
    static func h2load(_ sink: any BenchSink, requests: Int, directory: URL, shape: H2loadShape = .plain) async throws -> Double? {
        guard requests > 0, sink is NginxSink, let executable = findExecutable("h2load") else { return nil }
        let body = directory.appendingPathComponent("h2load-body.json")
        try Data(#"{"aps":{"timestamp":1,"event":"update","content-state":{"score":"1-0","minute":42}}}"#.utf8).write(to: body)
        let uris = directory.appendingPathComponent("h2load-uris.txt")
        if case .pushes(let devices, _) = shape {
            // One line a device, for as many devices as requests at most, written a few thousand lines at a time: the
            // bench keeps no string per instance (a million of them, with `--instances 1000000`).
            guard devices > 0 else { return nil }
            guard FileManager.default.createFile(atPath: uris.path, contents: nil) else {
                throw ValidationError("Could not write \(uris.path).")
            }
            let file = try FileHandle(forWritingTo: uris)
            defer { try? file.close() }
            let prefix = sink.baseURL + "/3/device/"
            for start in stride(from: 0, to: min(devices, requests), by: 4096) {
                var lines = ""
                for index in start..<min(start + 4096, devices, requests) { lines += prefix + BenchRequests.pushToken(index) + "\n" }
                try file.write(contentsOf: Data(lines.utf8))
            }
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = h2loadArguments(requests: requests, bodyPath: body.path, baseURL: sink.baseURL, shape: shape, urisPath: uris.path)
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        BenchChildren.shared.add(process.processIdentifier)
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        BenchChildren.shared.remove(process.processIdentifier)
        let text = String(decoding: data, as: UTF8.self)
        guard let rate = BenchRequests.h2loadRate(text) else {
            Bench.say("  h2load gave no rate: \(text.split(separator: "\n").suffix(5).joined(separator: " | "))")
            return nil
        }
        if let succeeded = BenchRequests.h2loadSucceeded(text), succeeded != requests {
            Bench.say("  h2load: only \(succeeded) of \(requests) requests answered 2xx")
        }
        return rate
    }

    static func findExecutable(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        let directories = path.split(separator: ":").map(String.init) + ["/usr/bin", "/usr/local/bin"]
        return directories.map { ($0 as NSString).appendingPathComponent(name) }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}

extension Bench.FanOut {
    /// The real path: `liveline serve` as a child process with APNs pointed at the sink; the instances registered
    /// through `PUT /v1/activities/bench/instances/{deviceId}` from keep-alive connections; each round one
    /// `POST /v1/activities/bench/updates`, timed from the request until the sink has counted every push, while updates
    /// to other activities are posted at a steady rate and their accept latency measured.
    func measureThroughAPI(_ target: Bench.Target, root: URL) async throws {
        let sink = target.sink
        // One event loop (thread) for all the load, so it takes little of the machine from the server.
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let runStarted = ContinuousClock.now
        try await Bench.withServers(server, directory: root) { nodes in
            let server = nodes.first
            let app = try await server.createApp(name: "Bench", bundleID: target.bundleID)
            try await server.setAPNs(
                appID: app.id, baseURL: sink.baseURL, caCertificatePEM: sink.caCertificatePEM, signingKey: target.key
            )
            if let emulator = target.emulator {
                for index in 0..<instances { _ = emulator.addDevice(bundleID: target.bundleID, token: BenchRequests.pushToken(index)) }
            }
            Bench.say("""
                liveline bench fanout (through the HTTP API): \(BenchRequests.grouped(instances)) instances on one activity, sink \(sinkKind.rawValue)\
                \(sinkRoundTripMilliseconds > 0 ? " \(sinkRoundTripMilliseconds) ms away (round trip)" : ""), \(self.server.storeText), \(nodes.pidText)
                """)
            if let text = nodes.databaseCPUText { Bench.say("  \(text)") }
            if nodes.count > 1 {
                Bench.say("  registrations spread round-robin over the \(nodes.count) nodes' ports; updates posted to node 1")
            }
            // Two references, each before and after the rounds: h2load at its fastest (one path, no APNs headers), and
            // h2load sending requests shaped as the fan-out's pushes (each instance's device path, APNs' headers).
            let shaped = Bench.H2loadShape.pushes(
                devices: instances, headers: Bench.pushHeaders(bundleID: target.bundleID, signingKey: target.key)
            )
            if h2loadRequests > 0, sink is NginxSink, Bench.findExecutable("h2load") == nil {
                Bench.say("  h2load not found (Debian: apt-get install nghttp2-client): no reference in this run")
            }
            let before = try await Bench.h2load(sink, requests: h2loadRequests, directory: root)
            if let before { Bench.say("  h2load → nginx, before      \(BenchRequests.grouped(Int(before))) requests/s") }
            let shapedBefore = try await Bench.h2load(sink, requests: h2loadRequests, directory: root, shape: shaped)
            if let shapedBefore {
                Bench.say("  h2load → nginx, before      \(BenchRequests.grouped(Int(shapedBefore))) requests/s shaped as pushes (device paths, APNs' headers)")
            }

            // Registration: every instance through the API, from keep-alive connections, in an order unrelated to their
            // device ids unless asked (``BenchRequests/registrationOrder(count:inIDOrder:)``).
            let registering = try await HTTPLoad.connect(host: "127.0.0.1", ports: nodes.ports, connections: httpConnections, eventLoop: eventLoop)
            let publishable = "Bearer \(app.publishableKey)"
            let order = BenchRequests.registrationOrder(count: instances, inIDOrder: registrationsInIDOrder)
            // What the registrations cost each part, as `bench api` prints it: the order of registration weighs on the
            // Store (in an order other than the device ids', each new instance lands on a page of its own).
            var meter = Bench.CPUMeter(nodes: nodes)
            let registered = try await registering.run(count: instances) { registration in
                let index = order[registration]
                return LoadRequest(
                    method: .PUT, uri: BenchRequests.registrationPath(activityID: "bench", deviceID: BenchRequests.deviceID(index)),
                    authorization: publishable, body: BenchRequests.registrationBody(pushToken: BenchRequests.pushToken(index))
                )
            }
            Bench.say("  registrations               \(Bench.describe(registered, count: instances))")
            let registrationsSpent = meter.spent()
            if let line = Bench.cpuLine("a registration", requests: instances, registrationsSpent) {
                Bench.say(line + (registrationsInIDOrder ? "; in order of device ids" : "; in an order other than the device ids'"))
            }
            if let line = Bench.partsLine(registrationsSpent.parts, per: instances, unit: "registration") { Bench.say(line) }
            guard registered.succeeded == instances else {
                throw ValidationError("Only \(registered.succeeded) of \(instances) registrations succeeded.")
            }
            // With --side-deliveries, a phone on each side activity, whose pushes the sink logs apart with their times.
            var timesSideDeliveries = false
            if sideDeliveries, sideAccepts > 0 { timesSideDeliveries = try await sink.sideArrivals() != nil }
            if sideDeliveries, !timesSideDeliveries {
                Bench.say("  side deliveries not timed: they need side accepts and the nginx sink")
            }
            if timesSideDeliveries {
                let sides = try await registering.run(count: BenchRequests.sideActivities) { index in
                    LoadRequest(
                        method: .PUT, uri: BenchRequests.registrationPath(activityID: "side-\(index)", deviceID: "side-phone-\(index)"),
                        authorization: publishable, body: BenchRequests.registrationBody(pushToken: BenchRequests.sideToken(index))
                    )
                }
                guard sides.succeeded == BenchRequests.sideActivities else {
                    throw ValidationError("Only \(sides.succeeded) of \(BenchRequests.sideActivities) side phones registered: \(sides.errorText)")
                }
                Bench.say(
                    "  side phones                 \(BenchRequests.sideActivities), one on each side activity: each side update is timed until the sink has its push"
                )
            }
            await registering.close()

            let updating = try await HTTPLoad.connect(host: "127.0.0.1", port: server.port, connections: 1, eventLoop: eventLoop)
            let side = try await HTTPLoad.connect(host: "127.0.0.1", port: server.port, connections: sideConnections, eventLoop: eventLoop)
            let secret = "Bearer \(app.secretKey)"
            var rates: [Double] = []
            var sideLatencies: [UInt64] = []
            var sideDeliveryLatencies: [UInt64] = []
            var sidePosts = 0
            // The disk's own syncs beside the side accepts: the floor of a durable accept's latency, round by round.
            let probe = try DiskSyncProbe.started(in: root, perSecond: diskSyncs)
            defer { probe?.stop() }
            var diskLatencies: [UInt64] = []
            // With --h2load-each-round: the plain reference before the first round, then after each one.
            var eachRound: [Double?] = [before]
            // The share of the machine's cores left idle in each round (``MachineTimes``).
            var idleShares: [Double] = []
            // Each round's CPU a push: the servers' (added up), and the sink's when it runs apart (nginx).
            var serverPerPush: [Double] = []
            var sinkPerPush: [Double] = []
            // Each round's CPU ticks by part of the server (``ServerPart``), the nodes' added up.
            var partsPerRound: [[Bench.ServerPart: Int]] = []
            for round in 1...rounds {
                let received = try await sink.received()
                let cpuBefore = nodes.cpuSeconds()
                let partsBefore = nodes.partTicks()
                let sinkCPUBefore = sink.cpuSeconds()
                let machineBefore = MachineTimes.read()
                let databaseCPUBefore = nodes.databaseCPUSeconds()
                let sentBefore = await nodes.pushesSent()
                // The side phones' pushes are the sink's too: they are not the fan-out's.
                var sideBefore = 0
                if timesSideDeliveries { sideBefore = try await sink.sideArrivals()?.count ?? 0 }
                let posts = NIOLockedValueBox<[(phone: Int, at: Double)]>([])
                // The syncs of the pause before the round are not the round's.
                _ = try probe?.take()
                let started = ContinuousClock.now
                // Updates to other activities at a steady rate while the fan-out runs, as a busy backend sends them.
                var paced: PacedRun?
                if sideAccepts > 0 {
                    paced = side.startPaced(perSecond: sideAccepts) { [timesSideDeliveries] index in
                        let activity = index % BenchRequests.sideActivities
                        if timesSideDeliveries { posts.withLockedValue { $0.append((activity, Date().timeIntervalSince1970)) } }
                        return LoadRequest(
                            method: .POST, uri: BenchRequests.updatePath(activityID: "side-\(activity)"), authorization: secret,
                            body: BenchRequests.updateBody(score: "\(round)-\(index)", minute: index % 90)
                        )
                    }
                }
                // With --end, the last round ends the activity.
                let ending = endsActivity && round == rounds
                let accepted = try await updating.run(count: 1) { _ in
                    LoadRequest(
                        method: .POST, uri: ending ? "/v1/activities/bench/end" : BenchRequests.updatePath(activityID: "bench"),
                        authorization: secret, body: BenchRequests.updateBody(score: ending ? "final" : "\(round)-0", minute: ending ? 90 : 42)
                    )
                }
                guard accepted.succeeded == 1 else {
                    _ = try await paced?.stop()
                    throw ValidationError("The fan-out's \(ending ? "end" : "update") was not accepted: \(accepted.errorText)")
                }
                while true {
                    var counted = try await sink.received() - received
                    if timesSideDeliveries {
                        let sideCount = try await sink.sideArrivals()?.count ?? sideBefore
                        counted -= sideCount - sideBefore
                    }
                    if counted >= instances { break }
                    try await Task.sleep(
                        for: BenchRequests.pollPause(counted: counted, expected: instances, elapsed: ContinuousClock.now - started)
                    )
                    if ContinuousClock.now - started > .seconds(600) {
                        _ = try await paced?.stop()
                        throw ValidationError("The sink did not receive every push within 10 minutes.")
                    }
                }
                let elapsed = ContinuousClock.now - started
                let cpu = zip(nodes.cpuSeconds(), cpuBefore).map { $0 - $1 }
                let parts = Bench.partsSpent(before: partsBefore, after: nodes.partTicks())
                let sinkCPU = sink.cpuSeconds().flatMap { now in sinkCPUBefore.map { now - $0 } }
                serverPerPush.append(cpu.reduce(0, +) / Double(instances))
                if let sinkCPU { sinkPerPush.append(sinkCPU / Double(instances)) }
                let coresIdle = machineBefore.flatMap { before in MachineTimes.read()?.idleShare(since: before) }
                if let coresIdle { idleShares.append(coresIdle) }
                let databaseCPU = nodes.databaseCPUSeconds().flatMap { now in databaseCPUBefore.map { now - $0 } }
                let sideResult = try await paced?.stop() ?? LoadResult()
                sideLatencies.append(contentsOf: sideResult.latencies)
                let roundSyncs = try probe?.take().sorted()
                diskLatencies.append(contentsOf: roundSyncs ?? [])
                let rate = Double(instances) / elapsed.seconds
                rates.append(rate)
                Bench.say(
                    "  round \(round) of \(rounds)  "
                        + Bench.roundLine(
                            instances: instances, elapsed: elapsed, rate: rate, h2load: before, shapedH2load: shapedBefore,
                            accept: accepted.summary.p50,
                            side: sideResult, disk: roundSyncs.map { LatencySummary(sortedNanoseconds: $0) }, serverCPU: cpu.reduce(0, +),
                            databaseCPU: databaseCPU, sinkCPU: sinkCPU, coresIdle: coresIdle
                        )
                )
                if nodes.count > 1 {
                    Bench.say("      server CPU per node  \(Bench.perNodeCPU(cpu, per: instances, unit: "push"))")
                }
                if let line = Bench.partsLine(parts, per: instances, unit: "push") { Bench.say(line) }
                partsPerRound.append(parts)
                if ending {
                    // The end pushes are out; the Store records each instance as ended with its progress.
                    while true {
                        let counts = try await server.instanceCounts(activityID: "bench", secretKey: app.secretKey)
                        if counts["ended", default: 0] >= instances {
                            Bench.say(
                                "      every instance ended  \(String(format: "%.2f", (ContinuousClock.now - started).seconds)) s after the POST "
                                    + "(GET /v1/activities/bench)"
                            )
                            break
                        }
                        if ContinuousClock.now - started > .seconds(600) {
                            throw ValidationError("The API did not count every instance ended within 10 minutes: \(counts)")
                        }
                        try await Task.sleep(for: .milliseconds(50))
                    }
                }
                // Each node's share, from its /metrics push counter: the counters may trail the sink by a moment.
                var sent = await Bench.sentDuring(nodes, since: sentBefore)
                let countDeadline = ContinuousClock.now + .seconds(3)
                while sent.contains(where: { $0 == nil }) == false, sent.compactMap({ $0 }).reduce(0, +) < instances, ContinuousClock.now < countDeadline {
                    try await Task.sleep(for: .milliseconds(50))
                    sent = await Bench.sentDuring(nodes, since: sentBefore)
                }
                Bench.say("      pushes sent (/metrics)  \(Bench.perNodeText(sent))")
                if timesSideDeliveries {
                    // Each side update against the pushes its phone received, once every one has met its push (or 5 s).
                    let roundPosts = posts.withLockedValue { $0 }
                    var delivered: [Double?] = []
                    let deadline = ContinuousClock.now + .seconds(5)
                    while true {
                        let arrivals = try await sink.sideArrivals() ?? SideArrivals()
                        delivered = BenchRequests.sideDeliveries(posts: roundPosts, arrivals: arrivals.byPhone)
                        if !delivered.contains(where: { $0 == nil }) || ContinuousClock.now > deadline { break }
                        try await Task.sleep(for: .milliseconds(20))
                    }
                    let latencies = delivered.compactMap { $0 }.map { UInt64(($0 * 1e9).rounded()) }.sorted()
                    sideDeliveryLatencies += latencies
                    sidePosts += roundPosts.count
                    Bench.say(
                        "      side deliveries  \(latencies.count) of \(roundPosts.count) updates reached their phones: "
                            + LatencySummary(sortedNanoseconds: latencies).text
                    )
                }
                // With --h2load-each-round the pause comes after the last round too: the engine may still be recording
                // its progress when the reference runs.
                if round < rounds || h2loadEachRound, pause > 0 { try await Task.sleep(for: .seconds(pause)) }
                if h2loadEachRound {
                    let reference = try await Bench.h2load(sink, requests: h2loadRequests, directory: root)
                    eachRound.append(reference)
                    if let reference, let adjacent = BenchRequests.adjacentReference(eachRound, round: round) {
                        Bench.say(
                            "      h2load after round \(round)  \(BenchRequests.grouped(Int(reference))) requests/s; "
                                + "the round \(String(format: "%.2f", rate / adjacent)) × the runs either side"
                        )
                    }
                }
            }
            await updating.close()
            await side.close()

            // With --h2load-each-round, the plain run after the last round is the one after the rounds.
            let after = h2loadEachRound ? eachRound.last ?? nil : try await Bench.h2load(sink, requests: h2loadRequests, directory: root)
            if let after { Bench.say("  h2load → nginx, after       \(BenchRequests.grouped(Int(after))) requests/s") }
            let shapedAfter = try await Bench.h2load(sink, requests: h2loadRequests, directory: root, shape: shaped)
            if let shapedAfter {
                Bench.say("  h2load → nginx, after       \(BenchRequests.grouped(Int(shapedAfter))) requests/s shaped as pushes")
            }
            sideLatencies.sort()
            var range = "  pushes/s over the rounds    \(BenchRequests.grouped(Int(rates.min() ?? 0))) – \(BenchRequests.grouped(Int(rates.max() ?? 0)))"
            if let referenceMean = BenchRequests.mean([before, after].compactMap { $0 }) {
                var ratios = [BenchRequests.ratioRange(rates, to: referenceMean)]
                if let shapedMean = BenchRequests.mean([shapedBefore, shapedAfter].compactMap { $0 }) {
                    ratios.append(BenchRequests.ratioRange(rates, to: shapedMean, shaped: true))
                }
                range += "   (\(ratios.joined(separator: ", ")); each reference before and after averaged)"
            }
            let share = BenchRequests.slowestShare(rates)
            if !share.isEmpty { range += "   \(share)" }
            Bench.say(range)
            if h2loadEachRound, eachRound.contains(where: { $0 != nil }) {
                let runs = eachRound.compactMap { $0 }
                let references = BenchRequests.adjacentReferences(eachRound, rounds: rounds)
                Bench.say(
                    "  each round's own reference  \(BenchRequests.adjacentRatioRange(rates, references: references))   "
                        + "h2load itself \(BenchRequests.grouped(Int(runs.min() ?? 0))) – \(BenchRequests.grouped(Int(runs.max() ?? 0))) "
                        + "requests/s over \(runs.count) runs, \(BenchRequests.slowestShare(runs))"
                )
            }
            if let line = Bench.cpuAPushLine(server: serverPerPush, sink: sinkPerPush) { Bench.say(line) }
            if let line = Bench.slowestRoundPartsLine(rates: rates, parts: partsPerRound) { Bench.say(line) }
            if let least = idleShares.min(), let most = idleShares.max() {
                Bench.say(
                    "  cores idle in the rounds    \(Bench.percent(least)) – \(Bench.percent(most))   "
                        + "(the machine's, from /proc/stat: what the server, nginx, the bench and the rest left unused)"
                )
            }
            if !sideLatencies.isEmpty {
                Bench.say("  side accepts, all rounds    \(sideLatencies.count) updates   \(LatencySummary(sortedNanoseconds: sideLatencies).text)")
            }
            if timesSideDeliveries {
                sideDeliveryLatencies.sort()
                Bench.say(
                    "  side deliveries, all rounds \(sideDeliveryLatencies.count) of \(sidePosts) updates   "
                        + "\(LatencySummary(sortedNanoseconds: sideDeliveryLatencies).text)   (from the post until the sink had the phone's push)"
                )
            }
            if !diskLatencies.isEmpty {
                diskLatencies.sort()
                Bench.say(
                    "  disk syncs, all rounds      \(diskLatencies.count) syncs     \(LatencySummary(sortedNanoseconds: diskLatencies).text)"
                        + "   (4 KB written in place and fdatasync'd beside the server's data: a durable accept's floor)"
                )
            }
            Bench.say("  total time                  \(Bench.format(ContinuousClock.now - runStarted)) (registrations, rounds and pauses, h2load runs included)")
            Bench.say("  bench process peak memory   \(Bench.peakMemory())")
        }
    }
}

extension Bench {
    /// `  CPU a push in the rounds    server 21.0 – 28.4 µs, nginx 8.2 – 12.1 µs, the server's ÷ nginx's 2.55 – 2.61   (…)`:
    /// the least and the most the servers (added up) and the sink spent a push over the rounds (`server` and `sink`:
    /// seconds a push, one of each per round; `sink` empty when the sink's CPU is not measured), and the least and the
    /// most of the two's quotient round by round; nil without rounds. nginx answers every round's pushes alike, so its
    /// spread is the machine's own from round to round: where the quotient stays put while both spread, the server did
    /// the same work every round and the machine ran slower in some.
    static func cpuAPushLine(server: [Double], sink: [Double]) -> String? {
        guard let least = server.min(), let most = server.max() else { return nil }
        var line = String(format: "  CPU a push in the rounds    server %.1f – %.1f µs", least * 1e6, most * 1e6)
        let quotients = zip(server, sink).compactMap { server, sink in sink > 0 ? server / sink : nil }
        if sink.count == server.count, let sinkLeast = sink.min(), let sinkMost = sink.max(), let low = quotients.min(), let high = quotients.max() {
            line += String(
                format: ", nginx %.1f – %.1f µs, the server's ÷ nginx's %.2f – %.2f   "
                    + "(nginx does the same work every round: where both rise together, the machine ran slower)",
                sinkLeast * 1e6, sinkMost * 1e6, low, high
            )
        }
        return line
    }

    /// `  the slowest round's CPU     +31 % against the fastest's: push connections +28 %, engine +35 %, …`: what each part
    /// of the server spent in the slowest round (the least `rates`) against the fastest, the largest parts first; nil
    /// with fewer than two rounds, or when the rounds' parts were not counted. Where every part grew alike, the
    /// machine ran slower; where one part grew alone, that part did more work. Parts that spent fewer than
    /// `leastTicks` clock ticks (at least one) in the fastest round are left out: too few to compare.
    static func slowestRoundPartsLine(rates: [Double], parts: [[ServerPart: Int]], leastTicks: Int = 10) -> String? {
        guard rates.count >= 2, parts.count == rates.count,
            let slowest = rates.indices.min(by: { rates[$0] < rates[$1] }), let fastest = rates.indices.max(by: { rates[$0] < rates[$1] })
        else { return nil }
        let (slow, fast) = (parts[slowest], parts[fastest])
        let fastTotal = fast.values.reduce(0, +)
        guard fastTotal > 0 else { return nil }
        /// `+12 %` or `−8 %`: `slow` against `fast`, which is above 0.
        func growth(_ slow: Int, _ fast: Int) -> String {
            let change = (Double(slow) / Double(fast) - 1) * 100
            return (change >= 0 ? "+" : "−") + String(format: "%.0f %%", abs(change))
        }
        let total = growth(slow.values.reduce(0, +), fastTotal)
        let each = ServerPart.allCases.filter { fast[$0, default: 0] >= max(1, leastTicks) }
            .sorted { fast[$0, default: 0] > fast[$1, default: 0] }
            .map { "\($0.rawValue) \(growth(slow[$0, default: 0], fast[$0, default: 0]))" }
        return "  the slowest round's CPU     \(total) against the fastest's (rounds \(slowest + 1) and \(fastest + 1)): " + each.joined(separator: ", ")
    }

    /// One fan-out round: `100,000 pushes in 3.21 s   31,152 /s   0.24 × h2load   update accepted in 2.10 ms   …`, with the
    /// side accepts' latency and the disk's own syncs' (``DiskSyncProbe``) in the same round when there were any.
    static func roundLine(
        instances: Int, elapsed: Duration, rate: Double, h2load: Double?, shapedH2load: Double? = nil, accept: Duration, side: LoadResult,
        disk: LatencySummary? = nil, serverCPU: Double, databaseCPU: Double? = nil, sinkCPU: Double? = nil, coresIdle: Double? = nil
    ) -> String {
        var line = "\(BenchRequests.grouped(instances)) pushes in \(format(elapsed))   \(BenchRequests.grouped(Int(rate))) pushes/s"
        if h2load != nil { line += "   \(BenchRequests.ratio(rate, to: h2load))" }
        if shapedH2load != nil { line += " (\(BenchRequests.ratio(rate, to: shapedH2load, shaped: true)))" }
        line += "   update accepted in \(format(accept))"
        if side.summary.count > 0 {
            line += "   side accepts \(side.summary.count): p50 \(format(side.summary.p50)) p99 \(format(side.summary.p99))"
            if side.errors > 0 { line += " (errors: \(side.errorText))" }
        }
        if let disk, disk.count > 0 { line += "   disk syncs \(disk.count): p99 \(format(disk.p99)) max \(format(disk.max))" }
        line += String(format: "   server CPU %.1f µs/push", serverCPU / Double(instances) * 1e6)
        if let databaseCPU { line += String(format: ", PostgreSQL %.1f µs/push", databaseCPU / Double(instances) * 1e6) }
        if let sinkCPU { line += String(format: ", nginx %.1f µs/push", sinkCPU / Double(instances) * 1e6) }
        if let coresIdle { line += "   cores idle \(percent(coresIdle))" }
        return line
    }
}
