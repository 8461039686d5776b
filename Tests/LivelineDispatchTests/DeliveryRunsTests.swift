import LivelineCore
import LivelineDispatch
import LivelineStore
import Testing

/// Which pushes of a chunk a mark records (``DeliveryRuns``), without a Store or a socket.
@Suite("Delivery runs")
struct DeliveryRunsTests {
    private static func entries(_ markable: [Bool], priorities: [Int]? = nil) -> [DeliveryRuns.Entry] {
        markable.enumerated().map { index, markable in
            DeliveryRuns.Entry(deviceID: "d\(100 + index)", markable: markable, priority: priorities?[index] ?? 10)
        }
    }

    private static func runs(_ entries: [DeliveryRuns.Entry], firstPosition: Int = 0) -> [DeliveryRun] {
        DeliveryRuns.runs(of: entries, firstPosition: firstPosition, platform: .ios, sequence: 3, pass: 7, sentAt: 1_000)
    }

    @Test("a run is cut at every push that is not markable; runs shorter than the minimum are left to rows")
    func cutAtFailures() {
        // d100 – d104 taken, d105 failed, d106 – d107 taken (too short), d108 failed, d109 – d113 taken.
        let marks = Self.runs(Self.entries([true, true, true, true, true, false, true, true, false, true, true, true, true, true]))
        #expect(marks.map { [$0.mark.fromDevice, $0.mark.throughDevice] } == [["d100", "d104"], ["d109", "d113"]])
        #expect(marks.map { [$0.firstPosition, $0.lastPosition] } == [[0, 4], [9, 13]])
        #expect(marks.allSatisfy { $0.mark.sequence == 3 && $0.mark.pass == 7 && $0.mark.sentAt == 1_000 && $0.mark.priority == 10 })
        #expect(Self.runs(Self.entries(Array(repeating: true, count: DeliveryRuns.minimumLength - 1))).isEmpty)
        #expect(Self.runs(Self.entries(Array(repeating: false, count: 20))).isEmpty)
    }

    @Test("a run keeps one priority: where an instance's budget lowers its push to 5, a new run starts")
    func cutAtPriority() {
        let priorities = [10, 10, 10, 10, 5, 5, 5, 5, 5, 10]
        let marks = Self.runs(Self.entries(Array(repeating: true, count: 10), priorities: priorities))
        #expect(marks.map { [$0.mark.fromDevice, $0.mark.throughDevice] } == [["d100", "d103"], ["d104", "d108"]])
        #expect(marks.map(\.mark.priority) == [10, 5])
    }

    @Test("only an update taken by the push service, to an active instance of a pass after the one it joined in, is markable")
    func markable() {
        func markable(
            state: InstanceState = .active, channel: String? = nil, joined: Int64 = 3, event: LiveActivityEvent = .update, delivered: Bool = true
        ) -> Bool {
            DeliveryRuns.markable(state: state, channelID: channel, joinedPass: joined, pass: 4, event: event, delivered: delivered)
        }
        #expect(markable())
        #expect(!markable(joined: 4), "it joined during this pass")
        #expect(!markable(delivered: false))
        #expect(!markable(event: .start) && !markable(event: .end), "starts and ends change the instance's row anyway")
        #expect(!markable(state: .starting))
        #expect(!markable(channel: "channel"))
    }

    @Test("runs of chunks read one after the other join into one mark; a gap, another sequence or priority, or devices out of order keep them apart")
    func joining() {
        let first = Self.runs(Self.entries(Array(repeating: true, count: 8)), firstPosition: 0)
        let second = DeliveryRuns.runs(
            of: (0..<8).map { DeliveryRuns.Entry(deviceID: "d\(200 + $0)", markable: true, priority: 10) }, firstPosition: 8, platform: .ios,
            sequence: 3, pass: 7, sentAt: 1_005
        )
        let joined = DeliveryRuns.joined(second + first)
        #expect(joined.count == 1)
        #expect(joined.first?.mark.fromDevice == "d100" && joined.first?.mark.throughDevice == "d207")
        #expect(joined.first?.mark.sentAt == 1_005, "the later time: the pushes count at least as long as they should")
        #expect(joined.first.map { [$0.firstPosition, $0.lastPosition] } == [0, 15])

        // A chunk between them not yet answered (positions 8 – 15): the runs stay apart.
        var later = second
        later[0].firstPosition = 16
        later[0].lastPosition = 23
        #expect(DeliveryRuns.joined(first + later).count == 2)
        var newer = second
        newer[0].mark.sequence = 4
        #expect(DeliveryRuns.joined(first + newer).count == 2)
        var android = second
        android[0].mark.platform = .android
        #expect(DeliveryRuns.joined(first + android).count == 2)
        // A pass that went back to its start for a newer state: the positions follow, the devices do not.
        let again = DeliveryRuns.runs(of: Self.entries(Array(repeating: true, count: 8)), firstPosition: 8, platform: .ios, sequence: 3, pass: 7, sentAt: 1)
        #expect(DeliveryRuns.joined(first + again).count == 2)
    }
}
