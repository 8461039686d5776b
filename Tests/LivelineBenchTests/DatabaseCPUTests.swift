import Foundation
import LivelineTestSupport
import Logging
import PostgresNIO
import Testing

@testable import liveline

@Suite struct ProcessTimesTests {
    @Test func readsTheFieldsAfterTheCommandName() throws {
        // A backend's line: comm `postgres`, state S, parent 812, utime 1520, stime 340, cutime 7, cstime 3.
        let line = "4242 (postgres) S 812 4242 4242 0 -1 4194560 3010 0 0 0 1520 340 7 3 20 0 1 0 88123 228503552 4621 "
            + "18446744073709551615 1 1 0 0 0 0 4194304 19935232 1536 0 0 0 17 1 0 0 0 0 0"
        let times = try #require(ProcessTimes(stat: line))
        #expect(times.id == 4242 && times.command == "postgres" && times.state == "S" && times.parent == 812)
        #expect(times.user == 1520 && times.system == 340 && times.childrenUser == 7 && times.childrenSystem == 3)
        #expect(abs(times.cpuSeconds - ProcessTimes.seconds(ticks: 1860)) < 1e-9)
    }

    @Test func aCommandNameMayHoldSpacesAndParentheses() throws {
        let line = "77 (a (b) c) R 1 77 77 0 -1 0 0 0 0 0 11 22 33 44 20 0 1 0 5 0 0"
        let times = try #require(ProcessTimes(stat: line))
        #expect(times.command == "a (b) c" && times.parent == 1 && times.user == 11 && times.childrenSystem == 44)
    }

    @Test func refusesWhatIsNotAStatLine() {
        #expect(ProcessTimes(stat: "") == nil)
        #expect(ProcessTimes(stat: "12 (short) S 1 2 3") == nil)
        #expect(ProcessTimes(stat: "x (postgres) S 1 1 1 0 -1 0 0 0 0 0 1 1 1 1") == nil)
    }

    @Test func thisProcessIsInProc() throws {
        let own = try #require(ProcessTimes.read(getpid()))
        #expect(own.id == getpid() && own.parent == getppid())
        #expect(ProcessTimes.all().contains { $0.id == getpid() })
    }
}

@Suite struct PostgresClusterCPUTests {
    static func process(_ id: Int32, _ command: String = "postgres", parent: Int32, user: Int, system: Int, children: (Int, Int) = (0, 0))
        -> ProcessTimes
    {
        ProcessTimes(
            stat: "\(id) (\(command)) S \(parent) 0 0 0 -1 0 0 0 0 0 \(user) \(system) \(children.0) \(children.1) 20 0 1 0 1 0 0"
        )!
    }

    @Test func theClusterIsThePostmasterItsReapedChildrenAndItsLiveOnes() {
        let processes = [
            Self.process(1, "systemd", parent: 0, user: 9_000, system: 9_000, children: (50_000, 50_000)),
            // The postmaster: its own 10 + 5, and 300 + 100 of children that have exited.
            Self.process(812, parent: 1, user: 10, system: 5, children: (300, 100)),
            Self.process(900, parent: 812, user: 1_000, system: 200),
            Self.process(901, parent: 812, user: 40, system: 2),
            // Another cluster's backend, and a process of this machine that is none of PostgreSQL's.
            Self.process(2000, parent: 1999, user: 7_777, system: 7_777),
            Self.process(3000, "liveline", parent: 1, user: 5_000, system: 100),
        ]
        #expect(PostgresClusterCPU.ticks(postmaster: 812, in: processes) == 15 + 400 + 1_200 + 42)
        #expect(PostgresClusterCPU.ticks(postmaster: 4040, in: processes) == nil)
    }

    @Test func nginxIsItsMasterAndItsWorker() {
        let processes = [
            Self.process(1, "bash", parent: 0, user: 900, system: 900),
            Self.process(700, "nginx", parent: 1, user: 3, system: 2),
            Self.process(701, "nginx", parent: 700, user: 80, system: 20),
            // The bench, nginx's parent's sibling, and h2load: none of nginx's.
            Self.process(650, "liveline", parent: 1, user: 5_000, system: 500),
            Self.process(710, "h2load", parent: 650, user: 60, system: 30),
        ]
        #expect(ProcessTimes.treeTicks(root: 700, in: processes) == 5 + 100)
        #expect(ProcessTimes.treeTicks(root: 702, in: processes) == nil)
    }

