import Foundation
import LivelineCore

/// An activity a dispatcher has claimed: its current sequence and what to send.
public struct DispatchClaim: Sendable, Hashable {
    /// The activity as of the claim.
    public var activity: ActivityRecord
    /// The app's iOS bundle id (APNs topics derive from it).
    public var bundleID: String
    /// The claim's holder.
    public var owner: String
    /// The app's own priority-10 budget, if it has one.
    public var budget: BudgetOverride = BudgetOverride()
    /// A remote start's audience waits to be admitted (``DispatchStore/admitStartAudience(appID:activityID:limit:at:)``).
    public var audienceWaiting = false
    /// The activity's pass counter as of the claim (raised by the claim of the activity, read by a slice's): the pass
    /// the marks of this claim's sends carry (``DeliveryMark``).
    public var pass: Int64 = 0
    /// The activity has marks of priority-10 pushes (``DispatchStore/priority10Marks(appID:activityID:since:)``), which
    /// count against its instances' budgets.
    public var priority10Marked = false
    /// The activity had marks of its sequence as of the claim (left by a pass that stopped, or by another slice): the
    /// pass's reads must consult them. Without, a pass reads its pages without them, and writes marks only behind
    /// its pages.
    public var sequenceMarked = true
    /// The activity had slices of a shared fan-out as of the claim (``DispatchStore/planSlices(appID:activityID:owner:below:platforms:size:now:consultingMarks:)``),
    /// left by a holder that stopped before they were all sent: the pass adopts them. Only the claim's holder plans
    /// slices, so none appear while it holds the claim. Without, a pass whose first page holds every instance it has to
    /// send, no more than a slice, sends them itself without asking the Store to plan (one statement fewer an activity).
    public var slicesLeft = true
    /// The app's stored credentials as of the claim, by provider: their version and health (a provider missing: none
    /// stored). A transport directory whose client was built from that version sends with it without reading them
    /// again. `nil`: not read with the claim.
    public var credentials: [CredentialProvider: CredentialsVersion]? = nil
}

/// Which of an app's stored credentials for one provider are current (``StoredCredentials/updatedAt``), and whether
/// they are marked refused, as a claim read them (``DispatchClaim/credentials``).
public struct CredentialsVersion: Sendable, Hashable {
    /// When they were stored: their version.
    public var updatedAt: Date
    /// Whether the provider took them (``StoredCredentials/healthy``).
    public var healthy: Bool

    public init(updatedAt: Date, healthy: Bool) {
        self.updatedAt = updatedAt
        self.healthy = healthy
    }
}

/// What an engine read after a pass that sent `sequence` under the claim of pass `pass`: no instance of the activity, of
/// any platform, waited for it (``DispatchStore/pendingInstanceCount(appID:activityID:below:platforms:after:through:)``).
/// The release then settles the activity at it: every instance that joined before the pass has it, whatever its row and
/// its marks say, and the marks of it may go.
public struct SettledPass: Sendable, Hashable {
    public var sequence: Int64
    public var pass: Int64
    /// When the engine read it.
    public var at: Date

    public init(sequence: Int64, pass: Int64, at: Date) {
        self.sequence = sequence
        self.pass = pass
        self.at = at
    }
}

extension DispatchStore {
    /// Releases the claim without a verified pass, its `retryAt` for whatever sequence is then the activity's
    /// (``releaseClaim(appID:activityID:owner:platforms:retryAt:claimedSequence:sendStart:verified:)``).
    @discardableResult
    public func releaseClaim(
        appID: String, activityID: String, owner: String, platforms: [Platform], retryAt: Date?, sendStart: SendStart?
    ) async throws -> Bool {
        try await releaseClaim(
            appID: appID, activityID: activityID, owner: owner, platforms: platforms, retryAt: retryAt, claimedSequence: nil,
            sendStart: sendStart, verified: nil
        )
    }
}

