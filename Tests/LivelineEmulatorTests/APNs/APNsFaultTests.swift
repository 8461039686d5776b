import Foundation
import LivelineCore
import NIOCore
import NIOHTTP2
import Testing

@testable import LivelineEmulator

/// Injected faults, for the sender's retry and reconnect paths.
@Suite("Faults")
struct FaultTests {
    @Test("internalErrorRate 1 answers 500 InternalServerError, without retry-after")
    func internalError() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(internalErrorRate: 1, retryAfterSeconds: 9))
            let connection = try await fixture.connect()
            let response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 500)
            #expect(response.reason == "InternalServerError")
            #expect(response.header("retry-after") == nil)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 0)
            await connection.close()
        }
    }

    @Test("unavailableRate 1 answers 503 ServiceUnavailable with retry-after")
    func unavailable() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(unavailableRate: 1, retryAfterSeconds: 30))
            let connection = try await fixture.connect()
            let response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 503)
            #expect(response.reason == "ServiceUnavailable")
            #expect(response.header("retry-after") == "30")
            await connection.close()
        }
    }

    @Test("tooManyRequestsRate 1 answers 429 TooManyRequests with retry-after; without the setting, none")
    func tooManyRequests() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(tooManyRequestsRate: 1, retryAfterSeconds: 2))
            let connection = try await fixture.connect()
            var response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 429)
            #expect(response.reason == "TooManyRequests")
            #expect(response.header("retry-after") == "2")
            fixture.emulator.setFaults(APNsFaults(tooManyRequestsRate: 1))
            response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 429)
            #expect(response.header("retry-after") == nil)
            fixture.emulator.setFaults(.none)
            response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 200)
            await connection.close()
        }
    }

    @Test("Faults apply only after authentication succeeds")
    func faultsAfterAuthentication() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(internalErrorRate: 1, dropConnectionRate: 0))
            let connection = try await fixture.connect()
            let unauthenticated = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds), ["authorization": nil]))
            #expect(unauthenticated.status == 403)
            #expect(unauthenticated.reason == "MissingProviderToken")
            // An otherwise bad request that authenticates meets the fault first.
            let badTopic = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-topic": "x"]))
            #expect(badTopic.status == 500)
            await connection.close()
        }
    }

    @Test("delayMilliseconds holds each answer back")
    func delay() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(delayMilliseconds: 300))
            let connection = try await fixture.connect()
            let clock = ContinuousClock()
            let started = clock.now
            let results = try await connection.sendAll([
                fixture.push(payload(timestamp: fixture.clock.seconds)), fixture.push(payload(timestamp: fixture.clock.seconds + 1)),
            ])
            let elapsed = clock.now - started
            #expect(results.allSatisfy { (try? $0.get().status) == 200 })
            #expect(elapsed >= .milliseconds(300))
            await connection.close()
        }
    }

    @Test("goAwayAfterRequests sends GOAWAY with {\"reason\":\"Shutdown\"} after N requests and closes the connection")
    func goAway() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(goAwayAfterRequests: 3))
            let connection = try await fixture.connect()
            for offset in 0..<3 {
                let response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds + Double(offset))))
                #expect(response.status == 200)
            }
            let goAway = try await connection.goAway.get()
            #expect(goAway.lastStreamID == 5)
            #expect(goAway.errorCode == .noError)
            #expect(try JSONValue(parsing: Array(goAway.debugData.utf8)) == ["reason": "Shutdown"])
            try await connection.channel.closeFuture.get()
            await #expect(throws: TestClientError.self) {
                try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds + 10)))
            }
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 3)
            // A new connection is served again.
            let next = try await fixture.connect()
            #expect(try await next.send(fixture.push(payload(timestamp: fixture.clock.seconds + 11))).status == 200)
            await next.close()
        }
    }

    @Test("Requests sent beside the N-th are either answered or refused by GOAWAY, never lost")
    func goAwayRefusesLaterStreams() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(goAwayAfterRequests: 2))
            let connection = try await fixture.connect()
            let results = try await connection.sendAll(
                (0..<5).map { fixture.push(payload(timestamp: fixture.clock.seconds + Double($0))) }
            )
            let answered = results.compactMap { try? $0.get() }
            let refused = results.filter {
                if case .failure(let error) = $0 { return (error as? TestClientError) == .refusedByGoAway }
                return false
            }
            // Requests complete out of stream order, so which ones were served before the GOAWAY
            // varies; what may not vary: none is lost, and none above lastStreamID was served.
            let goAway = try await connection.goAway.get()
            #expect(answered.count >= 2)
            #expect(answered.count + refused.count == 5)
            #expect(answered.allSatisfy { $0.status == 200 })
            #expect(answered.map(\.streamID).max() == goAway.lastStreamID)
            #expect(fixture.emulator.statistics.totalRequests == answered.count)
        }
    }

    @Test("dropConnectionRate 1 closes the connection instead of answering")
    func drop() async throws {
        try await withEmulator { fixture in
            fixture.emulator.setFaults(APNsFaults(dropConnectionRate: 1))
            let connection = try await fixture.connect()
            await #expect(throws: TestClientError.connectionClosed) {
                try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            }
            try await connection.channel.closeFuture.get()
            let recorded = try #require(fixture.emulator.pushes(limit: 1).last)
            #expect(recorded.status == nil)
            #expect(recorded.verdict == nil)
            #expect(fixture.emulator.statistics.dropped == 1)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 0)
        }
    }

    @Test("Shutting down sends open connections GOAWAY Shutdown")
    func shutdownSaysGoodbye() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            #expect(try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 200)
            try await fixture.emulator.shutdown()
            let goAway = try await connection.goAway.get()
            #expect(goAway.lastStreamID == 1)
            #expect(goAway.debugData == #"{"reason":"Shutdown"}"#)
            try await connection.channel.closeFuture.get()
            await #expect(throws: (any Error).self) { try await fixture.connect() }
            await #expect(throws: APNsEmulator.LifecycleError.self) { try await fixture.emulator.start() }
        }
    }

    @Test("APNsFaults decode with defaults and reject rates outside 0...1")
    func faultsCoding() throws {
        let decoded = try JSONDecoder().decode(APNsFaults.self, from: Data(#"{"unavailableRate":0.5,"retryAfterSeconds":3}"#.utf8))
        #expect(decoded == APNsFaults(unavailableRate: 0.5, retryAfterSeconds: 3))
        #expect(decoded.invalidMember == nil)
        #expect(APNsFaults(internalErrorRate: 1.5).invalidMember?.field == "internalErrorRate")
        #expect(APNsFaults(goAwayAfterRequests: 0).invalidMember?.field == "goAwayAfterRequests")
        let roundTrip = try JSONDecoder().decode(APNsFaults.self, from: JSONEncoder().encode(decoded))
        #expect(roundTrip == decoded)
    }
}
