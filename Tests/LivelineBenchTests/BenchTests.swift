import Crypto
import Foundation
import LivelineCore
import Testing

@testable import liveline

@Suite struct BenchRequestTests {
    @Test func tokensAreDistinctSixtyFourHexDigits() {
        #expect(BenchRequests.pushToken(0) == String(repeating: "0", count: 63) + "1")
        #expect(BenchRequests.pushToken(255) == String(repeating: "0", count: 61) + "100")
        #expect(BenchRequests.pushToken(999_999).utf8.count == 64)
        let isHex = BenchRequests.pushToken(999_999).allSatisfy { $0.isHexDigit }
        #expect(isHex)
        #expect(Set((0..<1000).map(BenchRequests.pushToken)).count == 1000)
    }

    @Test("side phones' tokens are hexadecimal, apart from every bench token, and read back from a device path")
    func sidePhoneTokens() {
        #expect(BenchRequests.sideToken(0) == "feed" + String(repeating: "0", count: 59) + "1")
        #expect(BenchRequests.sideToken(49).utf8.count == 64)
        #expect(BenchRequests.sideToken(49).allSatisfy { $0.isHexDigit })
        #expect(!BenchRequests.pushToken(999_999).hasPrefix(BenchRequests.sideTokenPrefix))
        for index in [0, 1, 15, 16, 49] {
            #expect(BenchRequests.sidePhone(path: Substring("/3/device/" + BenchRequests.sideToken(index))) == index)
        }
        #expect(BenchRequests.sidePhone(path: Substring(BenchRequests.sideToken(7))) == 7)
        #expect(BenchRequests.sidePhone(path: Substring("/3/device/" + BenchRequests.pushToken(7))) == nil)
        #expect(BenchRequests.sidePhone(path: "/3/device/feed") == nil)
        #expect(BenchRequests.sidePhone(path: Substring("/3/device/feed" + String(repeating: "0", count: 60))) == nil)
        #expect(BenchRequests.sidePhone(path: Substring("/3/device/feed" + String(repeating: "x", count: 60))) == nil)
    }

    @Test("each side update is met by its phone's first push no earlier than it, within the sink's tolerance")
    func sideDeliveriesMatchPostsToPushes() throws {
        let arrivals: [Int: [Double]] = [0: [10.000, 10.020, 10.600], 1: [10.300]]
        let latencies = BenchRequests.sideDeliveries(
            posts: [(0, 10.010), (0, 10.015), (0, 10.500), (1, 10.250), (1, 10.400), (2, 10.000), (0, 10.597), (0, 9.000)],
            arrivals: arrivals
        )
        let expected: [Double?] = [0.010, 0.005, 0.100, 0.050, nil, nil, 0.003, 1.000]
        #expect(latencies.count == expected.count)
        for (latency, expected) in zip(latencies, expected) {
            if let expected {
                let latency = try #require(latency)
                #expect(abs(latency - expected) < 1e-9)
            } else {
                #expect(latency == nil)
            }
        }
        // Logged up to the tolerance before the post (the sink's clock is the time of its loop turn, in milliseconds):
        // met, at 0.
        #expect(BenchRequests.sideDeliveries(posts: [(0, 10.0235)], arrivals: arrivals, tolerance: 0.005) == [0])
        let later = try #require(BenchRequests.sideDeliveries(posts: [(0, 10.0235)], arrivals: arrivals, tolerance: 0.001).first ?? nil)
        #expect(abs(later - 0.5765) < 1e-9)
    }

    @Test("the sink's side log is read line by line, and any other line is refused")
    func sideLogLines() {
        var arrivals = SideArrivals()
        let taken = [
            "1733351234.567 /3/device/" + BenchRequests.sideToken(3), "1733351234.600 /3/device/" + BenchRequests.sideToken(3),
            "1733351234.601 /3/device/" + BenchRequests.pushToken(3), "garbage",
        ].map { arrivals.add(line: Substring($0)) }
        #expect(taken == [true, true, false, false])
        #expect(arrivals.count == 2)
        #expect(arrivals.byPhone == [3: [1733351234.567, 1733351234.600]])
    }