/// A run of instances one pass sent one sequence to, written in place of a row write an instance: every instance of
/// `platform` with a device id in `fromDevice ... throughDevice` whose ``InstanceRecord/joinedPass`` is below `pass`,
/// and that was deliverable when the pass read it, was sent `sequence` at `priority` at `sentAt` (seconds since 1970),
/// and the push service took it. Instances of the range the pass did not read (ended ones, ones sent the sequence
/// before, another platform's) are named by the range but not by the mark: the Store reads a mark only for an instance
/// it would send to.
public struct DeliveryMark: Sendable, Hashable {
    public var platform: Platform
    public var sequence: Int64
    public var pass: Int64
    public var fromDevice: String
    public var throughDevice: String
    public var priority: Int
    public var sentAt: Int64

    public init(platform: Platform, sequence: Int64, pass: Int64, fromDevice: String, throughDevice: String, priority: Int, sentAt: Int64) {
        self.platform = platform
        self.sequence = sequence
        self.pass = pass
        self.fromDevice = fromDevice
        self.throughDevice = throughDevice
        self.priority = priority
        self.sentAt = sentAt
    }

    /// Whether the mark speaks for `instance` (its platform and range, and a pass after the one it joined in). Device ids
    /// are compared by their bytes, as both stores compare them.
    public func covers(_ instance: InstanceRecord) -> Bool {
        covers(device: instance.deviceID, platform: instance.platform, joinedPass: instance.joinedPass)
    }

    /// ``covers(_:)`` for the instance of `device` on `platform` that joined in pass `joinedPass`.
    public func covers(device: String, platform: Platform, joinedPass: Int64) -> Bool {
        platform == self.platform && joinedPass < pass && !device.utf8.lexicographicallyPrecedes(fromDevice.utf8)
            && !throughDevice.utf8.lexicographicallyPrecedes(device.utf8)
    }
}

/// When pending work may next be claimed (``DispatchStore/nextClaimable()``).
public struct ClaimableTimes: Sendable, Hashable {
    /// The next pending activity or fan-out slice, whichever comes first; `nil`: nothing is pending.
    public var next: Date?
    /// The next slice of a shared fan-out not sent yet (now or earlier when nobody holds it); `nil`: none.
    public var slice: Date?

    public init(next: Date?, slice: Date?) {
        self.next = next
        self.slice = slice
    }
}

/// What a claim found (``DispatchStore/claimPendingActivity(owner:now:lease:platforms:)``) among the pending activities
/// due first: those with nothing behind their sequence, marked done, and the first with something to send, leased.
public struct PendingActivityClaim: Sendable, Hashable {
    /// The first activity looked at with something to send, leased to the claim's owner; `nil` when none had.
    public var claim: DispatchClaim?
    /// The activities looked at with nothing behind their sequence (no instance on the engine's platforms, no start
    /// audience, no broadcast, no slices), in the order they fell due: marked done, as a release after a pass that found
    /// nothing to send would, and leased to nobody. None when the first due had something behind: the claim then
    /// leased it and looked at no other.
    public var settled: [ActivityKey]
    /// Whether the claim may have left activities due for the next claims: one due after the first, when it leased the
    /// first at once; otherwise one it looked at with something to send besides the one it leased, or as many as a
    /// claim looks at (more may be due beyond them). When not, another worker looking at once would find nothing.
    public var leftPending: Bool

    /// Creates what a claim found.
    public init(claim: DispatchClaim?, settled: [ActivityKey], leftPending: Bool = true) {
        self.claim = claim
        self.settled = settled
        self.leftPending = leftPending
    }
}

/// What happened to one push attempt.
public enum DeliveryStatus: String, Sendable, Hashable, CaseIterable {
    /// The push service accepted the push.
    case delivered
    /// A retryable failure; another attempt follows or the activity is rescheduled.
    case retrying
    /// The push service said the token is gone; the instance is invalidated.
    case invalidated
    /// A terminal refusal; not retried.
    case rejected
    /// The app's credentials were refused.
    case credentialsRejected = "credentials_rejected"
}

