import Foundation
import LivelineCore

/// The decision of ``SQLStore/registerInstance(_:at:)`` for many registrations at once, apart from the I/O: what a set
/// of registrations sharing one transaction writes, given the activities and instances its reads found.
///
/// The set decides the common case, a device new to its activity, exactly as the registration's own body does, as if
/// the registrations ran one after another in the order given: the first registration to an unknown activity creates
/// it (the ones after it find it), a registration naming another channel than its activity's, or to an ended activity,
/// is refused, and one to an activity with accepted state is caught up. It leaves to the body (``SetWriteOutcome/alone``)
/// what it does not decide: a device that already has an instance (a new token, a confirmed start) or that comes
/// twice, and the attributes of an activity created earlier without them. The same registration again, the most
/// common of all (an app registers its token at every launch), it answers itself once its instance has been read
/// under its lock (``unchangedCandidates``, ``answerUnchanged(_:)``): the body would write nothing.
struct RegistrationSet {
    /// An instance, by its key.
    struct InstanceKey: Hashable, Sendable {
        var appID: String
        var activityID: String
        var deviceID: String
    }

    /// What a registration's decisions rest on in its activity's row.
    struct FoundActivity: Hashable, Sendable {
        var state: ActivityState
        var attributesType: String?
        var sequence: Int64
        var channelID: String?
    }

    /// An activity the set creates, with the attributes of its first registration that carries them, at the time of
    /// its first registration.
    struct NewActivity: Hashable, Sendable {
        var key: ActivityKey
        var attributesType: String?
        var attributes: JSONValue?
        var nowMillis: Int
    }

    /// A registration, and the time it is made at (milliseconds since 1970).
    struct Member: Hashable, Sendable {
        var registration: InstanceRegistration
        var nowMillis: Int
    }

    /// The set's decision for one registration: written, a new instance (its ``RegistrationResult/change`` is
    /// ``RegistrationChange/created``).
    typealias Decision = SetWriteOutcome<RegistrationResult>

    /// One decision per registration, in the order given.
    private(set) var decisions: [Decision] = []
    /// The activities to create, in the order of their first registration.
    private(set) var newActivities: [NewActivity] = []
    /// The instances to insert, in order.
    private(set) var newInstances: [Member] = []
    /// The activities with accepted state that new instances joined: each is made pending, so they are caught up.
    private(set) var catchingUp: [ActivityKey] = []
    /// The events to record, each at its registration's time, in order.
    private(set) var events: [(event: NewEvent, nowMillis: Int)] = []
    /// The members (by index) left to their bodies whose devices have instances already and come once in the set: the
    /// ones ``answerUnchanged(_:)`` may answer. (A device that comes twice keeps its bodies, which run in order.)
    private(set) var unchangedCandidates: [Int] = []
    /// The registrations decided, in order, and their activities' rows as found: what ``answerUnchanged(_:)`` decides on.
    private let members: [Member]
    private let found: [ActivityKey: FoundActivity]

    /// The registrations of ``unchangedCandidates``, in order: the devices whose instances are read for
    /// ``answerUnchanged(_:)``.
    var unchangedRegistrations: [InstanceRegistration] { unchangedCandidates.map { members[$0].registration } }

