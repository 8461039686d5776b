import LivelineDispatch
import Testing

@testable import LivelineServer

@Suite("Engine configuration")
struct EngineConfigurationTests {
    private func configuration(_ environment: [String: String]) async throws -> LivelineConfiguration {
        try LivelineConfiguration(reader: await LivelineConfiguration.reader(flags: [:], file: nil, environment: environment))
    }

    @Test("the engine's call size, pushes in flight and progress batch default to the engine's own and are read from the environment")
    func keys() async throws {
        let defaults = try await configuration([:])
        let engine = DispatcherConfiguration()
        #expect(defaults.enginePushesPerCall == engine.pushesPerCall)
        #expect(defaults.enginePushesInFlight == engine.pushesInFlight)
        #expect(defaults.engineProgressBatch == engine.progressBatchSize)
        #expect((defaults.enginePushesPerCall, defaults.enginePushesInFlight, defaults.engineProgressBatch) == (64, 4000, 250))

        let configured = try await configuration([
            "LIVELINE_ENGINE_PUSHES_PER_CALL": "1000", "LIVELINE_ENGINE_PUSHES_IN_FLIGHT": "8000", "LIVELINE_ENGINE_PROGRESS_BATCH": "1000",
        ])
        #expect((configured.enginePushesPerCall, configured.enginePushesInFlight, configured.engineProgressBatch) == (1000, 8000, 1000))
        for name in ["liveline.engine.pushesPerCall", "liveline.engine.pushesInFlight", "liveline.engine.progressBatch"] {
            #expect(LivelineConfiguration.keys.contains { $0.name == name })
        }
    }

    @Test("the engine's workers default to the store's number and are read from the environment")
    func workers() async throws {
        #expect(try await configuration([:]).engineWorkers == nil)
        #expect(try await configuration([:]).deliveryWorkers() == DispatcherConfiguration.workersOnSQLite)
        let postgres = "postgres://liveline@127.0.0.1:5432/liveline"
        #expect(try await configuration(["LIVELINE_DATABASE": postgres]).deliveryWorkers() == DispatcherConfiguration.workersSharingADatabase)
        #expect((DispatcherConfiguration.workersOnSQLite, DispatcherConfiguration.workersSharingADatabase) == (128, 8))
        #expect(try await configuration(["LIVELINE_ENGINE_WORKERS": "7"]).deliveryWorkers() == 7)
        #expect(try await configuration(["LIVELINE_ENGINE_WORKERS": "9", "LIVELINE_DATABASE": postgres]).deliveryWorkers() == 9)
        #expect(LivelineConfiguration.keys.contains { $0.name == "liveline.engine.workers" })
    }

    @Test("calls larger than the default in flight raise the default in flight with them")
    func inFlightFollowsALargeCall() async throws {
        let configured = try await configuration(["LIVELINE_ENGINE_PUSHES_PER_CALL": "5000"])
        #expect(configured.enginePushesInFlight == 5000)
    }

    @Test("out-of-range values are refused", arguments: [
        ["LIVELINE_ENGINE_PUSHES_PER_CALL": "0"], ["LIVELINE_ENGINE_PUSHES_PER_CALL": "10001"],
        ["LIVELINE_ENGINE_PUSHES_IN_FLIGHT": "63"], ["LIVELINE_ENGINE_PUSHES_IN_FLIGHT": "100001"],
        ["LIVELINE_ENGINE_PUSHES_PER_CALL": "1000", "LIVELINE_ENGINE_PUSHES_IN_FLIGHT": "999"],
        ["LIVELINE_ENGINE_PROGRESS_BATCH": "0"], ["LIVELINE_ENGINE_PROGRESS_BATCH": "10001"],
        ["LIVELINE_ENGINE_WORKERS": "0"], ["LIVELINE_ENGINE_WORKERS": "257"], ["LIVELINE_ENGINE_WORKERS": "four"],
    ])
    func refused(environment: [String: String]) async throws {
        let reader = try await LivelineConfiguration.reader(flags: [:], file: nil, environment: environment)
        #expect(throws: ConfigurationError.self) { try LivelineConfiguration(reader: reader) }
    }
}
