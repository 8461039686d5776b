import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore

/// Where the lifecycle of Live Activities happens: an update or an end is accepted, an instance registers, a phone
/// reports what it did. The routes parse a request into one of these calls and represent its answer; everything in
/// between is here, in this order:
///
/// 1. **validate** what the request cannot say alone: the activity's state, the attributes type's content-state
///    contract (``ContentContracts``);
/// 2. **apply Core's rules**: the next sequence and its `aps.timestamp`, the default stale date (``StalenessPolicy``),
///    an end's final state (``LiveActivityState/update(activityID:after:contentState:staleDate:relevanceScore:alert:now:)``,
///    ``LiveActivityState/end(activityID:after:contentState:staleDate:relevanceScore:alert:dismissalDate:now:)``);
/// 3. **render** that state once for APNs and FCM and refuse it if either push would be refused
///    (``LiveActivityState/validateRenderings(now:)``) — the delivery engine renders it with the same step;
/// 4. **store** it (the Store applies the same Core rule inside its transaction, so a concurrent change cannot slip
///    between the read and the write), committed before this returns;
/// 5. **wake delivery** (``DeliveryWaking``): the engine claims the activity and fans it out
///    (``Dispatcher``, ``FanOutStateMachine``).
struct ActivityLifecycle: Sendable {
    let store: any LifecycleStore & SchemaStore & BroadcastStore & AppStore
    let clock: WallClock
    /// Default stale dates for states given without one.
    let staleness: StalenessPolicy
    /// Woken after each commit that leaves work for the delivery engine.
    let delivery: any DeliveryWaking
    /// Creates broadcast activities' channels at APNs (`nil`: this server offers token delivery only).
    var channels: (any BroadcastChannelManagement)?
    /// The server's broadcast defaults.
    var broadcast = BroadcastSettings()
    /// The apps' broadcast defaults, read at most every few seconds: every new activity needs them.
    let appDefaults = AppDefaultsCache()
    var contracts: ContentContracts { ContentContracts(store: store) }

    /// An accepted update or end: its sequence, and the fields whose type changed (schema-less drift warnings).
    struct Accepted: Sendable {
        var sequence: AcceptedSequence
        var changes: [JSONShape.Change]
    }

    /// What a phone reports about its instance.
    enum InstanceReport: Sendable {
        case dismissed
        case ended
        case frequentPushes(enabled: Bool)
    }

    // MARK: Updates and ends

    /// Refuses a state of a remotely started activity that a start push could not carry: a phone of the start that has
    /// not started yet (its start was retried, or it was admitted later) gets its start with the newest state, its
    /// attributes and the start's alert, and APNs would refuse it (413), leaving the phone without its activity.
    static func validateStartRenderings(of next: LiveActivityState, for current: ActivityRecord, now: Date) throws(ValidationError) {
        guard let alert = current.startAlert, let attributesType = current.attributesType, let attributes = current.attributes else { return }
        do {
            try next.validateStartRenderings(attributesType: attributesType, attributes: attributes, alert: alert, now: now)
        } catch where error.code == "payload_too_large" {
            throw ValidationError(
                code: "payload_too_large",
                message: "This activity was started remotely, and a phone still waiting for its start gets the start push with the newest state, the activity's attributes and the start's alert: with this contentState that push would be too large for the push service. Send a smaller contentState.",
                field: "contentState"
            )
        }
    }

