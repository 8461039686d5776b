import ArgumentParser
import Foundation
import Testing

@testable import liveline

@Suite struct BenchNodesTests {
    @Test func severalNodesNeedADatabaseURL() {
        let problem = Bench.nodesProblem(nodes: 2, databaseURL: nil)
        #expect(problem?.contains("--nodes 2 needs --database-url") == true)
        #expect(Bench.nodesProblem(nodes: 1, databaseURL: nil) == nil)
        #expect(Bench.nodesProblem(nodes: 2, databaseURL: "postgres://liveline@127.0.0.1:55435/bench") == nil)
        #expect(Bench.nodesProblem(nodes: 1, databaseURL: "postgresql://u@h/db") == nil)
        #expect(Bench.nodesProblem(nodes: 0, databaseURL: "postgres://u@h/db") != nil)
        #expect(Bench.nodesProblem(nodes: 1, databaseURL: "/tmp/x.sqlite")?.contains("PostgreSQL URL") == true)
    }

    @Test func theCommandsRefuseNodesWithoutADatabase() throws {
        for command in [["fanout"], ["api"]] {
            do {
                _ = try Bench.parseAsRoot(command + ["--nodes", "3"])
                Issue.record("\(command) --nodes 3 without --database-url was accepted")
            } catch {
                #expect(Bench.message(for: error).contains("--nodes 3 needs --database-url"))
            }
        }
        let fanOut = try #require(try Bench.parseAsRoot(["fanout", "--nodes", "2", "--database-url", "postgres://u@127.0.0.1:5432/db"]) as? Bench.FanOut)
        #expect(fanOut.server.nodes == 2)
        #expect(fanOut.server.databaseURL == "postgres://u@127.0.0.1:5432/db")
        #expect(fanOut.server.storeText == "PostgreSQL, 2 nodes")
        let api = try #require(try Bench.parseAsRoot(["api"]) as? Bench.API)
        #expect(api.server.nodes == 1 && api.server.databaseURL == nil)
        #expect(api.server.storeText == "SQLite")
    }

    @Test func roundRobinSpreadsEvenly() {
        #expect((0..<6).map { Bench.roundRobin($0, over: 2) } == [0, 1, 0, 1, 0, 1])
        #expect((0..<7).map { Bench.roundRobin($0, over: 3) } == [0, 1, 2, 0, 1, 2, 0])
        #expect((0..<4).map { Bench.roundRobin($0, over: 1) } == [0, 0, 0, 0])
        // 64 connections over 2 nodes: 32 each.
        let counts = Dictionary(grouping: 0..<64) { Bench.roundRobin($0, over: 2) }.mapValues(\.count)
        #expect(counts == [0: 32, 1: 32])
    }

    @Test func masterKeysAreBase64Of32Bytes() {
        let key = Bench.newMasterKey()
        #expect(Data(base64Encoded: key)?.count == 32)
        #expect(key != Bench.newMasterKey())
    }

    @Test func pushCounterIsSummedOverItsLabels() {
        let exposition = """
            # TYPE liveline_pushes_total counter
            liveline_pushes_total{platform="ios",status="delivered",reason="none"} 51200
            liveline_pushes_total{platform="android",status="delivered",reason="none"} 0
            liveline_pushes_total{platform="ios",status="retrying",reason="HTTP 500"} 3
            # TYPE liveline_pushes_total_other counter
            liveline_pushes_total_other 7
            liveline_push_latency_seconds_count{platform="ios"} 51203
            """
        #expect(Bench.counterTotal("liveline_pushes_total", inExposition: exposition) == 51203)
        #expect(Bench.counterTotal("liveline_broadcasts_total", inExposition: exposition) == nil)
        #expect(Bench.perNodeText([51200, nil]) == "node 1 51,200 · node 2 ?")
    }
}
