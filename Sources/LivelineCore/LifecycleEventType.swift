/// A lifecycle fact Liveline tells the app's backend about (the event feed, and webhooks): what happened to an
/// activity, one of its instances, a delivery, a budget or the app's credentials.
public enum LifecycleEventType: String, Sendable, Hashable, CaseIterable, Codable {
    /// The activity got its first state: a remote start, or the first update of an activity started on a phone.
    case activityStarted = "activity.started"
    /// A later state was accepted (an update, or a remote start adding an audience to a running activity).
    case activityUpdated = "activity.updated"
    /// The activity ended: by the backend, by Liveline at the end of its lifetime, or when all its instances were gone.
    case activityEnded = "activity.ended"
    /// A phone registered an instance (or confirmed a remote start by registering its own token or channel, or registered
    /// again the token the push service had refused).
    case instanceRegistered = "instance.registered"
    /// A phone registered a new push token for its instance.
    case instanceTokenRotated = "instance.token_rotated"
    /// The phone reported that the user dismissed the Live Activity.
    case instanceDismissed = "instance.dismissed"
    /// The phone reported that the Live Activity ended on it.
    case instanceEnded = "instance.ended"
    /// The push service refused the instance's token: it gets nothing more until the phone registers a token
    /// again (a new one, or the same one).
    case instanceInvalidated = "instance.invalidated"
    /// A remote start was delivered but the phone has not registered its instance within the confirmation time.
    case instanceStartUnconfirmed = "instance.start_unconfirmed"
    /// A push (or a broadcast) was refused for good; it is not retried.
    case deliveryFailed = "delivery.failed"
    /// Instances of the activity reached the warning share of their hourly priority-10 budget.
    case budgetWarning = "budget.warning"
    /// The push service refused the app's credentials; its pushes wait until they are fixed.
    case credentialsUnhealthy = "credentials.unhealthy"
}
