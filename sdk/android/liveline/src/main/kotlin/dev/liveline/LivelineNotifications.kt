package dev.liveline

import android.Manifest
import android.annotation.SuppressLint
import android.app.AlarmManager
import android.app.Notification
import android.app.NotificationChannel
import android.app.NotificationManager
import android.app.PendingIntent
import android.content.Context
import android.content.Intent
import android.content.pm.PackageManager
import android.net.Uri
import android.os.Build
import android.os.Bundle
import android.util.Log
import androidx.annotation.RequiresApi
import androidx.core.app.NotificationCompat
import androidx.core.app.NotificationManagerCompat
import androidx.core.content.ContextCompat

/**
 * Posts an activity's notification: tag = activity id, one notification per activity, updated in place.
 *
 * - Android 16 (API 36) and later, while the activity is live: a framework `Notification` that asks to be
 *   promoted to a Live Update and meets the documented requirements — ongoing, a content title, the
 *   standard style or `Notification.ProgressStyle`, no custom `RemoteViews`, not colorized, not a group
 *   summary, a channel above `IMPORTANCE_MIN`, the `POST_PROMOTED_NOTIFICATIONS` permission (in the SDK's
 *   manifest) and the `android.requestPromotedOngoing` extra. The system decides; a notification it does
 *   not promote (the user turned Live Updates off for the app) still shows as an ongoing one.
 * - Below Android 16: an ongoing `NotificationCompat` notification with a classic progress bar.
 * - On `end`: a notification that is no longer ongoing, removed at `liveline_dismissal_date` (4 hours after
 *   the end when there is none, as iOS does).
 *
 * Every notification carries a delete intent: swiping it away reports `dismissed` to Liveline.
 */
internal object LivelineNotifications {
    /** The notification id; the activity id is the tag. */
    const val NOTIFICATION_ID = 0x4c4c

    /** `Notification.EXTRA_REQUEST_PROMOTED_ONGOING`: public from API 36.1 only, so its value is spelled out. */
    private const val EXTRA_REQUEST_PROMOTED_ONGOING = "android.requestPromotedOngoing"

    /** Without a dismissal date an ended activity stays this long, as on iOS. */
    private const val DEFAULT_END_DISPLAY_MILLIS = 4L * 60 * 60 * 1000
    /** An end whose dismissal date has passed is still shown this long: every high-priority message must lead to a visible notification. */
    private const val PAST_DISMISSAL_DISPLAY_MILLIS = 5_000L

    fun ensureChannel(context: Context, config: LivelineConfig) {
        val manager = context.getSystemService(NotificationManager::class.java) ?: return
        if (manager.getNotificationChannel(config.channelId) != null) return
        // IMPORTANCE_DEFAULT: above MIN (a promoted notification's channel must be), and an update with an alert can alert.
        val channel = NotificationChannel(config.channelId, config.channelName, NotificationManager.IMPORTANCE_DEFAULT)
        channel.setShowBadge(false)
        manager.createNotificationChannel(channel)
    }

    /** Whether the app may post notifications at all (Android 13+: the runtime permission; any version: the user's switch). */
    fun canPost(context: Context): Boolean {
        if (Build.VERSION.SDK_INT >= 33 &&
            ContextCompat.checkSelfPermission(context, Manifest.permission.POST_NOTIFICATIONS) != PackageManager.PERMISSION_GRANTED
        ) return false
        return NotificationManagerCompat.from(context).areNotificationsEnabled()
    }

    /** Whether the activity's notification is on screen now. */
    fun isShowing(context: Context, activityId: String): Boolean {
        val manager = context.getSystemService(NotificationManager::class.java) ?: return false
        return manager.activeNotifications.any { it.tag == activityId && it.id == NOTIFICATION_ID }
    }

    /**
     * Posts or updates the notification for [message]. [alert] lets it sound and peek (an update that came with an
     * alert); otherwise it updates silently. Returns whether it was posted.
     */
    @SuppressLint("MissingPermission") // canPost checks POST_NOTIFICATIONS first
    fun post(context: Context, config: LivelineConfig, message: LivelineMessage, alert: Boolean): Boolean {
        ensureChannel(context, config)
        if (!canPost(context)) {
            Log.w(Liveline.TAG, "Cannot post the live update for ${message.activityId}: notifications are not allowed")
            return false
        }
        val now = System.currentTimeMillis()
        val isStale = message.staleDate != null && message.staleDate * 1000 <= now
        // The app's renderer must not cost the notification: if it throws (a key its content state lacks), or gives no
        // title (a promoted notification needs one), the default rendering stands in.
        val rendered = try {
            config.renderer.render(context, message, isStale).takeIf { it.title.isNotBlank() }
        } catch (e: Exception) { // org.json's JSONException is not a RuntimeException
            Log.e(Liveline.TAG, "The LivelineRenderer failed for ${message.activityId}; using the default rendering", e)
            null
        }
        val content = rendered ?: DefaultLivelineRenderer.render(context, message, isStale)
        val notification = if (message.event != LivelineEvent.END && Build.VERSION.SDK_INT >= 36) {
            promoted(context, config, message, content, alert)
        } else {
            compat(context, config, message, content, alert, now)
        }
        try {
            NotificationManagerCompat.from(context).notify(message.activityId, NOTIFICATION_ID, notification)
        } catch (e: SecurityException) {
            Log.w(Liveline.TAG, "Cannot post the live update for ${message.activityId}", e)
            return false
        }
        if (message.event != LivelineEvent.END && !isStale) scheduleStaleRender(context, message)
        return true
    }

