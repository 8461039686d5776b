import AsyncHTTPClient
import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
@testable import LivelineStore
import LivelineTestSupport
import Logging
import NIOCore
import NIOHTTP1
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Several real `liveline serve` processes ("nodes") on one PostgreSQL database, sending through one in-process APNs
/// emulator: what each phone received is counted at the emulator (``APNsEmulator/acceptedPushCounts()``: accepted pushes
/// per token and `aps.timestamp`, and Liveline gives each sequence of an activity its own timestamp), never taken from
/// the nodes' own account.
///
/// Runs only with a test PostgreSQL server (`LIVELINE_TEST_POSTGRES_URL`) and `LIVELINE_MULTINODE_TESTS=1` (CI sets
/// both, in a step of its own after the other tests): the suite takes about 4 minutes of a 2-core machine (debug builds
/// of three processes and 20,000 phones per test). Every test has a database of its own. The tests run one after
/// another: each starts several processes and a fan-out to 20,000 phones, and on a 2-core machine a second one beside
/// it would only blur their timing (the kill test's above all).
///
/// The nodes run with the engine's defaults (2,048 pushes in flight a pass), against an emulator that answers only a
/// few hundred pushes a second here (debug builds, several nodes and PostgreSQL on two cores). The APNs client's stream
/// limit keeps the pushes that wait for an answer on the nodes' side, unsent, rather than on the wire past the 30 s
/// timeout, so a push sent twice means the claims failed. Before that limit, beside one busy core, pushes waited 18 –
/// 20 s for their answers, the slowest timed out after the emulator had taken them, and the exactly-once tests counted
/// hundreds of pushes twice (the tests then ran at 128 in flight).
@Suite(
    "Several liveline serve nodes on one PostgreSQL database", .tags(.slow), .unlessSkippingSlowTests,
    .enabled(
        if: PostgresTestServer.url != nil && ProcessInfo.processInfo.environment["LIVELINE_MULTINODE_TESTS"] == "1",
        "needs LIVELINE_TEST_POSTGRES_URL and LIVELINE_MULTINODE_TESTS=1"
    ),
    .serialized
)
struct MultiNodeTests {
    @Test("two nodes: one update to 20,000 instances reaches every instance exactly once")
    func twoNodesExactlyOnce() async throws {
        try await withCluster(activities: ["match": 20_000]) { cluster in
            // Slices of 1,000: twenty, more than one node's four engine workers take at once, so both nodes send.
            let nodes = try await cluster.start(count: 2, environment: ["LIVELINE_SLICE_SIZE": "1000"])
            defer { nodes.forEach { $0.stop() } }
            let accepted = try await cluster.postUpdate(to: nodes[0], activity: "match", contentState: ["score": "1-0"])
            #expect(accepted == 202)

            let arrived = try await cluster.waitUntilEveryPhone(shows: ["score": "1-0"], timeout: .seconds(180))
            #expect(arrived, "every phone shows the update")
            // Once the pass is over and a while after, anything sent twice has arrived.
            try await cluster.waitUntilReleased(["match"])
            try await Task.sleep(for: .seconds(2))
            let tally = try cluster.tally(activity: "match")
            print("MultiNodeTests two nodes: \(tally); pushes per node (liveline_pushes_total): \(try await cluster.pushCounts(nodes))")
            #expect(tally.missing == 0)
            #expect(tally.duplicates == 0, "no phone was sent the update twice")
            #expect(tally.other == 0, "no other push reached the phones")
            #expect(cluster.emulator.statistics.accepted == 20_000)
            if cluster.emulator.statistics.accepted != 20_000 {
                print("MultiNodeTests two nodes, every node's pushes and log:\n\(try await cluster.pushesAndLogs(nodes))")
            }
            let pushed = try await cluster.pushCounts(nodes)
            #expect(pushed.reduce(0, +) == 20_000, "the nodes count the pushes the emulator accepted")
            #expect(pushed.allSatisfy { $0 > 0 }, "both nodes sent part of the one fan-out: \(pushed)")
            try await cluster.expectDispatched(["match"])
            #expect(try await postgresRows(cluster.databaseURL, "SELECT slice::text FROM fanout_slices").isEmpty, "the slices are dropped")
            try cluster.expectAlive(nodes)
        }
    }

