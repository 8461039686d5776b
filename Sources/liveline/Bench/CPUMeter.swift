extension Bench {
    /// What a part of a run spent: CPU seconds of the servers (each node's), of PostgreSQL's cluster when it is measured
    /// (``PostgresClusterCPU``) and of the bench itself, and the share of the machine's cores left idle.
    struct CPUSpent {
        var server: [Double]
        var database: Double?
        var own: Double
        var coresIdle: Double?
        /// The servers' CPU ticks by part (``ServerPart``), the nodes' added up.
        var parts: [ServerPart: Int] = [:]
    }

    /// Reads what each part of a run spent (``CPUSpent``), part after part: each ``spent()`` counts from the one before
    /// it (or from the meter's start).
    struct CPUMeter {
        private let nodes: ServerNodes
        private var cpu: [Double]
        private var databaseCPU: Double?
        private var ownCPU: Double
        private var machine: MachineTimes?
        private var parts: [[ServerPart: Int]]

        init(nodes: ServerNodes) {
            self.nodes = nodes
            (cpu, databaseCPU, ownCPU, machine) = (nodes.cpuSeconds(), nodes.databaseCPUSeconds(), Bench.processCPUSeconds(), MachineTimes.read())
            parts = nodes.partTicks()
        }

        /// The CPU each part spent since the last call, and the share of the machine's cores left idle meanwhile; the
        /// counts then start afresh.
        mutating func spent() -> CPUSpent {
            let (server, database, own) = (nodes.cpuSeconds(), nodes.databaseCPUSeconds(), Bench.processCPUSeconds())
            let machineNow = MachineTimes.read()
            let partsNow = nodes.partTicks()
            defer { (cpu, databaseCPU, ownCPU, machine, parts) = (server, database, own, machineNow, partsNow) }
            return CPUSpent(
                server: zip(server, cpu).map { $0 - $1 }, database: database.flatMap { now in databaseCPU.map { now - $0 } },
                own: own - ownCPU, coresIdle: machine.flatMap { before in machineNow?.idleShare(since: before) },
                parts: Bench.partsSpent(before: parts, after: partsNow)
            )
        }
    }

    /// `    CPU a registration: server 83.5 µs, load generator 20.4 µs; cores idle 12 %`: CPU seconds spent over
    /// `requests` requests (the servers' added up, then each node's when there are several), with PostgreSQL's
    /// cluster's beside the servers' when it is measured, and the machine's idle share (``MachineTimes``). Nil for a
    /// part of no requests.
    static func cpuLine(_ what: String, requests: Int, _ spent: CPUSpent) -> String? {
        guard requests > 0 else { return nil }
        var line = "    CPU \(what): " + cpuText(server: spent.server, database: spent.database, own: spent.own, per: requests, unit: "request")
        if let idle = spent.coresIdle { line += "; cores idle \(percent(idle))" }
        return line
    }
}
