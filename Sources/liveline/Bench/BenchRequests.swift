import Foundation

/// What the HTTP benchmarks send, built from an index so that a million instances need no million stored strings:
/// device ids, push tokens, paths and bodies, and the reading of h2load's figure. Pure, so it is unit-tested.
enum BenchRequests {
    /// The attributes type every bench instance registers with.
    static let attributesType = "BenchAttributes"

    /// `device-0000042` for index 42 (seven digits, more when the index needs them).
    static func deviceID(_ index: Int) -> String {
        "device-" + zeroPadded(index, width: 7)
    }

    /// The order in which `count` instances register: instance `order[n]` (its ``deviceID(_:)`` and ``pushToken(_:)``)
    /// is the `n`th registration. By default a shuffle, the same in every run (a fixed seed), so that the order of
    /// registration has nothing to do with that of device ids, as with real phones, which register when they start
    /// an activity and whose ids are their own; in order of device ids (`device-0000000` first) with `inIDOrder`, as
    /// `bench fanout` registered before 2026-12-05. The Store keeps an activity's instances in order of device id: in
    /// that order they fill its pages one after another, in any other they land between each other.
    static func registrationOrder(count: Int, inIDOrder: Bool = false) -> [Int] {
        var order = Array(0..<max(0, count))
        guard !inIDOrder else { return order }
        // Fisher–Yates with SplitMix64 (Steele, Lea and Flood, 2014), seeded with a constant: written out, so that the
        // permutation stays the same whatever the Swift version (the standard library's shuffle may draw differently).
        var state: UInt64 = 0x5EED_0F_11FE_11AE
        func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        var index = order.count - 1
        while index > 0 {
            order.swapAt(index, Int(next() % UInt64(index + 1)))
            index -= 1
        }
        return order
    }

    /// A 64-digit hexadecimal (32-byte) APNs token, unique per index and never all zeros: index + 1 in hexadecimal.
    static func pushToken(_ index: Int) -> String {
        let hex = String(UInt64(index) &+ 1, radix: 16)
        return String(repeating: "0", count: max(0, 64 - hex.utf8.count)) + hex
    }

    /// The activities the side updates of `bench fanout` go to, in turn (`side-0` … `side-49`).
    static let sideActivities = 50

    /// The first digits of every side phone's token (``sideToken(_:)``): the sink tells the side pushes apart by them.
    static let sideTokenPrefix = "feed"

    /// The token of the phone on side activity `index`: ``sideTokenPrefix``, then index + 1 in hexadecimal, 64 digits in
    /// all. No bench instance's token (``pushToken(_:)``, zeros first) begins so below 2^240 instances.
    static func sideToken(_ index: Int) -> String {
        let hex = String(UInt64(index) &+ 1, radix: 16)
        return sideTokenPrefix + String(repeating: "0", count: max(0, 60 - hex.utf8.count)) + hex
    }

    /// The side phone a `/3/device/<token>` path (or a bare token) goes to (``sideToken(_:)``), or nil for any other.
    static func sidePhone(path: Substring) -> Int? {
        let token = path.split(separator: "/").last ?? path
        guard token.utf8.count == 64, token.hasPrefix(sideTokenPrefix),
            let value = UInt64(token.dropFirst(sideTokenPrefix.utf8.count), radix: 16), value > 0
        else { return nil }
        return Int(value - 1)
    }

    /// How long each side update took to reach its phone: from its post (`at`, seconds since 1970) to the first push
    /// its phone received no earlier than it (`arrivals`: each phone's, ascending, as the sink logged them), nil for one
    /// that nothing reached. The engine sends only an activity's newest state: two posts to one activity may be met by
    /// one push, and each is then reached by it. A push is matched by its time alone, so a post is taken as reached by
    /// a push logged up to `tolerance` before it (the sink logs the time of the loop turn that read the request, in
    /// milliseconds), its latency then 0; the posts to one activity are half a second apart at 100 a second.
    static func sideDeliveries(posts: [(phone: Int, at: Double)], arrivals: [Int: [Double]], tolerance: Double = 0.005) -> [Double?] {
        posts.map { post in
            guard let times = arrivals[post.phone] else { return nil }
            // The first arrival at or after the post, less the tolerance: a binary search of the ascending times.
            var low = 0, high = times.count
            while low < high {
                let middle = (low + high) / 2
                if times[middle] < post.at - tolerance { low = middle + 1 } else { high = middle }
            }
            return low < times.count ? max(0, times[low] - post.at) : nil
        }
    }

