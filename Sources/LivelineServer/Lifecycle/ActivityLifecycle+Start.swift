import Foundation
import LivelineCore
import LivelineStore

extension ActivityLifecycle {
    /// An accepted remote start: its sequence, who it reaches, and the fields whose type changed.
    struct AcceptedStartReport: Sendable {
        var start: AcceptedStart
        var changes: [JSONShape.Change]
    }

    /// Starts the activity remotely for `start.audience` (creating the activity on first sight; on an active one, the
    /// audience is added), in the same order as an update: validate, apply Core's rules, render both starts and
    /// refuse one that could not be sent, store (O(1) writes: the engine admits the audience later), wake delivery.
    func start(
        _ start: ActivityStart, delivery requested: DeliveryRequest = DeliveryRequest(),
        idempotency: IdempotencyClaim<AcceptedStartReport>? = nil
    ) async throws -> IdempotentOutcome<AcceptedStartReport> {
        let now = clock.now()
        var start = start
        let current = try await store.activityWithoutInstanceCounts(appID: start.appID, activityID: start.activityID)
        if let current, current.state != .active { throw APIError.activityEnded(start.activityID) }
        // The type is the backend's once it has given the activity state; before, it came from a phone's registration
        // (any holder of the publishable key), and the backend's start sets it.
        if let current, let type = current.attributesType, type != start.attributesType, current.sequence > 0 {
            throw Self.attributesTypeMismatch(start.activityID, existing: type)
        }
        let plan = try await deliveryPlan(requested, appID: start.appID, current: current)
        var changes: [JSONShape.Change] = []
        if let schema = try await contracts.schema(appID: start.appID, attributesType: start.attributesType) {
            start.contentState = try schema.conform(contentState: start.contentState)
            start.attributes = try schema.conform(attributes: start.attributes)
        } else {
            let checked = try await contracts.check(start.contentState, appID: start.appID, activity: current, remember: true)
            start.contentShape = checked.shape
            changes = checked.changes
        }
        start.staleDate = start.staleDate ?? staleness.staleDate(now: now, previous: current?.sequenceAt)
        let next: LiveActivityState
        do {
            next = try LiveActivityState.update(
                activityID: start.activityID, after: current?.head, contentState: start.contentState, staleDate: start.staleDate,
                relevanceScore: start.relevanceScore, alert: nil, now: now
            )
        } catch {
            throw APIError.activityEnded(start.activityID)
        }
        try next.validateRenderings(now: now, delivery: plan.delivery, android: try await reachesAndroid(appID: start.appID, delivery: plan.delivery))
        try next.validateStartRenderings(attributesType: start.attributesType, attributes: start.attributes, alert: start.alert, now: now)
        try await prepareDelivery(plan, appID: start.appID, activityID: start.activityID)
        let found = changes
        let claim = idempotency?.pullback { (accepted: AcceptedStart) in AcceptedStartReport(start: accepted, changes: found) }
        let outcome: IdempotentOutcome<AcceptedStart>
        do {
            outcome = try await store.startActivity(start, at: now, idempotency: claim)
        } catch StoreError.activityEnded {
            throw APIError.activityEnded(start.activityID)
        } catch StoreError.attributesTypeMismatch(let existing) {
            throw Self.attributesTypeMismatch(start.activityID, existing: existing)
        }
        // A replay accepted nothing: there is nothing new to deliver.
        if case .performed = outcome { delivery.wake() }
        return outcome.map { AcceptedStartReport(start: $0, changes: found) }
    }

    /// Remotely started instances whose phones have not confirmed them (registered their own token) within `allowed`.
    func unconfirmedStarts(appID: String, activityID: String, allowed: TimeInterval, limit: Int) async throws -> UnconfirmedStarts {
        try await store.unconfirmedStarts(
            appID: appID, activityID: activityID, startedBefore: clock.now().addingTimeInterval(-allowed), limit: limit
        )
    }

    private static func attributesTypeMismatch(_ activityID: String, existing: String) -> APIError {
        APIError(
            .conflict, code: "attributes_type_mismatch",
            message: "Activity '\(activityID)' has attributes type '\(existing)'; a start must name the same type.",
            field: "attributesType"
        )
    }
}
