/// Whether an activity still takes updates.
public enum ActivityState: String, Sendable, Hashable, CaseIterable, Codable {
    /// Takes updates; its instances receive them.
    case active
    /// Ended by the backend (or by Liveline); refuses further updates.
    case ended
}

/// What a backend can ask of an activity.
public enum ActivityCommand: Sendable, Hashable {
    /// A new content state.
    case update
    /// The final state.
    case end
}

/// A refused lifecycle transition.
public enum LifecycleViolation: Error, Sendable, Hashable {
    /// The activity has ended; nothing more may be sent to it.
    case activityEnded
}

extension ActivityState {
    /// The state after `command`, or a ``LifecycleViolation`` when the command is refused.
    public func applying(_ command: ActivityCommand) throws(LifecycleViolation) -> ActivityState {
        switch (self, command) {
        case (.active, .update): .active
        case (.active, .end): .ended
        case (.ended, _): throw .activityEnded
        }
    }
}

/// The state of one device watching one activity.
public enum InstanceState: String, Sendable, Hashable, CaseIterable, Codable {
    /// Started remotely (push-to-start on iOS, a start message on Android) and not yet confirmed: the phone has not
    /// registered the instance's own token. An iPhone receives only its start, to its push-to-start token; an Android
    /// phone receives every state at its FCM token.
    case starting
    /// Receives pushes.
    case active
    /// The user removed the Live Activity; it is never brought back.
    case dismissed
    /// The Live Activity ended on the device.
    case ended
    /// APNs or FCM rejected the token; the phone registering a token (a new one, or the same one again) makes the instance
    /// active again.
    case invalidated

    /// Whether pushes go to an instance in this state (a `starting` iPhone receives only its start).
    public var receivesPushes: Bool { self == .active || self == .starting }
}

/// Something that happened to one instance.
public enum InstanceEvent: Sendable, Hashable {
    /// The device registered a (possibly new) push token.
    case tokenRegistered
    /// The user dismissed the Live Activity on the device.
    case dismissedOnDevice
    /// The Live Activity ended on the device.
    case endedOnDevice
    /// The push service reported the token invalid.
    case tokenInvalidated
    /// Liveline delivered the activity's end to this instance.
    case endDelivered
}

extension InstanceState {
    /// The state after `event`. Pure: the rules of who may come back to life live here.
    ///
    /// - A dismissal is final: nothing but another dismissal changes a dismissed instance.
    /// - An ended instance stays ended, except that the user may still dismiss it.
    /// - A token registered (a new one, or the refused one again: the phone vouches for it) revives an invalidated
    ///   instance, and only that.
    /// - A remotely started instance is confirmed (becomes active) when the phone registers its token, and is
    ///   invalidated when the push service refuses the token its start went to.
    public func applying(_ event: InstanceEvent) -> InstanceState {
        switch (self, event) {
        case (.dismissed, _): .dismissed
        case (_, .dismissedOnDevice): .dismissed
        case (.ended, _): .ended
        case (_, .endedOnDevice), (_, .endDelivered): .ended
        case (.active, .tokenInvalidated), (.starting, .tokenInvalidated): .invalidated
        case (.invalidated, .tokenInvalidated): .invalidated
        case (.active, .tokenRegistered), (.invalidated, .tokenRegistered), (.starting, .tokenRegistered): .active
        }
    }
}
