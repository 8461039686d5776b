import Foundation
import LivelineCore
import SQLiteNIO

/// The decision of ``SQLStore/acceptUpdate(_:at:idempotency:)`` (without a key) for many updates at once, apart from
/// the I/O: what a set of updates sharing one transaction writes, given the heads of their activities.
///
/// Each update is decided as its own body decides it (``SQLStore/nextState(_:after:at:)``): the next sequence of its
/// activity, or a new activity at sequence 1, or the activity's refusal (it ended). The set takes one update per
/// activity; a second one to the same activity is left to its body (``SetWriteOutcome/alone``), which runs after the set and
/// reads what the first wrote.
struct UpdateSet {
    /// An update, and the time it is accepted at.
    struct Member: Sendable {
        var update: ActivityUpdate
        var now: Date
    }

    /// An activity's row to write: its key and ``SQLStore/updatedActivityValues(_:next:nowMillis:)``.
    struct Row: Sendable {
        var key: ActivityKey
        var values: [SQLiteData]
        var nowMillis: Int
    }

    /// The set's decision for one update: written, its accepted sequence.
    typealias Decision = SetWriteOutcome<AcceptedSequence>

    /// One decision per update, in the order given.
    private(set) var decisions: [Decision] = []
    /// The rows of existing activities to change.
    private(set) var changed: [Row] = []
    /// The rows of activities the updates create.
    private(set) var created: [Row] = []
    /// The events to record, each at its update's time, in order.
    private(set) var events: [(event: NewEvent, nowMillis: Int)] = []

    /// Decides `members`, in order: `heads` holds the heads found of their activities (by key; an activity missing from
    /// it does not exist).
    init(_ members: [Member], heads: [ActivityKey: ActivityHead]) {
        var taken = Set<ActivityKey>()
        for member in members {
            let update = member.update
            let key = ActivityKey(appID: update.appID, activityID: update.activityID)
            guard taken.insert(key).inserted else {
                decisions.append(.alone)
                continue
            }
            let head = heads[key]
            let next: LiveActivityState
            do {
                next = try SQLStore.nextState(update, after: head, at: member.now)
            } catch {
                decisions.append(.refused(error))
                continue
            }
            let nowMillis = SQLStore.millis(member.now)
            let row = Row(key: key, values: SQLStore.updatedActivityValues(update, next: next, nowMillis: nowMillis), nowMillis: nowMillis)
            if head == nil { created.append(row) } else { changed.append(row) }
            events.append((SQLStore.updateEvent(update, after: head, next: next), nowMillis))
            decisions.append(
                .done(
                    AcceptedSequence(
                        activityID: update.activityID, sequence: next.sequence, event: .update, acceptedAt: SQLStore.date(nowMillis),
                        needsDelivery: head != nil
                    )
                )
            )
        }
    }
}
