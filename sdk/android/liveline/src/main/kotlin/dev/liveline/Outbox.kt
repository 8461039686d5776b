package dev.liveline

import android.content.Context
import android.content.SharedPreferences
import android.util.Log
import org.json.JSONArray
import org.json.JSONObject
import java.util.UUID
import kotlin.random.Random

/**
 * One request waiting to reach Liveline.
 *
 * [key] says what it is about (`device`, `instance:<activity id>`, `event:<activity id>:dismissed`): a newer
 * request with the same key replaces an older one that has not been sent, so the newest token always wins
 * and a stale token is never sent after a fresh one.
 */
internal class OutboxItem(
    val id: String,
    val key: String,
    val method: String,
    val path: String,
    val body: String,
    /** Sent as `Idempotency-Key` on POSTs, the same on every retry. */
    val idempotencyKey: String?,
    val createdAt: Long,
    val attempts: Int = 0,
    val notBefore: Long = 0,
) {
    fun toJson(): JSONObject = JSONObject()
        .put("id", id).put("key", key).put("method", method).put("path", path).put("body", body)
        .put("idempotencyKey", idempotencyKey ?: JSONObject.NULL)
        .put("createdAt", createdAt).put("attempts", attempts).put("notBefore", notBefore)

    companion object {
        fun fromJson(json: JSONObject) = OutboxItem(
            id = json.getString("id"),
            key = json.getString("key"),
            method = json.getString("method"),
            path = json.getString("path"),
            body = json.getString("body"),
            idempotencyKey = if (json.isNull("idempotencyKey")) null else json.getString("idempotencyKey"),
            createdAt = json.getLong("createdAt"),
            attempts = json.optInt("attempts"),
            notBefore = json.optLong("notBefore"),
        )

        fun make(key: String, method: String, path: String, body: JSONObject, idempotent: Boolean = false) = OutboxItem(
            id = UUID.randomUUID().toString(),
            key = key,
            method = method,
            path = path,
            body = body.toString(),
            idempotencyKey = if (idempotent) UUID.randomUUID().toString() else null,
            createdAt = System.currentTimeMillis(),
        )
    }
}

/**
 * The requests not yet accepted by Liveline, persisted in SharedPreferences and sent by [OutboxWorker]
 * (WorkManager: it runs when the network is there, and after the app's process is gone).
 *
 * Retries: 408, 429, 5xx and network failures back off exponentially from 10 s to 30 min, with jitter
 * (a random point in the upper half of the interval), never sooner than the server's `Retry-After`; other
 * 4xx answers are dropped (logged); a request still failing a day after it was made is dropped.
 */
internal object Outbox {
    private const val BASE_DELAY_MILLIS = 10_000L
    private const val MAX_DELAY_MILLIS = 30 * 60_000L
    private const val GIVE_UP_AFTER_MILLIS = 24 * 60 * 60_000L

    private val lock = Any()
    private val drainLock = Any()

    private fun prefs(context: Context): SharedPreferences =
        context.applicationContext.getSharedPreferences("dev.liveline.outbox", Context.MODE_PRIVATE)

    /** Adds requests (each replacing any unsent one with its key) and asks WorkManager to send them now. */
    fun put(context: Context, vararg items: OutboxItem) {
        if (items.isEmpty()) return
        synchronized(lock) {
            val all = load(context).toMutableList()
            for (item in items) {
                all.removeAll { it.key == item.key }
                all.add(item)
            }
            save(context, all)
        }
        OutboxWorker.sendNow(context)
    }

    fun pending(context: Context): List<OutboxItem> = synchronized(lock) { load(context) }

    /**
     * Sends every request that is due, one after another, and returns the time the next one is due
     * (`null` when none is left). [stopped] lets WorkManager interrupt between requests.
     */
    fun drain(context: Context, api: LivelineApi, stopped: () -> Boolean): Long? = synchronized(drainLock) {
        val due = synchronized(lock) { load(context) }.filter { it.notBefore <= System.currentTimeMillis() }
        for (item in due) {
            if (stopped()) break
            settle(context, item, api.send(item))
        }
        synchronized(lock) { load(context).minOfOrNull { it.notBefore } }
    }

    /** Records how [item] ended, unless a newer request with its key replaced it while it was on the wire. */
    private fun settle(context: Context, item: OutboxItem, outcome: SendOutcome) = synchronized(lock) {
        val all = load(context).toMutableList()
        val index = all.indexOfFirst { it.id == item.id }
        if (index < 0) return@synchronized
        val now = System.currentTimeMillis()
        when (outcome) {
            SendOutcome.Sent, is SendOutcome.Refused -> all.removeAt(index)
            is SendOutcome.Retry -> {
                if (now - item.createdAt > GIVE_UP_AFTER_MILLIS) {
                    Log.w(Liveline.TAG, "Giving up on ${item.method} ${item.path} after a day: ${outcome.reason}")
                    all.removeAt(index)
                } else {
                    val attempts = item.attempts + 1
                    val delay = maxOf(backoff(attempts), outcome.retryAfterMillis ?: 0)
                    Log.i(Liveline.TAG, "${item.method} ${item.path} failed (${outcome.reason}); retry in ${delay / 1000} s")
                    all[index] = OutboxItem(
                        item.id, item.key, item.method, item.path, item.body, item.idempotencyKey, item.createdAt,
                        attempts = attempts, notBefore = now + delay,
                    )
                }
            }
        }
        save(context, all)
    }

    /** The delay before attempt [attempts] + 1: exponential, capped, in the upper half of the interval at random. */
    fun backoff(attempts: Int, random: Random = Random.Default): Long {
        val exponent = (attempts - 1).coerceIn(0, 20)
        val ceiling = minOf(MAX_DELAY_MILLIS, BASE_DELAY_MILLIS shl exponent)
        return ceiling / 2 + random.nextLong(ceiling / 2 + 1)
    }

    private fun load(context: Context): List<OutboxItem> {
        val text = prefs(context).getString("items", null) ?: return emptyList()
        val array = runCatching { JSONArray(text) }.getOrElse { return emptyList() }
        return (0 until array.length()).mapNotNull { runCatching { OutboxItem.fromJson(array.getJSONObject(it)) }.getOrNull() }
    }

    private fun save(context: Context, items: List<OutboxItem>) {
        val array = JSONArray()
        items.forEach { array.put(it.toJson()) }
        prefs(context).edit().putString("items", array.toString()).commit()
    }
}