    @Test("instances register once each, in a shuffle that is the same in every run, or in order of device id when asked")
    func registrationOrder() {
        let order = BenchRequests.registrationOrder(count: 10_000)
        #expect(order.sorted() == Array(0..<10_000))
        #expect(order == BenchRequests.registrationOrder(count: 10_000))
        // Unrelated to the ids' order: hardly an instance in its own place, hardly two in a row next to each other.
        #expect(order.indices.filter { order[$0] == $0 }.count < 10)
        #expect(zip(order, order.dropFirst()).filter { abs($0 - $1) == 1 }.count < 10)
        #expect(BenchRequests.registrationOrder(count: 5, inIDOrder: true) == [0, 1, 2, 3, 4])
        #expect(BenchRequests.registrationOrder(count: 1) == [0])
        #expect(BenchRequests.registrationOrder(count: 0).isEmpty)
    }

    @Test func deviceAndActivityIDs() {
        #expect(BenchRequests.deviceID(42) == "device-0000042")
        #expect(BenchRequests.deviceID(12_345_678) == "device-12345678")
        #expect(BenchRequests.activityID(forInstance: 0, perActivity: 100) == "bench-000000")
        #expect(BenchRequests.activityID(forInstance: 99, perActivity: 100) == "bench-000000")
        #expect(BenchRequests.activityID(forInstance: 100, perActivity: 100) == "bench-000001")
    }

    @Test func pathsAndBodies() {
        #expect(BenchRequests.registrationPath(activityID: "bench", deviceID: "device-0000001") == "/v1/activities/bench/instances/device-0000001")
        #expect(BenchRequests.updatePath(activityID: "side-3") == "/v1/activities/side-3/updates")
        #expect(
            BenchRequests.registrationBody(pushToken: "ab12")
                == #"{"platform":"ios","pushToken":"ab12","attributesType":"BenchAttributes"}"#
        )
        #expect(BenchRequests.updateBody(score: "2-0", minute: 42) == #"{"contentState":{"score":"2-0","minute":42}}"#)
    }

    @Test func readsH2loadSummary() {
        let output = """
            starting benchmark...
            finished in 1.40s, 142857.14 req/s, 22.34MB/s
            requests: 200000 total, 200000 started, 200000 done, 200000 succeeded, 0 failed, 0 errored, 0 timeout
            status codes: 200000 2xx, 0 3xx, 0 4xx, 0 5xx
            """
        #expect(BenchRequests.h2loadRate(output) == 142857.14)
        #expect(BenchRequests.h2loadSucceeded(output) == 200_000)
        #expect(BenchRequests.h2loadRate("no such line") == nil)
        #expect(BenchRequests.h2loadSucceeded("") == nil)
    }

    @Test func ratiosAndGrouping() {
        #expect(BenchRequests.ratio(31_000, to: 124_000) == "0.25 × h2load")
        #expect(BenchRequests.ratio(31_000, to: nil) == "-")
        #expect(BenchRequests.ratio(31_000, to: 0) == "-")
        #expect(BenchRequests.ratio(40_000, to: 100_000, shaped: true) == "0.40 × h2load shaped as pushes")
        #expect(BenchRequests.ratioRange([25_000, 31_000], to: 100_000) == "0.25 – 0.31 × h2load")
        #expect(BenchRequests.ratioRange([40_000, 42_000], to: 100_000, shaped: true) == "0.40 – 0.42 × h2load shaped as pushes")
        #expect(BenchRequests.ratioRange([], to: 100_000) == "-")
        #expect(BenchRequests.mean([100, 200]) == 150)
        #expect(BenchRequests.mean([]) == nil)
        #expect(BenchRequests.slowestShare([34_349, 41_234, 40_331]) == "slowest 83 % of the best")
        #expect(BenchRequests.slowestShare([35_990, 40_000]) == "slowest 89 % of the best", "89.975 % is not 90 %")
        #expect(BenchRequests.slowestShare([40_000]) == "")
        #expect(BenchRequests.slowestShare([]) == "")
        #expect(BenchRequests.grouped(0) == "0")
        #expect(BenchRequests.grouped(999) == "999")
        #expect(BenchRequests.grouped(1000) == "1,000")
        #expect(BenchRequests.grouped(1_000_000) == "1,000,000")
        #expect(BenchRequests.grouped(-12_345) == "-12,345")
    }

    @Test("with h2load after every round, each round is read against the runs just before and just after it")
    func adjacentReferences() {
        // Before the first round 60,000; after rounds 1, 2 and 3: 80,000, no rate, 70,000.
        let runs: [Double?] = [60_000, 80_000, nil, 70_000]
        #expect(BenchRequests.adjacentReferences(runs, rounds: 3) == [70_000, 80_000, 70_000])
        // Mid-run, the rounds so far.
        #expect(BenchRequests.adjacentReferences([60_000, 80_000], rounds: 1) == [70_000])
        #expect(BenchRequests.adjacentReferences([nil, nil], rounds: 1) == [nil])
        #expect(BenchRequests.adjacentReferences([60_000], rounds: 0) == [])
        #expect(
            BenchRequests.adjacentRatioRange([21_000, 24_000, 21_700], references: [70_000, 80_000, 70_000])
                == "0.30 – 0.31 × the h2load runs either side"
        )
        #expect(BenchRequests.adjacentRatioRange([21_000, 24_000], references: [nil, 80_000]) == "0.30 – 0.30 × the h2load runs either side")
        #expect(BenchRequests.adjacentRatioRange([21_000], references: [nil]) == "-")
    }
}