    @Test("kill -9 of one node sharing a fan-out: the survivor takes its slices over, every phone ends at the update")
    func killOneNodeSharingAFanOut() async throws {
        try await withCluster(activities: ["match": 20_000]) { cluster in
            // Ten slices of 2,000, shared by both nodes; a 10 s lease, as in the test above.
            let nodes = try await cluster.start(count: 2, environment: ["LIVELINE_CLAIM_LEASE": "10", "LIVELINE_SLICE_SIZE": "2000"])
            defer { nodes.forEach { $0.stop() } }
            // Answers 100 ms late keep the fan-out going long enough to be caught while both nodes hold slices.
            var slow = APNsFaults()
            slow.delayMilliseconds = 100
            cluster.emulator.setFaults(slow)
            #expect(try await cluster.postUpdate(to: nodes[0], activity: "match", contentState: ["score": "1-0"]) == 202)

            // Both nodes send when both hold slices, read from the database: one short query. (Each node's /metrics
            // was the first way, but a node busy sending answered it so late that the fan-out was over before both
            // counts were read, in CI once.)
            // A slice's holder is one engine worker, `dispatcher-<pid>-<engine uuid>-w<worker>`; each node runs one engine.
            let slicesHeld = """
                SELECT count(DISTINCT regexp_replace(claim_owner, '-w[0-9]+$', ''))::text AS n FROM fanout_slices
                WHERE claim_owner IS NOT NULL
                """
            let bothSending = try await poll(timeout: .seconds(60), every: .milliseconds(50)) {
                // Part-way: a slice's worth of phones reached already.
                guard cluster.emulator.statistics.accepted >= 2_000 else { return false }
                return (try? await postgresRows(cluster.databaseURL, slicesHeld))?.first?["n"] == "2"
            }
            #expect(bothSending, "both nodes hold slices of the fan-out, part-way through it")
            if !bothSending { print("MultiNodeTests kill -9 (shared), the nodes' logs:\n\(nodes.map(\.logTail).joined(separator: "\n-----\n"))") }
            nodes[0].kill9()
            let atKill = cluster.emulator.statistics.accepted
            #expect(atKill < 20_000, "the node was killed part-way through the fan-out")
            cluster.emulator.setFaults(APNsFaults())

            let survivor = nodes[1]
            let arrived = try await cluster.waitUntilEveryPhone(shows: ["score": "1-0"], timeout: .seconds(180))
            #expect(arrived, "every phone ends at the update")
            if !arrived {
                let slices = try await postgresRows(
                    cluster.databaseURL, "SELECT slice::text, claim_owner, claim_expires_at::text, outcome FROM fanout_slices ORDER BY slice"
                )
                print("MultiNodeTests kill -9 (shared), stuck: accepted \(cluster.emulator.statistics), slices \(slices)\n\(survivor.logTail)")
            }
            try await cluster.waitUntilReleased(["match"])
            try await Task.sleep(for: .seconds(2))
            let tally = try cluster.tally(activity: "match")
            let survivorPushes = try await cluster.pushCounts([survivor])[0]
            print("MultiNodeTests kill -9 (shared): killed node A at \(atKill) accepted pushes; the survivor sent \(survivorPushes); \(tally)")
            #expect(tally.missing == 0)
            #expect(tally.other == 0)
            // Only the killed node's slices can go twice, and each at most once more: its engine's four workers hold a
            // slice of 2,000 each at most.
            #expect(tally.duplicates <= 4 * 2_000, "duplicates: \(tally.duplicates)")
            #expect(tally.maximumPerPhone <= 2, "no phone got the update more than twice")
            #expect(cluster.emulator.statistics.accepted == 20_000 + tally.duplicates)
            #expect(survivorPushes > 0, "the survivor sent its own slices and the killed node's")
            try await cluster.expectDispatched(["match"])
            #expect(try await postgresRows(cluster.databaseURL, "SELECT slice::text FROM fanout_slices").isEmpty, "the slices are dropped")
            try cluster.expectAlive([survivor])
        }
    }