    @Test func theClusterIsTheBackendsParentWhenBothArePostgres() {
        let table: [Int32: ProcessTimes] = [
            900: Self.process(900, parent: 812, user: 1, system: 1),
            812: Self.process(812, parent: 1, user: 1, system: 1),
            950: Self.process(950, "bash", parent: 812, user: 1, system: 1),
            960: Self.process(960, parent: 3000, user: 1, system: 1),
            3000: Self.process(3000, "containerd-shim", parent: 1, user: 1, system: 1),
        ]
        func read(_ pid: Int32) -> ProcessTimes? { table[pid] }
        guard case .measured(let cluster) = PostgresClusterCPU.located(backend: 900, in: read) else {
            Issue.record("the backend 900 of postmaster 812 was not located")
            return
        }
        #expect(cluster.postmaster == 812)
        // A pid of another namespace may name any process here, or none.
        for backend: Int32 in [950, 960, 4040] {
            guard case .unmeasured = PostgresClusterCPU.located(backend: backend, in: read) else {
                Issue.record("backend \(backend) was believed")
                continue
            }
        }
    }

    @Test func aServerElsewhereIsNotMeasured() async {
        let located = await PostgresClusterCPU.locate(databaseURL: "postgres://u@db.example.com:5432/liveline", logger: Logger(label: "test"))
        guard case .unmeasured(let why) = located else {
            Issue.record("a server on another host was measured")
            return
        }
        #expect(why.contains("not on this machine"))
    }

    /// Against the test server: its cluster is found through a connection, and the work of that connection's backend
    /// shows in the cluster's CPU.
    @Test(.enabled(if: PostgresTestServer.url != nil)) func theTestServersClusterIsMeasured() async throws {
        let url = try #require(PostgresTestServer.url)
        guard case .measured(let cluster) = await PostgresClusterCPU.locate(databaseURL: url, logger: Logger(label: "test")) else {
            Issue.record("the test server's cluster was not located (is it on this machine?)")
            return
        }
        try await PostgresTestServer.withConnection(url: url) { connection in
            var backend: Int32?
            for try await pid in try await connection.query("SELECT pg_backend_pid()", logger: PostgresTestServer.logger).decode(Int32.self) {
                backend = pid
            }
            let pid = try #require(backend)
            let serving = try #require(ProcessTimes.read(pid))
            #expect(serving.parent == cluster.postmaster)
            let clusterBefore = try #require(PostgresClusterCPU.ticks(postmaster: cluster.postmaster, in: ProcessTimes.all()))
            // Work for the backend alone: sums over series, nothing read from disk (about a second of CPU here).
            for _ in 0..<4 {
                _ = try await connection.query("SELECT sum(i) FROM generate_series(1, 2000000) AS i", logger: PostgresTestServer.logger).collect()
            }
            let clusterAfter = try #require(PostgresClusterCPU.ticks(postmaster: cluster.postmaster, in: ProcessTimes.all()))
            let servingAfter = try #require(ProcessTimes.read(serving.id))
            let backendTicks = servingAfter.user + servingAfter.system - serving.user - serving.system
            #expect(backendTicks > 0)
            // The cluster's count holds the backend's, and whatever its other processes did meanwhile.
            #expect(clusterAfter - clusterBefore >= backendTicks)
            #expect((cluster.seconds() ?? 0) > 0)
        }
    }
}

@Suite struct MachineTimesTests {
    @Test func readsTheAggregateLineOfProcStat() throws {
        let stat = """
            cpu  1000 20 300 5000 80 7 9 40 0 0
            cpu0 500 10 150 2500 40 3 4 20 0 0
            cpu1 500 10 150 2500 40 4 5 20 0 0
            intr 123
            """
        let times = try #require(MachineTimes(stat: stat))
        #expect(times == MachineTimes(busy: 1000 + 20 + 300 + 7 + 9, idle: 5000 + 80, stolen: 40))
    }

    @Test func theIdleShareIsIdleTicksOverAllTicksBetweenTwoReadings() throws {
        let before = MachineTimes(busy: 1000, idle: 500, stolen: 10)
        let after = MachineTimes(busy: 1170, idle: 520, stolen: 20)
        #expect(abs(try #require(after.idleShare(since: before)) - 20.0 / 200.0) < 1e-12)
        #expect(before.idleShare(since: before) == nil)
        #expect(Bench.percent(0.124) == "12 %" && Bench.percent(0.126) == "13 %")
        #expect(Bench.percent(0.5) == "50 %")
    }

    @Test func refusesWhatIsNotProcStat() {
        #expect(MachineTimes(stat: "") == nil)
        #expect(MachineTimes(stat: "cpu0 1 2 3 4 5 6 7 8") == nil)
        #expect(MachineTimes(stat: "cpu  1 2 3 x 5 6 7 8") == nil)
        #expect(MachineTimes(stat: "cpu  1 2 3 4 5") == nil)
    }

    @Test(.enabled(if: FileManager.default.fileExists(atPath: "/proc/stat"), "needs Linux's /proc"))
    func thisMachineHasOne() throws {
        let times = try #require(MachineTimes.read())
        #expect(times.busy + times.idle > 0)
    }
}
