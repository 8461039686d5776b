import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("Lifecycle events from the delivery engine")
struct EventsDispatchTests {
    @Test("a refused token is instance.invalidated with its reason, a terminal refusal delivery.failed; retries and successes are not events", arguments: StoreKind.available)
    func invalidatedAndFailed(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            try await register(store, activity: "order-1", devices: 0..<4)
            let transport = ScriptedTransport()
            transport.answer(token(0), with: [.invalidToken(reason: "Unregistered", providerID: "a")])
            transport.answer(token(1), with: [.rejected(reason: "PayloadTooLarge", providerID: "b")])
            transport.answer(token(2), with: [.retryable(reason: "TooManyRequests", retryAfter: nil, providerID: "c")])
            try await whileDispatching(store, transport) { _ in
                _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "order-1", contentState: ["step": 1]), at: Date())
                #expect(try await eventually {
                    try await store.events(appID: appID, after: nil, types: [.instanceInvalidated, .deliveryFailed], limit: 10).count == 2
                })
                #expect(try await eventually { try await allCaughtUp(store, "order-1") })
            }
            let events = try await store.events(appID: appID, after: nil, types: [], limit: 50)
            #expect(events.prefix(5).map(\.type) == [
                .instanceRegistered, .instanceRegistered, .instanceRegistered, .instanceRegistered, .activityStarted,
            ])
            let invalidated = try #require(events.first { $0.type == .instanceInvalidated })
            #expect(invalidated.deviceID == "device-00000")
            #expect(invalidated.data.objectValue?["reason"] == "Unregistered")
            #expect(invalidated.data.objectValue?["platform"] == "ios")
            let failed = try #require(events.first { $0.type == .deliveryFailed })
            #expect(failed.deviceID == "device-00001")
            #expect(failed.data.objectValue?["reason"] == "PayloadTooLarge")
            #expect(failed.data.objectValue?["sequence"] == 1)
            #expect(events.filter { $0.type == .instanceInvalidated || $0.type == .deliveryFailed }.count == 2)
        }
    }

    @Test("a broadcast APNs refuses for good is delivery.failed with its channel", arguments: StoreKind.available)
    func broadcastFailed(on kind: StoreKind) async throws {
        try await withTemporaryStore(kind) { store, _ in
            try await seedApp(store)
            _ = try await store.assignChannel(
                appID: appID, activityID: "match", channelID: "Y2g=", storagePolicy: .mostRecent, maximumChannels: 10, at: Date()
            )
            let transport = ScriptedBroadcasts()
            transport.answer(with: [.channelNotRegistered(reason: "ChannelNotRegistered", requestID: "r-1")])
            let dispatcher = Dispatcher(store: store, transports: transport, configuration: fastConfiguration())
            let task = Task { try await dispatcher.run() }
            _ = try await store.acceptUpdate(ActivityUpdate(appID: appID, activityID: "match", contentState: ["minute": 1]), at: Date())
            #expect(try await eventually {
                try await store.events(appID: appID, after: nil, types: [.deliveryFailed], limit: 10).count == 1
            })
            task.cancel()
            _ = await task.result
            let failed = try #require(try await store.events(appID: appID, after: nil, types: [.deliveryFailed], limit: 10).first)
            #expect(failed.data.objectValue?["channelId"] == "Y2g=")
            #expect(failed.data.objectValue?["reason"] == "ChannelNotRegistered")
        }
    }
}

@Suite("Lifecycle events through the emulators")
struct EventsEndToEndTests {
    @Test("APNs refusing the app's key turns its credentials unhealthy, told once as credentials.unhealthy; the token it refuses is instance.invalidated")
    func credentialsAndInvalidation() async throws {
        try await withEmulatedPhones { env in
            let known = try await env.addIPhone("iphone-1", activity: "order-1")
            try await env.register("stale-1", activity: "order-1", platform: .ios, token: String(repeating: "0f", count: 32))
            let dispatcher = env.makeDispatcher()
            try await running(dispatcher) { () async throws in
                _ = try await env.update("order-1", ["step": 1])
                dispatcher.wake()
                #expect(try await waitFor { env.apns.display(token: known)?.contentState == ["step": 1] })
                #expect(try await waitFor {
                    try await env.store.events(appID: env.appID, after: nil, types: [.instanceInvalidated], limit: 10).count == 1
                })
                let invalidated = try await env.store.events(appID: env.appID, after: nil, types: [.instanceInvalidated], limit: 10)
                #expect(invalidated.first?.deviceID == "stale-1")
                #expect(invalidated.first?.data.objectValue?["reason"] == "BadDeviceToken")

                // A key the emulator does not trust.
                let sealer = try CredentialSealer(masterKey: Array(repeating: 9, count: 32))
                let stored = try #require(try await env.store.credentials(appID: env.appID, provider: .apns))
                var credentials = try APNsCredentials(stored, sealer: sealer)
                credentials.privateKeyPEM = P256.Signing.PrivateKey().pemRepresentation
                try await env.store.saveCredentials(try credentials.stored(appID: env.appID, sealer: sealer, at: env.clock.now))
                _ = try await env.update("order-1", ["step": 2])
                dispatcher.wake()
                #expect(try await waitFor {
                    try await env.store.events(appID: env.appID, after: nil, types: [.credentialsUnhealthy], limit: 10).count == 1
                })
                // The refused token was just signed: it is kept, not renewed at once (Apple: one renewal in 20 minutes,
                // and a new token from the same key would be refused alike), so the push is not sent again with another.
                let refused = env.apns.pushes(token: known).filter { $0.status == 403 }
                #expect(refused.count == 1)
                #expect(refused.first?.reason == "InvalidProviderToken")
            }
            let unhealthy = try await env.store.events(appID: env.appID, after: nil, types: [.credentialsUnhealthy], limit: 10)
            #expect(unhealthy.count == 1)
            #expect(unhealthy.first?.data.objectValue?["provider"] == "apns")
        }
    }
}
