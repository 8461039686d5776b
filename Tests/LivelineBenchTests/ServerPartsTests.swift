import Foundation
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Testing

@testable import liveline

@Suite struct ServerPartsTests {
    @Test("each thread of a server is told to its part by its name; NIO's and Swift's own threads are other")
    func threadNames() {
        #expect(Bench.ServerPart.of(threadNamed: "NIO-SGLTN-1-#0") == .pushConnections)
        #expect(Bench.ServerPart.of(threadNamed: "ll-engine-3-#0") == .engine)
        #expect(Bench.ServerPart.of(threadNamed: "ll-writer-#0") == .sqliteWriter)
        #expect(Bench.ServerPart.of(threadNamed: "ll-checkpt-#0") == .checkpointer)
        #expect(Bench.ServerPart.of(threadNamed: "ll-walsync-#0") == .walSyncer)
        #expect(Bench.ServerPart.of(threadNamed: "ll-reader-#1") == .readers)
        #expect(Bench.ServerPart.of(threadNamed: "ll-pg-#3") == .postgres)
        #expect(Bench.ServerPart.of(threadNamed: "ll-pgio-5-#0") == .postgres)
        #expect(Bench.ServerPart.of(threadNamed: "ll-http-2-#1") == .http)
        #expect(Bench.ServerPart.of(threadNamed: "SGLTN-TP-#0") == .other)
        #expect(Bench.ServerPart.of(threadNamed: "oot.default-qos") == .other)
        #expect(Bench.ServerPart.of(threadNamed: "liveline") == .other)
    }

    @Test("a process's threads' ticks are added up by part, user and system")
    func ticksByPart() throws {
        let lines = [
            "101 (ll-http-2-#0) S 1 1 1 0 -1 4194560 0 0 0 0 30 5 0 0 20 0 9 0 100 0 0",
            "102 (ll-http-2-#1) S 1 1 1 0 -1 4194560 0 0 0 0 20 5 0 0 20 0 9 0 100 0 0",
            "103 (NIO-SGLTN-1-#0) R 1 1 1 0 -1 4194560 0 0 0 0 140 12 0 0 20 0 9 0 100 0 0",
            "104 (ll-writer-#0) S 1 1 1 0 -1 4194560 0 0 0 0 22 8 0 0 20 0 9 0 100 0 0",
            "105 (liveline) S 1 1 1 0 -1 4194560 0 0 0 0 1 1 0 0 20 0 9 0 100 0 0",
        ]
        let threads = try lines.map { try #require(ProcessTimes(stat: $0)) }
        #expect(Bench.ServerPart.ticks(of: threads) == [.http: 60, .pushConnections: 152, .sqliteWriter: 30, .other: 2])
    }

    @Test("the parts' line: each part's CPU a unit of work over the nodes, the largest first, parts that spent nothing left out")
    func partsLine() throws {
        let tick = ProcessTimes.seconds(ticks: 1)
        let before: [[Bench.ServerPart: Int]] = [[.pushConnections: 100, .engine: 10], [.pushConnections: 50, .http: 5]]
        let after: [[Bench.ServerPart: Int]] = [[.pushConnections: 200, .engine: 50, .http: 1], [.pushConnections: 150, .http: 5]]
        #expect(Bench.partsSpent(before: before, after: after) == [.pushConnections: 200, .engine: 40, .http: 1])
        let line = try #require(Bench.partsLine(Bench.partsSpent(before: before, after: after), per: 100_000, unit: "push"))
        let each = { (ticks: Int) in String(format: "%.1f", Double(ticks) * tick / 100_000 * 1e6) }
        #expect(line == "      server CPU by part  push connections \(each(200)) · engine \(each(40)) · HTTP API \(each(1)) µs/push")
        #expect(Bench.partsLine(Bench.partsSpent(before: before, after: before), per: 100_000, unit: "push") == nil)
        #expect(Bench.partsLine(Bench.partsSpent(before: [], after: []), per: 100_000, unit: "push") == nil)
        // Over a million pushes a tick is 0.01 µs a push: a part of a few ticks is left out rather than printed as 0.0.
        let few = try #require(Bench.partsLine(Bench.partsSpent(before: before, after: after), per: 1_000_000, unit: "push"))
        #expect(few == "      server CPU by part  push connections \(String(format: "%.1f", 200 * tick)) · engine \(String(format: "%.1f", 40 * tick)) µs/push")
    }

    @Test("the slowest round's parts against the fastest's: what grew, and by how much")
    func slowestRound() throws {
        let parts: [[Bench.ServerPart: Int]] = [
            [.pushConnections: 150, .engine: 50, .sqliteWriter: 30, .http: 6],
            [.pushConnections: 195, .engine: 65, .sqliteWriter: 30, .http: 9, .other: 1],
            [.pushConnections: 160, .engine: 52, .sqliteWriter: 31, .http: 7],
        ]
        let line = try #require(Bench.slowestRoundPartsLine(rates: [60_000, 45_000, 58_000], parts: parts))
        #expect(
            line == "  the slowest round's CPU     +27 % against the fastest's (rounds 2 and 1): "
                + "push connections +30 %, engine +30 %, SQLite writer +0 %"
        )
        #expect(Bench.slowestRoundPartsLine(rates: [60_000], parts: [parts[0]]) == nil)
        #expect(Bench.slowestRoundPartsLine(rates: [60_000, 45_000], parts: [[:], [:]]) == nil)
    }

    #if os(Linux)
    @Test("a Store's threads carry their names, and the bench tells them to their parts", arguments: StoreKind.available)
    func storeThreadsAreNamed(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { _, _ in
            let names = Self.threadNames()
            let expected = kind == .sqlite
                ? [StoreThreadNames.sqliteWriter, StoreThreadNames.sqliteCheckpointer, StoreThreadNames.sqliteReaders, StoreThreadNames.walSyncer]
                : [StoreThreadNames.postgresConnections, StoreThreadNames.postgresEventLoops]
            for prefix in expected {
                #expect(names.contains { $0.hasPrefix(prefix) }, "no thread named \(prefix)…: \(names.sorted())")
            }
            let parts = Set(names.map(Bench.ServerPart.of(threadNamed:)))
            #expect(parts.isSuperset(of: kind == .sqlite ? [.sqliteWriter, .checkpointer, .readers, .walSyncer] : [.postgres]))
        }
    }

    /// The names of this process's threads.
    static func threadNames() -> [String] {
        (Bench.threadFiles(of: getpid(), "comm") ?? []).map { $0.trimmingCharacters(in: .newlines) }
    }
    #endif
}