@Suite struct AllocatorTests {
    @Test("the server's malloc is read from its memory map: a mapped jemalloc (linked or preloaded), or glibc's")
    func allocatorFromTheMemoryMap() {
        let glibc = """
            55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234                       /work/main/.build/release/liveline
            7f3a2c000000-7f3a2c021000 rw-p 00000000 00:00 0
            7f3a2d000000-7f3a2d028000 r--p 00000000 08:01 5678                       /usr/lib/x86_64-linux-gnu/libc.so.6
            7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0                          [stack]
            """
        #expect(Bench.allocator(inMaps: glibc) == "glibc malloc")
        let jemalloc = glibc + "\n7f3a2e000000-7f3a2e00a000 r--p 00000000 08:01 9012   /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
        #expect(Bench.allocator(inMaps: jemalloc) == "jemalloc")
        #expect(Bench.allocator(inMaps: "7f3a2e000000-7f3a2e00a000 r-xp 00000000 08:01 9 /usr/lib/libmimalloc.so.2.0") == "mimalloc")
        // A directory or file of another name that merely contains the word is not the library.
        #expect(Bench.allocator(inMaps: "7f3a2e000000-7f3a2e00a000 r--p 00000000 08:01 9 /srv/jemalloc-notes/liveline.sqlite") == "glibc malloc")
        #expect(Bench.allocator(inMaps: "") == "glibc malloc")
    }

    @Test("a memory map is read to its end, past the one block of 4 KB that /proc's empty-looking files gave")
    func allocatorOfThisProcess() throws {
        #if os(Linux)
        let maps = try #require(Bench.procFile("/proc/self/maps"))
        // The stack's mapping lies near the top of the address space, so near the end of the map: a test process maps
        // dozens of libraries, several 4 KB of lines before it.
        #expect(maps.utf8.count > 4096)
        #expect(maps.contains("[stack]"))
        // An unreadable map would say "malloc unknown", which is none of these.
        #expect(["glibc malloc", "jemalloc", "mimalloc", "tcmalloc"].contains(Bench.allocator(process: getpid())))
        #endif
    }
}

