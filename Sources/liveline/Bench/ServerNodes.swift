import Crypto
import Foundation
import Logging

/// The `liveline serve` processes of one benchmark: one, on SQLite in its data directory (the default) or on a
/// PostgreSQL database; or several on the same PostgreSQL database, each with its own data directory and port, the
/// same admin token file and the same LIVELINE_MASTER_KEY (generated here). Apps are created through node 1.
final class ServerNodes: Sendable {
    let servers: [ServerUnderTest]
    /// The PostgreSQL cluster the nodes share, whose CPU the benchmarks print beside theirs (``PostgresClusterCPU``), or
    /// why it cannot be measured; nil on SQLite.
    let database: PostgresClusterCPU.Located?

    /// Node 1: where apps are created and, in `bench fanout`, the updates posted.
    var first: ServerUnderTest { servers[0] }
    /// Every node's HTTP port, node 1 first.
    var ports: [Int] { servers.map(\.port) }
    var count: Int { servers.count }

    private init(servers: [ServerUnderTest], database: PostgresClusterCPU.Located?) {
        self.servers = servers
        self.database = database
    }

    /// Starts `nodes` servers (in `directory/server`, or `directory/server-1` … when more than one) one after the
    /// other, node 1 first, so that it alone prepares a fresh database; stops those started if one fails.
    static func start(executable: String, directory: URL, databaseURL: String?, nodes: Int) async throws -> ServerNodes {
        if let problem = Bench.nodesProblem(nodes: nodes, databaseURL: databaseURL) { throw ServerUnderTest.Failure(description: problem) }
        let token = try ServerUnderTest.AdminToken.create(in: directory)
        var environment: [String: String] = [:]
        if databaseURL != nil { environment["LIVELINE_MASTER_KEY"] = Bench.newMasterKey() }
        var servers: [ServerUnderTest] = []
        do {
            for node in 1...nodes {
                let name = nodes == 1 ? "server" : "server-\(node)"
                servers.append(
                    try await ServerUnderTest(
                        executable: executable, directory: directory.appendingPathComponent(name), adminToken: token,
                        databaseURL: databaseURL, environment: environment
                    )
                )
            }
        } catch {
            for server in servers { await server.stop() }
            throw error
        }
        var database: PostgresClusterCPU.Located?
        if let databaseURL { database = await PostgresClusterCPU.locate(databaseURL: databaseURL, logger: Logger(label: "liveline.bench")) }
        return ServerNodes(servers: servers, database: database)
    }

    /// `server pid 123 (jemalloc)` or `server pids 123, 456 (nodes 1–2; glibc malloc)`: the processes, and the malloc
    /// node 1 runs on (``Bench/allocator(process:)``; every node is the same executable).
    var pidText: String {
        let allocator = Bench.allocator(process: first.pid)
        return servers.count == 1
            ? "server pid \(first.pid) (\(allocator))"
            : "server pids \(servers.map { String($0.pid) }.joined(separator: ", ")) (nodes 1–\(servers.count); \(allocator))"
    }

    /// Each node's CPU seconds so far, node 1 first.
    func cpuSeconds() -> [Double] { servers.map { $0.cpuSeconds() } }

    /// Each node's CPU ticks so far by part (``Bench/ServerPart``), node 1 first.
    func partTicks() -> [[Bench.ServerPart: Int]] { servers.map { Bench.ServerPart.ticks(ofProcess: $0.pid) } }

    /// The PostgreSQL cluster's CPU seconds so far; nil on SQLite, or when it cannot be measured.
    func databaseCPUSeconds() -> Double? {
        guard case .measured(let cluster) = database else { return nil }
        return cluster.seconds()
    }

    /// What the header says of the database's CPU: `PostgreSQL's CPU from its processes (postmaster pid 123)`, or why
    /// it is not measured; nil on SQLite.
    var databaseCPUText: String? {
        switch database {
        case nil: nil
        case .measured(let cluster)?: "PostgreSQL's CPU counted from its processes (postmaster pid \(cluster.postmaster))"
        case .unmeasured(let why)?: "PostgreSQL's CPU not measured: \(why)"
        }
    }

    /// Each node's pushes attempted so far (its /metrics counter), node 1 first; nil where it cannot be read.
    func pushesSent() async -> [Int?] {
        var sent: [Int?] = []
        for server in servers { sent.append(await server.pushesSent()) }
        return sent
    }

    /// Every node is still running.
    var allRunning: Bool { servers.allSatisfy { $0.process.isRunning } }

    /// What the nodes that exited logged last.
    func exitedLogs() -> String {
        zip(1..., servers).filter { !$0.1.process.isRunning }.map { "node \($0.0): \($0.1.logTail())" }.joined(separator: "\n")
    }

    /// Prints each node's peak memory.
    func printPeakMemory() {
        for (node, server) in zip(1..., servers) {
            let label = servers.count == 1 ? "server peak memory (VmHWM)" : "node \(node) peak memory (VmHWM)"
            Bench.say("  \(label.padding(toLength: 26, withPad: " ", startingAt: 0))  \(Bench.megabytes(server.peakResidentBytes()))")
        }
    }

    func stop() async {
        for server in servers { await server.stop() }
    }
}

extension Bench {
    /// Why `--nodes` and `--database-url` cannot be used together as given; nil when they can.
    static func nodesProblem(nodes: Int, databaseURL: String?) -> String? {
        guard nodes >= 1 else { return "--nodes must be at least 1." }
        if let databaseURL, !(databaseURL.hasPrefix("postgres://") || databaseURL.hasPrefix("postgresql://")) {
            return "--database-url must be a PostgreSQL URL (postgres://user@host:port/db); without it the server uses SQLite in its data directory."
        }
        if nodes > 1, databaseURL == nil {
            return "--nodes \(nodes) needs --database-url: several nodes share one PostgreSQL database (SQLite is one node's file)."
        }
        return nil
    }

    /// The node (0-based) that request or connection `index` goes to when spread round-robin over `nodes` nodes.
    static func roundRobin(_ index: Int, over nodes: Int) -> Int {
        index % max(1, nodes)
    }

    /// A master key as LIVELINE_MASTER_KEY takes it: Base64 of 32 random bytes.
    static func newMasterKey() -> String {
        SymmetricKey(size: .bits256).withUnsafeBytes { Data($0) }.base64EncodedString()
    }

    /// The sum of every sample of counter `name` (all its label sets) in a Prometheus text exposition; nil when it
    /// has none.
    static func counterTotal(_ name: String, inExposition text: String) -> Int? {
        var total: Double?
        for line in text.split(separator: "\n") where line.hasPrefix(name) {
            let rest = line.dropFirst(name.count)
            guard rest.first == "{" || rest.first == " " else { continue }
            // The value follows the labels' closing brace (label values may hold spaces) or the name.
            let afterLabels = rest.first == "{" ? rest[(rest.lastIndex(of: "}").map { rest.index(after: $0) } ?? rest.endIndex)...] : rest
            guard let value = afterLabels.split(separator: " ").first.flatMap({ Double($0) }) else { continue }
            total = (total ?? 0) + value
        }
        return total.map { Int($0.rounded()) }
    }

    /// `node 1 51,200 · node 2 48,800`: each node's share of a round's pushes (`?` where /metrics could not be read).
    static func perNodeText(_ counts: [Int?]) -> String {
        zip(1..., counts).map { "node \($0.0) \($0.1.map(BenchRequests.grouped) ?? "?")" }.joined(separator: " · ")
    }
}
