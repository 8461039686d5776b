import Foundation
import LivelineCore
import LivelineTestSupport
import Logging
import Testing

@testable import LivelineEmulator

/// With `persistsPhones`, a restarted emulator shows every simulated phone as it was.
@Suite("Phone persistence")
struct PhonePersistenceTests {
    @Test("iPhones, their push-to-start tokens and started activities survive a restart")
    func apns() async throws {
        let directory = uniqueTemporaryURL(prefix: "liveline-emulator-persist").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let clock = TestClock()
        var configuration = APNsEmulatorConfiguration(dataDirectory: directory)
        configuration.now = { clock.now }
        configuration.persistsPhones = true
        var logger = Logger(label: "emulator-tests")
        logger.logLevel = .warning
        let key = TestSigningKey()

        let first = try APNsEmulator(configuration: configuration, logger: logger)
        first.registerSigningKey(teamID: key.teamID, keyID: key.keyID, publicKey: key.privateKey.publicKey)
        let ports = try await first.start()
        let phone = try first.createPhone(id: "phone-1", userID: "user-7", attributesTypes: ["MatchAttributes"])
        let legacy = first.addDevice(bundleID: "com.example.liveline.demo")
        let token = try #require(phone.pushToStartTokens["MatchAttributes"])
        let connection = try await HTTP2TestConnection.connect(port: ports.apnsPort, caPEM: first.caCertificatePEM)
        let request = TestRequest(
            path: "/3/device/\(token)",
            headers: [
                ("authorization", "bearer \(key.token(issuedAt: clock.seconds))"), ("apns-push-type", "liveactivity"),
                ("apns-topic", "com.example.liveline.demo.push-type.liveactivity"),
            ],
            body: startPayload(timestamp: clock.seconds)
        )
        #expect(try await connection.send(request).status == 200)
        await connection.close()
        let before = try #require(first.phone(id: "phone-1"))
        let rotatedAway = try #require(first.rotatePushToStartToken(phoneID: "phone-1", attributesType: "MatchAttributes"))
        try await first.shutdown()
        #expect(FileManager.default.fileExists(atPath: (directory as NSString).appendingPathComponent(APNsEmulator.phoneFileName)))

        let second = try APNsEmulator(configuration: configuration, logger: logger)
        let after = try #require(second.phone(id: "phone-1"))
        #expect(after == rotatedAway)
        #expect(after.activities == before.activities)
        #expect(after.activities.first?.state.contentState == ["score": "0-0"])
        #expect(second.display(token: legacy) != nil)
        // The token rotated away still answers as rotated: the registry knows it.
        #expect(second.core.state.withLock { $0.pushToStart[token]?.revokedAt } != nil)
        try await second.shutdown()
    }

    @Test("Android phones and their notifications survive a restart")
    func fcm() async throws {
        let directory = uniqueTemporaryURL(prefix: "liveline-fcm-persist").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var configuration = FCMEmulatorConfiguration(dataDirectory: directory)
        configuration.persistsPhones = true
        var logger = Logger(label: "emulator-tests")
        logger.logLevel = .warning

        let first = try FCMEmulator(configuration: configuration, logger: logger)
        try await first.start()
        let token = first.addDevice(deviceID: "pixel-1", userID: "user-7")
        _ = first.dismissNotification(token: token, activityID: "match-42")
        let before = try #require(first.device(token: token))
        try await first.shutdown()

        let second = try FCMEmulator(configuration: configuration, logger: logger)
        #expect(second.device(token: token) == before)
        #expect(second.device(token: token)?.deviceID == "pixel-1")
        try await second.shutdown()
    }
}
