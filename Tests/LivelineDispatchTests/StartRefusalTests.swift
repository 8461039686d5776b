import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("A remote start APNs refuses for good")
struct StartRefusalTests {
    @Test(
        "an iPhone whose start is refused (not its token) is invalidated, keeps its token, and the next start reaches it",
        arguments: StoreKind.available
    )
    func refusedStartIsTriedAgainByTheNextStart(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            let startToken = token(7)
            _ = try await store.putDevice(
                DeviceRegistration(appID: appID, deviceID: "iphone-1", platform: .ios, pushToStartTokens: ["MatchAttributes": startToken]),
                at: Date()
            )
            let transport = ScriptedTransport()
            // The app's topic is not (yet) enabled for Live Activities at APNs: refused for good, the token is fine.
            transport.answer(startToken, with: [.rejected(reason: "TopicDisallowed", providerID: nil)])
            func start() async throws -> AcceptedStart {
                try await store.startActivity(
                    ActivityStart(
                        appID: appID, activityID: "match-1", attributesType: "MatchAttributes", attributes: ["home": "Lions"],
                        contentState: ["minute": 1], alert: LiveActivityAlert(title: "Kick-off", body: "Lions", sound: nil), audience: .all
                    ),
                    at: Date()
                )
            }
            func instance() async throws -> InstanceRecord? {
                try await store.instances(appID: appID, activityID: "match-1", cursor: nil, limit: 10).items.first
            }
            try await running(Dispatcher(store: store, transports: transport, configuration: fastConfiguration())) {
                #expect(try await start().counts == AudienceCounts(ios: 1, android: 0, skipped: 0))
                #expect(try await eventually { try await instance()?.state == .invalidated })
                #expect(transport.pushes(to: startToken).count == 1)
                // The token was not what APNs refused: the device keeps it.
                let device = try #require(try await store.device(appID: appID, deviceID: "iphone-1"))
                #expect(device.pushToStartTokens.first?.droppedAt == nil)
                // Put right, the app starts it again: the iPhone is admitted afresh and its start goes out.
                #expect(try await start().counts == AudienceCounts(ios: 1, android: 0, skipped: 0))
                #expect(try await eventually { transport.pushes(to: startToken).count == 2 })
                #expect(try await eventually { try await instance()?.state == .starting })
                #expect(transport.pushes(to: startToken).last?.event == .start)
            }
            let events = try await store.events(appID: appID, after: nil, types: [], limit: 50).map(\.type)
            #expect(events.contains(.deliveryFailed))
            #expect(events.contains(.instanceInvalidated))
        }
    }
}
