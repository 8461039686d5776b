package dev.liveline

import android.content.Context
import org.json.JSONArray
import org.json.JSONException
import org.json.JSONObject
import org.json.JSONTokener

/**
 * Liveline's Android data contract (docs/android.md, "The data contract"): the FCM `data` keys the
 * server sends and the parser that turns one message into a [LivelineMessage].
 *
 * Every value arrives as a string; absent optional values are left out. The repository's contract test
 * (Tests/LivelineCoreTests/AndroidContractTests.swift) reads the `const val` keys below and checks them
 * against what the server's encoder emits, so renaming one here without the server fails that test.
 */
object LivelineContract {
    /** The activity id: the app keys its notification by it. Always present. */
    const val KEY_ACTIVITY_ID = "liveline_activity_id"
    /** `start`, `update` or `end`. Always present. */
    const val KEY_EVENT = "liveline_event"
    /** The activity's sequence number, decimal; strictly increases with every accepted state. Always present. */
    const val KEY_SEQUENCE = "liveline_sequence"
    /** When Liveline accepted the state, seconds since 1970, decimal. Always present. */
    const val KEY_TIMESTAMP = "liveline_timestamp"
    /** The content state as JSON text (an object, keys sorted). Always present. */
    const val KEY_CONTENT_STATE = "liveline_content_state"
    /** Seconds since 1970, decimal: after it the state is out of date. If set. */
    const val KEY_STALE_DATE = "liveline_stale_date"
    /** Seconds since 1970, decimal: remove the notification at that time. `end` only, if set. */
    const val KEY_DISMISSAL_DATE = "liveline_dismissal_date"
    /** The attributes type name. `start` only. */
    const val KEY_ATTRIBUTES_TYPE = "liveline_attributes_type"
    /** The static attributes as JSON text (an object). `start` only. */
    const val KEY_ATTRIBUTES = "liveline_attributes"
    /** The alert's title, if the update has an alert whose title is text. */
    const val KEY_ALERT_TITLE = "liveline_alert_title"
    /** The alert's body, if the update has an alert whose body is text. */
    const val KEY_ALERT_BODY = "liveline_alert_body"
    /** The name of the app's string resource for the alert's title, if the title is localized on the phone. */
    const val KEY_ALERT_TITLE_LOC_KEY = "liveline_alert_title_loc_key"
    /** The arguments for that string's placeholders, in order: a JSON array of strings (with the loc key only). */
    const val KEY_ALERT_TITLE_LOC_ARGS = "liveline_alert_title_loc_args"
    /** The name of the app's string resource for the alert's body, if the body is localized on the phone. */
    const val KEY_ALERT_BODY_LOC_KEY = "liveline_alert_body_loc_key"
    /** The arguments for that string's placeholders, in order: a JSON array of strings (with the loc key only). */
    const val KEY_ALERT_BODY_LOC_ARGS = "liveline_alert_body_loc_args"

    /** The keys every Liveline message carries. */
    val REQUIRED_KEYS: List<String> =
        listOf(KEY_ACTIVITY_ID, KEY_EVENT, KEY_SEQUENCE, KEY_TIMESTAMP, KEY_CONTENT_STATE)

    /** The longest activity id the server accepts (`Limits.maximumIdentifierLength`). */
    const val MAXIMUM_ID_LENGTH = 128

    private val identifier = Regex("^[A-Za-z0-9._:-]{1,$MAXIMUM_ID_LENGTH}$")

    /** Whether [value] is an id the server accepts: 1 to 128 of `A-Z a-z 0-9 . _ : -`, and not `.` or `..`. */
    fun isValidId(value: String): Boolean = identifier.matches(value) && value != "." && value != ".."

    /** Whether an FCM message is meant for Liveline (it carries [KEY_ACTIVITY_ID]); other messages are the app's. */
    fun isLivelineMessage(data: Map<String, String>): Boolean = data.containsKey(KEY_ACTIVITY_ID)

