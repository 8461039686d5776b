import LivelineCore
import Testing

@testable import LivelineDispatch

/// What each instance is sent of a state: the state, its start, or nothing — without a socket or a database.
@Suite("What a remotely started instance is sent")
struct StartDecisionTests {
    typealias Send = Dispatcher.InstanceSend

    @Test("an instance watching already gets the state, whatever it is")
    func watching() {
        for platform in [Platform.ios, .android] {
            for event in [LiveActivityEvent.update, .end] {
                #expect(Send.decide(state: .active, platform: platform, deliveredSequence: 0, event: event, hasStart: true) == .state)
                #expect(Send.decide(state: .active, platform: platform, deliveredSequence: 4, event: event, hasStart: false) == .state)
            }
        }
    }

    @Test("a starting instance whose start has not gone out gets the start, carrying the newest state")
    func startNotYetSent() {
        #expect(Send.decide(state: .starting, platform: .ios, deliveredSequence: 0, event: .update, hasStart: true) == .start)
        #expect(Send.decide(state: .starting, platform: .android, deliveredSequence: 0, event: .update, hasStart: true) == .start)
    }

    @Test("an Android phone already started gets the states after its start at the same FCM token")
    func androidAfterStart() {
        #expect(Send.decide(state: .starting, platform: .android, deliveredSequence: 3, event: .update, hasStart: true) == .state)
        #expect(Send.decide(state: .starting, platform: .android, deliveredSequence: 3, event: .end, hasStart: false) == .state)
    }

    @Test("an iPhone is never started only to be ended; an Android phone hears the end")
    func endedBeforeStart() {
        #expect(Send.decide(state: .starting, platform: .ios, deliveredSequence: 0, event: .end, hasStart: false) == .nothing)
        #expect(Send.decide(state: .starting, platform: .ios, deliveredSequence: 0, event: .update, hasStart: false) == .nothing)
        #expect(Send.decide(state: .starting, platform: .android, deliveredSequence: 0, event: .end, hasStart: false) == .state)
    }
}