    @Test("three nodes, four activities of 5,000 updated through node C: every instance exactly once")
    func threeNodesFourActivities() async throws {
        let activities = ["race-1", "race-2", "race-3", "race-4"]
        try await withCluster(activities: Dictionary(uniqueKeysWithValues: activities.map { ($0, 5_000) })) { cluster in
            let nodes = try await cluster.start(count: 3)
            defer { nodes.forEach { $0.stop() } }
            // Node C accepts all four; the others hear of them over LISTEN/NOTIFY and claim what C's engine has not.
            let statuses = try await withThrowingTaskGroup(of: UInt.self) { group in
                for activity in activities {
                    group.addTask { try await cluster.postUpdate(to: nodes[2], activity: activity, contentState: ["lap": 1]) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(statuses == [202, 202, 202, 202])

            let arrived = try await cluster.waitUntilEveryPhone(shows: ["lap": 1], timeout: .seconds(180))
            #expect(arrived, "every phone shows the update")
            try await cluster.waitUntilReleased(activities)
            try await Task.sleep(for: .seconds(2))
            let pushed = try await cluster.pushCounts(nodes)
            // The spread varies from run to run (it is whoever claims first); it is reported, not required.
            print("MultiNodeTests three nodes: pushes per node A, B, C (liveline_pushes_total): \(pushed)")
            for activity in activities {
                let tally = try cluster.tally(activity: activity)
                print("MultiNodeTests three nodes, \(activity): \(tally)")
                #expect(tally.missing == 0, "\(activity)")
                #expect(tally.duplicates == 0, "\(activity): no phone was sent the update twice")
                #expect(tally.other == 0, "\(activity)")
            }
            #expect(cluster.emulator.statistics.accepted == 20_000)
            #expect(pushed.reduce(0, +) == 20_000)
            if cluster.emulator.statistics.accepted != 20_000 {
                print("MultiNodeTests three nodes, every node's pushes and log:\n\(try await cluster.pushesAndLogs(nodes))")
            }
            try await cluster.expectDispatched(activities)
            try cluster.expectAlive(nodes)
        }
    }

    @Test("kill -9 of one node mid-fan-out: the other takes over once its claim's lease ran out, every phone ends at the update")
    func killOneNodeMidFanOut() async throws {
        try await withCluster(activities: ["match": 20_000]) { cluster in
            // A 10 s lease (the default is 30): the survivor takes over 10 s after the last renewal. Shorter is not safe
            // here: with three debug processes and PostgreSQL on two cores, a renewal (every third of the lease) was
            // seen to take up to 2.6 s to be written, and a 3 s lease then lapsed under the survivor's own pass.
            // Fan-outs are not shared here (LIVELINE_SLICE_SIZE=0): one node sends, and the other takes over from it.
            let nodes = try await cluster.start(count: 2, environment: ["LIVELINE_CLAIM_LEASE": "10", "LIVELINE_SLICE_SIZE": "0"])
            defer { nodes.forEach { $0.stop() } }
            // Slow answers keep the fan-out going long enough to be caught half-way (the phone applies a push when it
            // arrives; the answer comes 100 ms later).
            var slow = APNsFaults()
            slow.delayMilliseconds = 100
            cluster.emulator.setFaults(slow)
            #expect(try await cluster.postUpdate(to: nodes[0], activity: "match", contentState: ["score": "1-0"]) == 202)

            let started = try await poll(timeout: .seconds(60), every: .milliseconds(50)) { cluster.emulator.statistics.accepted >= 3_000 }
            #expect(started, "the fan-out began")
            // The node that holds the claim is the one sending; the claim names its process (`dispatcher-<pid>-…`), read
            // from the database with one short query. (Each node's /metrics was the first way, but a node busy sending
            // can answer it so late that the fan-out is over before the kill, as it was once in the shared test above.)
            let owner = try await cluster.claimOwner("match")
            let victim = try #require(
                nodes.firstIndex { owner?.hasPrefix("dispatcher-\($0.process.processIdentifier)-") == true },
                "the activity is claimed by one of the nodes: \(owner ?? "nil")"
            )
            nodes[victim].kill9()
            let atKill = cluster.emulator.statistics.accepted
            #expect(atKill < 20_000, "the node was killed part-way through the fan-out")
            cluster.emulator.setFaults(APNsFaults())
            #expect(try await postgresRows(cluster.databaseURL, "SELECT slice::text FROM fanout_slices").isEmpty, "the fan-out is not shared")

            let survivor = nodes[1 - victim]
            let arrived = try await cluster.waitUntilEveryPhone(shows: ["score": "1-0"], timeout: .seconds(180))
            #expect(arrived, "every phone ends at the update")
            if !arrived {
                let activity = try await postgresRows(
                    cluster.databaseURL,
                    "SELECT sequence::text, dispatched_sequence::text, claim_owner, claim_expires_at::text, next_dispatch_at::text, (extract(epoch from now()) * 1000)::bigint::text AS now FROM activities"
                )
                print("MultiNodeTests kill -9, stuck: accepted \(cluster.emulator.statistics), activity \(activity), pushes \(try await cluster.pushCounts([survivor]))\n\(survivor.logTail)")
            }
            try await cluster.waitUntilReleased(["match"])
            try await Task.sleep(for: .seconds(2))
            let tally = try cluster.tally(activity: "match")
            let survivorPushes = try await cluster.pushCounts([survivor])[0]
            print(
                "MultiNodeTests kill -9: killed node \(victim == 0 ? "A" : "B") at \(atKill) accepted pushes; the survivor sent \(survivorPushes); \(tally)"
            )
            #expect(tally.missing == 0)
            #expect(tally.other == 0)
            // Only what the killed node had sent without recording it may go twice: its pushes in flight and the results
            // not yet written (the engine sends on while up to `progressBatchesBehind` batches wait). The survivor sends
            // everyone else exactly once.
            let engine = DispatcherConfiguration()
            let bound = engine.pushesInFlight + (engine.progressBatchesBehind + 1) * engine.progressBatchSize
            #expect(tally.duplicates <= bound, "duplicates: \(tally.duplicates), at most \(bound)")
            if tally.duplicates > bound || tally.maximumPerPhone > 2 { print("MultiNodeTests kill -9, the survivor's log:\n\(survivor.logTail)") }
            // Every push the emulator accepted was the update's first to a phone or one of those duplicates.
            #expect(cluster.emulator.statistics.accepted == 20_000 + tally.duplicates)
            #expect(survivorPushes > 0, "the survivor took the fan-out over")
            #expect(tally.maximumPerPhone <= 2, "no phone got the update more than twice")
            try await cluster.expectDispatched(["match"])
            #expect(try await cluster.claimOwner("match") == nil, "the survivor released the claim")
            try cluster.expectAlive([survivor])
        }
    }

    @Test("a slow APNs: the nodes sending keep their claims while their pushes wait for answers longer than the lease")
    func slowAnswersKeepTheClaim() async throws {
        try await withCluster(activities: ["match": 1_000]) { cluster in
            // Five slices of 200, shared by the nodes: each slice's lease, too, is kept while its answers wait. A 6 s lease,
            // renewed every 2 s: at 3 s, with the other multi-node tests' load just before, a slice's lease lapsed under
            // renewals written late (the activity's claim and five slices' are renewed here).
            let nodes = try await cluster.start(count: 2, environment: ["LIVELINE_CLAIM_LEASE": "6", "LIVELINE_SLICE_SIZE": "200"])
            defer { nodes.forEach { $0.stop() } }
            // Every answer takes 8 s, longer than the 6 s lease: a claim renewed only when the next page is read would
            // run out while the first pages' pushes wait for their answers, and the other node would send them again.
            var slow = APNsFaults()
            slow.delayMilliseconds = 8_000
            cluster.emulator.setFaults(slow)
            #expect(try await cluster.postUpdate(to: nodes[0], activity: "match", contentState: ["score": "1-0"]) == 202)
            let arrived = try await cluster.waitUntilEveryPhone(shows: ["score": "1-0"], timeout: .seconds(120))
            #expect(arrived, "every phone shows the update")
            // Until every answer came back and a while after: anything sent twice has arrived by then.
            try await cluster.waitUntilReleased(["match"])
            try await Task.sleep(for: .seconds(2))
            let tally = try cluster.tally(activity: "match")
            print("MultiNodeTests slow APNs: \(tally); pushes per node: \(try await cluster.pushCounts(nodes))")
            #expect(tally.missing == 0)
            #expect(tally.duplicates == 0, "no phone was sent the update twice")
            if tally.duplicates > 0 { print("MultiNodeTests slow APNs, every node's pushes:\n\(try await cluster.pushLines(nodes))") }
            try await cluster.expectDispatched(["match"])
            try cluster.expectAlive(nodes)
        }
    }

    @Test("a key rotated on one node stops working on the other at once; an app deleted by the CLI leaves no node connected to APNs for it")
    func appNoticesReachEveryNode() async throws {
        try await withCluster(activities: ["notices": 200]) { cluster in
            let adminToken = "admin-" + APIKeyText.random(32)
            let nodes = try await cluster.start(count: 2, environment: ["LIVELINE_ADMIN_TOKEN": adminToken])
            defer { nodes.forEach { $0.stop() } }
            let (a, b) = (nodes[0], nodes[1])
            // A fan-out, so that the nodes open connections to APNs with the app's credentials.
            #expect(try await cluster.postUpdate(to: a, activity: "notices", contentState: ["n": 1]) == 202)
            #expect(try await cluster.waitUntilEveryPhone(shows: ["n": 1], timeout: .seconds(60)))
            #expect(try await poll(timeout: .seconds(5), every: .milliseconds(100)) { cluster.connectionsToAPNs() > 0 }, "the nodes hold connections to APNs")

            // B has the key in its cache, which it would trust for 5 s without reading it again; A rotates the keys.
            let appStatus = { (node: Node) in try await WalkthroughTests.call(cluster.client, .GET, node.api + "/v1/app", key: cluster.secretKey).status }
            #expect(try await appStatus(b) == 200)
            let rotation = try await WalkthroughTests.call(
                cluster.client, .POST, a.api + "/admin/v1/apps/\(Cluster.appID)/keys/rotate", key: adminToken
            )
            #expect(rotation.status == 200)
            // The Store's notice reaches B: the old key is refused well within the cache's 5 s.
            let started = ContinuousClock.now
            let refused = try await poll(timeout: .seconds(3), every: .milliseconds(20)) { try await appStatus(b) == 401 }
            #expect(refused, "node B still took the rotated key after \(ContinuousClock.now - started)")
            if refused { print("MultiNodeTests: node B refused the rotated key after \(ContinuousClock.now - started)") }
            let newKey = try #require(rotation.json.objectValue?["secretKey"]?.stringValue)
            #expect(try await WalkthroughTests.call(cluster.client, .GET, b.api + "/v1/app", key: newKey).status == 200)

            // Deleted by a one-shot command beside the nodes: neither node deleted it, both hear of it, and close the
            // app's connections to APNs.
            try cluster.runCommand(["apps", "delete", "--app", Cluster.appID, "--yes"])
            #expect(try await poll(timeout: .seconds(15), every: .milliseconds(100)) { cluster.connectionsToAPNs() == 0 })
            #expect(try await WalkthroughTests.call(cluster.client, .GET, a.api + "/v1/app", key: newKey).status == 401)
            #expect(try await WalkthroughTests.call(cluster.client, .GET, b.api + "/v1/app", key: newKey).status == 401)
            try cluster.expectAlive(nodes)
        }
    }
}

@Suite("Nodes starting at once", .enabled(if: PostgresTestServer.url != nil, "needs LIVELINE_TEST_POSTGRES_URL"))
struct ConcurrentMigrationTests {
    @Test("nodes starting at once apply the migrations once")
    func concurrentMigrations() async throws {
        try await withTemporaryPostgresDatabase { url in
            let database = try PostgresDatabaseURL(url)
            let quiet = {
                var logger = Logger(label: "multinode")
                logger.logLevel = .warning
                return logger
            }()
            // Four nodes' stores open at once; every one that opened is closed, whatever the others did.
            let opened = await withTaskGroup(of: Result<SQLStore, any Error>.self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        do {
                            return .success(try await SQLStore.open(postgres: database, writers: 2, readers: 1, logger: quiet))
                        } catch {
                            return .failure(error)
                        }
                    }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            let latest = try #require(PostgresMigrations.all.last).version
            for result in opened {
                switch result {
                case .success(let store):
                    #expect(try await store.schemaVersion() == latest)
                    try await store.close()
                case .failure(let error):
                    Issue.record("A store failed to open beside the others: \(String(reflecting: error))")
                }
            }
            let rows = try await postgresRows(url, "SELECT version::text AS version, count(*)::text AS n FROM schema_migrations GROUP BY version")
            #expect(rows.count == PostgresMigrations.all.count)
            #expect(Set(rows.compactMap { $0["version"] ?? nil }) == Set(PostgresMigrations.all.map { String($0.version) }))
            #expect(rows.allSatisfy { $0["n"] == "1" }, "one row per version: \(rows)")
        }
    }
}

// MARK: - The cluster

/// Polls `condition` every `interval` until it holds or `timeout` passes; whether it held. (``waitFor(timeout:_:)``
/// polls every 20 ms, too often for conditions that look at 20,000 phones beside the nodes on a 2-core machine.)
private func poll(
    timeout: Duration, every interval: Duration = .milliseconds(200), _ condition: () async throws -> Bool
) async throws -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: interval)
    }
    return try await condition()
}

