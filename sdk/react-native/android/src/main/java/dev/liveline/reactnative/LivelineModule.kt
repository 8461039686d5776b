package dev.liveline.reactnative

import com.facebook.react.bridge.Arguments
import com.facebook.react.bridge.Promise
import com.facebook.react.bridge.ReactApplicationContext
import com.facebook.react.bridge.ReactContextBaseJavaModule
import com.facebook.react.bridge.ReactMethod
import com.facebook.react.bridge.ReadableMap
import com.facebook.react.bridge.ReadableType
import com.facebook.react.bridge.WritableMap
import com.facebook.react.modules.core.DeviceEventManagerModule
import dev.liveline.Liveline
import dev.liveline.LivelineConfig
import dev.liveline.LivelineEvent
import dev.liveline.LivelineListener
import dev.liveline.LivelineMessage
import org.json.JSONArray
import org.json.JSONObject

/**
 * `NativeModules.LivelineModule` on Android: forwards JavaScript's requests to the Kotlin SDK ([Liveline]) and the
 * SDK's news to JavaScript as `updateToken` and `activityState` events. The SDK does the registering, the
 * notification and the reporting itself, also when no JavaScript runs (a push to a closed app).
 */
class LivelineModule(private val reactContext: ReactApplicationContext) :
    ReactContextBaseJavaModule(reactContext), LivelineListener {

    init {
        Liveline.addListener(this)
    }

    override fun getName(): String = NAME

    override fun invalidate() {
        Liveline.removeListener(this)
        super.invalidate()
    }

    @ReactMethod
    fun configure(options: ReadableMap, promise: Promise) {
        try {
            // The status-bar icon: the manifest's dev.liveline.small_icon, else the app's icon.
            val fromManifest = LivelineConfig.fromManifest(reactContext)
            val config = LivelineConfig(
                serverUrl = options.getString("serverUrl") ?: throw IllegalArgumentException("serverUrl is required"),
                publishableKey = options.getString("publishableKey") ?: throw IllegalArgumentException("publishableKey is required"),
                smallIcon = fromManifest?.smallIcon ?: reactContext.applicationInfo.icon,
                deviceId = if (options.hasKey("deviceId")) options.getString("deviceId") else null,
            )
            Liveline.configure(reactContext, config)
            // Only what JavaScript gave: a missing userId keeps the stored user, missing tags keep the stored tags.
            val tags = if (options.hasKey("tags") && options.getType("tags") == ReadableType.Map) {
                options.getMap("tags")!!.toHashMap().mapValues { it.value.toString() }
            } else null
            if (options.hasKey("userId")) {
                Liveline.identify(reactContext, options.getString("userId"), tags)
            } else if (tags != null) {
                Liveline.setTags(reactContext, tags)
            }
            promise.resolve(Liveline.deviceId(reactContext))
        } catch (e: Exception) {
            promise.reject("liveline_configure", e.message, e)
        }
    }

    @ReactMethod
    fun startActivity(options: ReadableMap, promise: Promise) {
        try {
            val staleDate = if (options.hasKey("staleDate") && !options.isNull("staleDate")) options.getDouble("staleDate").toLong() else null
            val shown = Liveline.start(
                reactContext,
                activityId = options.getString("activityId") ?: throw IllegalArgumentException("activityId is required"),
                attributesType = options.getString("attributesType") ?: throw IllegalArgumentException("attributesType is required"),
                attributes = json(options.getMap("attributes")),
                contentState = json(options.getMap("contentState")),
                staleDate = staleDate,
            )
            promise.resolve(shown)
        } catch (e: Exception) {
            promise.reject("liveline_start", e.message, e)
        }
    }

    @ReactMethod
    fun endActivity(activityId: String, @Suppress("UNUSED_PARAMETER") options: ReadableMap, promise: Promise) {
        try {
            Liveline.end(reactContext, activityId) // Android removes the notification; the options are iOS's
            promise.resolve(null)
        } catch (e: Exception) {
            promise.reject("liveline_end", e.message, e)
        }
    }

    // NativeEventEmitter calls these; the SDK's listener is registered for the module's lifetime instead.
    @ReactMethod
    fun addListener(@Suppress("UNUSED_PARAMETER") eventName: String) {}

    @ReactMethod
    fun removeListeners(@Suppress("UNUSED_PARAMETER") count: Int) {}

    // LivelineListener: called on the SDK's threads.

    override fun onToken(token: String) {
        emit("updateToken", Arguments.createMap().apply {
            putNull("activityId")
            putString("token", token)
        })
    }

    override fun onState(message: LivelineMessage) {
        emit("activityState", Arguments.createMap().apply {
            putString("activityId", message.activityId)
            putString("state", if (message.event == LivelineEvent.END) "ended" else "active")
            putDouble("sequence", message.sequence.toDouble())
            putMap("contentState", Arguments.makeNativeMap(toMap(message.contentState)))
        })
    }

    override fun onDismissed(activityId: String) {
        emit("activityState", Arguments.createMap().apply {
            putString("activityId", activityId)
            putString("state", "dismissed")
        })
    }

    private fun emit(event: String, body: WritableMap) {
        if (!reactContext.hasActiveReactInstance()) return
        reactContext.getJSModule(DeviceEventManagerModule.RCTDeviceEventEmitter::class.java).emit(event, body)
    }

    private fun json(map: ReadableMap?): JSONObject =
        JSONObject(map?.toHashMap() ?: throw IllegalArgumentException("attributes and contentState must be objects"))

    private fun toMap(json: JSONObject): Map<String, Any?> =
        json.keys().asSequence().associateWith { key -> unwrap(json.get(key)) }

    private fun unwrap(value: Any?): Any? = when (value) {
        JSONObject.NULL -> null
        is JSONObject -> toMap(value)
        is JSONArray -> (0 until value.length()).map { unwrap(value.get(it)) }
        else -> value
    }

    companion object {
        const val NAME = "LivelineModule"
    }
}