    /// `PUT` here registers (or re-registers) the device's instance of the activity.
    static func registrationPath(activityID: String, deviceID: String) -> String {
        "/v1/activities/\(activityID)/instances/\(deviceID)"
    }

    /// The body of a registration: an iOS instance with its update token.
    static func registrationBody(pushToken: String) -> String {
        #"{"platform":"ios","pushToken":"\#(pushToken)","attributesType":"\#(attributesType)"}"#
    }

    /// `POST` here accepts a new content state for the activity.
    static func updatePath(activityID: String) -> String {
        "/v1/activities/\(activityID)/updates"
    }

    /// The body of an update: a small content state, as a score board would send.
    static func updateBody(score: String, minute: Int) -> String {
        #"{"contentState":{"score":"\#(score)","minute":\#(minute)}}"#
    }

    /// The activity the `index`th registration goes to when `perActivity` instances share one: `bench-000000`, ….
    static func activityID(forInstance index: Int, perActivity: Int) -> String {
        "bench-" + zeroPadded(index / max(1, perActivity), width: 6)
    }

    /// h2load's requests per second from its summary line (`finished in 1.40s, 142857.14 req/s, 22.34MB/s`).
    static func h2loadRate(_ output: String) -> Double? {
        for line in output.split(separator: "\n") where line.hasPrefix("finished in") {
            let fields = line.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            guard let field = fields.first(where: { $0.hasSuffix(" req/s") }) else { continue }
            return Double(field.dropLast(" req/s".count))
        }
        return nil
    }

    /// How many requests h2load answered 2xx, from its `status codes:` line; nil when the line is missing.
    static func h2loadSucceeded(_ output: String) -> Int? {
        guard let line = output.split(separator: "\n").first(where: { $0.trimmingCharacters(in: .whitespaces).hasPrefix("status codes:") })
        else { return nil }
        // "status codes: 200000 2xx, 0 3xx, 0 4xx, 0 5xx"
        let afterColon = line.split(separator: ":", maxSplits: 1).last ?? ""
        let first = afterColon.split(separator: ",").first?.trimmingCharacters(in: .whitespaces) ?? ""
        return Int(first.split(separator: " ").first ?? "")
    }

    /// A rate against h2load's: `0.31 × h2load` (`0.42 × h2load shaped as pushes` against the reference shaped as pushes), or
    /// `-` without a reference.
    static func ratio(_ rate: Double, to reference: Double?, shaped: Bool = false) -> String {
        guard let reference, reference > 0 else { return "-" }
        return String(format: shaped ? "%.2f × h2load shaped as pushes" : "%.2f × h2load", rate / reference)
    }

    /// The slowest and fastest of `rates` against a reference: `0.25 – 0.31 × h2load` (or `… × h2load shaped as pushes`).
    static func ratioRange(_ rates: [Double], to reference: Double, shaped: Bool = false) -> String {
        guard reference > 0, let slowest = rates.min(), let fastest = rates.max() else { return "-" }
        return String(format: shaped ? "%.2f – %.2f × h2load shaped as pushes" : "%.2f – %.2f × h2load", slowest / reference, fastest / reference)
    }

    /// How long to wait before asking the sink for its count again, while a fan-out of `expected` pushes has `counted`
    /// of them after `elapsed`: a quarter of the time the rest should take at the rate so far, between 1 and 20 ms.
    /// Each ask costs the sink and the bench a request on the cores the server needs; asked every 2 ms, a round of
    /// 2.5 s cost about a thousand. Near the end the asks come every millisecond, so the round's time is as exact as
    /// before.
    static func pollPause(counted: Int, expected: Int, elapsed: Duration) -> Duration {
        let floor = Duration.milliseconds(1), ceiling = Duration.milliseconds(20)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        guard counted > 0, seconds > 0 else { return .milliseconds(2) }
        let left = Double(max(0, expected - counted)) / (Double(counted) / seconds)
        let pause = Duration.nanoseconds(Int64(min(left / 4, 1) * 1e9))
        return min(max(pause, floor), ceiling)
    }