/// One `liveline serve` process of a cluster.
private final class Node: @unchecked Sendable {
    let name: String
    let process: ChildProcess
    let api: String
    let log: URL

    init(name: String, process: ChildProcess, api: String, log: URL) {
        self.name = name
        self.process = process
        self.api = api
        self.log = log
    }

    /// Graceful shutdown (SIGTERM); a node that is gone already is left alone.
    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }

    func kill9() {
        process.signal(SIGKILL)
        process.waitUntilExit()
    }

    /// The end of the node's log, for a failure's message.
    var logTail: String {
        let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        return "--- \(name) ---\n" + text.split(separator: "\n", omittingEmptySubsequences: false).suffix(40).joined(separator: "\n")
    }
}

/// A prepared database, the emulator its app's credentials point at, and what it takes to start nodes on it.
private struct Cluster: Sendable {
    let root: URL
    let databaseURL: String
    let emulator: APNsEmulator
    /// The emulator's APNs port.
    let apnsPort: Int
    /// Base64 of the 32-byte master key every node is given.
    let masterKey: String
    let secretKey: String
    /// Each activity's phones (their update tokens).
    let tokens: [String: [String]]
    let client: HTTPClient

    static let appID = "app_multinode"
    static let bundleID = "com.example.multinode"

    /// Starts `count` nodes (A, B, C …) on the database, each with a data directory of its own, and waits until each
    /// answers `/healthz`.
    func start(count: Int, environment: [String: String] = [:]) async throws -> [Node] {
        let executable = livelineExecutable()
        guard FileManager.default.isExecutableFile(atPath: executable.path) else {
            throw ClusterError("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY: \(executable.path) is missing")
        }
        var nodes: [Node] = []
        for index in 0..<count {
            let name = String(UnicodeScalar(UInt8(65 + index)))
            let directory = root.appendingPathComponent("node-\(name)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let port = freePort()
            let log = root.appendingPathComponent("node-\(name).log")
            let process = try runLiveline(
                [
                    "serve", "--database-url", databaseURL, "--port", "\(port)", "--no-emulator", "--data-dir", directory.path,
                    "--log-level", "warning",
                ],
                environment: ["LIVELINE_MASTER_KEY": masterKey].merging(environment) { $1 }, output: log
            )
            nodes.append(Node(name: name, process: process, api: "http://127.0.0.1:\(port)", log: log))
        }
        let started = nodes
        let ready = try await poll(timeout: .seconds(60)) {
            for node in started {
                guard node.process.isRunning else { return false }
                guard (try? await WalkthroughTests.call(client, .GET, node.api + "/healthz"))?.status == 200 else { return false }
            }
            return true
        }
        guard ready else {
            nodes.forEach { $0.stop() }
            throw ClusterError("The nodes did not come up:\n" + nodes.map(\.logTail).joined(separator: "\n"))
        }
        return nodes
    }

    /// Runs the one-shot command `liveline <arguments>` on the cluster's database, with its master key, and waits for it;
    /// throws when it fails.
    func runCommand(_ arguments: [String]) throws {
        let log = root.appendingPathComponent("command-\(arguments.prefix(2).joined(separator: "-")).log")
        let process = try runLiveline(
            arguments + ["--database-url", databaseURL, "--data-dir", root.appendingPathComponent("command").path],
            environment: ["LIVELINE_MASTER_KEY": masterKey], output: log
        )
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw ClusterError("liveline \(arguments.joined(separator: " ")) failed: " + ((try? String(contentsOf: log, encoding: .utf8)) ?? ""))
        }
    }

