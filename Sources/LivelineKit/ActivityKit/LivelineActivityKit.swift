#if canImport(ActivityKit)
import ActivityKit
import Foundation

// The ActivityKit adapter. It only maps ActivityKit's sequences onto the core's protocols
// (``LivelineTrackableActivity``, ``LivelinePushToStartSource``); everything else — registration, rotation, retries,
// the outbox — is the core's, tested on Linux.

/// An ActivityKit attributes type that carries the Liveline activity it shows. A remote start puts
/// `"liveline": {"activityId": "…"}` into the attributes; declare the member to receive it:
///
/// ```swift
/// struct MatchAttributes: LivelineActivityAttributes {
///     struct ContentState: Codable, Hashable { var home: Int; var away: Int }
///     var home: String
///     var away: String
///     var liveline: LivelineActivityReference?
/// }
/// ```
@available(iOS 16.1, *)
public protocol LivelineActivityAttributes: ActivityAttributes {
    /// The Liveline activity the Live Activity shows (set by Liveline's remote start, or by the app).
    var liveline: LivelineActivityReference? { get }
}

@available(iOS 16.2, *)
extension LivelineActivityState {
    /// The state of an ActivityKit `ActivityState`; `nil` for states this version of LivelineKit does not know.
    init?(_ state: ActivityState) {
        switch state {
        case .active: self = .active
        case .ended: self = .ended
        case .dismissed: self = .dismissed
        case .stale: self = .stale
        @unknown default: return nil
        }
    }
}

/// An `Activity<Attributes>` seen through ``LivelineTrackableActivity``: its `pushTokenUpdates` and
/// `activityStateUpdates` re-published as streams.
@available(iOS 16.2, *)
struct ActivityKitActivity: LivelineTrackableActivity {
    let livelineActivityID: String
    let attributesTypeName: String
    let pushTokenUpdates: AsyncStream<Data>
    let activityStateUpdates: AsyncStream<LivelineActivityState>

    init<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, activityID: String) {
        livelineActivityID = activityID
        attributesTypeName = String(describing: Attributes.self)
        // ActivityKit's sequences are read only by the task each stream starts.
        nonisolated(unsafe) let tokens = activity.pushTokenUpdates
        nonisolated(unsafe) let states = activity.activityStateUpdates
        pushTokenUpdates = AsyncStream { continuation in
            let task = Task {
                for await token in tokens { continuation.yield(token) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
        activityStateUpdates = AsyncStream { continuation in
            let task = Task {
                for await state in states {
                    if let mapped = LivelineActivityState(state) { continuation.yield(mapped) }
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}

/// `Activity<Attributes>.pushToStartTokenUpdates` seen through ``LivelinePushToStartSource``.
@available(iOS 17.2, *)
struct ActivityKitPushToStart<Attributes: ActivityAttributes>: LivelinePushToStartSource {
    let attributesTypeName = String(describing: Attributes.self)
    let pushToStartTokenUpdates: AsyncStream<Data>

    init() {
        pushToStartTokenUpdates = AsyncStream { continuation in
            let task = Task {
                for await token in Activity<Attributes>.pushToStartTokenUpdates { continuation.yield(token) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}

@available(iOS 16.2, *)
extension Liveline {
    /// Follows a Live Activity with the shared client: registers its update token and every rotation under the
    /// Liveline activity id, and reports `ended` and `dismissed`.
    ///
    /// - Parameters:
    ///   - activity: the Live Activity (started by the app, or by a remote start).
    ///   - activityID: the Liveline activity id; when `nil`, the activity's `attributes.liveline.activityId`
    ///     (``LivelineActivityAttributes``).
    /// - Returns: the task that follows it (cancel it to stop), or `nil` when no activity id is known.
    @discardableResult
    public static func track<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, activityID: String? = nil) -> Task<Void, Never>? {
        let reference = (activity.attributes as? any LivelineActivityAttributes)?.liveline?.activityId
        guard let id = activityID ?? reference else { return nil }
        let trackable = ActivityKitActivity(activity, activityID: id)
        let client = client
        return Task { await client.track(trackable) }
    }

    /// Registers every push-to-start token ActivityKit issues for `type` (`Activity<A>.pushToStartTokenUpdates`), and
    /// follows every Live Activity of that type — those already running and each new one from
    /// `Activity<A>.activityUpdates` — so a remotely started activity's update token reaches Liveline even when the
    /// system launched the app in the background. Call it early, e.g. in `application(_:didFinishLaunchingWithOptions:)`.
    ///
    /// - Returns: the task that observes (cancel it to stop).
    @available(iOS 17.2, *)
    @discardableResult
    public static func observePushToStart<Attributes: LivelineActivityAttributes>(for type: Attributes.Type) -> Task<Void, Never> {
        let client = client
        let source = ActivityKitPushToStart<Attributes>()
        return Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await client.observePushToStart(source) }
                group.addTask {
                    for activity in Activity<Attributes>.activities { Liveline.track(activity) }
                    for await activity in Activity<Attributes>.activityUpdates { Liveline.track(activity) }
                }
            }
        }
    }
}
#endif