    /// Accepts `update`, as the backend posted it, as the activity's next sequence (creating the activity on first
    /// sight). Its `contentShape` is the lifecycle's to set. Under an idempotency key (`idempotency`), the Store
    /// remembers the accepted update with its response, or replays the response of the same update accepted before.
    func accept(
        _ update: ActivityUpdate, delivery requested: DeliveryRequest = DeliveryRequest(), idempotency: IdempotencyClaim<Accepted>? = nil
    ) async throws -> IdempotentOutcome<Accepted> {
        let now = clock.now()
        let current = try await store.activityWithoutInstanceCounts(appID: update.appID, activityID: update.activityID)
        if let current, current.state != .active { throw APIError.activityEnded(update.activityID) }
        let plan = try await deliveryPlan(requested, appID: update.appID, current: current)
        let checked = try await contracts.check(update.contentState, appID: update.appID, activity: current, remember: true)
        var staleDate = update.staleDate ?? staleness.staleDate(now: now, previous: current?.sequenceAt)
        // Under rate shaping a state reaches the phones up to one interval after it is accepted, and the next one an
        // interval after that: a default stale date reckoned from the accepts alone (updates every 10 s, an interval of
        // 6 minutes: stale after 2) showed the phones' fresh state as stale most of the time.
        if update.staleDate == nil, let interval = update.minUpdateInterval ?? current?.minUpdateInterval, interval > 0 {
            staleDate = max(staleDate, APIDate.epochSeconds(now) + Int64((2 * interval).rounded(.up)))
        }
        let next: LiveActivityState
        do {
            next = try LiveActivityState.update(
                activityID: update.activityID, after: current?.head, contentState: checked.contentState, staleDate: staleDate,
                relevanceScore: update.relevanceScore, alert: update.alert, now: now
            )
        } catch {
            throw Self.apiError(error, activityID: update.activityID)
        }
        try next.validateRenderings(now: now, delivery: plan.delivery, android: try await reachesAndroid(appID: update.appID, delivery: plan.delivery))
        if let current { try Self.validateStartRenderings(of: next, for: current, now: now) }
        try await prepareDelivery(plan, appID: update.appID, activityID: update.activityID)
        var accepting = update
        accepting.contentState = next.contentState
        accepting.staleDate = next.staleDate
        accepting.contentShape = checked.shape
        let changes = checked.changes
        let claim = idempotency?.pullback { (sequence: AcceptedSequence) in Accepted(sequence: sequence, changes: changes) }
        let outcome = try await Self.storing(update.activityID) { try await store.acceptUpdate(accepting, at: now, idempotency: claim) }
        return woken(outcome.map { Accepted(sequence: $0, changes: changes) })
    }

    /// Ends the activity with a final state (its current one unless `end` gives one), dismissed at `end.dismissalDate`
    /// (at most four hours ahead), or at once when `dismissingNow`; under an idempotency key as ``accept(_:idempotency:)``.
    func end(
        _ end: ActivityEnd, dismissingNow: Bool = false, idempotency: IdempotencyClaim<Accepted>? = nil
    ) async throws -> IdempotentOutcome<Accepted> {
        let now = clock.now()
        var end = end
        if dismissingNow { end.dismissalDate = APIDate.epochSeconds(now) }
        if let date = end.dismissalDate {
            guard date <= APIDate.epochSeconds(now) + Limits.maximumDismissalDelaySeconds else {
                throw ValidationError(
                    code: "invalid_dismissal_date",
                    message: "dismissalDate must be at most four hours from now; the system removes an ended Live Activity by then.",
                    field: "dismissalDate"
                )
            }
        }
        guard let current = try await store.activityWithoutInstanceCounts(appID: end.appID, activityID: end.activityID) else {
            throw APIError.activityNotFound(end.activityID)
        }
        guard current.state == .active else { throw APIError.activityEnded(end.activityID) }
        var changes: [JSONShape.Change] = []
        if let given = end.contentState {
            let checked = try await contracts.check(given, appID: end.appID, activity: current, remember: false)
            end.contentState = checked.contentState
            changes = checked.changes
        }
        let next: LiveActivityState?
        do {
            next = try LiveActivityState.end(
                activityID: end.activityID, after: current.head, contentState: end.contentState, staleDate: end.staleDate,
                relevanceScore: end.relevanceScore, alert: end.alert, dismissalDate: end.dismissalDate, now: now
            )
        } catch {
            throw Self.apiError(error, activityID: end.activityID)
        }
        guard let next else {
            throw ValidationError(
                code: "content_state_required", message: "This activity has no content state yet; end it with a final contentState.",
                field: "contentState"
            )
        }
        try next.validateRenderings(now: now, delivery: current.delivery, android: try await reachesAndroid(appID: end.appID, delivery: current.delivery))
        let ending = end
        let endChanges = changes
        let claim = idempotency?.pullback { (sequence: AcceptedSequence) in Accepted(sequence: sequence, changes: endChanges) }
        let outcome = try await Self.storing(end.activityID) { try await store.endActivity(ending, at: now, idempotency: claim) }
        return woken(outcome.map { Accepted(sequence: $0, changes: endChanges) })
    }

