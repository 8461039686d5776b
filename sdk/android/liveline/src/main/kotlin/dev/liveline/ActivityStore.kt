package dev.liveline

import android.content.Context
import android.content.SharedPreferences
import org.json.JSONObject

/**
 * What the phone knows about each activity, kept in SharedPreferences so it survives the process:
 * the highest `liveline_sequence` applied, whether the activity ended or the user dismissed it, whether
 * the app watches it (registers its token for it), and the last applied state (to show again).
 *
 * The ordering rules of the contract live in [apply]: a sequence not above the highest applied is
 * ignored, and nothing is applied after an `end` or a dismissal.
 */
internal class ActivityStore(context: Context) {
    private val prefs: SharedPreferences =
        context.applicationContext.getSharedPreferences("dev.liveline.activities", Context.MODE_PRIVATE)

    /** One activity's record. */
    class Record(
        val activityId: String,
        var sequence: Long = -1,
        var ended: Boolean = false,
        var dismissed: Boolean = false,
        var watched: Boolean = false,
        var attributesType: String? = null,
        var attributesJson: String? = null,
        /** The last applied message, as its FCM data map. */
        var lastData: Map<String, String>? = null,
        var updatedAt: Long = 0,
    )

    /** What [apply] decided for a message. */
    enum class Verdict {
        /** Newer than anything applied: show it. */
        APPLIED,
        /** Not newer than the highest applied sequence (FCM reordered or retried it). */
        OUT_OF_ORDER,
        /** The activity already ended; an end is final. */
        AFTER_END,
        /** The user swiped the notification away. */
        DISMISSED,
    }

    fun record(activityId: String): Record? = synchronized(lock) { load(activityId) }

    fun watchedActivities(): List<Record> = synchronized(lock) {
        prefs.all.keys.filter { it.startsWith(PREFIX) }.mapNotNull { load(it.removePrefix(PREFIX)) }.filter { it.watched }
    }

    /** Applies the contract's ordering rules to [message] and, when it is newer, records it as the activity's state. */
    fun apply(message: LivelineMessage, now: Long = System.currentTimeMillis()): Verdict = synchronized(lock) {
        val record = load(message.activityId) ?: Record(message.activityId)
        when (val decided = verdict(record, message)) {
            Verdict.DISMISSED, Verdict.AFTER_END, Verdict.OUT_OF_ORDER -> decided
            Verdict.APPLIED -> {
                record.sequence = message.sequence
                record.lastData = message.toData()
                if (message.event == LivelineEvent.START) {
                    // A start (remote or local) makes the phone watch the activity and register for it.
                    record.watched = true
                    record.attributesType = message.attributesType
                    record.attributesJson = message.attributesJson
                }
                if (message.event == LivelineEvent.END) {
                    record.ended = true
                    record.watched = false
                }
                record.updatedAt = now
                save(record, now)
                Verdict.APPLIED
            }
        }
    }

    /** Marks the activity watched (its token is registered for it, again on every new token). */
    fun watch(activityId: String, attributesType: String?, attributesJson: String?, now: Long = System.currentTimeMillis()) =
        synchronized(lock) {
            val record = load(activityId) ?: Record(activityId)
            if (record.ended || record.dismissed) return@synchronized false
            record.watched = true
            if (attributesType != null) record.attributesType = attributesType
            if (attributesJson != null) record.attributesJson = attributesJson
            record.updatedAt = now
            save(record, now)
            true
        }

    /**
     * Marks the activity dismissed by the user; returns false when there is nothing to report (it had
     * already ended, or was dismissed before): an ended activity's notification going away is no news.
     */
    fun markDismissed(activityId: String, now: Long = System.currentTimeMillis()): Boolean = synchronized(lock) {
        val record = load(activityId) ?: Record(activityId)
        if (record.ended || record.dismissed) return@synchronized false
        record.dismissed = true
        record.watched = false
        record.updatedAt = now
        save(record, now)
        true
    }

    /** Marks the activity ended on the phone (the app ended it); returns false when it had already ended or was dismissed. */
    fun markEnded(activityId: String, now: Long = System.currentTimeMillis()): Boolean = synchronized(lock) {
        val record = load(activityId) ?: Record(activityId)
        if (record.ended || record.dismissed) return@synchronized false
        record.ended = true
        record.watched = false
        record.updatedAt = now
        save(record, now)
        true
    }

    private fun load(activityId: String): Record? {
        val text = prefs.getString(PREFIX + activityId, null) ?: return null
        val json = JSONObject(text)
        val last = json.optJSONObject("last")
        return Record(
            activityId = activityId,
            sequence = json.optLong("sequence", -1),
            ended = json.optBoolean("ended"),
            dismissed = json.optBoolean("dismissed"),
            watched = json.optBoolean("watched"),
            attributesType = json.optStringOrNull("attributesType"),
            attributesJson = json.optStringOrNull("attributes"),
            lastData = last?.let { obj -> obj.keys().asSequence().associateWith { obj.getString(it) } },
            updatedAt = json.optLong("updatedAt"),
        )
    }

    private fun save(record: Record, now: Long) {
        val json = JSONObject()
            .put("sequence", record.sequence)
            .put("ended", record.ended)
            .put("dismissed", record.dismissed)
            .put("watched", record.watched)
            .put("updatedAt", record.updatedAt)
        record.attributesType?.let { json.put("attributesType", it) }
        record.attributesJson?.let { json.put("attributes", it) }
        record.lastData?.let { json.put("last", JSONObject(it)) }
        val editor = prefs.edit().putString(PREFIX + record.activityId, json.toString())
        // Forget finished activities a day after they finished: Android keeps nothing on screen that long.
        for ((key, value) in prefs.all) {
            if (!key.startsWith(PREFIX) || key == PREFIX + record.activityId || value !is String) continue
            val other = runCatching { JSONObject(value) }.getOrNull() ?: continue
            val finished = other.optBoolean("ended") || other.optBoolean("dismissed")
            if (finished && now - other.optLong("updatedAt") > FORGET_AFTER_MILLIS) editor.remove(key)
        }
        // commit, not apply: the next message may be handled by a process started after this one dies.
        editor.commit()
    }

    private fun JSONObject.optStringOrNull(key: String): String? = if (has(key)) getString(key) else null

    companion object {
        /**
         * The contract's ordering rules: nothing after a dismissal, nothing after an `end`, nothing whose sequence
         * is not above the highest applied.
         */
        fun verdict(record: Record, message: LivelineMessage): Verdict = when {
            record.dismissed -> Verdict.DISMISSED
            record.ended -> Verdict.AFTER_END
            message.sequence <= record.sequence -> Verdict.OUT_OF_ORDER
            else -> Verdict.APPLIED
        }

        private const val PREFIX = "activity:"
        private const val FORGET_AFTER_MILLIS = 24L * 60 * 60 * 1000
        private val lock = Any()
    }
}
