import Foundation
import LivelineCore
import Testing

@Suite("Priority-10 tally")
struct Priority10TallyTests {
    /// The start of a quarter of an hour.
    let quarter: Int64 = 1_795_255_200

    @Test("a push counts from when it is sent until its quarter of an hour is five quarters old: 60 to 75 minutes")
    func window() {
        let sentAtStart = Priority10Tally(packed: 0).recording(at: quarter)
        #expect(sentAtStart.used(at: quarter) == 1)
        #expect(sentAtStart.used(at: quarter + 3600 - 1) == 1)
        #expect(sentAtStart.used(at: quarter + 3600) == 1, "the quarter it is in is only four quarters old")
        #expect(sentAtStart.used(at: quarter + 4500 - 1) == 1)
        #expect(sentAtStart.used(at: quarter + 4500) == 0, "60 + 15 minutes")
        let sentAtEnd = Priority10Tally(packed: 0).recording(at: quarter + 899)
        #expect(sentAtEnd.used(at: quarter + 899 + 3601) == 0, "a push at a quarter's last second counts for 60 minutes and 1 second")
        #expect(sentAtEnd.used(at: quarter + 899 + 3600) == 1)
    }

    @Test("no push of the last hour is ever left out", arguments: [0, 1, 299, 450, 899] as [Int64])
    func neverUndercounts(offset: Int64) {
        var tally = Priority10Tally(packed: 0)
        var times: [Int64] = []
        // One push every 7 minutes for three hours, starting `offset` seconds into a quarter.
        for minute in stride(from: 0, to: 180, by: 7) {
            let time = quarter + offset + Int64(minute) * 60
            tally = tally.recording(at: time)
            times.append(time)
            for later in stride(from: time, through: time + 4500, by: 97) {
                let exact = times.filter { $0 > later - PriorityBudget.window && $0 <= later }.count
                let counted = tally.used(at: later)
                #expect(counted >= exact)
                // At most the pushes of the quarter of an hour before the hour are counted too.
                #expect(counted <= times.filter { $0 > later - PriorityBudget.window - 900 && $0 <= later }.count)
            }
        }
    }

    @Test("quarters that left the window are dropped when a push is recorded")
    func recordingDropsOldQuarters() {
        var tally = Priority10Tally(packed: 0)
        for minute in 0..<12 { tally = tally.recording(at: quarter + Int64(minute) * 60) }
        #expect(tally.used(at: quarter + 11 * 60) == 12)
        // Two quarters later, two more: the first twelve still count.
        tally = tally.recording(at: quarter + 1800).recording(at: quarter + 1860)
        #expect(tally.used(at: quarter + 1860) == 14)
        // Five quarters after the first: only the two.
        tally = tally.recording(at: quarter + 4500)
        #expect(tally.used(at: quarter + 4500) == 3)
        // Long after: a fresh start.
        tally = tally.recording(at: quarter + 86_400)
        #expect(tally.used(at: quarter + 86_400) == 1)
    }

    @Test("a quarter counts up to 255; a clock that went back counts in the newest quarter")
    func limits() {
        var tally = Priority10Tally(packed: 0)
        for second in 0..<300 { tally = tally.recording(at: quarter + Int64(second)) }
        #expect(tally.used(at: quarter + 300) == Priority10Tally.countLimit)
        let back = Priority10Tally(packed: 0).recording(at: quarter + 1000).recording(at: quarter)
        #expect(back.used(at: quarter + 1000) == 2)
        #expect(back.used(at: quarter) == 2, "a clock before the newest quarter counts everything kept")
        // An empty tally that names a later quarter (written by a node whose clock is ahead) starts at the push.
        let ahead = Priority10Tally.empty(at: quarter + 86_400).recording(at: quarter)
        #expect(ahead.used(at: quarter) == 1)
        #expect(ahead.used(at: quarter + 4500) == 0)
    }

    @Test("a tally of times counts each in its quarter, as recording them one by one does")
    func fromTimes() {
        let times: [Int64] = [quarter - 5000, quarter + 10, quarter - 100, quarter + 950, quarter - 3000]
        let recorded = times.sorted().reduce(Priority10Tally(packed: 0)) { $0.recording(at: $1) }
        #expect(Priority10Tally(times: times) == recorded)
        #expect(Priority10Tally(times: times).used(at: quarter + 950) == 3, "5,000 and 3,000 s before are out")
        #expect(Priority10Tally(times: []) == Priority10Tally(packed: 0))
    }

    @Test("the integer keeps its size: the quarter's number is in the high bits, so an empty tally is 8 bytes too")
    func packing() {
        let empty = Priority10Tally.empty(at: quarter)
        #expect(empty.used(at: quarter) == 0)
        #expect(empty == Priority10Tally(packed: 0), "tallies without a push are equal")
        #expect(empty.packed > 1 << 47, "SQLite stores integers above 2^47 in 8 bytes")
        let one = empty.recording(at: quarter + 5)
        #expect(one.packed > 1 << 47)
        #expect(Priority10Tally(packed: one.packed) == one)
        #expect(one != empty)
    }

    @Test("a push told late counts in its own quarter while that quarter is kept, and not at all once it is not")
    func pushToldLate() {
        let later = Priority10Tally.empty(at: quarter).recording(at: quarter + 1_800)
        // Told after a push half an hour later: it counts for its own 60 – 75 minutes, not the later one's.
        let both = later.counting(pushAt: quarter + 10)
        #expect(both.used(at: quarter + 1_800) == 2)
        #expect(both.used(at: quarter + 3_600 + 899) == 2)
        #expect(both.used(at: quarter + 4_500) == 1, "five quarters on, the earlier push is out; the later one is not")
        #expect(later.counting(pushAt: quarter + 1_800 + 60) == later.recording(at: quarter + 1_800 + 60))
        #expect(later.counting(pushAt: quarter - 3_600) == later, "older than the quarters kept: it counts no more")
        #expect(Priority10Tally(packed: 0).counting(pushAt: quarter).used(at: quarter) == 1)
    }
}