@Suite struct BacklogScrapeTests {
    @Test("bench api's scrapes for the engine's backlog are spaced by nine times their cost, and at least 100 ms apart")
    func pauseBetweenScrapes() {
        #expect(Bench.API.pauseBetweenScrapes(lastTook: .milliseconds(2)) == .milliseconds(100))
        #expect(Bench.API.pauseBetweenScrapes(lastTook: .zero) == .milliseconds(100))
        #expect(Bench.API.pauseBetweenScrapes(lastTook: .milliseconds(40)) == .milliseconds(360))
        #expect(Bench.API.pauseBetweenScrapes(lastTook: .seconds(1)) == .seconds(9))
    }
}

@Suite struct LatencySummaryTests {
    @Test func nearestRankPercentiles() {
        let hundred = (1...100).map { UInt64($0) }
        #expect(LatencySummary.percentile(hundred, 0.50) == 50)
        #expect(LatencySummary.percentile(hundred, 0.99) == 99)
        #expect(LatencySummary.percentile(hundred, 1.0) == 100)
        #expect(LatencySummary.percentile([7], 0.99) == 7)
        #expect(LatencySummary.percentile([], 0.5) == 0)
    }

    @Test func summaryInDurations() {
        let summary = LatencySummary(sortedNanoseconds: [1_000_000, 2_000_000, 3_000_000, 40_000_000])
        #expect(summary.count == 4)
        #expect(summary.p50 == .milliseconds(2))
        #expect(summary.p99 == .milliseconds(40))
        #expect(summary.max == .milliseconds(40))
        #expect(LatencySummary(sortedNanoseconds: []).count == 0)
    }

    @Test func loadResultCountsErrorsByStatus() {
        var result = LoadResult()
        result.statuses = [201: 8, 200: 1, 409: 2]
        result.errorSamples = [409: #"{"error":"conflict"}"#]
        result.unanswered = 1
        #expect(result.succeeded == 9)
        #expect(result.errors == 3)
        #expect(result.errorText == #"409: 2 (first: {"error":"conflict"}), no answer: 1"#)
        #expect(LoadResult().errorText == "none")
    }
}

@Suite struct RoundLineTests {
    @Test func roundWithReferenceAndSideAccepts() {
        var side = LoadResult()
        side.latencies = [1_000_000, 2_000_000, 9_000_000]
        side.statuses = [202: 3]
        let line = Bench.roundLine(
            instances: 100_000, elapsed: .seconds(4), rate: 25_000, h2load: 100_000, accept: .microseconds(2500), side: side, serverCPU: 3.2
        )
        #expect(
            line == "100,000 pushes in 4.00 s   25,000 pushes/s   0.25 × h2load   update accepted in 2.50 ms"
                + "   side accepts 3: p50 2.00 ms p99 9.00 ms   server CPU 32.0 µs/push"
        )
    }

    @Test func roundWithTheDisksSyncs() {
        var side = LoadResult()
        side.latencies = [1_000_000, 2_000_000, 120_000_000]
        side.statuses = [202: 3]
        let line = Bench.roundLine(
            instances: 100_000, elapsed: .seconds(4), rate: 25_000, h2load: nil, accept: .milliseconds(2), side: side,
            disk: LatencySummary(sortedNanoseconds: [300_000, 400_000, 95_000_000]), serverCPU: 3.2
        )
        #expect(line.hasSuffix("side accepts 3: p50 2.00 ms p99 120.00 ms   disk syncs 3: p99 95.00 ms max 95.00 ms   server CPU 32.0 µs/push"))
    }

    @Test func roundWithoutReferenceOrSideAccepts() {
        let line = Bench.roundLine(
            instances: 2_000, elapsed: .milliseconds(500), rate: 4_000, h2load: nil, accept: .milliseconds(3), side: LoadResult(), serverCPU: 0.1
        )
        #expect(line == "2,000 pushes in 500.00 ms   4,000 pushes/s   update accepted in 3.00 ms   server CPU 50.0 µs/push")
    }

