import Foundation
import LivelineCore
import Testing

@Suite("Identifiers, tokens and dates")
struct RulesTests {
    @Test("valid identifiers", arguments: ["order-1234", "a", "match:42", "A.b_c-d:e", String(repeating: "x", count: 128)])
    func validIdentifiers(_ id: String) {
        #expect(Identifier.isValid(id))
    }

    @Test("invalid identifiers", arguments: ["", "with space", "slash/inside", "ünï", "semi;colon", String(repeating: "x", count: 129)])
    func invalidIdentifiers(_ id: String) {
        #expect(!Identifier.isValid(id))
        #expect(throws: ValidationError.self) { try Identifier.validate(id, field: "activityId") }
    }

    @Test("iOS tokens must be hex and are lowercased")
    func iosTokens() throws {
        #expect(try PushToken.validate("ABCDEF0123", platform: .ios) == "abcdef0123")
        #expect(throws: ValidationError.self) { try PushToken.validate("xyz", platform: .ios) }
        #expect(throws: ValidationError.self) { try PushToken.validate("abc", platform: .ios) }  // odd length
        #expect(throws: ValidationError.self) { try PushToken.validate("", platform: .ios) }
    }

    @Test("Android tokens are printable ASCII without spaces")
    func androidTokens() throws {
        #expect(try PushToken.validate("fcm:APA91b-x_y", platform: .android) == "fcm:APA91b-x_y")
        #expect(throws: ValidationError.self) { try PushToken.validate("has space", platform: .android) }
    }

    @Test("dates: ISO-8601 with and without fractions, and epoch seconds")
    func dates() throws {
        #expect(try APIDate.epochSeconds(from: "2026-11-21T10:00:00Z", field: "staleDate") == 1_795_255_200)
        #expect(try APIDate.epochSeconds(from: "2026-11-21T10:00:00.750Z", field: "staleDate") == 1_795_255_200)
        #expect(try APIDate.epochSeconds(from: "2026-11-21T11:00:00+01:00", field: "staleDate") == 1_795_255_200)
        #expect(try APIDate.epochSeconds(from: 1_795_255_200, field: "staleDate") == 1_795_255_200)
        #expect(throws: ValidationError.self) { try APIDate.epochSeconds(from: "tomorrow", field: "staleDate") }
        #expect(throws: ValidationError.self) { try APIDate.epochSeconds(from: true, field: "staleDate") }
        #expect(throws: ValidationError.self) { try APIDate.epochSeconds(from: -5, field: "staleDate") }
    }
}

@Suite("Lifecycle state machines")
struct LifecycleTests {
    @Test("an active activity takes updates and ends once")
    func activityTransitions() throws {
        #expect(try ActivityState.active.applying(.update) == .active)
        #expect(try ActivityState.active.applying(.end) == .ended)
        #expect(throws: LifecycleViolation.activityEnded) { try ActivityState.ended.applying(.update) }
        #expect(throws: LifecycleViolation.activityEnded) { try ActivityState.ended.applying(.end) }
    }

    @Test("a dismissed instance is never brought back", arguments: [
        InstanceEvent.tokenRegistered, .endedOnDevice, .tokenInvalidated, .endDelivered, .dismissedOnDevice,
    ])
    func dismissedIsFinal(_ event: InstanceEvent) {
        #expect(InstanceState.dismissed.applying(event) == .dismissed)
    }

    @Test("instance transitions")
    func instanceTransitions() {
        #expect(InstanceState.active.applying(.tokenRegistered) == .active)
        #expect(InstanceState.active.applying(.tokenInvalidated) == .invalidated)
        #expect(InstanceState.invalidated.applying(.tokenRegistered) == .active)
        #expect(InstanceState.active.applying(.endedOnDevice) == .ended)
        #expect(InstanceState.ended.applying(.tokenRegistered) == .ended)
        #expect(InstanceState.ended.applying(.dismissedOnDevice) == .dismissed)
        #expect(InstanceState.active.applying(.dismissedOnDevice) == .dismissed)
        #expect(InstanceState.active.receivesPushes)
        #expect(!InstanceState.dismissed.receivesPushes)
        #expect(!InstanceState.invalidated.receivesPushes)
    }

    @Test("a remotely started instance is confirmed by its token, refused with it, and ends or is dismissed like any")
    func startingTransitions() {
        #expect(InstanceState.starting.applying(.tokenRegistered) == .active)
        #expect(InstanceState.starting.applying(.tokenInvalidated) == .invalidated)
        #expect(InstanceState.starting.applying(.dismissedOnDevice) == .dismissed)
        #expect(InstanceState.starting.applying(.endedOnDevice) == .ended)
        #expect(InstanceState.starting.applying(.endDelivered) == .ended)
        #expect(InstanceState.starting.receivesPushes)
    }
}
