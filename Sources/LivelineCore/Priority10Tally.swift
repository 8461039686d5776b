/// One instance's priority-10 pushes over the last hour, counted per quarter of an hour in one 64-bit integer.
///
/// ``PriorityBudget`` needs, for each push, how many priority-10 pushes the instance received in the last hour. The
/// tally answers it at a fixed size: the counts of the five newest quarter-hours (the current one and the four before
/// it) and which quarter-hour is the newest. A push is counted from when it was sent until its quarter-hour is five
/// quarters old: for at least 60 and at most 75 minutes. The tally never counts a push of the last hour out, so an
/// instance never goes past its budget; near the window's edge it may count one in for up to 15 minutes longer than
/// an exact sliding hour would, which only sends a push at priority 5 that could have gone at 10.
///
/// Every priority-10 push of a fan-out reads its instance's tally and writes it back. A list of times grew with each
/// push (parsed, filtered and written again every time, and the instance's row grew with it); a tally is one integer,
/// read and written as it is, so the hundredth push of an hour costs what the first did.
///
/// The layout of ``packed``, from the lowest bit: five counts of 8 bits, the newest quarter-hour first; then the
/// newest quarter-hour's number since 1970 (bits 40 – 62). A count stops at 255: as long as an instance's hourly
/// budget is at most 255 that changes no decision (a full quarter-hour is at the limit either way); a larger budget
/// can be overrun only by more than 255 priority-10 pushes to one instance within a quarter of an hour.
public struct Priority10Tally: Sendable, Hashable {
    /// How long one count covers, in seconds.
    public static let quarterSeconds: Int64 = 900
    /// How many quarters are counted: the current one and the four before it.
    public static let quarters = 5
    /// The longest a push counts, in seconds: the five quarters. Marks of priority-10 pushes are kept that long.
    public static let windowSeconds = quarterSeconds * Int64(quarters)
    /// The most one quarter's count holds.
    public static let countLimit = 255

    /// The tally as one integer, as the Store keeps it.
    public private(set) var packed: Int64

    /// The tally kept as `packed`.
    public init(packed: Int64) {
        self.packed = packed
    }

    /// No push counted yet, with `now`'s quarter as the newest: the value the Store writes for a new instance, so that
    /// later tallies are written over an integer of the same size.
    public static func empty(at now: Int64) -> Priority10Tally {
        Priority10Tally(newestQuarter: quarter(of: now), counts: 0)
    }

    /// The tally of pushes sent at `times` (seconds since 1970, in any order): each counted in its quarter, those more
    /// than four quarters older than the newest left out (they are out of every window from then on).
    public init(times: [Int64]) {
        self = times.sorted().reduce(Priority10Tally(packed: 0)) { $0.recording(at: $1) }
    }

    private init(newestQuarter: Int64, counts: UInt64) {
        packed = Int64(newestQuarter) << 40 | Int64(counts & Self.countsMask)
    }

    private static let countsMask: UInt64 = (1 << 40) - 1
    /// The last quarter the 23 bits hold (in the year 2209); later times count in it.
    private static let lastQuarter: Int64 = (1 << 23) - 1

    private static func quarter(of time: Int64) -> Int64 {
        min(max(0, time) / quarterSeconds, lastQuarter)
    }

    private var newestQuarter: Int64 { packed >> 40 }
    private var counts: UInt64 { UInt64(bitPattern: packed) & Self.countsMask }

    private func count(_ index: Int) -> Int {
        Int((counts >> (8 * UInt64(index))) & 0xFF)
    }

    /// How many priority-10 pushes count against the budget at `now` (seconds since 1970): those of the last hour, and
    /// perhaps some of the quarter of an hour before it.
    public func used(at now: Int64) -> Int {
        // A clock that went back (now before the newest quarter) counts everything kept.
        let age = max(0, Self.quarter(of: now) - newestQuarter)
        guard age < Int64(Self.quarters) else { return 0 }
        var used = 0
        for index in 0..<(Self.quarters - Int(age)) {
            used += count(index)
        }
        return used
    }

    /// The tally with one more push, sent at `now`: quarters that fell out of the window are dropped first.
    public func recording(at now: Int64) -> Priority10Tally {
        let quarter = Self.quarter(of: now)
        let age = quarter - newestQuarter
        var counts = self.counts
        var newest = newestQuarter
        // A tally with nothing counted starts at `now`, whichever quarter it names (an empty tally written by a node
        // whose clock is ahead names a later one).
        if counts == 0 || age >= Int64(Self.quarters) {
            counts = 0
            newest = quarter
        } else if age > 0 {
            counts = (counts << (8 * UInt64(age))) & Self.countsMask
            newest = quarter
        }
        // A push timed before the newest quarter (a clock that went back) counts in the newest one.
        if counts & 0xFF < UInt64(Self.countLimit) {
            counts += 1
        }
        return Priority10Tally(newestQuarter: newest, counts: counts)
    }

    /// The tally with one more push, sent at `time` and counted in its own quarter (a push recorded by a mark, told
    /// after pushes sent later): one older than the quarters kept counts no more; one in or after the newest quarter is
    /// recorded as ``recording(at:)`` records it.
    public func counting(pushAt time: Int64) -> Priority10Tally {
        let quarter = Self.quarter(of: time)
        if counts == 0 || quarter >= newestQuarter { return recording(at: time) }
        let age = newestQuarter - quarter
        guard age < Int64(Self.quarters) else { return self }
        let shift = 8 * UInt64(age)
        guard (counts >> shift) & 0xFF < UInt64(Self.countLimit) else { return self }
        return Priority10Tally(newestQuarter: newestQuarter, counts: counts + (1 << shift))
    }

    /// Tallies are equal when they count the same pushes in the same quarters; all tallies with no push are equal,
    /// whichever quarter they name as the newest.
    public static func == (lhs: Priority10Tally, rhs: Priority10Tally) -> Bool {
        lhs.counts == rhs.counts && (lhs.counts == 0 || lhs.newestQuarter == rhs.newestQuarter)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(counts == 0 ? 0 : packed)
    }
}