    @Test func roundWithTheDatabasesCPU() {
        let line = Bench.roundLine(
            instances: 100_000, elapsed: .seconds(5), rate: 20_000, h2load: nil, accept: .milliseconds(6), side: LoadResult(), serverCPU: 5.5,
            databaseCPU: 2.25
        )
        #expect(line.hasSuffix("server CPU 55.0 µs/push, PostgreSQL 22.5 µs/push"))
    }

    @Test func roundWithTheSinksCPU() {
        let line = Bench.roundLine(
            instances: 100_000, elapsed: .seconds(2), rate: 50_000, h2load: nil, accept: .milliseconds(1), side: LoadResult(), serverCPU: 2.2,
            sinkCPU: 0.85, coresIdle: 0.04
        )
        #expect(line.hasSuffix("server CPU 22.0 µs/push, nginx 8.5 µs/push   cores idle 4 %"))
    }

    @Test func cpuAPushOverTheRoundsWithTheSinksBeside() {
        // Three rounds: the second slower for both (the machine), the third slower for the server alone.
        let line = Bench.cpuAPushLine(server: [22e-6, 33e-6, 30e-6], sink: [8e-6, 12e-6, 8e-6])
        #expect(
            line == "  CPU a push in the rounds    server 22.0 – 33.0 µs, nginx 8.0 – 12.0 µs, the server's ÷ nginx's 2.75 – 3.75   "
                + "(nginx does the same work every round: where both rise together, the machine ran slower)"
        )
        // A sink whose CPU is not measured (the emulator, in the bench's own process): the server's alone.
        #expect(Bench.cpuAPushLine(server: [22e-6, 25e-6], sink: []) == "  CPU a push in the rounds    server 22.0 – 25.0 µs")
        #expect(Bench.cpuAPushLine(server: [], sink: []) == nil)
    }

    @Test func cpuOfEachPartPerRequest() {
        #expect(
            Bench.cpuText(server: [3.0], database: nil, own: 0.8, per: 20_000, unit: "request")
                == "server 150.0 µs, load generator 40.0 µs"
        )
        #expect(
            Bench.cpuText(server: [2.0, 1.0], database: 1.4, own: 0.8, per: 20_000, unit: "request")
                == "server 150.0 µs, PostgreSQL 70.0 µs, load generator 40.0 µs (servers: node 1 100.0 µs/request · node 2 50.0 µs/request)"
        )
    }

    @Test func sideErrorsAreShown() {
        var side = LoadResult()
        side.latencies = [1_000_000]
        side.statuses = [500: 1]
        let line = Bench.roundLine(
            instances: 10, elapsed: .seconds(1), rate: 10, h2load: nil, accept: .milliseconds(1), side: side, serverCPU: 0
        )
        #expect(line.contains("(errors: 500: 1)"))
    }

    @Test func sinkAsksSlowDownFarFromTheEnd() {
        // Nothing counted yet: ask again soon.
        #expect(BenchRequests.pollPause(counted: 0, expected: 100_000, elapsed: .milliseconds(5)) == .milliseconds(2))
        // 10 % after 250 ms: 2.25 s to go, so the longest pause.
        #expect(BenchRequests.pollPause(counted: 10_000, expected: 100_000, elapsed: .milliseconds(250)) == .milliseconds(20))
        // 40 pushes to go at 40,000 a second: 1 ms to go, so the shortest.
        #expect(BenchRequests.pollPause(counted: 99_960, expected: 100_000, elapsed: .milliseconds(2499)) == .milliseconds(1))
        // 40 ms to go: a quarter of it.
        let pause = BenchRequests.pollPause(counted: 98_400, expected: 100_000, elapsed: .milliseconds(2460))
        #expect(pause > .microseconds(9_900) && pause < .microseconds(10_100))
        // All counted (or more, the sink's count may run ahead): the shortest.
        #expect(BenchRequests.pollPause(counted: 100_010, expected: 100_000, elapsed: .seconds(2)) == .milliseconds(1))
    }

    @Test func h2loadReferences() throws {
        let plain = Bench.h2loadArguments(
            requests: 1000, bodyPath: "/tmp/body.json", baseURL: "https://127.0.0.1:8443", shape: .plain, urisPath: "/tmp/uris.txt"
        )
        #expect(plain == ["-n", "1000", "-c", "4", "-m", "256", "-d", "/tmp/body.json", "https://127.0.0.1:8443/3/device/x"])

        let key = P256.Signing.PrivateKey()
        let now = Date(timeIntervalSince1970: 1_764_000_000)
        let headers = Bench.pushHeaders(bundleID: "com.example.bench", signingKey: key, now: now)
        let byName = Dictionary(headers.map { ($0.name, $0.value) }, uniquingKeysWith: { first, _ in first })
        // The headers Liveline's APNs client sends with a Live Activity update.
        #expect(Set(byName.keys) == ["authorization", "apns-push-type", "apns-topic", "apns-priority", "apns-expiration"])
        #expect(byName["apns-topic"] == "com.example.bench.push-type.liveactivity")
        #expect(byName["apns-push-type"] == "liveactivity")
        #expect(byName["apns-expiration"] == "1764028800")
        // A provider token signed with the bench's key: three base64url parts after `bearer `.
        let authorization = try #require(byName["authorization"])
        #expect(authorization.hasPrefix("bearer "))
        #expect(authorization.dropFirst("bearer ".count).split(separator: ".").count == 3)

        let shaped = Bench.h2loadArguments(
            requests: 1000, bodyPath: "/tmp/body.json", baseURL: "https://127.0.0.1:8443",
            shape: .pushes(devices: 100_000, headers: headers), urisPath: "/tmp/uris.txt"
        )
        #expect(Array(shaped.prefix(10)) == ["-n", "1000", "-c", "4", "-m", "256", "-d", "/tmp/body.json", "-i", "/tmp/uris.txt"])
        #expect(shaped.contains("apns-topic: com.example.bench.push-type.liveactivity"))
        #expect(shaped.filter { $0 == "-H" }.count == headers.count)
        #expect(!shaped.contains { $0.hasSuffix("/3/device/x") })
    }
}

