import Foundation

/// Where a Live Activity stands in its life cycle, as ActivityKit's `ActivityState` says.
public enum LivelineActivityState: String, Sendable, Hashable, Codable {
    /// Scheduled to start later; not shown yet.
    case pending
    /// Shown and taking updates.
    case active
    /// Shown, but ended: it takes no more updates.
    case ended
    /// Removed by the person or the system.
    case dismissed
    /// Shown with content that is out of date.
    case stale
}

/// A Live Activity LivelineKit can follow: the ActivityKit adapter implements it for `Activity<Attributes>`; tests and
/// other platforms implement it with their own sequences.
public protocol LivelineTrackableActivity: Sendable {
    /// The sequence of update tokens.
    associatedtype PushTokens: AsyncSequence & Sendable where PushTokens.Element == Data
    /// The sequence of life-cycle states.
    associatedtype States: AsyncSequence & Sendable where States.Element == LivelineActivityState

    /// The Liveline activity id the Live Activity shows (from its `liveline` attribute, or the id the app chose).
    var livelineActivityID: String { get }
    /// The Swift name of the activity's attributes type (e.g. `MatchAttributes`).
    var attributesTypeName: String { get }
    /// Each update token the activity gets: the first and every rotation.
    var pushTokenUpdates: PushTokens { get }
    /// Each state the activity moves to.
    var activityStateUpdates: States { get }
}

/// A source of push-to-start tokens for one attributes type (ActivityKit's `Activity<A>.pushToStartTokenUpdates`).
public protocol LivelinePushToStartSource: Sendable {
    /// The sequence of push-to-start tokens.
    associatedtype Tokens: AsyncSequence & Sendable where Tokens.Element == Data

    /// The Swift name of the attributes type the tokens start.
    var attributesTypeName: String { get }
    /// Each push-to-start token the system issues for that type.
    var pushToStartTokenUpdates: Tokens { get }
}

extension LivelineClient {
    /// What an activity's state means for Liveline: `ended` and `dismissed` are reported; other states are not.
    public static func event(for state: LivelineActivityState) -> LivelineActivityEvent? {
        switch state {
        case .ended: .ended
        case .dismissed: .dismissed
        case .pending, .active, .stale: nil
        }
    }

    /// Follows `activity` until its sequences end, it is dismissed, or the calling task is cancelled: every update
    /// token is registered (``registerActivity(id:attributesType:pushToken:)``, so a rotation replaces the
    /// old token), `ended` is reported as ``LivelineActivityEvent/ended`` and `dismissed` as
    /// ``LivelineActivityEvent/dismissed`` (after which nothing more is followed).
    public nonisolated func track<Activity: LivelineTrackableActivity>(_ activity: Activity) async {
        let activityID = activity.livelineActivityID
        let attributesType = activity.attributesTypeName
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                do {
                    for try await token in activity.pushTokenUpdates {
                        await self.registerActivity(id: activityID, attributesType: attributesType, pushToken: token)
                    }
                } catch {}
                return false
            }
            group.addTask {
                do {
                    for try await state in activity.activityStateUpdates {
                        guard let event = Self.event(for: state) else { continue }
                        await self.report(event, activityID: activityID)
                        if state == .dismissed { return true }
                    }
                } catch {}
                return false
            }
            // Dismissed: the activity is gone, its token will not rotate again.
            while let dismissed = await group.next() {
                if dismissed { group.cancelAll() }
            }
        }
    }

    /// Registers every push-to-start token `source` yields for its attributes type, until the sequence ends or the
    /// calling task is cancelled.
    public nonisolated func observePushToStart<Source: LivelinePushToStartSource>(_ source: Source) async {
        let attributesType = source.attributesTypeName
        do {
            for try await token in source.pushToStartTokenUpdates {
                await setPushToStartToken(token, attributesType: attributesType)
            }
        } catch {}
    }
}

/// The attribute a remote start puts into the attributes Liveline sends: `"liveline": {"activityId": "match-42"}`.
/// Declare `var liveline: LivelineActivityReference?` in the app's attributes type to learn which Liveline activity a
/// Live Activity shows.
public struct LivelineActivityReference: Codable, Hashable, Sendable {
    /// The Liveline activity id.
    public var activityId: String

    /// Creates a reference.
    public init(activityId: String) {
        self.activityId = activityId
    }
}

/// The shared client and the entry points the ActivityKit adapter adds to.
public enum Liveline {
    private final class Shared: @unchecked Sendable {
        // Guarded by `lock`.
        private var client: LivelineClient?
        private let lock = NSLock()

        func get() -> LivelineClient? {
            lock.lock()
            defer { lock.unlock() }
            return client
        }

        func set(_ configuration: LivelineConfiguration) throws -> LivelineClient {
            lock.lock()
            defer { lock.unlock() }
            if let client {
                guard client.configuration == configuration else { throw LivelineError.alreadyConfigured }
                return client
            }
            let created = try LivelineClient(configuration: configuration)
            client = created
            return created
        }
    }

    private static let shared = Shared()

    /// Creates the shared client (once; calling again with the same configuration does nothing).
    ///
    /// - Throws: ``LivelineError/alreadyConfigured`` for a different configuration, or the client's storage errors.
    public static func configure(_ configuration: LivelineConfiguration) throws {
        _ = try shared.set(configuration)
    }

    /// Whether ``configure(_:)`` has been called.
    public static var isConfigured: Bool { shared.get() != nil }

    /// The shared client. Call ``configure(_:)`` first: using it before is a programming error and stops the app.
    public static var client: LivelineClient {
        guard let client = shared.get() else {
            preconditionFailure("Call Liveline.configure(_:) before using Liveline.client.")
        }
        return client
    }
}
