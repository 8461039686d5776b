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

/// An activity's marks of priority-10 pushes, arranged to find those that speak for an instance in a few steps: by
/// platform, pass and sequence (one pass's marks of one sequence never overlap: one push an instance), each group in
/// order of where its marks end and of where they start, searched by halves for the first ending at or after the
/// device and the last starting at or before it (as ``SQLStore/markedFor(_:sequence:)`` searches the Store).
public struct Priority10MarkIndex: Sendable {
    private struct Group: Sendable {
        var platform: Platform
        var pass: Int64
        /// (first device, last device, when sent), ordered by the last device's bytes.
        var marks: [(from: [UInt8], through: [UInt8], sentAt: Int64)]
        /// The same, ordered by the first device's bytes.
        var byStart: [(from: [UInt8], through: [UInt8], sentAt: Int64)]
    }

    private let groups: [Group]

    /// The index of `marks`' priority-10 ones.
    public init(_ marks: [DeliveryMark]) {
        struct Key: Hashable {
            var platform: Platform
            var pass: Int64
            var sequence: Int64
        }
        var grouped: [Key: [(from: [UInt8], through: [UInt8], sentAt: Int64)]] = [:]
        for mark in marks where mark.priority == 10 {
            grouped[Key(platform: mark.platform, pass: mark.pass, sequence: mark.sequence), default: []]
                .append((Array(mark.fromDevice.utf8), Array(mark.throughDevice.utf8), mark.sentAt))
        }
        groups = grouped.map { key, marks in
            Group(
                platform: key.platform, pass: key.pass, marks: marks.sorted { $0.through.lexicographicallyPrecedes($1.through) },
                byStart: marks.sorted { $0.from.lexicographicallyPrecedes($1.from) }
            )
        }
    }

    /// Whether it holds no mark.
    public var isEmpty: Bool { groups.isEmpty }

    /// `tally` with the pushes of the marks that speak for `instance` (``DeliveryMark/covers(_:)``) counted in, each in
    /// its own quarter (``Priority10Tally/counting(pushAt:)``): the instance's priority-10 pushes, those written in its
    /// row and those sent in runs.
    public func counting(_ tally: Priority10Tally, for instance: InstanceRecord) -> Priority10Tally {
        counting(tally, forDevice: instance.deviceID, platform: instance.platform, joinedPass: instance.joinedPass)
    }

    /// ``counting(_:for:)`` for the instance of `device` on `platform` that joined in pass `joinedPass`.
    public func counting(_ tally: Priority10Tally, forDevice device: String, platform: Platform, joinedPass: Int64) -> Priority10Tally {
        guard !groups.isEmpty else { return tally }
        let bytes = Array(device.utf8)
        var counted = tally
        for group in groups where group.platform == platform && group.pass > joinedPass {
            // The first mark ending at or after the device.
            var low = 0
            var high = group.marks.count
            while low < high {
                let middle = (low + high) / 2
                if group.marks[middle].through.lexicographicallyPrecedes(bytes) { low = middle + 1 } else { high = middle }
            }
            if low < group.marks.count, !bytes.lexicographicallyPrecedes(group.marks[low].from) {
                counted = counted.counting(pushAt: group.marks[low].sentAt)
                continue
            }
            // The last mark starting at or before it.
            low = 0
            high = group.byStart.count
            while low < high {
                let middle = (low + high) / 2
                if bytes.lexicographicallyPrecedes(group.byStart[middle].from) { high = middle } else { low = middle + 1 }
            }
            if low > 0, !group.byStart[low - 1].through.lexicographicallyPrecedes(bytes) {
                counted = counted.counting(pushAt: group.byStart[low - 1].sentAt)
            }
        }
        return counted
    }
}
