import Foundation
import LivelineCore
import Testing

@Suite("How long APNs and FCM keep a push for an offline phone")
struct LiveUpdateLifetimeTests {
    let now = Date(timeIntervalSince1970: 1_700_000_000.75)

    @Test("without a stale date: an hour for a start or an update, eight hours for an end")
    func defaults() {
        #expect(LiveUpdateLifetime.seconds(event: .start, staleDate: nil, now: now) == 3600)
        #expect(LiveUpdateLifetime.seconds(event: .update, staleDate: nil, now: now) == 3600)
        #expect(LiveUpdateLifetime.seconds(event: .end, staleDate: nil, now: now) == 8 * 3600)
        #expect(APNsLiveActivityPayload.expiration(event: .update, staleDate: nil, now: now) == 1_700_000_000 + 3600)
        #expect(APNsLiveActivityPayload.expiration(event: .end, staleDate: nil, now: now) == 1_700_000_000 + 8 * 3600)
        #expect(FCMLiveUpdateMessage.timeToLive(event: .end, staleDate: nil, now: now) == 8 * 3600)
    }

    @Test("a state is kept until its stale date; once that has passed, it goes now or never")
    func staleDate() {
        #expect(LiveUpdateLifetime.seconds(event: .update, staleDate: 1_700_000_600, now: now) == 600)
        #expect(APNsLiveActivityPayload.expiration(event: .update, staleDate: 1_700_000_600, now: now) == 1_700_000_600)
        #expect(LiveUpdateLifetime.seconds(event: .update, staleDate: 1_699_999_000, now: now) == 0)
        #expect(APNsLiveActivityPayload.expiration(event: .update, staleDate: 1_699_999_000, now: now) == 0)
        #expect(FCMLiveUpdateMessage.timeToLive(event: .update, staleDate: 1_699_999_000, now: now) == 0)
        // FCM keeps a message at most 28 days.
        #expect(LiveUpdateLifetime.seconds(event: .update, staleDate: 1_700_000_000 + 90 * 86400, now: now) == 28 * 86400)
    }

    @Test("an end is kept eight hours whatever its stale date: the phone must hear that the activity is over")
    func endIgnoresStaleDate() {
        #expect(LiveUpdateLifetime.seconds(event: .end, staleDate: 1_699_999_000, now: now) == 8 * 3600)
        #expect(APNsLiveActivityPayload.expiration(event: .end, staleDate: 1_700_000_600, now: now) == 1_700_000_000 + 8 * 3600)
    }
}
