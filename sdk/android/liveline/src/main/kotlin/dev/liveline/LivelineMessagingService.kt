package dev.liveline

import com.google.firebase.messaging.FirebaseMessagingService
import com.google.firebase.messaging.RemoteMessage

/**
 * The FCM entry point. Declare it in the app's manifest with the `com.google.firebase.MESSAGING_EVENT`
 * intent filter (README.md). An app with its own FirebaseMessagingService calls [Liveline.handleMessage] and
 * [Liveline.onNewToken] from it instead, or extends this class and overrides [onOtherMessage].
 */
open class LivelineMessagingService : FirebaseMessagingService() {

    override fun onMessageReceived(message: RemoteMessage) {
        // Runs on FCM's worker thread; posting the notification happens here, before returning, because a
        // high-priority message must lead to a visible notification. Network calls go to the outbox (WorkManager).
        if (!Liveline.handleMessage(this, message.data)) onOtherMessage(message)
    }

    override fun onNewToken(token: String) {
        Liveline.onNewToken(this, token)
    }

    /** A message that is not Liveline's. */
    open fun onOtherMessage(message: RemoteMessage) {}
}
