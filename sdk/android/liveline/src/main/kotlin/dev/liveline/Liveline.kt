package dev.liveline

import android.content.Context
import android.os.Build
import android.util.Log
import com.google.firebase.messaging.FirebaseMessaging
import org.json.JSONObject
import java.util.Locale
import java.util.UUID
import java.util.concurrent.CopyOnWriteArraySet

/** What the SDK tells the app (and the React Native bridge) as it happens. Called on the SDK's threads. */
interface LivelineListener {
    /** The device's FCM token, when first known and whenever it changes. */
    fun onToken(token: String) {}
    /** A state was applied and shown (from Liveline or a local [Liveline.start]). */
    fun onState(message: LivelineMessage) {}
    /** The user swiped a live activity's notification away. */
    fun onDismissed(activityId: String) {}
}

/**
 * The Liveline Android SDK: registers the device and the activities it watches with Liveline, turns
 * Liveline's FCM data messages into one ongoing notification per activity (a promoted Live Update on
 * Android 16), and reports what the user does with it.
 *
 * Call [configure] in `Application.onCreate` (or put the `dev.liveline.*` `<meta-data>` in the manifest, see
 * [LivelineConfig.fromManifest]): the messaging service can be started by a push before any activity of the app.
 */
object Liveline {
    const val TAG = "Liveline"

    @Volatile
    private var config: LivelineConfig? = null
    private val listeners = CopyOnWriteArraySet<LivelineListener>()

    /** Configures the SDK, creates the notification channel and registers this device (once its FCM token is known). */
    @JvmStatic
    fun configure(context: Context, config: LivelineConfig) {
        this.config = config
        LivelineNotifications.ensureChannel(context.applicationContext, config)
        // Requests left by a process that ended before they were sent (or sent before the SDK was configured).
        if (Outbox.pending(context).isNotEmpty()) OutboxWorker.sendNow(context.applicationContext)
        refreshToken(context.applicationContext)
    }

    /** Creates the SDK's notification channel if it does not exist yet ([configure] does it). */
    @JvmStatic
    fun ensureChannel(context: Context) = LivelineNotifications.ensureChannel(context, requireConfig(context))

    @JvmStatic
    fun addListener(listener: LivelineListener) { listeners.add(listener) }

    @JvmStatic
    fun removeListener(listener: LivelineListener) { listeners.remove(listener) }

    /** This installation's device id: the configured one, or a random UUID made once and kept. */
    @JvmStatic
    fun deviceId(context: Context): String {
        requireConfig(context).deviceId?.let { return it }
        val prefs = prefs(context)
        return synchronized(this) {
            prefs.getString(PREF_DEVICE_ID, null)
                ?: UUID.randomUUID().toString().also { prefs.edit().putString(PREF_DEVICE_ID, it).commit() }
        }
    }

    /**
     * Sets the user Liveline targets remote starts by (`audience.userIds`), and the tags when given, and registers the
     * device again. `userId = null` clears the user; `tags = null` keeps the tags (an empty map clears them).
     */
    @JvmStatic
    @JvmOverloads
    fun identify(context: Context, userId: String?, tags: Map<String, String>? = null) {
        require(userId == null || LivelineContract.isValidId(userId)) { "userId must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':' or '-'." }
        val editor = prefs(context).edit().putBoolean(PREF_USER_SET, true).putString(PREF_USER_ID, userId)
        if (tags != null) editor.putString(PREF_TAGS, JSONObject(tags).toString())
        editor.commit()
        token(context)?.let { Outbox.put(context, deviceRegistration(context, it)) }
    }

    /** Replaces the device's tags (`audience.tags` of a remote start), keeping the user, and registers the device again. */
    @JvmStatic
    fun setTags(context: Context, tags: Map<String, String>) {
        prefs(context).edit().putString(PREF_TAGS, JSONObject(tags).toString()).commit()
        token(context)?.let { Outbox.put(context, deviceRegistration(context, it)) }
    }

