package dev.liveline

import android.content.Context
import androidx.work.Constraints
import androidx.work.ExistingWorkPolicy
import androidx.work.NetworkType
import androidx.work.OneTimeWorkRequestBuilder
import androidx.work.WorkManager
import androidx.work.Worker
import androidx.work.WorkerParameters
import java.util.concurrent.TimeUnit

/** Sends the [Outbox] when the network is up, then schedules itself for the next retry that is due. */
class OutboxWorker(context: Context, params: WorkerParameters) : Worker(context, params) {

    override fun doWork(): Result {
        val config = Liveline.configOrNull(applicationContext) ?: return Result.success() // nothing to send to
        val nextDue = Outbox.drain(applicationContext, LivelineApi(config)) { isStopped }
        if (nextDue != null) retryAt(applicationContext, nextDue)
        return Result.success()
    }

    companion object {
        private const val NOW = "dev.liveline.outbox"
        private const val LATER = "dev.liveline.outbox.retry"

        private val network = Constraints.Builder().setRequiredNetworkType(NetworkType.CONNECTED).build()

        /** Sends what is due as soon as there is a network. */
        fun sendNow(context: Context) {
            val request = OneTimeWorkRequestBuilder<OutboxWorker>().setConstraints(network).build()
            WorkManager.getInstance(context).enqueueUniqueWork(NOW, ExistingWorkPolicy.REPLACE, request)
        }

        /**
         * Runs again at [time], replacing any retry already scheduled. A separate unique name from [sendNow], so a
         * new request never waits behind a long backoff; two runs at once are serialized by the outbox's lock.
         * (When the retry worker itself calls this, at the very end of its run, the replacement cancels a run
         * whose work is already done.)
         */
        private fun retryAt(context: Context, time: Long) {
            val delay = (time - System.currentTimeMillis()).coerceAtLeast(0)
            val request = OneTimeWorkRequestBuilder<OutboxWorker>()
                .setConstraints(network)
                .setInitialDelay(delay, TimeUnit.MILLISECONDS)
                .build()
            WorkManager.getInstance(context).enqueueUniqueWork(LATER, ExistingWorkPolicy.REPLACE, request)
        }
    }
}
