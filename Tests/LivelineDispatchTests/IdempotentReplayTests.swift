import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Delivery engine: a replayed idempotent request sends nothing")
struct IdempotentReplayTests {
    @Test("an update retried under its Idempotency-Key is not sent again; the next update is the next sequence", arguments: StoreKind.available)
    func replaySendsNothing(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "order-1", devices: 0..<3)
            let transport = ScriptedTransport()
            let claim = IdempotencyClaim<AcceptedSequence>(key: "retry-1", fingerprint: [1]) { accepted in
                StoredResponse(status: 202, body: Array("\(accepted.sequence)".utf8))
            }
            let keyed = ActivityUpdate(appID: appID, activityID: "order-1", contentState: ["eta": 5])
            try await whileDispatching(store, transport) { dispatcher in
                _ = try await store.acceptUpdate(keyed, at: Date(), idempotency: claim)
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "order-1") })
                #expect(transport.pushes.count == 3)

                let retry = try await store.acceptUpdate(keyed, at: Date(), idempotency: claim)
                guard case .replayed(let response) = retry else { Issue.record("not replayed: \(retry)"); return }
                #expect(response.body == Array("1".utf8))
                dispatcher.wake()
                let next = try await store.acceptUpdate(
                    ActivityUpdate(appID: appID, activityID: "order-1", contentState: ["eta": 3]), at: Date()
                )
                #expect(next.sequence == 2, "the replay took no sequence")
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "order-1") })
            }
            // Each phone got the first update once and the next one once: nothing for the replay.
            for index in 0..<3 {
                #expect(transport.pushes(to: token(index)).map(\.sequence) == [1, 2])
            }
        }
    }
}
