import Foundation

/// Apple's budget for priority-10 Live Activity pushes, and the rule that keeps each instance inside it.
///
/// iOS throttles a Live Activity that receives too many priority-10 pushes: beyond a budget Apple does not
/// publish, pushes arrive late or not at all. Liveline counts priority-10 pushes per instance over the last hour
/// (``Priority10Tally``: per quarter of an hour, so a push counts for 60 to 75 minutes) and sends ordinary updates at
/// priority 10 only while the instance is within its budget — a higher one when the app reported that the user enabled
/// frequent updates (`NSSupportsLiveActivitiesFrequentUpdates`) — and at 5 beyond it. Alerts and ends always go at 10,
/// and an explicit caller priority is honoured; both are counted.
public struct PriorityBudget: Sendable, Hashable {
    /// Priority-10 pushes per instance per hour (as ``Priority10Tally`` counts them).
    public var hourly: Int
    /// The same, for an instance whose app reported frequent updates enabled.
    public var hourlyWithFrequentPushes: Int
    /// Share of the budget at which an activity's instances are reported (`budget.warning`).
    public var warningShare: Double

    /// The conservative defaults: 10 an hour, 40 with frequent updates, a warning at 80 %.
    public init(hourly: Int = 10, hourlyWithFrequentPushes: Int = 40, warningShare: Double = 0.8) {
        self.hourly = max(0, hourly)
        self.hourlyWithFrequentPushes = max(self.hourly, hourlyWithFrequentPushes)
        self.warningShare = min(1, max(0, warningShare))
    }

    /// The window the budget counts over.
    public static let window: Int64 = 3600

    /// The instance's hourly budget.
    public func limit(frequentPushes: Bool?) -> Int {
        frequentPushes == true ? hourlyWithFrequentPushes : hourly
    }

    /// The priority of a push to one instance.
    ///
    /// - Parameters:
    ///   - requested: the priority the caller gave the update, if any (honoured).
    ///   - used: priority-10 pushes the instance received in the last hour.
    public func priority(event: LiveActivityEvent, hasAlert: Bool, requested: Int?, used: Int, frequentPushes: Bool?) -> Int {
        if event == .end || hasAlert { return 10 }
        if let requested { return requested }
        return used < limit(frequentPushes: frequentPushes) ? 10 : 5
    }

    /// Whether an instance that has used `used` is at or past the warning share of its budget.
    public func warns(used: Int, frequentPushes: Bool?) -> Bool {
        let limit = limit(frequentPushes: frequentPushes)
        return limit > 0 && Double(used) >= Double(limit) * warningShare
    }
}