    /**
     * Parses one FCM `data` map.
     *
     * Returns `null` when the message is not Liveline's (no [KEY_ACTIVITY_ID]); throws
     * [MalformedLivelineMessage] when it is but breaks the contract: a required key missing, a number that
     * is not a decimal integer, an unknown event, a content state or attributes that are not a JSON
     * object, a dismissal date on anything but `end`, a `start` without its attributes type and
     * attributes, or only one half of an alert.
     */
    @Throws(MalformedLivelineMessage::class)
    fun parse(data: Map<String, String>): LivelineMessage? {
        val activityId = data[KEY_ACTIVITY_ID] ?: return null
        if (!isValidId(activityId)) malformed(KEY_ACTIVITY_ID, "is not a valid activity id")
        val eventText = required(data, KEY_EVENT)
        val event = LivelineEvent.fromWire(eventText)
            ?: malformed(KEY_EVENT, "must be start, update or end, not '$eventText'")
        val sequence = decimal(data, KEY_SEQUENCE) ?: malformed(KEY_SEQUENCE, "is missing")
        if (sequence < 0) malformed(KEY_SEQUENCE, "must not be negative")
        val timestamp = decimal(data, KEY_TIMESTAMP) ?: malformed(KEY_TIMESTAMP, "is missing")
        val contentStateJson = required(data, KEY_CONTENT_STATE)
        val contentState = jsonObject(contentStateJson, KEY_CONTENT_STATE)
        val staleDate = decimal(data, KEY_STALE_DATE)
        val dismissalDate = decimal(data, KEY_DISMISSAL_DATE)
        if (dismissalDate != null && event != LivelineEvent.END) {
            malformed(KEY_DISMISSAL_DATE, "belongs to an end only")
        }
        val attributesType = data[KEY_ATTRIBUTES_TYPE]
        val attributesJson = data[KEY_ATTRIBUTES]
        val attributes = attributesJson?.let { jsonObject(it, KEY_ATTRIBUTES) }
        if (event == LivelineEvent.START && (attributesType.isNullOrEmpty() || attributes == null)) {
            malformed(KEY_ATTRIBUTES, "a start needs $KEY_ATTRIBUTES_TYPE and $KEY_ATTRIBUTES")
        }
        val alertTitle = alertText(data, KEY_ALERT_TITLE, KEY_ALERT_TITLE_LOC_KEY, KEY_ALERT_TITLE_LOC_ARGS)
        val alertBody = alertText(data, KEY_ALERT_BODY, KEY_ALERT_BODY_LOC_KEY, KEY_ALERT_BODY_LOC_ARGS)
        if ((alertTitle == null) != (alertBody == null)) {
            malformed(
                KEY_ALERT_TITLE,
                "an alert has both a title ($KEY_ALERT_TITLE or $KEY_ALERT_TITLE_LOC_KEY) " +
                    "and a body ($KEY_ALERT_BODY or $KEY_ALERT_BODY_LOC_KEY)",
            )
        }
        return LivelineMessage(
            activityId = activityId,
            event = event,
            sequence = sequence,
            timestamp = timestamp,
            contentStateJson = contentStateJson,
            contentState = contentState,
            staleDate = staleDate,
            dismissalDate = dismissalDate,
            attributesType = attributesType,
            attributesJson = attributesJson,
            attributes = attributes,
            alert = if (alertTitle != null && alertBody != null) {
                LivelineAlert(alertTitle.first, alertBody.first, alertTitle.second, alertBody.second)
            } else {
                null
            },
        )
    }

    /**
     * An alert's title or body: its text and `null`, or the name of a string resource and the arguments for its
     * placeholders; `null` when the message has neither.
     */
    private fun alertText(
        data: Map<String, String>, textKey: String, locKey: String, locArgsKey: String,
    ): Pair<String, List<String>?>? {
        data[textKey]?.let { return Pair(it, null) }
        val name = data[locKey] ?: return null
        if (name.isEmpty()) malformed(locKey, "must name a string resource")
        val argumentsJson = required(data, locArgsKey)
        val parsed = try {
            JSONTokener(argumentsJson).nextValue()
        } catch (e: JSONException) {
            malformed(locArgsKey, "is not JSON: ${e.message}")
        }
        val array = parsed as? JSONArray ?: malformed(locArgsKey, "must be a JSON array of strings")
        val arguments = (0 until array.length()).map { index ->
            array.opt(index) as? String ?: malformed(locArgsKey, "must be a JSON array of strings")
        }
        return Pair(name, arguments)
    }

    private fun required(data: Map<String, String>, key: String): String =
        data[key] ?: malformed(key, "is missing")

    /** A decimal integer value, `null` when the key is absent. */
    private fun decimal(data: Map<String, String>, key: String): Long? {
        val text = data[key] ?: return null
        return text.toLongOrNull() ?: malformed(key, "must be a decimal integer, not '$text'")
    }

    private fun jsonObject(text: String, key: String): JSONObject {
        val value = try {
            JSONTokener(text).nextValue()
        } catch (e: JSONException) {
            malformed(key, "is not JSON: ${e.message}")
        }
        return value as? JSONObject ?: malformed(key, "must be a JSON object")
    }