    /**
     * Starts a live activity on this phone: shows its notification with [contentState] and registers the phone for
     * it (`PUT /v1/activities/{activityId}/instances/{deviceId}`), so the backend's updates reach it.
     * Returns whether the notification was posted (false without the notification permission, or when the
     * activity was already started, ended or dismissed here).
     */
    @JvmStatic
    @JvmOverloads
    fun start(
        context: Context, activityId: String, attributesType: String, attributes: JSONObject, contentState: JSONObject,
        staleDate: Long? = null,
    ): Boolean {
        val config = requireConfig(context)
        require(LivelineContract.isValidId(activityId)) { "activityId must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':' or '-'." }
        val message = LivelineMessage(
            activityId = activityId, event = LivelineEvent.START,
            sequence = 0, // below the server's first sequence (1): any state from Liveline replaces it
            timestamp = System.currentTimeMillis() / 1000,
            contentStateJson = contentState.toString(), contentState = contentState,
            staleDate = staleDate, dismissalDate = null,
            attributesType = attributesType, attributesJson = attributes.toString(), attributes = attributes, alert = null,
        )
        val verdict = store(context).apply(message)
        val posted = verdict == ActivityStore.Verdict.APPLIED && LivelineNotifications.post(context, config, message, alert = false)
        if (verdict == ActivityStore.Verdict.APPLIED) listeners.forEach { it.onState(message) }
        watch(context, activityId, attributesType, attributes)
        return posted
    }

    /**
     * Watches an activity this phone did not start here (one it learned of another way): registers the phone's token
     * for it now and again on every new token. Does nothing for an activity that ended or was dismissed here.
     */
    @JvmStatic
    @JvmOverloads
    fun watch(context: Context, activityId: String, attributesType: String? = null, attributes: JSONObject? = null) {
        require(LivelineContract.isValidId(activityId)) { "activityId must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':' or '-'." }
        if (!store(context).watch(activityId, attributesType, attributes?.toString())) return
        val token = token(context)
        if (token == null) refreshToken(context) else Outbox.put(context, instanceRegistration(context, token, activityId))
    }

    /**
     * Ends a live activity on this phone (the app ended it, not the backend): removes its notification, stops
     * watching it and reports `ended` to Liveline, which sends this phone nothing more for it.
     */
    @JvmStatic
    fun end(context: Context, activityId: String) {
        if (!store(context).markEnded(activityId)) return
        LivelineNotifications.cancel(context, activityId)
        Outbox.put(context, event(context, activityId, "ended"))
    }

    /**
     * Handles one FCM data message. Returns false when it is not Liveline's (the app handles it); otherwise applies
     * the contract: a newer state is shown; an older or repeated one (FCM reorders and retries), one after the
     * activity's `end`, or a malformed one shows the last applied state again — every high-priority message
     * leads to a visible notification. The one exception: an activity the user swiped away is not brought
     * back (Liveline sends it nothing more once the dismissal is reported; only messages already in flight arrive).
     */
    @JvmStatic
    fun handleMessage(context: Context, data: Map<String, String>): Boolean {
        if (!LivelineContract.isLivelineMessage(data)) return false
        val config = configOrNull(context) ?: run {
            Log.e(TAG, "A Liveline message arrived but the SDK is not configured: call Liveline.configure in Application.onCreate")
            return true
        }
        val message = try {
            LivelineContract.parse(data) ?: return false
        } catch (e: MalformedLivelineMessage) {
            Log.w(TAG, "Malformed Liveline message: ${e.message}")
            data[LivelineContract.KEY_ACTIVITY_ID]?.takeIf(LivelineContract::isValidId)?.let { showAgain(context, config, it) }
            return true
        }
        when (store(context).apply(message)) {
            ActivityStore.Verdict.APPLIED -> {
                LivelineNotifications.post(context, config, message, alert = message.alert != null)
                // A start (a remote one: the phone learns of the activity now) is confirmed by registering for it.
                if (message.event == LivelineEvent.START) token(context)?.let {
                    Outbox.put(context, instanceRegistration(context, it, message.activityId))
                }
                listeners.forEach { it.onState(message) }
            }
            ActivityStore.Verdict.OUT_OF_ORDER, ActivityStore.Verdict.AFTER_END -> showAgain(context, config, message.activityId)
            ActivityStore.Verdict.DISMISSED -> Log.i(TAG, "Not showing ${message.activityId} again: the user dismissed it")
        }
        return true
    }

    /** A new FCM token: registers the device and every watched activity again with it (the newest token wins). */
    @JvmStatic
    fun onNewToken(context: Context, token: String) {
        val prefs = prefs(context)
        prefs.edit().putString(PREF_TOKEN, token).commit()
        listeners.forEach { it.onToken(token) }
        if (configOrNull(context) == null) return // registered once configure runs (refreshToken)
        val requests = mutableListOf(deviceRegistration(context, token))
        // The watched activities are registered again only for a token they were not registered with yet.
        if (prefs.getString(PREF_REGISTERED_TOKEN, null) != token) {
            store(context).watchedActivities().forEach { requests.add(instanceRegistration(context, token, it.activityId)) }
        }
        Outbox.put(context, *requests.toTypedArray())
        prefs.edit().putString(PREF_REGISTERED_TOKEN, token).commit()
    }

