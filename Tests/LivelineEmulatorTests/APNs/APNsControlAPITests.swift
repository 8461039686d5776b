import Crypto
import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// The JSON control and inspection API, over real HTTP/1.1.
@Suite("Control API")
struct ControlAPITests {
    @Test("healthz")
    func health() async throws {
        try await withEmulator { fixture in
            let response = try await controlRequest(port: fixture.controlPort, "GET", "/healthz")
            #expect(response.status == 200)
            #expect(response.json == ["status": "ok"])
        }
    }

    @Test("Keys, bundles and devices registered through the API make a push go through")
    func registerAndPush() async throws {
        try await withEmulator { fixture in
            let key = TestSigningKey(teamID: "ABCDE12345", keyID: "ZYXWV98765")
            let keyBody: JSONValue = [
                "teamId": .string(key.teamID), "keyId": .string(key.keyID),
                "publicKeyPem": .string(key.privateKey.publicKey.pemRepresentation),
            ]
            var response = try await controlRequest(port: fixture.controlPort, "POST", "/keys", body: keyBody.encodedString)
            #expect(response.status == 201)
            response = try await controlRequest(port: fixture.controlPort, "POST", "/bundles", body: #"{"bundleId":"com.example.rides"}"#)
            #expect(response.status == 201)
            #expect(response.json == ["bundleId": "com.example.rides"])
            response = try await controlRequest(port: fixture.controlPort, "POST", "/devices", body: #"{"bundleId":"com.example.rides"}"#)
            #expect(response.status == 201)
            let token = try #require(response.json?.objectValue?["token"]?.stringValue)
            #expect(token.count == 64)

            let connection = try await fixture.connect()
            let push = TestRequest(
                path: "/3/device/\(token)",
                headers: [
                    ("authorization", "bearer \(key.token(issuedAt: fixture.clock.seconds))"), ("apns-push-type", "liveactivity"),
                    ("apns-topic", "com.example.rides.push-type.liveactivity"),
                ],
                body: payload(timestamp: fixture.clock.seconds, contentState: ["stop": 3])
            )
            #expect(try await connection.send(push).status == 200)
            await connection.close()

            response = try await controlRequest(port: fixture.controlPort, "GET", "/devices/\(token)")
            #expect(response.status == 200)
            let display = try #require(response.json?.objectValue)
            #expect(display["contentState"] == ["stop": 3])
            #expect(display["bundleId"] == "com.example.rides")
            #expect(display["appliedCount"] == 1)
            #expect(display["priority10LastHour"] == 1)
            #expect(display["isStale"] == false)

            response = try await controlRequest(port: fixture.controlPort, "GET", "/devices")
            let devices = try #require(response.json?.objectValue?["devices"]?.arrayValue)
            #expect(devices.count == 2)
            #expect(devices.last?.objectValue?["token"] == .string(token))
            // Absent values are null, not missing: the shape is the same for every device.
            #expect(devices.first?.objectValue?["contentState"] == .null)
            #expect(devices.first?.objectValue?.keys.sorted() == devices.last?.objectValue?.keys.sorted())

            response = try await controlRequest(port: fixture.controlPort, "GET", "/pushes?token=\(token)")
            let pushes = try #require(response.json?.objectValue?["pushes"]?.arrayValue)
            #expect(pushes.count == 1)
            #expect(pushes.first?.objectValue?["status"] == 200)
            #expect(pushes.first?.objectValue?["verdict"] == "applied")
            #expect(pushes.first?.objectValue?["token"] == .string(token))

            response = try await controlRequest(port: fixture.controlPort, "GET", "/statistics")
            #expect(response.json?.objectValue?["accepted"] == 1)
            #expect(response.json?.objectValue?["byStatus"] == ["200": 1])
        }
    }

    @Test("A .p8 private key is accepted as publicKeyPem; a chosen token is kept")
    func privateKeyAndChosenToken() async throws {
        try await withEmulator { fixture in
            let key = P256.Signing.PrivateKey()
            let body: JSONValue = ["teamId": "TEAM000001", "keyId": "KEY0000001", "publicKeyPem": .string(key.pemRepresentation)]
            #expect(try await controlRequest(port: fixture.controlPort, "POST", "/keys", body: body.encodedString).status == 201)
            #expect(fixture.emulator.core.state.withLock { $0.keys["KEY0000001"]?.publicKey.rawRepresentation } == key.publicKey.rawRepresentation)
            let chosen = String(repeating: "0a", count: 40)
            let response = try await controlRequest(
                port: fixture.controlPort, "POST", "/devices", body: #"{"bundleId":"com.example.liveline.demo","token":"\#(chosen)"}"#
            )
            #expect(response.json == ["token": .string(chosen)])
            #expect(fixture.emulator.display(token: chosen)?.bundleID == "com.example.liveline.demo")
        }
    }

    @Test("Expiring a device through the API makes pushes answer 410")
    func expire() async throws {
        try await withEmulator { fixture in
            let response = try await controlRequest(port: fixture.controlPort, "POST", "/devices/\(fixture.token)/expire")
            #expect(response.status == 200)
            #expect(response.json?.objectValue?["unregisteredAt"] == .string(APIDate.iso8601(fixture.clock.now)))
            let connection = try await fixture.connect()
            #expect(try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 410)
            await connection.close()
            let missing = try await controlRequest(port: fixture.controlPort, "POST", "/devices/abcd/expire")
            #expect(missing.status == 404)
            #expect(missing.errorCode == "device_not_found")
        }
    }

    @Test("Dismissing through the API stops later pushes from applying")
    func dismiss() async throws {
        try await withEmulator { fixture in
            let response = try await controlRequest(port: fixture.controlPort, "POST", "/devices/\(fixture.token)/dismiss")
            #expect(response.status == 200)
            #expect(response.json?.objectValue?["dismissed"] == true)
        }
    }

    @Test("Faults are read and replaced; bad ones are refused with the field named")
    func faults() async throws {
        try await withEmulator { fixture in
            var response = try await controlRequest(port: fixture.controlPort, "GET", "/faults")
            #expect(response.json?.objectValue?["internalErrorRate"] == 0)
            response = try await controlRequest(
                port: fixture.controlPort, "PUT", "/faults", body: #"{"unavailableRate":1,"retryAfterSeconds":12,"goAwayAfterRequests":50}"#
            )
            #expect(response.status == 200)
            #expect(fixture.emulator.faults == APNsFaults(unavailableRate: 1, retryAfterSeconds: 12, goAwayAfterRequests: 50))

            response = try await controlRequest(port: fixture.controlPort, "PUT", "/faults", body: #"{"dropConnectionRate":2}"#)
            #expect(response.status == 400)
            #expect(response.errorField == "dropConnectionRate")
            response = try await controlRequest(port: fixture.controlPort, "PUT", "/faults", body: #"{"delayMilliseconds":"slow"}"#)
            #expect(response.status == 400)
            #expect(response.errorField == "delayMilliseconds")
            response = try await controlRequest(port: fixture.controlPort, "PUT", "/faults", body: #"{"chaos":1}"#)
            #expect(response.status == 400)
            #expect(response.errorCode == "unknown_field")
            #expect(fixture.emulator.faults.unavailableRate == 1)

            response = try await controlRequest(port: fixture.controlPort, "PUT", "/faults", body: "{}")
            #expect(fixture.emulator.faults == .none)
        }
    }

    @Test("Errors have the {\"error\":{code,message,field}} shape")
    func errors() async throws {
        try await withEmulator { fixture in
            var response = try await controlRequest(port: fixture.controlPort, "GET", "/devices/ffff")
            #expect(response.status == 404)
            #expect(response.errorCode == "device_not_found")
            #expect(response.json?.objectValue?["error"]?.objectValue?["message"]?.stringValue?.isEmpty == false)
            response = try await controlRequest(port: fixture.controlPort, "POST", "/devices", body: "{")
            #expect(response.status == 400)
            #expect(response.errorCode == "malformed_json")
            response = try await controlRequest(port: fixture.controlPort, "POST", "/devices", body: "{}")
            #expect(response.errorField == "bundleId")
            response = try await controlRequest(port: fixture.controlPort, "POST", "/devices", body: #"{"bundleId":"a.b","token":"xyz"}"#)
            #expect(response.errorField == "token")
            response = try await controlRequest(
                port: fixture.controlPort, "POST", "/keys", body: #"{"teamId":"T","keyId":"K","publicKeyPem":"nope"}"#
            )
            #expect(response.errorField == "publicKeyPem")
            response = try await controlRequest(port: fixture.controlPort, "GET", "/pushes?limit=0")
            #expect(response.errorField == "limit")
            response = try await controlRequest(port: fixture.controlPort, "GET", "/nowhere")
            #expect(response.status == 404)
            #expect(response.errorCode == "not_found")
        }
    }

    @Test("The push history is a ring buffer bounded by pushHistoryLimit, newest last")
    func historyBound() async throws {
        try await withEmulator(historyLimit: 5) { fixture in
            let connection = try await fixture.connect()
            let start = fixture.clock.seconds
            for offset in 1...8 {
                #expect(try await connection.send(fixture.push(payload(timestamp: start + Double(offset)))).status == 200)
            }
            await connection.close()
            let pushes = fixture.emulator.pushes(limit: 100)
            let timestamps = pushes.compactMap { try? JSONValue(parsing: Array($0.payload.utf8)).objectValue?["aps"]?.objectValue?["timestamp"] }
            #expect(timestamps == (4...8).map { JSONValue.integer(Int64(start) + Int64($0)) })
            #expect(fixture.emulator.pushes(limit: 2).count == 2)
            #expect(fixture.emulator.pushes(limit: 2).last == pushes.last)
            #expect(fixture.emulator.statistics.totalRequests == 8)

            let response = try await controlRequest(port: fixture.controlPort, "GET", "/pushes?limit=2")
            let listed = try #require(response.json?.objectValue?["pushes"]?.arrayValue)
            #expect(listed.count == 2)
            #expect(listed.last?.objectValue?["apnsId"] == .string(pushes.last!.apnsID))
        }
    }
}

extension JSONValue {
    var arrayValue: [JSONValue]? {
        if case .array(let values) = self { return values }
        return nil
    }
}
