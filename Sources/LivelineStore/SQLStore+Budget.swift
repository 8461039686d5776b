import Foundation
import LivelineCore
import SQLiteNIO

extension SQLStore {
    public func priority10Usage(appID: String, activityID: String) async throws -> [Priority10Usage] {
        // Every mark kept: each counts in its own quarter, and a quarter too old counts no more when the tally is read.
        let marks = Priority10MarkIndex(try await priority10Marks(appID: appID, activityID: activityID, since: 0))
        return try await reader.query(
            """
            SELECT device_id, platform, joined_pass, priority10_tally, priority10_sent, frequent_pushes FROM instances
            WHERE app_id = ? AND activity_id = ? AND state = 'active' AND platform = 'ios'
            """,
            [.text(appID), .text(activityID)]
        ).map { row in
            let tally = Self.priority10Tally(from: row)
            return Priority10Usage(
                tally: marks.isEmpty
                    ? tally
                    : marks.counting(
                        tally, forDevice: try row.string("device_id"), platform: .ios, joinedPass: Int64(row.column("joined_pass")?.integer ?? 0)
                    ),
                frequentPushes: row.column("frequent_pushes")?.integer.map { $0 != 0 }
            )
        }
    }

    public func priority10Marks(appID: String, activityID: String, since: Int64) async throws -> [DeliveryMark] {
        try await reader.query(Self.priority10MarksQuery, [.text(appID), .text(activityID), .integer(Int(since))]).map(Self.mark(from:))
    }

    /// The marks of one activity's priority-10 pushes since a time, oldest first. Binds: the app, the activity, the time
    /// (seconds since 1970).
    static let priority10MarksQuery = """
        SELECT platform, sequence, pass, from_device, through_device, priority, sent_at FROM delivery_marks
        WHERE app_id = ? AND activity_id = ? AND priority = 10 AND sent_at >= ? ORDER BY sent_at
        """

    static func mark(from row: StoreRow) throws -> DeliveryMark {
        DeliveryMark(
            platform: Platform(rawValue: try row.string("platform")) ?? .ios, sequence: Int64(row.column("sequence")?.integer ?? 0),
            pass: Int64(row.column("pass")?.integer ?? 0), fromDevice: try row.string("from_device"),
            throughDevice: try row.string("through_device"), priority: row.column("priority")?.integer ?? 0,
            sentAt: Int64(row.column("sent_at")?.integer ?? 0)
        )
    }
}

/// An activity's marks of priority-10 pushes, arranged so that what speaks for an instance is found with one search
/// however many passes left marks: the device ids are cut, per platform, where any mark starts or ends, into segments
/// that every mark either covers whole or misses; each segment lists the pushes of the marks covering it (one a pass and
/// sequence: one pass's marks of one sequence never overlap), the newest pass first. An instance's pushes are those
/// of its segment's passes after the one it joined in (as ``DeliveryMark/covers(_:)`` decides).
///
/// A fan-out counts these into every instance it reads. Kept as one group of marks a pass, searched one after another,
/// each pass of the tally's window made every later pass's instances cost one more search: the tenth pass of 100,000
/// instances spent 2.5 % of the server's CPU on them, and an activity sent priority 10 every minute would have had
/// 75 groups to search for each instance.
public struct Priority10MarkIndex: Sendable {
    /// One platform's segments.
    private struct Segments: Sendable {
        /// The first device id of each segment, in ascending order of their bytes; a segment runs up to the next one's
        /// first (the segment after a mark's last device starts at that id followed by a zero byte, the next id in
        /// the order of bytes).
        var starts: [[UInt8]] = []
        /// Where each segment's pushes start in ``pushes`` (and, one more, where the last one's end).
        var offsets: [Int] = [0]
        /// The pass and time of each push covering a segment, by segment, each segment's newest pass first.
        var pushes: [(pass: Int64, sentAt: Int64)] = []
    }

    private let segments: [Platform: Segments]

    /// The index of `marks`' priority-10 ones.
    public init(_ marks: [DeliveryMark]) {
        struct Group: Hashable {
            var pass: Int64
            var sequence: Int64
        }
        typealias Mark = (from: [UInt8], after: [UInt8], sentAt: Int64)
        var byPlatform: [Platform: [Group: [Mark]]] = [:]
        for mark in marks where mark.priority == 10 {
            byPlatform[mark.platform, default: [:]][Group(pass: mark.pass, sequence: mark.sequence), default: []]
                .append((Array(mark.fromDevice.utf8), Array(mark.throughDevice.utf8) + [0], mark.sentAt))
        }
        var segments: [Platform: Segments] = [:]
        for (platform, groups) in byPlatform {
            var cuts = Set<[UInt8]>()
            for marks in groups.values {
                for mark in marks {
                    cuts.insert(mark.from)
                    cuts.insert(mark.after)
                }
            }
            let starts = cuts.sorted { $0.lexicographicallyPrecedes($1) }
            let position = Dictionary(uniqueKeysWithValues: starts.enumerated().map { ($1, $0) })
            // Each segment's pushes, the newest pass first (the groups taken in that order): a group counted once in a
            // segment even if (against the rule) two of its marks overlapped there.
            var covering = [[(group: Group, sentAt: Int64)]](repeating: [], count: starts.count)
            for (group, marks) in groups.sorted(by: { $0.key.pass > $1.key.pass }) {
                for mark in marks {
                    guard let first = position[mark.from], let end = position[mark.after], first < end else { continue }
                    for segment in first..<end where covering[segment].last?.group != group {
                        covering[segment].append((group, mark.sentAt))
                    }
                }
            }
            var built = Segments(starts: starts)
            built.offsets.reserveCapacity(starts.count + 1)
            for pushes in covering {
                built.pushes += pushes.map { ($0.group.pass, $0.sentAt) }
                built.offsets.append(built.pushes.count)
            }
            segments[platform] = built
        }
        self.segments = segments
    }

    /// Whether it holds no mark.
    public var isEmpty: Bool { segments.isEmpty }

    /// `tally` with the pushes of the marks that speak for `instance` (``DeliveryMark/covers(_:)``) counted in, each in
    /// its own quarter (``Priority10Tally/counting(pushAt:)``): the instance's priority-10 pushes, those written in its
    /// row and those sent in runs.
    public func counting(_ tally: Priority10Tally, for instance: InstanceRecord) -> Priority10Tally {
        counting(tally, forDevice: instance.deviceID, platform: instance.platform, joinedPass: instance.joinedPass)
    }

    /// ``counting(_:for:)`` for the instance of `device` on `platform` that joined in pass `joinedPass`.
    public func counting(_ tally: Priority10Tally, forDevice device: String, platform: Platform, joinedPass: Int64) -> Priority10Tally {
        guard let segments = segments[platform] else { return tally }
        var device = device
        // The last segment starting at or before the device.
        let after = device.withUTF8 { bytes in
            var low = 0
            var high = segments.starts.count
            while low < high {
                let middle = (low + high) / 2
                if bytes.lexicographicallyPrecedes(segments.starts[middle]) { high = middle } else { low = middle + 1 }
            }
            return low
        }
        guard after > 0 else { return tally }
        var counted = tally
        for push in segments.pushes[segments.offsets[after - 1]..<segments.offsets[after]] {
            guard push.pass > joinedPass else { break }
            counted = counted.counting(pushAt: push.sentAt)
        }
        return counted
    }
}