    /// The TCP connections established to the emulator's APNs port (the nodes' side of them), from `/proc/net/tcp`.
    func connectionsToAPNs() -> Int {
        // Read to its end: the file's size says 0, and it is long beside the other tests' sockets.
        guard let data = FileHandle(forReadingAtPath: "/proc/net/tcp")?.readDataToEndOfFile() else { return -1 }
        let table = String(decoding: data, as: UTF8.self)
        let port = String(apnsPort, radix: 16, uppercase: true).leftPadded(to: 4)
        // Columns: slot, local address:port, remote address:port, state (01: established), … all in hexadecimal.
        return table.split(separator: "\n").dropFirst().filter { line in
            let columns = line.split(separator: " ")
            return columns.count > 3 && columns[2].hasSuffix(":" + port) && columns[3] == "01"
        }.count
    }

    /// `POST /v1/activities/{activity}/updates` on `node`; the answer's status.
    func postUpdate(to node: Node, activity: String, contentState: JSONValue) async throws -> UInt {
        try await WalkthroughTests.call(
            client, .POST, node.api + "/v1/activities/\(activity)/updates", key: secretKey, body: ["contentState": contentState]
        ).status
    }

    /// Waits until every phone of every activity shows `contentState`.
    func waitUntilEveryPhone(shows contentState: JSONValue, timeout: Duration) async throws -> Bool {
        let all = tokens.values.flatMap { $0 }
        return try await poll(timeout: timeout, every: .milliseconds(500)) {
            // Cheap first: not before the emulator accepted a push for each phone.
            guard emulator.statistics.accepted >= all.count else { return false }
            return all.allSatisfy { emulator.display(token: $0)?.contentState == contentState }
        }
    }

