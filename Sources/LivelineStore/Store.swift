import Foundation
import LivelineCore

/// Where Liveline keeps apps, keys, devices, activities and instances: every role below, with a health check and a close.
///
/// Shaped by the domain, not by SQL: implementations (SQLite, later PostgreSQL) are
/// interchangeable and one conformance suite runs on all of them. Every method that changes
/// data commits before it returns, so a caller can promise durability.
///
/// Each caller asks only for the roles it uses: the delivery engine for ``DispatchStore`` and ``TimelineStore``, the
/// push transports for ``CredentialStore`` and ``AppStore``, the lifetime sweeper for ``LifetimeStore``, the
/// activity lifecycle for ``LifecycleStore`` and ``SchemaStore``, the devices API and remote starts for ``DeviceStore``.
public protocol Store: AppStore, LifecycleStore, LifetimeStore, SchemaStore, DispatchStore, TimelineStore, CredentialStore, DeviceStore,
    BroadcastStore, EventStore, WebhookStore
{
    /// Checks that the database answers.
    func ping() async throws

    /// Closes the store; no call may follow.
    func close() async throws

    /// The numbers the app `appID` sees in place of the counters all apps share (``PublicNumbers``): in its event ids,
    /// its feed's cursors and the ids of its deliveries.
    func publicNumbers(appID: String) -> PublicNumbers
}

/// Apps, their keys and their budgets.
public protocol AppStore: Sendable {
    /// Creates an app with its first keys.
    func createApp(_ app: AppRecord, keys: [APIKeyRecord]) async throws
    /// Every app, oldest first.
    func apps() async throws -> [AppRecord]
    /// One app, or `nil`.
    func app(id: String) async throws -> AppRecord?
    /// Revokes every key of the app and stores `keys` in their place. Throws `appNotFound`.
    func replaceKeys(appID: String, with keys: [APIKeyRecord]) async throws
    /// Sets (or, with `nil` parts, clears) the app's own priority-10 budget. Throws `appNotFound`.
    func setBudget(appID: String, _ budget: BudgetOverride) async throws
    /// Sets who may set the app's devices' audience fields (``AudienceSource``). Throws `appNotFound`.
    func setAudienceFrom(appID: String, _ source: AudienceSource) async throws
    /// The live key with this lookup id, or `nil`.
    func apiKey(id: String) async throws -> APIKeyRecord?
    /// Deletes the app and everything it owns, in one transaction: its keys, credentials, schemas, activities (with
    /// their instances, start audiences and timelines), devices (with their tags and push-to-start tokens),
    /// idempotency keys, lifecycle events and webhooks (with their deliveries). While the app still holds broadcast
    /// channels at APNs it refuses (``StoreError/channelsHeld(count:)``), unless `leavingChannels`. Returns what went, or
    /// `nil` when there is no such app.
    func deleteApp(id: String, leavingChannels: Bool) async throws -> AppDeletion?
}

extension AppStore {
    /// Those of `appIDs` that are no longer apps in the Store: deleted, perhaps by another node (the transport
    /// directories close their clients).
    public func deletedApps(among appIDs: some Sequence<String>) async throws -> [String] {
        var deleted: [String] = []
        for appID in appIDs {
            if try await app(id: appID) == nil { deleted.append(appID) }
        }
        return deleted
    }
}