/// One attempt to push one sequence to one instance.
public struct DeliveryRecord: Sendable, Hashable {
    /// Store-assigned, increasing id (0 before it is stored).
    public var id: Int64
    public var appID: String
    public var activityID: String
    public var deviceID: String
    public var platform: Platform
    public var sequence: Int64
    public var event: LiveActivityEvent
    public var priority: Int
    public var status: DeliveryStatus
    /// `apns-id` (or the FCM message name).
    public var providerID: String?
    /// The push service's reason, or a transport error.
    public var reason: String?
    public var latencyMilliseconds: Double?
    /// 1 for the first attempt.
    public var attempt: Int
    public var attemptedAt: Date
    /// A broadcast's channel: the attempt went to every subscriber of it (``deviceID`` is empty, and ``providerID``
    /// is the `apns-request-id`).
    public var channelID: String?

    public init(
        id: Int64 = 0, appID: String, activityID: String, deviceID: String, platform: Platform, sequence: Int64,
        event: LiveActivityEvent, priority: Int, status: DeliveryStatus, providerID: String?, reason: String?,
        latencyMilliseconds: Double?, attempt: Int, attemptedAt: Date, channelID: String? = nil
    ) {
        self.channelID = channelID
        self.id = id
        self.appID = appID
        self.activityID = activityID
        self.deviceID = deviceID
        self.platform = platform
        self.sequence = sequence
        self.event = event
        self.priority = priority
        self.status = status
        self.providerID = providerID
        self.reason = reason
        self.latencyMilliseconds = latencyMilliseconds
        self.attempt = attempt
        self.attemptedAt = attemptedAt
    }
}

/// One instance, as it was when a push went to it: progress applies only while the token is unchanged,
/// so a push to a token that rotated meanwhile never marks the new token as served.
public struct PushedInstance: Sendable, Hashable {
    public var deviceID: String
    public var token: String
    public var sequence: Int64

    public init(deviceID: String, token: String, sequence: Int64) {
        self.deviceID = deviceID
        self.token = token
        self.sequence = sequence
    }
}

/// What a dispatcher learned from one page of pushes, written in one transaction.
public struct DeliveryProgress: Sendable {
    public var appID: String
    public var activityID: String
    /// Instances that now have their `sequence` (a delivered sequence only ever rises), matched on the token pushed to:
    /// an instance that has another token by now keeps its delivered sequence.
    public var delivered: [PushedInstance]
    /// Instances whose `start` push (to the device's push-to-start or FCM token) was delivered: they have its
    /// `sequence` whatever token they hold by now. The phone may register the started activity's own update token
    /// before this is written, and the phone shows what the start carried, so that new token must not be sent it again.
    public var startsDelivered: [PushedInstance] = []
    /// Instances whose token the push service refused: they become `invalidated`.
    public var invalidated: [PushedInstance]
    /// Instances that received the activity's end: they become `ended`.
    public var endDelivered: [PushedInstance]
    /// Every attempt, for the timeline.
    public var attempts: [DeliveryRecord]
    /// Instances that received a priority-10 push: their new priority-10 tally.
    public var priority10Tallies: [(instance: PushedInstance, tally: Priority10Tally)] = []
    /// How many instances reached the warning share of their budget (a `budget.warning`).
    public var budgetWarnings = 0
    /// Tokens the push service refused as invalid, with its reason, that a device may hold: a start's push-to-start or
    /// FCM token, an Android phone's FCM token after any push. Whichever of the device's tokens equals one is dropped
    /// from it (kept with the reason and time, no longer used for starts); a token rotated since is left alone.
    public var refusedTokens: [(instance: PushedInstance, reason: String)] = []
    /// Lifecycle events the batch causes (`instance.invalidated`, `delivery.failed`, `budget.warning`), recorded in
    /// its transaction.
    public var events: [NewEvent] = []
    /// Runs of instances sent and taken, in place of their rows (``DeliveryMark``): the instances they cover are in
    /// neither ``delivered`` nor ``priority10Tallies``.
    public var marks: [DeliveryMark] = []

    public init(
        appID: String, activityID: String, delivered: [PushedInstance] = [], invalidated: [PushedInstance] = [],
        endDelivered: [PushedInstance] = [], attempts: [DeliveryRecord] = []
    ) {
        self.appID = appID
        self.activityID = activityID
        self.delivered = delivered
        self.invalidated = invalidated
        self.endDelivered = endDelivered
        self.attempts = attempts
    }
}