    /// Whether a state of an activity delivered as `delivery` may reach Android phones, whose FCM message must fit its
    /// limit: always for a token activity (no lookup on the common path; a token activity's APNs payload is held to
    /// 4,096 bytes anyway), and for a broadcast activity when the app has an Android package. An iOS-only app's
    /// broadcasts may then use all of Apple's 5,120 bytes.
    func reachesAndroid(appID: String, delivery: ActivityDelivery) async throws -> Bool {
        guard delivery == .broadcast else { return true }
        return try await store.app(id: appID)?.androidPackage != nil
    }

    /// The delivery a start or update leaves the activity with (``DeliveryPlan``), under the app's and the server's
    /// defaults.
    func deliveryPlan(_ requested: DeliveryRequest, appID: String, current: ActivityRecord?) async throws -> DeliveryPlan {
        var defaults = BroadcastDefaults()
        if (current?.sequence ?? 0) == 0, current?.channel == nil, requested.delivery == nil || requested.storagePolicy == nil {
            defaults = try await appDefaults.defaults(appID: appID, now: clock.now()) {
                try await store.app(id: appID)?.broadcastDefaults ?? BroadcastDefaults()
            }
        }
        return try DeliveryPlan.plan(requested, current: current, app: defaults, server: broadcast)
    }

    // MARK: Instances

    /// Registers or refreshes one device watching an activity; a new or rotated token is caught up at once.
    func register(_ registration: InstanceRegistration) async throws -> RegistrationResult {
        var registration = registration
        if let given = registration.attributes,
            let schema = try await contracts.schema(appID: registration.appID, attributesType: registration.attributesType)
        {
            registration.attributes = try schema.conform(attributes: given)
        }
        let result = try await Self.storing(registration.activityID) {
            try await store.registerInstance(registration, at: clock.now())
        }
        if result.needsDelivery { delivery.wake() }
        return result
    }

    /// Applies what a phone reports about its instance; under an idempotency key as ``accept(_:idempotency:)``.
    func report(
        _ report: InstanceReport, appID: String, activityID: String, deviceID: String,
        idempotency: IdempotencyClaim<InstanceRecord>? = nil
    ) async throws -> IdempotentOutcome<InstanceRecord> {
        let now = clock.now()
        do {
            switch report {
            case .dismissed, .ended:
                return try await store.recordInstanceEvent(
                    appID: appID, activityID: activityID, deviceID: deviceID,
                    event: { if case .dismissed = report { .dismissedOnDevice } else { .endedOnDevice } }(), at: now,
                    idempotency: idempotency
                )
            case .frequentPushes(let enabled):
                return try await store.setFrequentPushes(
                    appID: appID, activityID: activityID, deviceID: deviceID, enabled: enabled, at: now, idempotency: idempotency
                )
            }
        } catch StoreError.instanceNotFound {
            throw APIError.instanceNotFound(deviceID)
        }
    }

    /// Wakes the delivery engine after a write it has work from; a replay wrote nothing, and an update that created its
    /// activity left nothing to deliver (``AcceptedSequence/needsDelivery``).
    private func woken(_ outcome: IdempotentOutcome<Accepted>) -> IdempotentOutcome<Accepted> {
        if case .performed(let accepted) = outcome, accepted.sequence.needsDelivery { delivery.wake() }
        return outcome
    }

    // MARK: Refusals

    /// A refusal of Core's next-state rules as the API's error.
    private static func apiError(_ refusal: NextStateRefusal, activityID: String) -> any Error {
        switch refusal {
        case .activityEnded: APIError.activityEnded(activityID)
        }
    }

    /// Runs a Store write, with the refusals it can still make (a concurrent end) as API errors.
    private static func storing<T>(_ activityID: String, _ write: () async throws -> T) async throws -> T {
        do {
            return try await write()
        } catch StoreError.activityEnded {
            throw APIError.activityEnded(activityID)
        } catch StoreError.activityNotFound {
            throw APIError.activityNotFound(activityID)
        } catch StoreError.channelMismatch {
            throw APIError.channelMismatch
        }
    }
}
