package dev.liveline

import android.util.Log
import org.json.JSONObject
import java.io.IOException
import java.net.HttpURLConnection
import java.net.URL

/** An error answer from Liveline: `{"error": {"code", "message", "field"}}`. */
data class LivelineApiError(val status: Int, val code: String?, val message: String?, val field: String?) {
    companion object {
        fun parse(status: Int, body: String): LivelineApiError {
            val error = runCatching { JSONObject(body).optJSONObject("error") }.getOrNull()
            return LivelineApiError(
                status,
                error?.optString("code")?.takeIf { it.isNotEmpty() },
                error?.optString("message")?.takeIf { it.isNotEmpty() },
                error?.optString("field")?.takeIf { it.isNotEmpty() },
            )
        }
    }
}

/** How one request ended. */
internal sealed interface SendOutcome {
    /** 2xx. */
    data object Sent : SendOutcome
    /** A refusal retrying cannot fix (4xx other than 408 and 429): the request is dropped. */
    data class Refused(val error: LivelineApiError) : SendOutcome
    /** 408, 429, 5xx or no answer: try again later, not before [retryAfterMillis] when the server said so. */
    data class Retry(val reason: String, val retryAfterMillis: Long?) : SendOutcome
}

/** The three `/v1` calls an app makes, over `HttpURLConnection`, with the publishable key. */
internal class LivelineApi(private val config: LivelineConfig) {

    fun send(request: OutboxItem): SendOutcome {
        val connection = try {
            URL(config.serverUrl.trimEnd('/') + request.path).openConnection() as HttpURLConnection
        } catch (e: IOException) {
            return SendOutcome.Retry("cannot open ${request.path}: ${e.message}", null)
        }
        return try {
            connection.requestMethod = request.method
            connection.connectTimeout = TIMEOUT_MILLIS
            connection.readTimeout = TIMEOUT_MILLIS
            connection.useCaches = false
            connection.setRequestProperty("Authorization", "Bearer ${config.publishableKey}")
            connection.setRequestProperty("Content-Type", "application/json")
            connection.setRequestProperty("Accept", "application/json")
            request.idempotencyKey?.let { connection.setRequestProperty("Idempotency-Key", it) }
            val bytes = request.body.toByteArray(Charsets.UTF_8)
            connection.doOutput = true
            connection.setFixedLengthStreamingMode(bytes.size)
            connection.outputStream.use { it.write(bytes) }

            val status = connection.responseCode
            val stream = if (status >= 400) connection.errorStream else connection.inputStream
            val body = stream?.use { it.readBytes().toString(Charsets.UTF_8) } ?: ""
            classify(status, connection.getHeaderField("Retry-After"), body)
        } catch (e: IOException) {
            SendOutcome.Retry("${request.method} ${request.path}: ${e.javaClass.simpleName} ${e.message}", null)
        } finally {
            connection.disconnect()
        }
    }

    companion object {
        private const val TIMEOUT_MILLIS = 15_000

        fun classify(status: Int, retryAfter: String?, body: String): SendOutcome = when {
            status in 200..299 -> SendOutcome.Sent
            status == 408 || status == 429 || status >= 500 ->
                SendOutcome.Retry("HTTP $status", retryAfter?.trim()?.toLongOrNull()?.takeIf { it >= 0 }?.times(1000))
            else -> SendOutcome.Refused(LivelineApiError.parse(status, body)).also {
                Log.w(Liveline.TAG, "Liveline refused a request: ${it.error}")
            }
        }
    }
}