/// A push provider's credentials as stored: public settings as JSON, the secret sealed.
public struct StoredCredentials: Sendable, Hashable {
    public var appID: String
    /// The push service they are for.
    public var provider: CredentialProvider
    /// Non-secret settings (team id, key id, environment, base URL, CA certificate …).
    public var settings: JSONValue
    /// The secret (a .p8 key), sealed with AES-GCM under the master key. Never logged, never returned.
    public var sealedSecret: [UInt8]
    public var healthy: Bool
    public var healthReason: String?
    public var updatedAt: Date

    public init(
        appID: String, provider: CredentialProvider, settings: JSONValue, sealedSecret: [UInt8], healthy: Bool = true,
        healthReason: String? = nil, updatedAt: Date
    ) {
        self.appID = appID
        self.provider = provider
        self.settings = settings
        self.sealedSecret = sealedSecret
        self.healthy = healthy
        self.healthReason = healthReason
        self.updatedAt = updatedAt
    }
}

/// The delivery engine's view of the Store.
public protocol DispatchStore: Sendable {
    /// Looks at the pending activities due first (not claimed, or whose lease ran out, and not waiting for a retry): the
    /// first is leased to `owner` until `now + lease` when it has something behind its sequence for an engine sending to
    /// `platforms`; otherwise a few dozen at most are looked at, those with nothing behind (no instance, no start
    /// audience, no broadcast) are marked done in the same write, and the first with something behind is leased. `nil`
    /// when no activity is due.
    func claimPendingActivity(owner: String, now: Date, lease: TimeInterval, platforms: [Platform]) async throws -> PendingActivityClaim?
    /// When the next pending activity or fan-out slice may be claimed (now or earlier when one may be claimed at once:
    /// it waits for no retry and no other owner's lease), and when the next slice may, each `nil` when none is pending.
    /// A read: an idle engine asks it to know how long it may rest, without taking the writer.
    func nextClaimable() async throws -> ClaimableTimes
    /// Re-reads a claimed activity (to coalesce onto a newer sequence) and extends the lease.
    /// Returns nil when the claim was lost.
    func renewClaim(appID: String, activityID: String, owner: String, now: Date, lease: TimeInterval) async throws -> DispatchClaim?
    /// Re-reads a claimed activity without extending the lease (no write, so it never waits for one).
    /// Returns nil when `owner` no longer holds it or its lease ran out.
    func heldClaim(appID: String, activityID: String, owner: String, now: Date) async throws -> DispatchClaim?
    /// Active instances on `platforms` whose delivered sequence is below `sequence`, ordered by device id, after `cursor`
    /// and up to `last` (to the end when `nil`: a slice's end).
    ///
    /// `consultingMarks` false leaves the marks out (``DeliveryMark``): for a pass whose claim found no mark of its
    /// sequence (``DispatchClaim/sequenceMarked``), which writes marks only behind the pages it has read.
    func pendingInstances(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, through last: String?,
        limit: Int, consultingMarks: Bool
    ) async throws -> [InstanceRecord]
    /// How many instances ``pendingInstances(appID:activityID:below:platforms:after:through:limit:)`` would read, without
    /// a limit: the engine's count of a large pass, read once (a read, on the Store's reader).
    func pendingInstanceCount(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, through last: String?,
        consultingMarks: Bool
    ) async throws -> Int
    /// Records a batch's progress and attempts: in one transaction, or (on SQLite, when an acknowledged write arrives
    /// while it runs) in parts each whole on its own, so that the acknowledged write need not wait for all of it.
    func recordProgress(_ progress: DeliveryProgress, at now: Date) async throws
    /// Releases the claim. When nothing on the activity is behind its current sequence (no active instance on
    /// `platforms`, no start audience, no broadcast, no slices of a shared fan-out), the activity is done (returns true)
    /// until a newer sequence or a new token arrives; otherwise it stays pending and is not claimed again before
    /// `retryAt` (now when nil) — unless a newer sequence than `claimedSequence` (the one the claim was for) was
    /// accepted meanwhile: that one is due at once, as it would have been had the pass ended before it came, so that a
    /// phone left for a later pass never holds the others' next state back.
    ///
    /// `sendStart`, when the pass sent a new sequence, is recorded in the same write, for the activity's rate shaping
    /// (``ActivityRecord/lastSentSequence`` and ``ActivityRecord/lastSentAt``, as the next claim reads them). Nobody reads
    /// them while the claim is held, so they need no write of their own before the pass.
    ///
    /// `verified`, when the engine read after its pass that no instance waited for the sequence it sent: the activity
    /// settles at it, unless something came since (``SettledPass``).
    @discardableResult
    func releaseClaim(
        appID: String, activityID: String, owner: String, platforms: [Platform], retryAt: Date?, claimedSequence: Int64?,
        sendStart: SendStart?, verified: SettledPass?
    ) async throws -> Bool
    /// The marks of priority-10 pushes sent to the activity's instances since `since` (seconds since 1970), oldest
    /// first: with an instance's own tally, its priority-10 pushes of the last hour (``Priority10MarkIndex``).
    /// A read.
    func priority10Marks(appID: String, activityID: String, since: Int64) async throws -> [DeliveryMark]
    /// At start-up, drops the claims (on activities and slices) a crashed process left: every claim on a store only this process uses (SQLite);
    /// none on a store several nodes share (PostgreSQL), where a dead node's claims run out with their lease.
    func releaseAllClaims() async throws
    /// Hands back a claim without sending: the activity is due again at `until` — unless a newer sequence than
    /// `sequence` arrived meanwhile, which is due at once (it may be an end).
    func deferClaim(appID: String, activityID: String, owner: String, sequence: Int64, until: Date) async throws
    /// Admits the next page (at most `limit` devices) of the claimed activity's oldest start audience not yet admitted:
    /// each device with a usable token for the start's attributes type becomes a `starting` instance (devices already
    /// watching the activity are left as they are). Returns whether any audience remains to be admitted.
    func admitStartAudience(appID: String, activityID: String, limit: Int, at now: Date) async throws -> Bool