@Suite struct DiskSyncProbeTests {
    /// On a real file: the probe times its syncs, never faster than the rate asked, hands each one over once, records
    /// nothing once stopped, and removes its file.
    @Test func timesSyncsAndCleansUp() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("disk-probe-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let probe = try DiskSyncProbe(directory: directory, perSecond: 200)
        let file = directory.appendingPathComponent("disk-sync-probe").path
        let size = try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int
        #expect(size == DiskSyncProbe.blockSize * DiskSyncProbe.blocks)
        let started = ContinuousClock.now
        probe.start()
        var taken: [UInt64] = []
        let deadline = ContinuousClock.now + .seconds(30)
        while taken.count < 5, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
            taken += try probe.take()
        }
        probe.stop()
        let elapsed = ContinuousClock.now - started
        taken += try probe.take()
        #expect(taken.count >= 5)
        #expect(taken.allSatisfy { $0 > 0 })
        #expect(Double(taken.count) <= elapsed.seconds * 200 + 1)
        #expect(try probe.take().isEmpty)
        #expect(!FileManager.default.fileExists(atPath: file))
        probe.stop()
    }

    @Test func noProbeAtZeroSyncsASecond() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("disk-probe-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try DiskSyncProbe.started(in: directory, perSecond: 0) == nil)
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("disk-sync-probe").path))
        let probe = try #require(try DiskSyncProbe.started(in: directory, perSecond: 50))
        probe.stop()
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("disk-sync-probe").path))
    }

    @Test func stopsWithoutStarting() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("disk-probe-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let probe = try DiskSyncProbe(directory: directory, perSecond: 10)
        probe.stop()
        #expect(try probe.take().isEmpty)
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("disk-sync-probe").path))
    }
}
