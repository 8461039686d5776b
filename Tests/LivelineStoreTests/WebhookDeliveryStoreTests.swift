import Foundation
import LivelineCore
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Webhook deliveries in the Store")
struct WebhookDeliveryStoreTests {
    /// An app with one enabled endpoint and `count` test deliveries queued for it.
    private func endpointWithDeliveries(_ store: SQLStore, count: Int) async throws -> [Int64] {
        try await makeApp(store)
        let webhook = WebhookRecord(
            id: "wh_1", appID: "app_test", url: "https://hooks.example.com/", eventTypes: [], enabled: true, sealedSecret: [1, 2, 3],
            createdAt: t0
        )
        #expect(try await store.createWebhook(webhook, maximum: 20))
        var ids: [Int64] = []
        for index in 0..<count {
            let queued = try await store.enqueueWebhookTest(
                appID: "app_test", webhookID: "wh_1", eventID: "evt_\(index)", payload: "{}", at: t0
            )
            ids.append(try #require(queued?.id))
        }
        return ids
    }

    private func delivery(_ store: SQLStore, _ id: Int64) async throws -> WebhookDeliveryRecord? {
        try await store.webhookDeliveries(appID: "app_test", webhookID: "wh_1", before: nil, limit: 100).first { $0.id == id }
    }

    @Test(
        "an attempt under way when another disabled the endpoint ends failed, not pending for ever; one that got through is delivered",
        arguments: StoreKind.available
    )
    func attemptsAfterTheEndpointWasDisabled(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            let ids = try await endpointWithDeliveries(store, count: 4)
            let at = t0.addingTimeInterval(10)
            // The second was tried once already (HTTP 500), and waits for its next try.
            try await store.recordWebhookAttempt(
                deliveryID: ids[1], statusCode: 500, error: nil, latencyMilliseconds: 3, result: .retry(next: at), at: at
            )
            // The first runs out of retries: the endpoint is disabled, and everything queued behind it fails.
            try await store.recordWebhookAttempt(
                deliveryID: ids[0], statusCode: 502, error: nil, latencyMilliseconds: 3, result: .failed(reason: "HTTP 502"), at: at
            )
            #expect(try await store.webhook(appID: "app_test", id: "wh_1")?.enabled == false)
            let triedBefore = try #require(try await delivery(store, ids[1]))
            #expect(triedBefore.status == .failed)
            #expect(triedBefore.lastStatusCode == 500)
            #expect(triedBefore.lastError == "not sent again: the endpoint was disabled", "it was sent once: not 'not sent'")
            #expect(try await delivery(store, ids[2])?.lastError == "not sent: the endpoint was disabled")

            // Attempts that were under way meanwhile come back: one to be tried again, one that got through.
            try await store.recordWebhookAttempt(
                deliveryID: ids[2], statusCode: 503, error: nil, latencyMilliseconds: 3, result: .retry(next: at.addingTimeInterval(5)),
                at: at.addingTimeInterval(1)
            )
            try await store.recordWebhookAttempt(
                deliveryID: ids[3], statusCode: 200, error: nil, latencyMilliseconds: 3, result: .delivered, at: at.addingTimeInterval(1)
            )
            let retried = try #require(try await delivery(store, ids[2]))
            #expect(retried.status == .failed, "pending behind a disabled endpoint would never be sent")
            #expect(retried.lastStatusCode == 503)
            #expect(retried.finishedAt != nil)
            #expect(try await delivery(store, ids[3])?.status == .delivered)
            #expect(try await store.stateCounts().pendingWebhookDeliveries == 0)
            let all = try await store.webhookDeliveries(appID: "app_test", webhookID: "wh_1", before: nil, limit: 100)
            #expect(!all.contains { $0.status == .pending })
        }
    }

    @Test(
        "an endpoint gets the events committed after its creation, not those before, though nothing read the feed before it",
        arguments: StoreKind.available
    )
    func eventsFromTheEndpointsCreation(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await makeApp(store)
            // With no endpoint, the deliverer's looks give the events no position (on PostgreSQL), and nothing reads the
            // feed.
            for n in 1...2 {
                _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "before", contentState: ["n": .integer(Int64(n))]), at: t0)
                #expect(try await store.enqueueWebhookDeliveries(limit: 500, at: t0) == 0)
            }
            let webhook = WebhookRecord(
                id: "wh_1", appID: "app_test", url: "https://hooks.example.com/", eventTypes: [], enabled: true, sealedSecret: [1, 2, 3],
                createdAt: t0
            )
            #expect(try await store.createWebhook(webhook, maximum: 20))
            _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_test", activityID: "after", contentState: ["n": 3]), at: t0)
            #expect(try await store.enqueueWebhookDeliveries(limit: 500, at: t0) == 1)
            let queued = try await store.webhookDeliveries(appID: "app_test", webhookID: "wh_1", before: nil, limit: 100)
            #expect(queued.count == 1)
            #expect(queued.allSatisfy { $0.payload.contains("after") && !$0.payload.contains("before") }, "\(queued.map(\.payload))")
        }
    }

    @Test("finished deliveries are forgotten after the retention; pending ones stay", arguments: StoreKind.available)
    func pruning(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            let ids = try await endpointWithDeliveries(store, count: 3)
            try await store.recordWebhookAttempt(
                deliveryID: ids[0], statusCode: 200, error: nil, latencyMilliseconds: 3, result: .delivered, at: t0.addingTimeInterval(10)
            )
            try await store.recordWebhookAttempt(
                deliveryID: ids[1], statusCode: 200, error: nil, latencyMilliseconds: 3, result: .delivered, at: t0.addingTimeInterval(100)
            )
            #expect(try await store.pruneWebhookDeliveries(finishedBefore: t0.addingTimeInterval(50)) == 1)
            let left = try await store.webhookDeliveries(appID: "app_test", webhookID: "wh_1", before: nil, limit: 100)
            #expect(Set(left.map(\.id)) == [ids[1], ids[2]])
            #expect(try await store.pruneWebhookDeliveries(finishedBefore: t0.addingTimeInterval(1_000)) == 1)
            let pending = try await store.webhookDeliveries(appID: "app_test", webhookID: "wh_1", before: nil, limit: 100)
            #expect(pending.map(\.id) == [ids[2]])
            #expect(pending.first?.status == .pending)
        }
    }
}
