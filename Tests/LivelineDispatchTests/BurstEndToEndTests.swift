import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineTestSupport
import Testing

@Suite("Bursts of updates through the APNs emulator", .tags(.slow), .unlessSkippingSlowTests)
struct BurstEndToEndTests {
    @Test("50 updates a second to 1,000 phones: strictly newer timestamps only, the final state everywhere, priority 10 within budget")
    func fiftyUpdatesASecond() async throws {
        try await withEmulatedAPNs { env in
            var tokens: [String] = []
            for index in 0..<1000 { tokens.append(try await env.addPhone(String(format: "p%05d", index), activity: "live")) }
            // A budget of 1 an hour, so that a phone receiving more than one push shows whether it was kept. (Every
            // phone gets at least two, an early state and the final one, unless its first push already carried the
            // final state; with a budget of 2, a first pass slowed down by a loaded machine could leave every phone
            // at exactly the budget, and the test would show nothing.)
            let budget = PriorityBudget(hourly: 1, hourlyWithFrequentPushes: 1)
            var configuration = e2eConfiguration()
            configuration.budget = budget
            let dispatcher = env.makeDispatcher(configuration)
            try await running(dispatcher) { () async throws in
                // 250 updates over five seconds, as a busy backend would post them.
                for n in 1...250 {
                    _ = try await env.update("live", ["n": .integer(Int64(n))])
                    dispatcher.wake()
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(try await waitFor(timeout: .seconds(120)) {
                    tokens.allSatisfy { env.emulator.display(token: $0)?.contentState == ["n": 250] }
                })
            }
            var received = 0
            for token in tokens {
                let display = try #require(env.emulator.display(token: token))
                // Every push a phone got carried a newer timestamp than the one before: none was ignored.
                #expect(display.ignoredCount == 0, "\(token): \(display.lastIgnoredReason ?? "")")
                #expect(display.priority10LastHour <= budget.hourly, "\(token): \(display.priority10LastHour) priority-10 pushes")
                received += display.appliedCount
            }
            // Coalescing: far fewer pushes than 250 per phone …
            #expect(received < 250 * tokens.count)
            // … yet more than the budget's worth, so the budget was what kept priority 10 in bounds.
            #expect(received > budget.hourly * tokens.count, "\(received) pushes applied")
        }
    }
}