    /// What the phones of `activity` were sent, counted at the emulator.
    struct Tally: CustomStringConvertible {
        /// Phones that never got the state they show now (or show none).
        var missing = 0
        /// Pushes of that state beyond the first, over all phones.
        var duplicates = 0
        /// Phones that got that state more than once.
        var phonesWithDuplicates = 0
        /// The most pushes of that state one phone got.
        var maximumPerPhone = 0
        /// Pushes of any other timestamp (there is one state only in these tests).
        var other = 0

        var description: String {
            "missing \(missing), duplicate pushes \(duplicates) (on \(phonesWithDuplicates) phones, at most \(maximumPerPhone) per phone), other \(other)"
        }
    }

    /// Counts, for each phone of `activity`, the accepted pushes of the activity's one state: the timestamp most of
    /// its phones show (a phone that shows another, or none, is missing it).
    func tally(activity: String) throws -> Tally {
        let phones = tokens[activity] ?? []
        let counts = emulator.acceptedPushCounts()
        var shown: [Double: Int] = [:]
        for token in phones {
            if let timestamp = emulator.display(token: token)?.timestamp { shown[timestamp, default: 0] += 1 }
        }
        let timestamp = try #require(shown.max { $0.value < $1.value }?.key, "a phone of \(activity) shows a state")
        var tally = Tally()
        for token in phones {
            let received = counts[token] ?? [:]
            let count = received[timestamp] ?? 0
            if count == 0 || emulator.display(token: token)?.timestamp != timestamp { tally.missing += 1 }
            if count > 1 {
                tally.duplicates += count - 1
                tally.phonesWithDuplicates += 1
            }
            tally.maximumPerPhone = max(tally.maximumPerPhone, count)
            tally.other += received.filter { $0.key != timestamp }.values.reduce(0, +)
        }
        return tally
    }