    // MARK: Shared fan-outs

    /// Cuts the claimed activity's instances behind `sequence` on `platforms` into slices of `size` by device id, so
    /// that the engines of every node sharing the Store send one fan-out together (``claimSlice(owner:now:lease:of:)``).
    /// Only the holder of the activity's claim plans. When the activity has slices already (planned by a holder that
    /// died), they are kept as they are. Returns how many slices the activity has: 0 when `owner` does not hold the
    /// claim, or when its pending instances fit in one slice (the holder sends them alone).
    ///
    /// `consultingMarks` false counts the pending instances without the marks (``DeliveryMark``): for a holder whose
    /// claim found no mark of `sequence` (``DispatchClaim/sequenceMarked``). None can have appeared since: only the
    /// holder sends the activity outside slices, and slices left by a holder that died are kept, not counted.
    func planSlices(
        appID: String, activityID: String, owner: String, below sequence: Int64, platforms: [Platform], size: Int, now: Date,
        consultingMarks: Bool
    ) async throws -> Int
    /// Claims one slice not yet sent (unclaimed, or whose lease ran out) — only `activity`'s when given — leasing it to
    /// `owner` until `now + lease`, with the activity as it is now (its newest state is what the slice sends).
    func claimSlice(owner: String, now: Date, lease: TimeInterval, of activity: ActivityKey?) async throws -> SliceClaim?
    /// Extends a slice's lease; false when `owner` no longer holds it.
    func renewSlice(_ slice: FanOutSlice, owner: String, now: Date, lease: TimeInterval) async throws -> Bool
    /// The slice's activity as it is now, while `owner` holds the slice (a read; nil when the slice was lost).
    func heldSlice(_ slice: FanOutSlice, owner: String, now: Date) async throws -> DispatchClaim?
    /// Ends `owner`'s claim on a slice: with its outcome once it was sent, or — `nil` — handed back unsent (the engine
    /// stopped), for another engine to claim. `completed`: the sequence its pass sent to every instance of its range that
    /// waited, for every platform, with nothing left to retry (the slice's share of a complete pass, ``SettledPass``);
    /// `nil` when it cannot say so.
    func finishSlice(_ slice: FanOutSlice, owner: String, outcome: SliceOutcome?, completed: Int64?) async throws
    /// The outcome of each of the activity's slices, `nil` for one not sent yet.
    func sliceOutcomes(appID: String, activityID: String) async throws -> [SliceOutcome?]
    /// The lowest sequence the activity's slices were each completed with (``finishSlice(_:owner:outcome:completed:)``),
    /// when every one of them was; `nil` when one was not, or there are none.
    func slicesCompleted(appID: String, activityID: String) async throws -> Int64?
    /// Drops the activity's slices once they are all sent: only the holder of the activity's claim (`owner`) does.
    func dropSlices(appID: String, activityID: String, owner: String) async throws
}