/// Activities and their instances: what the lifecycle accepts and the API reads.
public protocol LifecycleStore: Sendable {
    /// Registers or refreshes one instance; creates the activity on first sight.
    /// Throws `activityEnded` for an ended activity.
    func registerInstance(_ registration: InstanceRegistration, at now: Date) async throws -> RegistrationResult
    /// Accepts a new content state as the activity's next sequence; creates the activity on
    /// first sight. Throws `activityEnded`. O(1) writes whatever the number of instances.
    func acceptUpdate(_ update: ActivityUpdate, at now: Date) async throws -> AcceptedSequence
    /// Accepts a remote start as the activity's next sequence (creating the activity on first sight) and keeps its
    /// audience, counted, for the delivery engine to admit: O(1) writes whatever the audience's size. Throws
    /// `activityEnded`, or `attributesTypeMismatch` when the activity has state already and another attributes type
    /// (a type only phones' registrations gave is replaced by the start's).
    func startActivity(_ start: ActivityStart, at now: Date) async throws -> AcceptedStart
    /// Remotely started instances still `starting` (not confirmed by their phone) since `cutoff` or longer: how many, and
    /// the `limit` oldest.
    func unconfirmedStarts(appID: String, activityID: String, startedBefore cutoff: Date, limit: Int) async throws -> UnconfirmedStarts
    /// Ends the activity as its next sequence. Throws `activityNotFound` or `activityEnded`.
    func endActivity(_ end: ActivityEnd, at now: Date) async throws -> AcceptedSequence
    /// One activity without its instance counts (left empty), or `nil`: one row, for the write path.
    func activityWithoutInstanceCounts(appID: String, activityID: String) async throws -> ActivityRecord?
    /// One activity with its instance counts, or `nil`.
    func activity(appID: String, activityID: String) async throws -> ActivityRecord?
    /// Activities of one app ordered by id, after `cursor`.
    func activities(appID: String, filter: ActivityFilter, cursor: String?, limit: Int) async throws -> Page<ActivityRecord>
    /// Instances of one activity ordered by device id, after `cursor`.
    func instances(appID: String, activityID: String, cursor: String?, limit: Int) async throws -> Page<InstanceRecord>
    /// Applies a device-reported event. Throws `instanceNotFound`.
    func recordInstanceEvent(
        appID: String, activityID: String, deviceID: String, event: InstanceEvent, at now: Date
    ) async throws -> InstanceRecord
    /// Records the app's "frequent updates" setting for one instance. Throws `instanceNotFound`.
    func setFrequentPushes(
        appID: String, activityID: String, deviceID: String, enabled: Bool, at now: Date
    ) async throws -> InstanceRecord

    /// The priority-10 history of the activity's active iOS instances, for its budget report.
    func priority10Usage(appID: String, activityID: String) async throws -> [Priority10Usage]

    // Writes that may carry an idempotency key: each takes the key's decision and remembers an accepted request with
    // its response in the transaction of the write (``IdempotencyClaim``). Without a claim they are the writes above.
    // A replay changes nothing; another request under a remembered key throws `idempotencyKeyReused`.

    /// ``acceptUpdate(_:at:)`` under an idempotency key.
    func acceptUpdate(
        _ update: ActivityUpdate, at now: Date, idempotency: IdempotencyClaim<AcceptedSequence>?
    ) async throws -> IdempotentOutcome<AcceptedSequence>
    /// ``startActivity(_:at:)`` under an idempotency key.
    func startActivity(
        _ start: ActivityStart, at now: Date, idempotency: IdempotencyClaim<AcceptedStart>?
    ) async throws -> IdempotentOutcome<AcceptedStart>
    /// ``endActivity(_:at:)`` under an idempotency key.
    func endActivity(
        _ end: ActivityEnd, at now: Date, idempotency: IdempotencyClaim<AcceptedSequence>?
    ) async throws -> IdempotentOutcome<AcceptedSequence>
    /// ``recordInstanceEvent(appID:activityID:deviceID:event:at:)`` under an idempotency key.
    func recordInstanceEvent(
        appID: String, activityID: String, deviceID: String, event: InstanceEvent, at now: Date,
        idempotency: IdempotencyClaim<InstanceRecord>?
    ) async throws -> IdempotentOutcome<InstanceRecord>
    /// ``setFrequentPushes(appID:activityID:deviceID:enabled:at:)`` under an idempotency key.
    func setFrequentPushes(
        appID: String, activityID: String, deviceID: String, enabled: Bool, at now: Date,
        idempotency: IdempotencyClaim<InstanceRecord>?
    ) async throws -> IdempotentOutcome<InstanceRecord>
    /// What the app's idempotency key holds, if anything, whatever its age (``IdempotencyRecord/decision(for:now:)``
    /// applies the retention): read before a keyed request is validated, so a retry is answered even when the request
    /// would now be refused.
    func idempotencyRecord(appID: String, key: String) async throws -> IdempotencyRecord?
}

