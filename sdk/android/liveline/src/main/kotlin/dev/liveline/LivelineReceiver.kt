package dev.liveline

import android.content.BroadcastReceiver
import android.content.Context
import android.content.Intent

/**
 * The SDK's broadcasts, sent only by its own PendingIntents (not exported):
 * - [ACTION_DISMISSED], the notification's delete intent: the user swiped a live activity away; report `dismissed`.
 * - [ACTION_STALE], an alarm at the stale date: show the state again as out of date.
 */
class LivelineReceiver : BroadcastReceiver() {

    override fun onReceive(context: Context, intent: Intent) {
        val activityId = intent.getStringExtra(EXTRA_ACTIVITY_ID) ?: return
        when (intent.action) {
            ACTION_DISMISSED -> Liveline.onNotificationDeleted(context, activityId)
            ACTION_STALE -> Liveline.onStale(context, activityId, intent.getLongExtra(EXTRA_SEQUENCE, -1))
        }
    }

    companion object {
        const val ACTION_DISMISSED = "dev.liveline.action.DISMISSED"
        const val ACTION_STALE = "dev.liveline.action.STALE"
        const val EXTRA_ACTIVITY_ID = "dev.liveline.extra.ACTIVITY_ID"
        const val EXTRA_SEQUENCE = "dev.liveline.extra.SEQUENCE"

        fun intent(context: Context, action: String, activityId: String): Intent =
            Intent(context, LivelineReceiver::class.java)
                .setAction(action)
                .setData(LivelineNotifications.uri(action, activityId))
                .putExtra(EXTRA_ACTIVITY_ID, activityId)
    }
}