/// When a pass began sending a sequence of its activity: what the activity's rate shaping spaces the next one from,
/// recorded as the claim is released (``DispatchStore/releaseClaim(appID:activityID:owner:platforms:retryAt:sendStart:)``).
public struct SendStart: Sendable, Hashable {
    /// The activity's sequence the pass sent.
    public var sequence: Int64
    /// When it began sending it.
    public var at: Date

    /// Creates the record of a send's start.
    public init(sequence: Int64, at: Date) {
        self.sequence = sequence
        self.at = at
    }
}

extension DispatchStore {
    /// Releases the claim after a pass that sent no new sequence
    /// (``releaseClaim(appID:activityID:owner:platforms:retryAt:sendStart:)`` without a send's start).
    @discardableResult
    public func releaseClaim(appID: String, activityID: String, owner: String, platforms: [Platform], retryAt: Date?) async throws -> Bool {
        try await releaseClaim(appID: appID, activityID: activityID, owner: owner, platforms: platforms, retryAt: retryAt, sendStart: nil)
    }

    /// Active instances on `platforms` whose delivered sequence is below `sequence`, ordered by device id, after `cursor`.
    public func pendingInstances(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, limit: Int
    ) async throws -> [InstanceRecord] {
        try await pendingInstances(appID: appID, activityID: activityID, below: sequence, platforms: platforms, after: cursor, through: nil, limit: limit)
    }

    /// The pending instances, the marks consulted (``pendingInstances(appID:activityID:below:platforms:after:through:limit:consultingMarks:)``).
    public func pendingInstances(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, through last: String?,
        limit: Int
    ) async throws -> [InstanceRecord] {
        try await pendingInstances(
            appID: appID, activityID: activityID, below: sequence, platforms: platforms, after: cursor, through: last, limit: limit,
            consultingMarks: true
        )
    }

    /// Cuts the claimed activity's pending instances into slices, the marks consulted
    /// (``planSlices(appID:activityID:owner:below:platforms:size:now:consultingMarks:)``).
    public func planSlices(
        appID: String, activityID: String, owner: String, below sequence: Int64, platforms: [Platform], size: Int, now: Date
    ) async throws -> Int {
        try await planSlices(
            appID: appID, activityID: activityID, owner: owner, below: sequence, platforms: platforms, size: size, now: now,
            consultingMarks: true
        )
    }

    /// How many instances wait, the marks consulted (``pendingInstanceCount(appID:activityID:below:platforms:after:through:consultingMarks:)``).
    public func pendingInstanceCount(
        appID: String, activityID: String, below sequence: Int64, platforms: [Platform], after cursor: String?, through last: String?
    ) async throws -> Int {
        try await pendingInstanceCount(
            appID: appID, activityID: activityID, below: sequence, platforms: platforms, after: cursor, through: last, consultingMarks: true
        )
    }
}

/// One slice of a shared fan-out: the pending instances of one activity whose device ids come after `after` (from the
/// first when `nil`), up to and including `through` (to the last when `nil`).
public struct FanOutSlice: Sendable, Hashable {
    /// The activity's app.
    public var appID: String
    /// The activity.
    public var activityID: String
    /// The slice's place in the activity's plan, from 0.
    public var index: Int
    /// The device id the slice starts after (`nil`: from the first).
    public var after: String?
    /// The last device id of the slice (`nil`: to the last).
    public var through: String?

