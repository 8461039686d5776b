import Foundation
import LivelineStore
import Logging
import NIOPosix
import PostgresNIO

#if canImport(Glibc)
import Glibc
#endif

/// The CPU a PostgreSQL server on this machine spends: every process of its cluster (the postmaster, the backends
/// serving the nodes' connections, its background workers), read from /proc. On a machine the database shares with
/// the nodes and the load, what the database's own work costs decides how fast the path on PostgreSQL can go: the
/// benchmarks print it beside the servers' CPU.
///
/// The whole cluster is counted: any other database's work on the same server, and its autovacuum, are in the figure.
struct PostgresClusterCPU: Sendable {
    /// The cluster's postmaster, the parent of its every process.
    let postmaster: Int32

    /// Whether the cluster behind a database URL could be measured, and why not when it could not.
    enum Located: Sendable {
        case measured(PostgresClusterCPU)
        case unmeasured(String)
    }

    /// Finds the cluster serving `databaseURL`, when it runs on this machine: asks it for the process id of the backend
    /// serving the question (`pg_backend_pid()`), and takes that backend's parent, the postmaster, from /proc. Only a
    /// server on the loopback is looked for, and only a backend /proc shows as `postgres` is believed (a server in a
    /// container has process ids of its own namespace, which may name any process here).
    static func locate(databaseURL: String, logger: Logger) async -> Located {
        let url: PostgresDatabaseURL
        do {
            url = try PostgresDatabaseURL(databaseURL)
        } catch {
            return .unmeasured("\(error)")
        }
        guard url.isLoopback else {
            return .unmeasured("the database is not on this machine (\(url.host))")
        }
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.any(), configuration: try url.configuration(), id: 1, logger: logger
            )
        } catch {
            return .unmeasured("connecting to the database failed: \(String(reflecting: error))")
        }
        var backend: Int32?
        do {
            for try await pid in try await connection.query("SELECT pg_backend_pid()", logger: logger).decode(Int32.self) {
                backend = pid
            }
        } catch {
            try? await connection.close()
            return .unmeasured("asking the database for its backend's process id failed: \(String(reflecting: error))")
        }
        // Read while the connection is open: its backend exits when it closes.
        let found = backend.map { located(backend: $0, in: ProcessTimes.read) } ?? .unmeasured("pg_backend_pid() answered nothing")
        try? await connection.close()
        return found
    }

    /// The cluster of the backend `backend`, looked up with `read` (a process's times by id, nil when there is no such
    /// process): its parent, when both are PostgreSQL's processes.
    static func located(backend: Int32, in read: (Int32) -> ProcessTimes?) -> Located {
        guard let serving = read(backend), serving.command == "postgres" else {
            return .unmeasured(
                "the database's backend (pid \(backend)) is not a postgres process here: the database runs in another process namespace"
            )
        }
        guard let parent = read(serving.parent), parent.command == "postgres" else {
            return .unmeasured("the backend's parent (pid \(serving.parent)) is not PostgreSQL's postmaster")
        }
        return .measured(PostgresClusterCPU(postmaster: serving.parent))
    }

    /// The cluster's CPU seconds so far (user and system); nil when its postmaster is gone.
    func seconds() -> Double? {
        guard let ticks = Self.ticks(postmaster: postmaster, in: ProcessTimes.all()) else { return nil }
        return ProcessTimes.seconds(ticks: ticks)
    }

    /// The CPU ticks of the cluster of `postmaster` among `processes` (``ProcessTimes/treeTicks(root:in:)``); nil when
    /// `postmaster` is not among them.
    static func ticks(postmaster: Int32, in processes: [ProcessTimes]) -> Int? {
        ProcessTimes.treeTicks(root: postmaster, in: processes)
    }
}

/// One process's line of `/proc/PID/stat`: its id, command name, state, parent and CPU ticks (`proc(5)`).
struct ProcessTimes: Equatable, Sendable {
    var id: Int32
    /// The command name (field 2, without its parentheses), at most 15 bytes: `postgres` for every PostgreSQL process.
    var command: String
    /// The state (field 3): `R` running, `S` sleeping, `Z` a zombie (exited, not yet waited for), …
    var state: Substring
    /// The parent's id (field 4).
    var parent: Int32
    /// utime and stime (fields 14 and 15), in clock ticks.
    var user: Int
    var system: Int
    /// cutime and cstime (fields 16 and 17): the ticks of the children this process waited for.
    var childrenUser: Int
    var childrenSystem: Int

    /// Parses a `/proc/PID/stat` line; nil when it is not one. The command name may hold spaces and parentheses: it
    /// ends at the line's last `)`.
    init?(stat: String) {
        guard let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")"), open < close,
            let id = Int32(stat[..<open].trimmingCharacters(in: .whitespaces))
        else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // fields[0] is the state (field 3), so field N is fields[N - 3].
        guard fields.count > 14, let parent = Int32(fields[1]), let user = Int(fields[11]), let system = Int(fields[12]),
            let childrenUser = Int(fields[13]), let childrenSystem = Int(fields[14])
        else { return nil }
        self.id = id
        command = String(stat[stat.index(after: open)..<close])
        state = fields[0]
        self.parent = parent
        self.user = user
        self.system = system
        self.childrenUser = childrenUser
        self.childrenSystem = childrenSystem
    }

    /// The user and system CPU time, in seconds.
    var cpuSeconds: Double { Self.seconds(ticks: user + system) }

    /// `ticks` clock ticks (the unit of /proc's times) in seconds.
    static func seconds(ticks: Int) -> Double {
        Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The CPU ticks of process `root` and its children among `processes`: its own, those of its children that have
    /// exited (it reaped them), and those of its children still running; nil when `root` is not among them. A server
    /// made of a master and its workers (PostgreSQL's postmaster and backends, nginx's master and worker) is counted
    /// whole.
    ///
    /// A child that exits between the reading of the root's times and the reading of its own is missed, or counted twice
    /// the other way round: /proc is read one file at a time. The processes measured here (PostgreSQL's backends of the
    /// servers' connections, nginx's worker) live as long as the run; the children that come and go (an autovacuum
    /// worker) are a small part.
    static func treeTicks(root: Int32, in processes: [ProcessTimes]) -> Int? {
        guard let own = processes.first(where: { $0.id == root }) else { return nil }
        return processes.reduce(own.user + own.system + own.childrenUser + own.childrenSystem) { sum, process in
            process.parent == root && process.id != root ? sum + process.user + process.system : sum
        }
    }

    /// The line of process `pid`, or nil when /proc has no such process.
    static func read(_ pid: Int32) -> ProcessTimes? {
        Bench.procFile("/proc/\(pid)/stat").flatMap(ProcessTimes.init(stat:))
    }

    /// The times of every process /proc shows.
    static func all() -> [ProcessTimes] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return names.compactMap { Int32($0) }.compactMap(read)
    }
}
