package dev.liveline

import android.content.Context
import org.json.JSONObject

/**
 * What the notification shows for one state.
 *
 * @param title the content title (required: a promoted Live Update must have one).
 * @param text the content text, if any.
 * @param progress 0 to 100 for a progress bar (Android 16: a `ProgressStyle` bar), `null` for none.
 * @param shortCriticalText Android 16: the few characters on the status-bar chip ("5 min"); about 7 fit.
 */
data class LivelineContent(
    val title: String,
    val text: String? = null,
    val progress: Int? = null,
    val shortCriticalText: String? = null,
)

/**
 * Turns a content state into what the notification shows. The app supplies its own to match its
 * content-state shape; [DefaultLivelineRenderer] reads a few conventional keys.
 *
 * Called on the thread that handles the message (the FCM service's worker thread); keep it quick.
 * [isStale] is true once the state's `liveline_stale_date` has passed: show it as out of date.
 */
fun interface LivelineRenderer {
    fun render(context: Context, message: LivelineMessage, isStale: Boolean): LivelineContent
}

/**
 * The default rendering, for content states shaped like
 * `{"title": "On the way", "body": "12 minutes away", "progress": 0.4, "shortText": "12 min"}`:
 *
 * - title: the alert's title, else `title`, else `status`, else the app's name;
 * - text: the alert's body, else `body`, else `text`, else `subtitle` (with " · out of date" once stale);
 * - progress: `progress` as a fraction from 0 to 1 (shown as a bar), none when absent or out of range;
 * - chip text: `shortText`.
 */
object DefaultLivelineRenderer : LivelineRenderer {
    override fun render(context: Context, message: LivelineMessage, isStale: Boolean): LivelineContent {
        val state = message.contentState
        val title = message.alert?.title
            ?: state.string("title")
            ?: state.string("status")
            ?: context.applicationInfo.loadLabel(context.packageManager).toString()
        val text = message.alert?.body ?: state.string("body") ?: state.string("text") ?: state.string("subtitle")
        val shownText = if (isStale) listOfNotNull(text, "out of date").joinToString(" · ") else text
        val fraction = if (state.has("progress")) state.optDouble("progress", Double.NaN) else Double.NaN
        val progress = if (fraction in 0.0..1.0) Math.round(fraction * 100).toInt() else null
        return LivelineContent(title, shownText, progress, state.string("shortText"))
    }

    private fun JSONObject.string(key: String): String? =
        if (has(key) && !isNull(key)) optString(key).takeIf { it.isNotEmpty() } else null
}