    /** The FCM token the SDK last saw, if any. */
    @JvmStatic
    fun token(context: Context): String? = prefs(context).getString(PREF_TOKEN, null)

    // Receiver callbacks.

    internal fun onNotificationDeleted(context: Context, activityId: String) {
        // An ended activity's notification going away (swiped or timed out) is no news to Liveline.
        if (!store(context).markDismissed(activityId)) return
        Outbox.put(context, event(context, activityId, "dismissed"))
        listeners.forEach { it.onDismissed(activityId) }
    }

    internal fun onStale(context: Context, activityId: String, sequence: Long) {
        val config = configOrNull(context) ?: return
        val record = store(context).record(activityId) ?: return
        // Only the state that set the alarm, still live and still on screen: never bring a notification back.
        if (record.sequence != sequence || record.ended || record.dismissed) return
        if (!LivelineNotifications.isShowing(context, activityId)) return
        val last = record.lastData?.let { runCatching { LivelineContract.parse(it) }.getOrNull() } ?: return
        LivelineNotifications.post(context, config, last, alert = false)
    }

    internal fun configOrNull(context: Context): LivelineConfig? =
        config ?: LivelineConfig.fromManifest(context.applicationContext)?.also { config = it }

    private fun requireConfig(context: Context): LivelineConfig = configOrNull(context)
        ?: error("Liveline is not configured: call Liveline.configure in Application.onCreate, or add the dev.liveline.* meta-data")

    /** Shows the activity's last applied state again (silently), unless the user dismissed it or an ended one is gone. */
    private fun showAgain(context: Context, config: LivelineConfig, activityId: String) {
        val record = store(context).record(activityId) ?: return
        if (record.dismissed) return
        val last = record.lastData?.let { runCatching { LivelineContract.parse(it) }.getOrNull() } ?: return
        if (last.event == LivelineEvent.END && !LivelineNotifications.isShowing(context, activityId)) return
        LivelineNotifications.post(context, config, last, alert = false)
    }

    private fun refreshToken(context: Context) {
        FirebaseMessaging.getInstance().token.addOnCompleteListener { task ->
            if (task.isSuccessful) task.result?.let { onNewToken(context, it) }
            else Log.w(TAG, "No FCM token yet", task.exception)
        }
    }

    // The three /v1 calls.

    private fun deviceRegistration(context: Context, token: String): OutboxItem {
        val prefs = prefs(context)
        val body = JSONObject().put("platform", "android").put("fcmToken", token)
        shortString(Build.VERSION.RELEASE)?.let { body.put("osVersion", it) }
        shortString(Locale.getDefault().toLanguageTag())?.let { body.put("locale", it) }
        if (prefs.getBoolean(PREF_USER_SET, false)) body.put("userId", prefs.getString(PREF_USER_ID, null) ?: JSONObject.NULL)
        prefs.getString(PREF_TAGS, null)?.let { body.put("tags", JSONObject(it)) }
        return OutboxItem.make("device", "PUT", "/v1/devices/${deviceId(context)}", body)
    }

    private fun instanceRegistration(context: Context, token: String, activityId: String): OutboxItem {
        val record = store(context).record(activityId)
        val body = JSONObject().put("platform", "android").put("pushToken", token)
        record?.attributesType?.let { body.put("attributesType", it) }
        record?.attributesJson?.let { body.put("attributes", JSONObject(it)) }
        return OutboxItem.make(
            "instance:$activityId", "PUT", "/v1/activities/$activityId/instances/${deviceId(context)}", body,
        )
    }

    private fun event(context: Context, activityId: String, type: String): OutboxItem = OutboxItem.make(
        "event:$activityId:$type", "POST", "/v1/activities/$activityId/instances/${deviceId(context)}/events",
        JSONObject().put("type", type), idempotent = true,
    )

    /** `osVersion` and `locale`: 1 to 64 printable ASCII characters without spaces, as Liveline accepts. */
    private fun shortString(value: String?): String? =
        value?.filter { it in '!'..'~' }?.take(64)?.takeIf { it.isNotEmpty() }

    private fun store(context: Context) = ActivityStore(context)

    private fun prefs(context: Context) =
        context.applicationContext.getSharedPreferences("dev.liveline", Context.MODE_PRIVATE)

    private const val PREF_DEVICE_ID = "device_id"
    private const val PREF_TOKEN = "fcm_token"
    private const val PREF_REGISTERED_TOKEN = "registered_fcm_token"
    private const val PREF_USER_SET = "user_id_set"
    private const val PREF_USER_ID = "user_id"
    private const val PREF_TAGS = "tags"
}
