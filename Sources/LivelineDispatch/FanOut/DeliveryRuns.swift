import LivelineCore
import LivelineStore

/// A run of a chunk's instances sent and taken alike (``DeliveryRuns``): a mark, and where its first and last
/// instances were in the pass's reading of their platform (positions count the instances the pass read, one platform
/// at a time, in the order it sent them), so that runs of chunks read one after the other join into one mark.
public struct DeliveryRun: Sendable, Hashable {
    public var mark: DeliveryMark
    public var firstPosition: Int
    public var lastPosition: Int

    public init(mark: DeliveryMark, firstPosition: Int, lastPosition: Int) {
        self.mark = mark
        self.firstPosition = firstPosition
        self.lastPosition = lastPosition
    }
}

/// Which of a pass's pushes a mark records instead of a row write each (docs/progress-marks.md): pure decisions,
/// tested without a Store or a socket.
///
/// A run is instances of one chunk, next to one another in the order the pass read them, each an update of the chunk's
/// sequence taken by the push service at the same priority, each active and read by a pass later than the one it
/// joined in (``InstanceRecord/joinedPass``). Anything else cuts a run and keeps its row write: a start, an end, a
/// failure (to be retried or not), an instance that joined during this pass. Runs shorter than
/// ``minimumLength`` are written as rows too: a mark costs about what a row does.
public enum DeliveryRuns {
    /// The fewest instances a run marks.
    public static let minimumLength = 4

    /// One instance of a chunk as the runs see it, in the order the pass read the chunk.
    public struct Entry: Sendable, Hashable {
        public var deviceID: String
        /// Whether the instance may be part of a run: an update of the chunk's sequence, taken, to an active instance
        /// that joined before the pass.
        public var markable: Bool
        /// The push's priority (a run's pushes share one).
        public var priority: Int

        public init(deviceID: String, markable: Bool, priority: Int) {
            self.deviceID = deviceID
            self.markable = markable
            self.priority = priority
        }
    }

    /// Whether an instance's push may be part of a run (``Entry/markable``).
    public static func markable(
        state: InstanceState, channelID: String?, joinedPass: Int64, pass: Int64, event: LiveActivityEvent, delivered: Bool
    ) -> Bool {
        delivered && event == .update && state == .active && channelID == nil && joinedPass < pass
    }

    /// The runs of one chunk, whose first instance is at `firstPosition` of its platform's reading.
    public static func runs(
        of entries: [Entry], firstPosition: Int, platform: Platform, sequence: Int64, pass: Int64, sentAt: Int64
    ) -> [DeliveryRun] {
        var runs: [DeliveryRun] = []
        var start: Int?
        func close(before end: Int) {
            defer { start = nil }
            guard let first = start, end - first >= minimumLength else { return }
            runs.append(
                DeliveryRun(
                    mark: DeliveryMark(
                        platform: platform, sequence: sequence, pass: pass, fromDevice: entries[first].deviceID,
                        throughDevice: entries[end - 1].deviceID, priority: entries[first].priority, sentAt: sentAt
                    ),
                    firstPosition: firstPosition + first, lastPosition: firstPosition + end - 1
                )
            )
        }
        for (index, entry) in entries.enumerated() {
            if !entry.markable {
                close(before: index)
                continue
            }
            if let first = start, entries[first].priority != entry.priority || !precedes(entries[index - 1].deviceID, entry.deviceID) {
                close(before: index)
            }
            if start == nil { start = index }
        }
        close(before: entries.count)
        return runs
    }

    /// `runs` (of any chunks of one pass) with those that follow one another joined: the same platform, sequence, pass
    /// and priority, the second's first position right after the first's last, and its devices after the first's. The
    /// joined run's time is the later one, so that its pushes count against the budget at least as long as they
    /// should. Sorted by platform and position.
    public static func joined(_ runs: [DeliveryRun]) -> [DeliveryRun] {
        let sorted = runs.sorted {
            ($0.mark.platform.rawValue, $0.firstPosition) < ($1.mark.platform.rawValue, $1.firstPosition)
        }
        var joined: [DeliveryRun] = []
        joined.reserveCapacity(sorted.count)
        for run in sorted {
            if var last = joined.last, last.mark.platform == run.mark.platform, last.mark.sequence == run.mark.sequence,
                last.mark.pass == run.mark.pass, last.mark.priority == run.mark.priority, last.lastPosition + 1 == run.firstPosition,
                precedes(last.mark.throughDevice, run.mark.fromDevice)
            {
                last.mark.throughDevice = run.mark.throughDevice
                last.mark.sentAt = max(last.mark.sentAt, run.mark.sentAt)
                last.lastPosition = run.lastPosition
                joined[joined.count - 1] = last
            } else {
                joined.append(run)
            }
        }
        return joined
    }

    /// Whether device id `a` comes before `b` in the Stores' order (by their bytes).
    static func precedes(_ a: String, _ b: String) -> Bool {
        a.utf8.lexicographicallyPrecedes(b.utf8)
    }
}