    /// `node`'s `/metrics`, one line a string.
    func metricLines(_ node: Node) async throws -> [Substring] {
        var request = HTTPClientRequest(url: node.api + "/metrics")
        request.method = .GET
        return String(buffer: try await client.execute(request, timeout: .seconds(10)).body.collect(upTo: 1 << 22)).split(separator: "\n")
    }

    /// Each node's iOS pushes delivered, from its `/metrics` (`liveline_pushes_total{platform="ios",status="delivered"}`).
    func pushCounts(_ nodes: [Node]) async throws -> [Int] {
        var counts: [Int] = []
        for node in nodes {
            let delivered = try await metricLines(node).filter {
                $0.hasPrefix("liveline_pushes_total{") && $0.contains(#"platform="ios""#) && $0.contains(#"status="delivered""#)
            }
            counts.append(delivered.compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0) { $0 + Int($1) })
        }
        return counts
    }

    /// Every `liveline_pushes_total` (each status and reason) and `liveline_push_latency_seconds` line of each node's
    /// `/metrics`, for a failure's message.
    func pushLines(_ nodes: [Node]) async throws -> String {
        var lines: [String] = []
        for node in nodes {
            lines.append("--- \(node.name) ---")
            lines += try await metricLines(node).filter { $0.hasPrefix("liveline_pushes_total{") || $0.hasPrefix("liveline_push_latency_seconds") }
                .map(String.init)
        }
        return lines.joined(separator: "\n")
    }

    /// ``pushLines(_:)`` and the end of each node's log: what a miscount's message shows.
    func pushesAndLogs(_ nodes: [Node]) async throws -> String {
        try await pushLines(nodes) + "\n" + nodes.map(\.logTail).joined(separator: "\n")
    }

    /// The engine holding `activity`'s claim (`dispatcher-<pid>-<uuid>`), read from the database; `nil` when none does.
    func claimOwner(_ activity: String) async throws -> String? {
        let rows = try await postgresRows(
            databaseURL, "SELECT claim_owner FROM activities WHERE app_id = '\(Self.appID)' AND activity_id = '\(activity)'"
        )
        return rows.first?["claim_owner"] ?? nil
    }

    /// Waits (up to a minute) until no engine holds a claim on any of `activities`: the pass is over.
    func waitUntilReleased(_ activities: [String]) async throws {
        _ = try await poll(timeout: .seconds(60), every: .milliseconds(250)) {
            for activity in activities where try await claimOwner(activity) != nil { return false }
            return true
        }
    }

    /// Every one of `activities` was sent to the end and is no longer claimed. An instance is behind when neither its
    /// row, nor its activity's settled sequence, nor a mark of a pass's run says it has the activity's sequence
    /// (docs/progress-marks.md).
    func expectDispatched(_ activities: [String], sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let rows = try await postgresRows(
            databaseURL,
            """
            SELECT activity_id, (dispatched_sequence = sequence)::text AS done, claim_owner,
                (SELECT count(*) FROM instances i WHERE i.app_id = a.app_id AND i.activity_id = a.activity_id
                   AND i.delivered_sequence < a.sequence
                   AND NOT (i.joined_pass < a.settled_pass AND a.settled_sequence >= a.sequence)
                   AND NOT EXISTS (
                       SELECT 1 FROM delivery_marks m WHERE m.app_id = i.app_id AND m.activity_id = i.activity_id
                         AND m.platform = i.platform AND m.sequence >= a.sequence AND m.from_device <= i.device_id
                         AND m.through_device >= i.device_id AND m.pass > i.joined_pass
                   ))::text AS behind
            FROM activities a WHERE app_id = '\(Self.appID)'
            """
        )
        for activity in activities {
            let row = rows.first { $0["activity_id"] == activity }
            #expect(row?["done"] == "true", "\(activity) dispatched: \(String(describing: row))", sourceLocation: sourceLocation)
            #expect(row?["behind"] == "0", "\(activity): no instance behind: \(String(describing: row))", sourceLocation: sourceLocation)
            #expect(row?["claim_owner"] ?? nil == nil, "\(activity) released: \(String(describing: row))", sourceLocation: sourceLocation)
        }
    }

    /// The nodes are still running (none crashed on the way).
    func expectAlive(_ nodes: [Node], sourceLocation: SourceLocation = #_sourceLocation) throws {
        for node in nodes {
            #expect(node.process.isRunning, "node \(node.name) is running\n\(node.logTail)", sourceLocation: sourceLocation)
        }
    }
}

