package dev.liveline

import android.app.PendingIntent
import android.content.Context
import android.content.pm.PackageManager
import androidx.annotation.DrawableRes

/**
 * How the SDK reaches Liveline and how it shows a live update.
 *
 * @param serverUrl the Liveline server, e.g. `https://liveline.example.com` (no path).
 * @param publishableKey the app's publishable key (`pk_…`). A secret key (`sk_…`) never belongs in an app and is refused.
 * @param smallIcon the status-bar icon of the notification (a monochrome drawable).
 * @param deviceId this installation's id; by default a random UUID made once and kept in the app's storage.
 * @param channelId the notification channel the SDK creates ([Liveline.ensureChannel]).
 * @param channelName the channel's name, shown in the system settings.
 * @param renderer how a content state becomes the notification's title, text and progress.
 * @param contentIntent what a tap on the notification opens, given the activity id; `null` for nothing.
 */
class LivelineConfig(
    val serverUrl: String,
    val publishableKey: String,
    @DrawableRes val smallIcon: Int,
    val deviceId: String? = null,
    val channelId: String = DEFAULT_CHANNEL_ID,
    val channelName: String = "Live updates",
    val renderer: LivelineRenderer = DefaultLivelineRenderer,
    val contentIntent: ((Context, String) -> PendingIntent?)? = null,
) {
    init {
        require(serverUrl.startsWith("https://") || serverUrl.startsWith("http://")) {
            "serverUrl must be an http(s) URL, not '$serverUrl'."
        }
        require(publishableKey.startsWith("pk_")) {
            "publishableKey must be the app's publishable key (pk_…); a secret key must never ship in an app."
        }
        require(deviceId == null || LivelineContract.isValidId(deviceId)) {
            "deviceId must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':' or '-'."
        }
    }

    companion object {
        const val DEFAULT_CHANNEL_ID = "liveline_live_updates"

        /** `<meta-data>` names read by [fromManifest]. */
        const val META_SERVER_URL = "dev.liveline.server_url"
        const val META_PUBLISHABLE_KEY = "dev.liveline.publishable_key"
        const val META_SMALL_ICON = "dev.liveline.small_icon"

        /**
         * The configuration written as `<meta-data>` in the app's manifest, or `null` when it is not there.
         * This is how an app configures the SDK without code (React Native, Expo): the messaging service can run
         * before any JavaScript does.
         */
        fun fromManifest(context: Context): LivelineConfig? {
            val info = try {
                @Suppress("DEPRECATION")
                context.packageManager.getApplicationInfo(context.packageName, PackageManager.GET_META_DATA)
            } catch (e: PackageManager.NameNotFoundException) {
                return null
            }
            val meta = info.metaData ?: return null
            val url = meta.getString(META_SERVER_URL) ?: return null
            val key = meta.getString(META_PUBLISHABLE_KEY) ?: return null
            val icon = meta.getInt(META_SMALL_ICON, info.icon)
            return LivelineConfig(serverUrl = url, publishableKey = key, smallIcon = icon)
        }
    }
}
