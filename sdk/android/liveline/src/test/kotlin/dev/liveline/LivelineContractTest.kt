package dev.liveline

import org.junit.Assert.assertEquals
import org.junit.Assert.assertNull
import org.junit.Assert.assertTrue
import org.junit.Assert.fail
import org.junit.Test
import kotlin.random.Random

/** JVM unit tests of the parser, the ordering rules, the HTTP answer rules and the backoff (`./gradlew :liveline:testDebugUnitTest`). */
class LivelineContractTest {
    // What the server's encoder emits for a start with every optional field (Tests/LivelineCoreTests/AndroidContractTests.swift).
    private val start = mapOf(
        "liveline_activity_id" to "match-42",
        "liveline_event" to "start",
        "liveline_sequence" to "1",
        "liveline_timestamp" to "1763700000",
        "liveline_content_state" to """{"away":0,"home":0,"minute":1}""",
        "liveline_stale_date" to "1763703600",
        "liveline_attributes_type" to "MatchAttributes",
        "liveline_attributes" to """{"away":"Tigers","home":"Lions"}""",
        "liveline_alert_title" to "Kick-off",
        "liveline_alert_body" to "Lions – Tigers has started",
    )

    private fun expectMalformed(data: Map<String, String>, key: String) {
        try {
            LivelineContract.parse(data)
            fail("expected $key to be refused in $data")
        } catch (e: MalformedLivelineMessage) {
            assertEquals(key, e.key)
        }
    }

    @Test
    fun parsesAStartWithEveryField() {
        val message = LivelineContract.parse(start)!!
        assertEquals("match-42", message.activityId)
        assertEquals(LivelineEvent.START, message.event)
        assertEquals(1L, message.sequence)
        assertEquals(1763700000L, message.timestamp)
        assertEquals(1, message.contentState.getInt("minute"))
        assertEquals(1763703600L, message.staleDate)
        assertNull(message.dismissalDate)
        assertEquals("MatchAttributes", message.attributesType)
        assertEquals("Lions", message.attributes!!.getString("home"))
        assertEquals(LivelineAlert("Kick-off", "Lions – Tigers has started"), message.alert)
        assertEquals(start, message.toData())
    }

    @Test
    fun otherAppsMessagesAreNotLivelines() {
        assertNull(LivelineContract.parse(mapOf("chat" to "hello")))
    }

    @Test
    fun refusesMalformedMessages() {
        expectMalformed(start - "liveline_sequence", "liveline_sequence")
        expectMalformed(start + ("liveline_sequence" to "1.5"), "liveline_sequence")
        expectMalformed(start + ("liveline_event" to "pause"), "liveline_event")
        expectMalformed(start + ("liveline_content_state" to "[1,2]"), "liveline_content_state")
        expectMalformed(start + ("liveline_content_state" to "{"), "liveline_content_state")
        expectMalformed(start - "liveline_attributes", "liveline_attributes")
        expectMalformed(start - "liveline_alert_body", "liveline_alert_title")
        expectMalformed(start + ("liveline_dismissal_date" to "1763706000"), "liveline_dismissal_date")
        expectMalformed(start + ("liveline_activity_id" to "has space"), "liveline_activity_id")
    }

    @Test
    fun aLocalizedAlertCarriesItsResourceNamesAndArguments() {
        val localized = start - "liveline_alert_title" - "liveline_alert_body" + mapOf(
            "liveline_alert_title_loc_key" to "kick_off_title",
            "liveline_alert_title_loc_args" to "[]",
            "liveline_alert_body_loc_key" to "kick_off_body",
            "liveline_alert_body_loc_args" to """["Lions","Tigers"]""",
        )
        val message = LivelineContract.parse(localized)!!
        assertEquals(LivelineAlert("kick_off_title", "kick_off_body", emptyList(), listOf("Lions", "Tigers")), message.alert)
        assertEquals(localized, message.toData())
        // A localized title with a text body is an alert too.
        val mixed = start - "liveline_alert_title" + mapOf(
            "liveline_alert_title_loc_key" to "kick_off_title", "liveline_alert_title_loc_args" to """["Lions"]""",
        )
        assertEquals(LivelineAlert("kick_off_title", "Lions – Tigers has started", listOf("Lions"), null), LivelineContract.parse(mixed)!!.alert)
        expectMalformed(mixed - "liveline_alert_title_loc_args", "liveline_alert_title_loc_args")
        expectMalformed(mixed + ("liveline_alert_title_loc_args" to """[1]"""), "liveline_alert_title_loc_args")
        expectMalformed(mixed + ("liveline_alert_title_loc_key" to ""), "liveline_alert_title_loc_key")
        expectMalformed(mixed - "liveline_alert_body", "liveline_alert_title")
    }

    @Test
    fun anEndCarriesItsDismissalDate() {
        val end = mapOf(
            "liveline_activity_id" to "match-42", "liveline_event" to "end", "liveline_sequence" to "3",
            "liveline_timestamp" to "1763705400", "liveline_content_state" to "{}", "liveline_dismissal_date" to "1763706000",
        )
        assertEquals(1763706000L, LivelineContract.parse(end)!!.dismissalDate)
    }

    @Test
    fun orderingKeepsTheNewestAndNothingAfterAnEndOrADismissal() {
        fun update(sequence: Long) = LivelineContract.parse(
            start + mapOf("liveline_event" to "update", "liveline_sequence" to "$sequence") -
                setOf("liveline_attributes_type", "liveline_attributes")
        )!!
        val record = ActivityStore.Record("match-42", sequence = 5)
        assertEquals(ActivityStore.Verdict.APPLIED, ActivityStore.verdict(record, update(6)))
        assertEquals(ActivityStore.Verdict.OUT_OF_ORDER, ActivityStore.verdict(record, update(5)))
        assertEquals(ActivityStore.Verdict.OUT_OF_ORDER, ActivityStore.verdict(record, update(4)))
        assertEquals(ActivityStore.Verdict.APPLIED, ActivityStore.verdict(ActivityStore.Record("new"), update(1)))
        assertEquals(ActivityStore.Verdict.AFTER_END, ActivityStore.verdict(ActivityStore.Record("a", 5, ended = true), update(9)))
        assertEquals(ActivityStore.Verdict.DISMISSED, ActivityStore.verdict(ActivityStore.Record("a", 5, dismissed = true), update(9)))
    }

    @Test
    fun answersAreSortedIntoSentRefusedAndRetry() {
        assertEquals(SendOutcome.Sent, LivelineApi.classify(201, null, "{}"))
        val refused = LivelineApi.classify(422, null, """{"error":{"code":"invalid_id","message":"bad","field":"deviceId"}}""")
        assertEquals(SendOutcome.Refused(LivelineApiError(422, "invalid_id", "bad", "deviceId")), refused)
        assertEquals(SendOutcome.Retry("HTTP 429", 30_000L), LivelineApi.classify(429, "30", ""))
        assertEquals(SendOutcome.Retry("HTTP 503", null), LivelineApi.classify(503, null, ""))
    }

    @Test
    fun backoffGrowsIsCappedAndJittered() {
        val random = Random(7)
        for (attempt in 1..30) {
            val ceiling = minOf(30 * 60_000L, 10_000L shl minOf(attempt - 1, 20))
            val delay = Outbox.backoff(attempt, random)
            assertTrue("attempt $attempt: $delay", delay in ceiling / 2..ceiling)
        }
    }
}