    /// The mean of `values`; nil when there are none.
    static func mean(_ values: [Double]) -> Double? {
        values.isEmpty ? nil : values.reduce(0, +) / Double(values.count)
    }

    /// The reference each of `rounds` rounds is read against when h2load also runs after every round: the mean of the
    /// run just before the round and the run just after it. `runs[0]` is the run before the first round, `runs[i]` the
    /// one after round `i`; a run that gave no rate leaves the other alone, and a round with neither has none.
    static func adjacentReferences(_ runs: [Double?], rounds: Int) -> [Double?] {
        rounds > 0 ? (1...rounds).map { adjacentReference(runs, round: $0) } : []
    }

    /// Round `round`'s (counted from 1) reference of ``adjacentReferences(_:rounds:)``.
    static func adjacentReference(_ runs: [Double?], round: Int) -> Double? {
        mean([round - 1, round].compactMap { $0 >= 0 && $0 < runs.count ? runs[$0] : nil })
    }

    /// Each rate against its own reference (``adjacentReferences(_:rounds:)``), slowest and fastest:
    /// `0.27 – 0.31 × the h2load runs either side`; `-` when no round has a reference.
    static func adjacentRatioRange(_ rates: [Double], references: [Double?]) -> String {
        let ratios = zip(rates, references).compactMap { rate, reference in reference.flatMap { $0 > 0 ? rate / $0 : nil } }
        guard let slowest = ratios.min(), let fastest = ratios.max() else { return "-" }
        return String(format: "%.2f – %.2f × the h2load runs either side", slowest, fastest)
    }

    /// The slowest of `rates` as a share of the fastest, the figure issue 17 sets at 90 %: `slowest 83 % of the best`;
    /// empty for fewer than two rounds.
    static func slowestShare(_ rates: [Double]) -> String {
        guard rates.count > 1, let best = rates.max(), let slowest = rates.min(), best > 0 else { return "" }
        return String(format: "slowest %.0f %% of the best", (slowest / best * 100).rounded(.down))
    }

    /// A count with thousands separators: 1,000,000.
    static func grouped(_ value: Int) -> String {
        let digits = String(value.magnitude)
        var out = ""
        for (offset, character) in digits.enumerated() {
            if offset > 0, (digits.count - offset) % 3 == 0 { out.append(",") }
            out.append(character)
        }
        return value < 0 ? "-" + out : out
    }

    private static func zeroPadded(_ value: Int, width: Int) -> String {
        let digits = String(value)
        return String(repeating: "0", count: max(0, width - digits.utf8.count)) + digits
    }
}

/// p50, p99 and the maximum of a set of latencies.
struct LatencySummary: Equatable, Sendable {
    var count: Int
    var p50: Duration
    var p99: Duration
    var max: Duration

    /// From latencies in nanoseconds, sorted ascending.
    init(sortedNanoseconds sorted: [UInt64]) {
        count = sorted.count
        p50 = .nanoseconds(Int64(Self.percentile(sorted, 0.50)))
        p99 = .nanoseconds(Int64(Self.percentile(sorted, 0.99)))
        max = .nanoseconds(Int64(sorted.last ?? 0))
    }

    /// The nearest-rank percentile `p` (0…1) of sorted values: the smallest value at least `p` of them are at or
    /// below. 0 when there are none.
    static func percentile(_ sorted: [UInt64], _ p: Double) -> UInt64 {
        guard !sorted.isEmpty else { return 0 }
        return sorted[nearestRank(count: sorted.count, p)]
    }

    /// The index of the nearest-rank percentile `p` (0…1) among `count` (> 0) sorted values.
    static func nearestRank(count: Int, _ p: Double) -> Int {
        let rank = Int((Double(count) * p).rounded(.up))
        return Swift.min(count - 1, Swift.max(0, rank - 1))
    }

    /// `p50 1.20 ms  p99 8.40 ms  max 12.00 ms`
    var text: String {
        "p50 \(Bench.format(p50))  p99 \(Bench.format(p99))  max \(Bench.format(max))"
    }
}
