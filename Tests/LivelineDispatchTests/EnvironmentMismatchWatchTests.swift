import Foundation
import LivelineStore
import LivelineTestSupport
import Testing

@testable import LivelineDispatch

/// The warning about an app's APNs environment: the rule alone, then the engine's log.
@Suite("APNs environment mismatch warning")
struct EnvironmentMismatchWatchTests {
    @Test("a batch refused with BadDeviceToken and nothing delivered warns, once per app in ten minutes")
    func rule() {
        var watch = EnvironmentMismatchWatch()
        let t0 = Date(timeIntervalSince1970: 1_795_255_200)
        func warns(_ app: String, refused: Int, delivered: Int, after seconds: TimeInterval = 0) -> Bool {
            watch.shouldWarn(appID: app, badDeviceTokens: refused, delivered: delivered, at: t0.addingTimeInterval(seconds))
        }
        #expect(!warns("a", refused: 0, delivered: 0), "nothing refused")
        #expect(!warns("a", refused: 40, delivered: 1), "a push was taken: the tokens are at fault")
        #expect(warns("a", refused: 1, delivered: 0))
        #expect(!warns("a", refused: 5, delivered: 0, after: 599))
        #expect(warns("b", refused: 5, delivered: 0, after: 599), "another app's own")
        #expect(warns("a", refused: 5, delivered: 0, after: 600))
    }

    @Test("the engine warns of the environment when a pass's pushes are all refused with BadDeviceToken, not when some are taken", arguments: StoreKind.available)
    func engineWarns(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "some-taken", devices: 0..<4)
            try await register(store, activity: "all-refused", devices: 4..<8)
            let transport = ScriptedTransport()
            for index in 1..<8 { transport.answer(token(index), with: [.invalidToken(reason: "BadDeviceToken", providerID: nil)]) }
            let logged = LoggedMessages()
            try await whileDispatching(store, transport, logger: logged.logger()) { dispatcher in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "some-taken", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "some-taken") })
                #expect(!logged.messages(at: .warning).contains { $0.contains("BadDeviceToken") }, "\(logged.messages(at: .warning))")
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "all-refused", contentState: ["n": 1]), at: Date())
                dispatcher.wake()
                #expect(try await eventually { try await allCaughtUp(store, "all-refused") })
            }
            let environmentWarnings = logged.messages(at: .warning).filter { $0.contains("BadDeviceToken") && $0.contains("environment") }
            #expect(environmentWarnings.count == 1, "\(logged.messages(at: .warning))")
            let refused = try #require(try await store.activity(appID: appID, activityID: "all-refused"))
            #expect(refused.instanceCounts[.invalidated] == 4)
        }
    }
}