/// What the lifetime sweeper finds and changes: activities and instances past the platform's limits.
public protocol LifetimeStore: HousekeepingStore {
    /// Active activities first seen at or before `cutoff` whose first instance (if they have one) registered at or
    /// before `cutoff` too, oldest first.
    func activitiesActive(since cutoff: Date, limit: Int) async throws -> [ActivityKey]
    /// Active activities that had instances and have none left that is active, starting or invalidated (an invalidated
    /// instance comes back when the phone registers the activity's new token).
    func activitiesWithAllInstancesGone(limit: Int) async throws -> [ActivityKey]
    /// Marks active instances registered at or before `cutoff` as ended (the platform has ended them); returns how many.
    func endInstances(registeredBefore cutoff: Date, at now: Date) async throws -> Int
    /// Deletes activities that ended at or before `cutoff`, with their instances and timeline; returns how many.
    func purgeActivities(endedBefore cutoff: Date) async throws -> Int
    /// Forgets the requests remembered under idempotency keys that were accepted before `cutoff`; returns how many.
    func pruneIdempotencyKeys(olderThan cutoff: Date) async throws -> Int
}

/// The content-state contracts of attributes types.
public protocol SchemaStore: Sendable {
    /// Registers (or replaces) the schema of an attributes type. Throws `appNotFound`.
    func saveSchema(appID: String, attributesType: String, schema: JSONValue, at now: Date) async throws -> StoredSchema
    /// The schema registered for an attributes type, or `nil`.
    func schema(appID: String, attributesType: String) async throws -> StoredSchema?
}

/// An app's installations ("devices"): who they belong to, their tags, and the tokens that start Live Activities remotely
/// (iOS push-to-start tokens per attributes type, Android FCM tokens). Every method is keyed by the app: one app never
/// sees another's devices, even under the same device id.
public protocol DeviceStore: Sendable {
    /// Registers or refreshes a device (idempotent): creates it on first sight, otherwise applies what the registration
    /// gives and keeps the rest. Push-to-start tokens merge per attributes type, and a token given again clears its drop;
    /// a new FCM token clears the FCM token's drop. Nothing changes (not even `updatedAt`) when nothing differs.
    /// Synced to disk before it returns. Throws `platformMismatch` when the device exists with another platform.
    func putDevice(_ registration: DeviceRegistration, at now: Date) async throws -> (device: DeviceRecord, created: Bool)
    /// One device with its tokens, usable and dropped, or `nil`.
    func device(appID: String, deviceID: String) async throws -> DeviceRecord?
    /// The app's devices that pass `filter`, ordered by device id, after `cursor`. Throws `invalidCursor`.
    func devices(appID: String, filter: DeviceFilter, cursor: String?, limit: Int) async throws -> Page<DeviceRecord>
    /// Deletes a device with its tags and push-to-start tokens; `false` when there was none. Its remote starts that
    /// have not gone out yet (instances `starting`, nothing delivered) are withdrawn: they end, with an `instance.ended`
    /// event (`reportedBy` `backend`, `reason` `device_deleted`). Its other instances are the activities' own.
    func deleteDevice(appID: String, deviceID: String, at now: Date) async throws -> Bool
    /// Marks whichever of the device's tokens equals `token` (a push-to-start token of any attributes type, or the FCM
    /// token) as dropped, with the push service's `reason`: the engine calls it when APNs answers 410 / `BadDeviceToken`
    /// or FCM `UNREGISTERED`. The token is kept, to show why and when. A token the device has since replaced is left
    /// alone, and a drop already recorded keeps its first time. Bookkeeping durability: a lost drop is learnt again on
    /// the next start.
    func dropDeviceToken(appID: String, deviceID: String, token: String, reason: String, at now: Date) async throws
}
