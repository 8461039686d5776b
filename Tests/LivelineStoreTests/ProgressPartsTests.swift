import Foundation
import LivelineCore
import SQLiteNIO
import Testing

@testable import LivelineStore

/// How a batch of delivery progress is cut into parts a writer may commit one by one, without a database.
@Suite("Progress parts")
struct ProgressPartsTests {
    private static func pushed(_ range: ClosedRange<Int>) -> [PushedInstance] {
        range.map { PushedInstance(deviceID: String(format: "d%05d", $0), token: "t\($0)", sequence: 3) }
    }

    /// The devices whose delivered sequence each statement of `part` raises.
    private static func deliveredDevices(_ part: [(sql: String, binds: [SQLiteData])]) -> Set<String> {
        var devices: Set<String> = []
        // The statements of delivered sequences: lists of six values a row (a change of state binds its time first).
        for statement in part where statement.sql.contains("v.column5") {
            for row in stride(from: statement.binds.count % 6, to: statement.binds.count, by: 6) {
                if case .text(let device) = statement.binds[row + 2] { devices.insert(device) }
            }
        }
        return devices
    }

    /// How many statements of `part` bind `device`.
    private static func statements(_ part: [(sql: String, binds: [SQLiteData])], naming device: String) -> Int {
        part.filter { $0.binds.contains { if case .text(let named) = $0 { named == device } else { false } } }.count
    }

    private static func mentions(_ part: [(sql: String, binds: [SQLiteData])], _ table: String) -> Bool {
        part.contains { $0.sql.contains(table) }
    }

    @Test("delivered instances go a part at a time; the timeline comes last; together they are the whole batch")
    func deliveredInParts() {
        let delivered = Self.pushed(1...600)
        let attempt = DeliveryRecord(
            appID: "app", activityID: "a", deviceID: "d00001", platform: .ios, sequence: 3, event: .update, priority: 10, status: .delivered,
            providerID: nil, reason: nil, latencyMilliseconds: 2, attempt: 1, attemptedAt: Date()
        )
        let progress = DeliveryProgress(appID: "app", activityID: "a", delivered: delivered, attempts: [attempt])
        let parts = SQLStore.progressParts(progress, at: Date())
        #expect(parts.count == 4)
        #expect(parts.dropLast().map { Self.deliveredDevices($0).count } == [250, 250, 100])
        #expect(parts.dropLast().allSatisfy { $0.count == 1 && !Self.mentions($0, "delivery_segments") })
        #expect(Self.deliveredDevices(parts[3]).isEmpty && Self.mentions(parts[3], "delivery_segments"))
        #expect(parts.map { Self.deliveredDevices($0) }.reduce(into: Set()) { $0.formUnion($1) } == Set(delivered.map(\.deviceID)))
        #expect(SQLStore.progressStatements(progress, at: Date()).count == parts.map(\.count).reduce(0, +))
    }

    @Test("an instance an event or a change of state speaks of is marked delivered in the last part, with them")
    func tiedInstancesGoLast() throws {
        var progress = DeliveryProgress(appID: "app", activityID: "a", delivered: Self.pushed(1...300))
        let ended = Self.pushed(7...7)
        progress.endDelivered = ended
        progress.events = [NewEvent(.deliveryFailed, appID: "app", activityID: "a", deviceID: "d00012")]
        let parts = SQLStore.progressParts(progress, at: Date())
        let last = try #require(parts.last)
        #expect(Self.deliveredDevices(last) == ["d00007", "d00012"])
        #expect(Self.mentions(last, "state = CASE instances.state"))
        // The ended instance's row is written once, its delivered sequence with its change of state.
        #expect(Self.statements(last, naming: "d00007") == 1)
        #expect(Self.mentions(last, "INSERT INTO events"))
        for part in parts.dropLast() {
            #expect(Self.deliveredDevices(part).isDisjoint(with: ["d00007", "d00012"]))
            #expect(!Self.mentions(part, "events") && !Self.mentions(part, "state = CASE"))
        }
        #expect(parts.dropLast().map { Self.deliveredDevices($0).count } == [250, 48])
    }

    @Test("a batch that warns of a budget is one part: its event counts instances of every part")
    func budgetWarningIsOnePart() {
        var progress = DeliveryProgress(appID: "app", activityID: "a", delivered: Self.pushed(1...600))
        progress.budgetWarnings = 3
        progress.events = [NewEvent(.budgetWarning, appID: "app", activityID: "a", data: ["instances": .integer(3)])]
        let parts = SQLStore.progressParts(progress, at: Date())
        #expect(parts.count == 1)
        #expect(Self.deliveredDevices(parts[0]).count == 600)
    }
}