    fun cancel(context: Context, activityId: String) {
        NotificationManagerCompat.from(context).cancel(activityId, NOTIFICATION_ID)
    }

    @RequiresApi(36)
    private fun promoted(
        context: Context, config: LivelineConfig, message: LivelineMessage, content: LivelineContent, alert: Boolean,
    ): Notification {
        val builder = Notification.Builder(context, config.channelId)
            .setSmallIcon(config.smallIcon)
            .setContentTitle(content.title)
            .setContentText(content.text)
            .setOngoing(true)
            .setColorized(false)
            .setOnlyAlertOnce(!alert)
            .setWhen(message.timestamp * 1000)
            .setShowWhen(true)
            .setCategory(Notification.CATEGORY_PROGRESS)
            .setDeleteIntent(dismissIntent(context, message.activityId))
            .addExtras(Bundle().apply { putBoolean(EXTRA_REQUEST_PROMOTED_ONGOING, true) })
        config.contentIntent?.invoke(context, message.activityId)?.let { builder.setContentIntent(it) }
        content.shortCriticalText?.let { builder.setShortCriticalText(it) }
        content.progress?.let { progress ->
            builder.setStyle(
                Notification.ProgressStyle()
                    .setProgressSegments(listOf(Notification.ProgressStyle.Segment(100)))
                    .setProgress(progress.coerceIn(0, 100))
            )
        }
        return builder.build()
    }

    private fun compat(
        context: Context, config: LivelineConfig, message: LivelineMessage, content: LivelineContent, alert: Boolean, now: Long,
    ): Notification {
        val ended = message.event == LivelineEvent.END
        val builder = NotificationCompat.Builder(context, config.channelId)
            .setSmallIcon(config.smallIcon)
            .setContentTitle(content.title)
            .setContentText(content.text)
            .setOngoing(!ended)
            .setOnlyAlertOnce(!alert)
            .setWhen(message.timestamp * 1000)
            .setShowWhen(true)
            .setCategory(NotificationCompat.CATEGORY_PROGRESS)
            .setPriority(NotificationCompat.PRIORITY_DEFAULT)
            .setDeleteIntent(dismissIntent(context, message.activityId))
        config.contentIntent?.invoke(context, message.activityId)?.let { builder.setContentIntent(it) }
        content.progress?.let { builder.setProgress(100, it.coerceIn(0, 100), false) }
        if (ended) {
            val display = message.dismissalDate?.let { it * 1000 - now } ?: DEFAULT_END_DISPLAY_MILLIS
            builder.setTimeoutAfter(display.coerceAtLeast(PAST_DISMISSAL_DISPLAY_MILLIS))
            builder.setAutoCancel(true)
        }
        return builder.build()
    }

    /** The delete intent: [LivelineReceiver] reports `dismissed` (unless the activity had ended). */
    private fun dismissIntent(context: Context, activityId: String): PendingIntent =
        PendingIntent.getBroadcast(
            context, 0, LivelineReceiver.intent(context, LivelineReceiver.ACTION_DISMISSED, activityId),
            PendingIntent.FLAG_IMMUTABLE or PendingIntent.FLAG_UPDATE_CURRENT,
        )

    /**
     * At the stale date, shows the state again as out of date (the renderer gets `isStale = true`). An inexact
     * alarm: no exact-alarm permission, and a few minutes late is fine for "out of date".
     */
    private fun scheduleStaleRender(context: Context, message: LivelineMessage) {
        val staleAt = message.staleDate ?: return
        val alarms = context.getSystemService(AlarmManager::class.java) ?: return
        val intent = LivelineReceiver.intent(context, LivelineReceiver.ACTION_STALE, message.activityId)
            .putExtra(LivelineReceiver.EXTRA_SEQUENCE, message.sequence)
        val pending = PendingIntent.getBroadcast(
            context, 0, intent, PendingIntent.FLAG_IMMUTABLE or PendingIntent.FLAG_UPDATE_CURRENT,
        )
        alarms.set(AlarmManager.RTC, staleAt * 1000, pending)
    }

    /** A unique data URI per activity and action, so each activity has its own PendingIntents. */
    fun uri(action: String, activityId: String): Uri =
        Uri.Builder().scheme("liveline").authority(action.substringAfterLast('.')).appendPath(activityId).build()
}
