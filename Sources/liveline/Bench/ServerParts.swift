import Foundation
import LivelineServer
import LivelineStore

extension Bench {
    /// The parts of a `liveline serve` process that its CPU is split into, told apart by the names of its threads
    /// (each part's threads are named for it: ``StoreThreadNames``, ``LivelineApplication/httpThreadNamePrefix``,
    /// ``LowPriorityEngine/threadNamePrefix``).
    enum ServerPart: String, CaseIterable, Sendable {
        /// NIO's shared event loops, where the push connections live (APNs' and FCM's; webhooks' and, with `--dev`,
        /// the built-in emulators' too): TLS, HTTP/2 and HPACK for every push; on PostgreSQL the engine's jobs as well
        /// (``LowPriorityEngine/Placement``).
        case pushConnections = "push connections"
        /// The delivery engine's own event loops (on SQLite; on PostgreSQL its jobs run on the push connections'):
        /// its passes, the pushes' building and the results.
        case engine
        case sqliteWriter = "SQLite writer"
        case checkpointer
        case walSyncer = "WAL syncer"
        case readers
        /// The threads that run the Store's statements on PostgreSQL connections, and PostgresNIO's event loops.
        case postgres = "PostgreSQL connections"
        /// The HTTP API's event loops: parsing, routing, the handlers, the answers.
        case http = "HTTP API"
        /// Any other thread: Swift's cooperative pool (the engine's jobs at niceness 0), NIO's blocking pool, the main
        /// thread.
        case other

        /// The part whose thread is named `name` (a thread's `comm`).
        static func of(threadNamed name: String) -> ServerPart {
            let prefixes: [(String, ServerPart)] = [
                ("NIO-SGLTN-", .pushConnections), (LowPriorityEngine.threadNamePrefix, .engine),
                (StoreThreadNames.sqliteWriter, .sqliteWriter), (StoreThreadNames.sqliteCheckpointer, .checkpointer),
                (StoreThreadNames.walSyncer, .walSyncer), (StoreThreadNames.sqliteReaders, .readers),
                (StoreThreadNames.postgresConnections, .postgres), (StoreThreadNames.postgresEventLoops, .postgres),
                (LivelineApplication.httpThreadNamePrefix, .http),
            ]
            // Linux keeps 15 bytes of a thread's name: a long prefix is compared as far as the name goes.
            return prefixes.first { prefix, _ in name.hasPrefix(String(prefix.prefix(15))) }?.1 ?? .other
        }

        /// The CPU ticks (user and system) of `threads`, the lines of a process's `/proc/PID/task/*/stat`, by part.
        static func ticks(of threads: [ProcessTimes]) -> [ServerPart: Int] {
            threads.reduce(into: [:]) { parts, thread in parts[of(threadNamed: thread.command), default: 0] += thread.user + thread.system }
        }

        /// The CPU ticks of process `pid`'s threads by part (empty when /proc cannot tell). A thread that ended since
        /// the last reading takes its ticks with it: the server's threads live as long as it does.
        static func ticks(ofProcess pid: Int32) -> [ServerPart: Int] {
            ticks(of: (Bench.threadFiles(of: pid, "stat") ?? []).compactMap(ProcessTimes.init(stat:)))
        }
    }

    /// `      server CPU by part  push connections 14.2 · engine 5.1 · SQLite writer 2.4 · … µs/push`: the ticks each
    /// part spent (``partsSpent(before:after:)``) over `count` units of work, the largest first; parts that spent less
    /// than 0.05 µs a unit (nothing to print at this precision) left out. Nil when no part is left.
    static func partsLine(_ spent: [ServerPart: Int], per count: Int, unit: String) -> String? {
        guard count > 0 else { return nil }
        let microseconds = spent.mapValues { ProcessTimes.seconds(ticks: $0) / Double(count) * 1e6 }
        let shown = ServerPart.allCases.filter { microseconds[$0, default: 0] >= 0.05 }
        guard !shown.isEmpty else { return nil }
        let text = shown.sorted { microseconds[$0, default: 0] > microseconds[$1, default: 0] }
            .map { String(format: "\($0.rawValue) %.1f", microseconds[$0, default: 0]) }
        return "      server CPU by part  " + text.joined(separator: " · ") + " µs/\(unit)"
    }

    /// Each part's ticks from `before` to `after` (a reading per node, in the same order), added up over the nodes.
    static func partsSpent(before: [[ServerPart: Int]], after: [[ServerPart: Int]]) -> [ServerPart: Int] {
        var spent: [ServerPart: Int] = [:]
        for (nodeBefore, nodeAfter) in zip(before, after) {
            for (part, ticks) in nodeAfter { spent[part, default: 0] += max(0, ticks - nodeBefore[part, default: 0]) }
        }
        return spent
    }
}
