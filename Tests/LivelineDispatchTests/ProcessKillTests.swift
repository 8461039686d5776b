import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineEmulator
import LivelineStore
import LivelineTestSupport
import Logging
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("A real liveline process, killed mid-fan-out", .tags(.slow), .unlessSkippingSlowTests)
struct ProcessKillTests {
    @Test("SIGKILL during a fan-out to thousands of instances, then a restart: every phone ends at the latest state")
    func killAndRestart() async throws {
        let executable = livelineExecutable()
        guard FileManager.default.isExecutableFile(atPath: executable.path) else {
            Issue.record("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY: \(executable.path) is missing")
            return
        }
        let root = uniqueTemporaryURL(prefix: "liveline-kill")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }

        let emulator = try APNsEmulator(
            configuration: APNsEmulatorConfiguration(dataDirectory: root.appendingPathComponent("emulator").path), logger: Logger(label: "test")
        )
        let ports = try await emulator.start()
        defer { Task { try? await emulator.shutdown() } }
        let key = P256.Signing.PrivateKey()
        emulator.registerSigningKey(teamID: "TEAM123456", keyID: "KEY1234567", publicKey: key.publicKey)
        emulator.registerBundleID("com.example.kill")

        // The server's data directory, prepared the way an operator would: an app with credentials.
        let masterKey = try CredentialSealer.loadOrCreateMasterKey(at: root.appendingPathComponent("master.key").path)
        let store = try await SQLStore.open(path: root.appendingPathComponent("liveline.sqlite").path)
        try await store.createApp(AppRecord(id: "app_kill", name: "K", bundleID: "com.example.kill", androidPackage: nil, createdAt: Date()), keys: [])
        let credentials = APNsCredentials(
            teamID: "TEAM123456", keyID: "KEY1234567", privateKeyPEM: key.pemRepresentation, environment: .sandbox,
            baseURL: "https://127.0.0.1:\(ports.apnsPort)", caCertificatePEM: emulator.caCertificatePEM
        )
        try await store.saveCredentials(try credentials.stored(appID: "app_kill", sealer: CredentialSealer(masterKey: masterKey), at: Date()))
        var tokens: [String] = []
        for index in 0..<3000 {
            let token = emulator.addDevice(bundleID: "com.example.kill")
            tokens.append(token)
            _ = try await store.registerInstance(
                InstanceRegistration(appID: "app_kill", activityID: "match", deviceID: String(format: "phone-%05d", index), platform: .ios,
                                     pushToken: token, attributesType: "Match", attributes: [:], userID: nil),
                at: Date()
            )
        }
        _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_kill", activityID: "match", contentState: ["score": "1-0"]), at: Date())

        func launch() throws -> ChildProcess {
            try ChildProcess(
                executable: executable,
                arguments: ["serve", "--data-dir", root.path, "--port", "\(freePort())", "--no-emulator", "--log-level", "warning"],
                output: nil
            )
        }

        var slow = APNsFaults()
        slow.delayMilliseconds = 20
        emulator.setFaults(slow)
        let first = try launch()
        let started = try await waitFor(timeout: .seconds(60)) { emulator.statistics.accepted >= 300 }
        first.signal(SIGKILL)
        first.waitUntilExit()
        #expect(started)
        let beforeRestart = emulator.statistics.accepted
        #expect(beforeRestart < 3000, "the process was killed part-way through the fan-out")

        // A newer state arrives while the server is down; the restarted server coalesces onto it.
        _ = try await store.acceptUpdate(ActivityUpdate(appID: "app_kill", activityID: "match", contentState: ["score": "2-0"]), at: Date())
        emulator.setFaults(APNsFaults())
        let second = try launch()
        let caughtUp = try await waitFor(timeout: .seconds(120)) {
            tokens.allSatisfy { emulator.display(token: $0)?.contentState == ["score": "2-0"] }
        }
        second.terminate()
        second.waitUntilExit()
        #expect(caughtUp)
        let activity = try await store.activity(appID: "app_kill", activityID: "match")
        #expect(activity?.instanceCounts[.active] == 3000)
        try await store.close()
    }
}