private struct ClusterError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Prepares a fresh database for `activities` (activity id → how many iOS instances), with an app whose APNs
/// credentials point at an in-process emulator that has a phone for every instance, and runs `body` with it; stops the
/// emulator and drops the database afterwards. No node runs yet: `body` starts them.
///
/// The instances are registered through the Store (``SQLStore/registerInstance(_:at:)``), 32 at a time, before any
/// node starts: the same Store logic the API's `PUT /v1/activities/{id}/instances/{deviceId}` runs, without 20,000
/// HTTP requests through debug-built processes on a 2-core machine, which these tests are not about. Device ids are
/// random, as real ones are: numbered ones all go to the last page of the instances' key index, where serializable
/// registrations running side by side collide and are run again (about two attempts in three failed so).
private func withCluster(activities: [String: Int], _ body: (Cluster) async throws -> Void) async throws {
    try await withTemporaryDirectory(prefix: "liveline-multinode") { root in
        var logger = Logger(label: "multinode")
        logger.logLevel = .warning
        var configuration = APNsEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path)
        configuration.pushHistoryLimit = 100
        let emulator = try APNsEmulator(configuration: configuration, logger: logger)
        let ports = try await emulator.start()
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            let signingKey = P256.Signing.PrivateKey()
            emulator.registerSigningKey(teamID: "TEAM123456", keyID: "KEY1234567", publicKey: signingKey.publicKey)
            emulator.registerBundleID(Cluster.bundleID)
            var tokens: [String: [String]] = [:]
            for (activity, count) in activities {
                tokens[activity] = (0..<count).map { _ in emulator.addDevice(bundleID: Cluster.bundleID) }
            }
            let masterKey = CredentialSealer.newMasterKey()
            let secretKey = "sk_" + APIKeyText.random(16) + APIKeyText.random(32)
            try await withTemporaryPostgresDatabase { url in
                let store = try await SQLStore.open(postgres: try PostgresDatabaseURL(url), writers: 8, readers: 2, logger: logger)
                do {
                    try await store.createApp(
                        AppRecord(id: Cluster.appID, name: "Multi-node", bundleID: Cluster.bundleID, androidPackage: nil, createdAt: Date()),
                        keys: [
                            APIKeyRecord(
                                id: String(secretKey.dropFirst(3).prefix(16)), appID: Cluster.appID, scope: .secret,
                                hash: Array(SHA256.hash(data: Data(secretKey.utf8))), createdAt: Date()
                            )
                        ]
                    )
                    let credentials = APNsCredentials(
                        teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: signingKey.pemRepresentation, environment: .sandbox,
                        baseURL: "https://127.0.0.1:\(ports.apnsPort)", caCertificatePEM: emulator.caCertificatePEM
                    )
                    try await store.saveCredentials(
                        try credentials.stored(appID: Cluster.appID, sealer: CredentialSealer(masterKey: masterKey), at: Date())
                    )
                    let registrations = tokens.flatMap { activity, tokens in
                        tokens.map { token in
                            InstanceRegistration(
                                appID: Cluster.appID, activityID: activity, deviceID: "phone-" + token.prefix(16), platform: .ios,
                                pushToken: token, attributesType: "Match", attributes: [:], userID: nil
                            )
                        }
                    }
                    let started = ContinuousClock.now
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        var next = registrations.makeIterator()
                        for _ in 0..<32 {
                            guard let registration = next.next() else { break }
                            group.addTask { _ = try await store.registerInstance(registration, at: Date()) }
                        }
                        while try await group.next() != nil {
                            guard let registration = next.next() else { continue }
                            group.addTask { _ = try await store.registerInstance(registration, at: Date()) }
                        }
                    }
                    print("MultiNodeTests: registered \(registrations.count) instances through the Store in \(ContinuousClock.now - started)")
                    try await store.close()
                } catch {
                    try? await store.close()
                    throw error
                }
                try await body(
                    Cluster(
                        root: root, databaseURL: url, emulator: emulator, apnsPort: ports.apnsPort,
                        masterKey: Data(masterKey).base64EncodedString(),
                        secretKey: secretKey, tokens: tokens, client: client
                    )
                )
            }
        } catch {
            try? await client.shutdown()
            try? await emulator.shutdown()
            throw error
        }
        try await client.shutdown()
        try await emulator.shutdown()
    }
}

extension String {
    /// The string with zeros before it, up to `length` characters.
    fileprivate func leftPadded(to length: Int) -> String { String(repeating: "0", count: max(0, length - count)) + self }
}

/// Random letters and digits, as API keys are made of.
private enum APIKeyText {
    static let alphabet = Array("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

    static func random(_ length: Int) -> String {
        String((0..<length).map { _ in alphabet.randomElement()! })
    }
}