    /// Creates a slice.
    public init(appID: String, activityID: String, index: Int, after: String?, through: String?) {
        self.appID = appID
        self.activityID = activityID
        self.index = index
        self.after = after
        self.through = through
    }
}

extension DispatchStore {
    /// Ends `owner`'s claim on a slice, without saying that its pass completed it.
    public func finishSlice(_ slice: FanOutSlice, owner: String, outcome: SliceOutcome?) async throws {
        try await finishSlice(slice, owner: owner, outcome: outcome, completed: nil)
    }
}

/// A claimed slice and its activity as of the claim.
public struct SliceClaim: Sendable, Hashable {
    /// The slice.
    public var slice: FanOutSlice
    /// Its activity, owned (for the slice only) by the slice's holder.
    public var claim: DispatchClaim
}

/// How a slice's pass ended, as the engine that sent it records it for the activity's claim holder.
public enum SliceOutcome: String, Sendable, Hashable, CaseIterable {
    /// Every instance of the slice is done for the sequence sent.
    case done
    /// Some instances still failed after their retries: the activity is tried again after the pass-retry delay.
    case retryLater = "retry_later"
    /// The Store failed during the slice's pass: the activity is tried again soon.
    case storeFailed = "store_failed"
}

/// Who does the housekeeping (lifetime sweeps, purges, pruning of old rows) when several nodes share the database: one
/// node at a time.
public protocol HousekeepingStore: Sendable {
    /// Whether this process does the housekeeping now. Always, on a store only this process uses (SQLite). On a
    /// database several nodes share (PostgreSQL), only for the node holding the housekeeping lease: the call takes it
    /// when it is free or has run out, renews it when this node holds it, and a dead node's lease runs out after
    /// ``housekeepingLease``.
    func leadsHousekeeping(at now: Date) async throws -> Bool
}

/// How long a node's housekeeping lease lasts from its last renewal.
public let housekeepingLease: TimeInterval = 300

/// The delivery timeline: every push attempt, recorded by ``DispatchStore/recordProgress(_:at:)``, read by the API
/// and kept bounded by the engine.
public protocol TimelineStore: HousekeepingStore {
    /// The delivery timeline of an activity, newest first, after `cursor`.
    func deliveries(appID: String, activityID: String, cursor: String?, limit: Int) async throws -> Page<DeliveryRecord>
    /// Keeps the timeline bounded: drops attempts older than `olderThan` and all but the newest `keepPerActivity` per activity.
    func pruneDeliveries(olderThan: Date, keepPerActivity: Int) async throws
    /// Forgets the marks sent before `cutoff` whose activity has settled at their sequence or a later one: the
    /// settled sequence speaks for them, and their priority-10 pushes count no longer.
    func pruneDeliveryMarks(sentBefore cutoff: Date) async throws
    /// Drops all but the newest `keepNewest` attempts of one activity: after a pass that recorded that many or more,
    /// so that a large fan-out's timeline is trimmed as it grows rather than all at once by the next periodic prune.
    func pruneDeliveries(appID: String, activityID: String, keepNewest: Int) async throws
}

/// Apps' provider credentials at rest (sealed by the caller) and their health.
public protocol CredentialStore: Sendable {
    /// Saves (replaces) an app's credentials for one provider.
    func saveCredentials(_ credentials: StoredCredentials) async throws
    /// An app's credentials for one provider, or nil.
    func credentials(appID: String, provider: CredentialProvider) async throws -> StoredCredentials?
    /// Records whether the provider accepted the credentials.
    func setCredentialsHealth(appID: String, provider: CredentialProvider, healthy: Bool, reason: String?, at now: Date) async throws
    /// The database's master-key check (``CredentialSealer/sealCheck()``): the one stored, or `proposed`, stored now
    /// when there was none. Whoever stores it first decides, so nodes starting at once agree.
    func masterKeyCheck(proposing proposed: [UInt8]) async throws -> [UInt8]
    /// The database's master-key check, or `nil` while none is stored.
    func storedMasterKeyCheck() async throws -> [UInt8]?
}