    /// Decides `members`, in order: `activities` holds the rows found of their activities (by key; an activity missing
    /// from it does not exist), `existing` the instances found of their devices.
    init(_ members: [Member], activities found: [ActivityKey: FoundActivity], existing: Set<InstanceKey>) {
        self.members = members
        self.found = found
        var activities = found
        var instances = existing
        var catchingUp = Set<ActivityKey>()
        let times = Dictionary(members.map { (Self.key(of: $0.registration), 1) }, uniquingKeysWith: +)
        for (index, member) in members.enumerated() {
            let r = member.registration
            let key = ActivityKey(appID: r.appID, activityID: r.activityID)
            let instanceKey = Self.key(of: r)
            guard !instances.contains(instanceKey) else {
                if existing.contains(instanceKey), times[instanceKey] == 1 { unchangedCandidates.append(index) }
                decisions.append(.alone)
                continue
            }
            let activity = activities[key]
            // A phone subscribed to a channel names the activity's own.
            if let channelID = r.channelID, activity?.channelID != channelID {
                decisions.append(.refused(.channelMismatch))
                continue
            }
            if let activity {
                if activity.state == .ended {
                    decisions.append(.refused(.activityEnded))
                    continue
                }
                if activity.attributesType == nil, r.attributesType != nil {
                    // Attributes come from the first registration that carries them: of an activity this set creates,
                    // they are part of its insert; an existing row is updated by the body.
                    guard let index = newActivities.firstIndex(where: { $0.key == key }) else {
                        decisions.append(.alone)
                        continue
                    }
                    newActivities[index].attributesType = r.attributesType
                    newActivities[index].attributes = r.attributes
                    activities[key]?.attributesType = r.attributesType
                }
            } else {
                newActivities.append(
                    NewActivity(key: key, attributesType: r.attributesType, attributes: r.attributes, nowMillis: member.nowMillis)
                )
                activities[key] = FoundActivity(state: .active, attributesType: r.attributesType, sequence: 0, channelID: nil)
            }
            // A newcomer to an activity with accepted state is caught up (a channel subscriber by the channel).
            let catchUp = (activity?.sequence ?? 0) > 0 && r.channelID == nil
            if catchUp, catchingUp.insert(key).inserted { self.catchingUp.append(key) }
            instances.insert(instanceKey)
            newInstances.append(member)
            events.append((SQLStore.registrationEvent(r, confirmedStart: false), member.nowMillis))
            let instance = SQLStore.newInstance(r, nowMillis: member.nowMillis)
            decisions.append(.done(RegistrationResult(change: .created, instance: instance, needsDelivery: catchUp)))
        }
    }

    /// Answers the candidates (``unchangedCandidates``) whose registrations change nothing of their instances as
    /// `instances` holds them (read under their locks, by key) in their activities' rows (as the set read them under
    /// theirs): ``RegistrationChange/unchanged``, with the instance, as the body would answer. The others stay with
    /// their bodies.
    mutating func answerUnchanged(_ instances: [InstanceKey: InstanceRecord]) {
        for index in unchangedCandidates {
            let r = members[index].registration
            guard let instance = instances[Self.key(of: r)], let activity = found[ActivityKey(appID: r.appID, activityID: r.activityID)],
                Self.changesNothing(r, instance: instance, activity: activity)
            else { continue }
            decisions[index] = .done(RegistrationResult(change: .unchanged, instance: instance))
        }
    }

    /// Whether `registration` changes nothing of `instance` in `activity`, so that its body (``SQLStore/registerInstance(_:at:)``)
    /// would write nothing and answer ``RegistrationChange/unchanged``: an activity that has not ended, takes the
    /// registration's channel (if it names one) and needs no attributes from it; the instance on the same platform, at
    /// the same token and channel, with no user id other than the one given, and neither started remotely and awaiting
    /// its token nor refused by its push service (a registration then writes). Anything else is the body's to decide.
    static func changesNothing(_ registration: InstanceRegistration, instance: InstanceRecord, activity: FoundActivity) -> Bool {
        let r = registration
        guard activity.state != .ended, r.channelID == nil || r.channelID == activity.channelID,
            activity.attributesType != nil || r.attributesType == nil
        else { return false }
        return instance.platform == r.platform && instance.pushToken == r.pushToken && instance.channelID == r.channelID
            && instance.state != .starting && instance.state != .invalidated && (r.userID == nil || r.userID == instance.userID)
    }

    /// The key of `registration`'s instance.
    static func key(of registration: InstanceRegistration) -> InstanceKey {
        InstanceKey(appID: registration.appID, activityID: registration.activityID, deviceID: registration.deviceID)
    }
}