    private fun malformed(key: String, reason: String): Nothing =
        throw MalformedLivelineMessage(key, "$key $reason")
}

/** The three events of the contract, by their wire value. */
enum class LivelineEvent(val wire: String) {
    START("start"),
    UPDATE("update"),
    END("end");

    companion object {
        fun fromWire(value: String): LivelineEvent? = entries.firstOrNull { it.wire == value }
    }
}

/**
 * An alert that came with a state: the notification alerts (sound, heads-up) only when one is present.
 *
 * [title] and [body] are the text to show, unless [titleArgs] (or [bodyArgs]) is not `null`: the server sent a
 * localized text, and [title] (or [body]) is then the name of one of the app's string resources, to be formatted with
 * those arguments on the phone ([resolvedTitle], [resolvedBody]).
 */
data class LivelineAlert(
    val title: String,
    val body: String,
    val titleArgs: List<String>? = null,
    val bodyArgs: List<String>? = null,
) {
    /** The title to show: the text, or the string resource it names formatted with [titleArgs] (its name when the app has none). */
    fun resolvedTitle(context: Context): String = resolve(context, title, titleArgs)

    /** The body to show: the text, or the string resource it names formatted with [bodyArgs] (its name when the app has none). */
    fun resolvedBody(context: Context): String = resolve(context, body, bodyArgs)

    private fun resolve(context: Context, text: String, arguments: List<String>?): String {
        if (arguments == null) return text
        val id = context.resources.getIdentifier(text, "string", context.packageName)
        if (id == 0) return text
        return context.getString(id, *arguments.toTypedArray())
    }
}

/**
 * One parsed Liveline message. Dates are seconds since 1970, as on the wire.
 *
 * [contentStateJson] and [attributesJson] keep the exact text received (it is what the SDK stores and
 * what a React Native app receives); [contentState] and [attributes] are the same values parsed.
 */
class LivelineMessage(
    val activityId: String,
    val event: LivelineEvent,
    val sequence: Long,
    val timestamp: Long,
    val contentStateJson: String,
    val contentState: JSONObject,
    val staleDate: Long?,
    val dismissalDate: Long?,
    val attributesType: String?,
    val attributesJson: String?,
    val attributes: JSONObject?,
    val alert: LivelineAlert?,
) {
    /** The message back as the FCM `data` map it came from (what the SDK stores as an activity's last state). */
    fun toData(): Map<String, String> = buildMap {
        put(LivelineContract.KEY_ACTIVITY_ID, activityId)
        put(LivelineContract.KEY_EVENT, event.wire)
        put(LivelineContract.KEY_SEQUENCE, sequence.toString())
        put(LivelineContract.KEY_TIMESTAMP, timestamp.toString())
        put(LivelineContract.KEY_CONTENT_STATE, contentStateJson)
        staleDate?.let { put(LivelineContract.KEY_STALE_DATE, it.toString()) }
        dismissalDate?.let { put(LivelineContract.KEY_DISMISSAL_DATE, it.toString()) }
        attributesType?.let { put(LivelineContract.KEY_ATTRIBUTES_TYPE, it) }
        attributesJson?.let { put(LivelineContract.KEY_ATTRIBUTES, it) }
        alert?.let {
            putAlertText(it.title, it.titleArgs, LivelineContract.KEY_ALERT_TITLE, LivelineContract.KEY_ALERT_TITLE_LOC_KEY, LivelineContract.KEY_ALERT_TITLE_LOC_ARGS)
            putAlertText(it.body, it.bodyArgs, LivelineContract.KEY_ALERT_BODY, LivelineContract.KEY_ALERT_BODY_LOC_KEY, LivelineContract.KEY_ALERT_BODY_LOC_ARGS)
        }
    }
}

/** Puts an alert's title or body as the server sent it: text under [textKey], or a resource name and its arguments. */
private fun MutableMap<String, String>.putAlertText(
    text: String, arguments: List<String>?, textKey: String, locKey: String, locArgsKey: String,
) {
    if (arguments == null) {
        put(textKey, text)
    } else {
        put(locKey, text)
        put(locArgsKey, JSONArray(arguments).toString())
    }
}

/** A message that carries [LivelineContract.KEY_ACTIVITY_ID] but breaks the contract; [key] names the culprit. */
class MalformedLivelineMessage(val key: String, message: String) : Exception(message)
