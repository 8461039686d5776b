import Foundation
import LivelineCore
import Testing

@testable import LivelineEmulator

/// The APNs listener answers as Apple documents: statuses, reasons, `apns-id`.
@Suite("APNs protocol")
struct APNsProtocolTests {
    @Test("A valid update is accepted, its apns-id echoed, and the phone shows it")
    func validUpdate() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let apnsID = "3e1f8a4c-52b4-4a7e-9a3c-2a1d9c0b7f11"
            let response = try await connection.send(
                fixture.push(payload(timestamp: fixture.clock.seconds, contentState: ["eta": 7, "driver": "Ana"]), extra: [("apns-id", apnsID)])
            )
            #expect(response.status == 200)
            #expect(response.apnsID == apnsID)
            #expect(response.body.isEmpty)

            let display = try #require(fixture.emulator.display(token: fixture.token))
            #expect(display.contentState == ["eta": 7, "driver": "Ana"])
            #expect(display.timestamp == fixture.clock.seconds)
            #expect(display.appliedCount == 1)
            #expect(display.lastEvent == "update")
            #expect(display.bundleID == fixture.bundleID)

            let pushes = fixture.emulator.pushes(token: fixture.token)
            #expect(pushes.count == 1)
            #expect(pushes.first?.status == 200)
            #expect(pushes.first?.verdict == .applied)
            #expect(pushes.first?.apnsID == apnsID)
            #expect(pushes.first?.header("apns-topic") == fixture.topic)
            #expect(pushes.first?.header("authorization")?.hasPrefix("bearer ") == true)
            #expect(pushes.first?.payload.contains("\"driver\":\"Ana\"") == true)
            let statistics = fixture.emulator.statistics
            #expect(statistics.totalRequests == 1)
            #expect(statistics.accepted == 1)
            #expect(statistics.applied == 1)
            #expect(statistics.byStatus[200] == 1)
            await connection.close()
        }
    }

    @Test("Without an apns-id the answer carries a new lowercase UUID")
    func generatedAPNsID() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let first = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            let second = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds + 1)))
            let id = try #require(first.apnsID)
            #expect(UUID(uuidString: id) != nil)
            #expect(id == id.lowercased())
            #expect(second.apnsID != id)
            await connection.close()
        }
    }

    @Test("A payload of exactly 4096 bytes is accepted")
    func largestPayload() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let base = payload(timestamp: fixture.clock.seconds, contentState: ["pad": ""]).count
            let body = payload(timestamp: fixture.clock.seconds, contentState: ["pad": .string(String(repeating: "x", count: 4096 - base))])
            #expect(body.count == 4096)
            let response = try await connection.send(fixture.push(body))
            #expect(response.status == 200)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 1)
            await connection.close()
        }
    }

    struct RejectionCase: Sendable, CustomTestStringConvertible {
        var name: String
        var status: Int
        var reason: String
        var request: @Sendable (EmulatorFixture) -> TestRequest
        var testDescription: String { "\(name) → \(status) \(reason)" }
    }

    static let rejections: [RejectionCase] = [
        RejectionCase(name: "GET", status: 405, reason: "MethodNotAllowed") { fixture in
            var request = fixture.push(payload(timestamp: fixture.clock.seconds))
            request.method = "GET"
            return request
        },
        RejectionCase(name: "path outside /3/device", status: 404, reason: "BadPath") { fixture in
            var request = fixture.push(payload(timestamp: fixture.clock.seconds))
            request.path = "/3/devices/\(fixture.token)"
            return request
        },
        RejectionCase(name: "path with no token", status: 400, reason: "MissingDeviceToken") { fixture in
            var request = fixture.push(payload(timestamp: fixture.clock.seconds))
            request.path = "/3/device/"
            return request
        },
        RejectionCase(name: "no authorization", status: 403, reason: "MissingProviderToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["authorization": nil])
        },
        RejectionCase(name: "two authorization headers", status: 400, reason: "DuplicateHeaders") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), extra: [("authorization", "bearer \(fixture.providerToken)")])
        },
        RejectionCase(name: "not a bearer token", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["authorization": "basic \(fixture.providerToken)"])
        },
        RejectionCase(name: "malformed JWT", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), providerToken: "not.a-jwt")
        },
        RejectionCase(name: "padded base64 in the JWT", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), providerToken: fixture.providerToken + "=")
        },
        RejectionCase(name: "alg HS256", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(
                payload(timestamp: fixture.clock.seconds),
                providerToken: fixture.key.token(iat: .integer(Int64(fixture.clock.seconds)), alg: "HS256")
            )
        },
        RejectionCase(name: "unknown kid", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(
                payload(timestamp: fixture.clock.seconds),
                providerToken: fixture.key.token(iat: .integer(Int64(fixture.clock.seconds)), kid: "UNKNOWN123")
            )
        },
        RejectionCase(name: "iss not the key's team", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(
                payload(timestamp: fixture.clock.seconds),
                providerToken: fixture.key.token(iat: .integer(Int64(fixture.clock.seconds)), iss: "OTHERTEAM1")
            )
        },
        RejectionCase(name: "signed by another key", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(
                payload(timestamp: fixture.clock.seconds),
                providerToken: fixture.key.token(iat: .integer(Int64(fixture.clock.seconds)), signingKey: .init())
            )
        },
        RejectionCase(name: "iat a string", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(
                payload(timestamp: fixture.clock.seconds),
                providerToken: fixture.key.token(iat: .string(String(Int64(fixture.clock.seconds))))
            )
        },
        RejectionCase(name: "iat in the future", status: 403, reason: "InvalidProviderToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), providerToken: fixture.key.token(issuedAt: fixture.clock.seconds + 600))
        },
        RejectionCase(name: "iat 61 minutes old", status: 403, reason: "ExpiredProviderToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), providerToken: fixture.key.token(issuedAt: fixture.clock.seconds - 61 * 60))
        },
        RejectionCase(name: "no apns-push-type", status: 400, reason: "MissingPushType") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-push-type": nil])
        },
        RejectionCase(name: "apns-push-type alert", status: 400, reason: "InvalidPushType") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-push-type": "alert"])
        },
        RejectionCase(name: "no apns-topic", status: 400, reason: "MissingTopic") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-topic": nil])
        },
        RejectionCase(name: "topic without .push-type.liveactivity", status: 400, reason: "BadTopic") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-topic": fixture.bundleID])
        },
        RejectionCase(name: "topic of an unknown bundle", status: 400, reason: "TopicDisallowed") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-topic": "com.example.unknown.push-type.liveactivity"])
        },
        RejectionCase(name: "token of another bundle", status: 400, reason: "DeviceTokenNotForTopic") { fixture in
            let other = fixture.emulator.addDevice(bundleID: "com.example.other")
            return fixture.push(payload(timestamp: fixture.clock.seconds), token: other)
        },
        RejectionCase(name: "apns-priority 1", status: 400, reason: "BadPriority") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-priority": "1"])
        },
        RejectionCase(name: "apns-expiration not an integer", status: 400, reason: "BadExpirationDate") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-expiration": "tomorrow"])
        },
        RejectionCase(name: "apns-id not a UUID", status: 400, reason: "BadMessageId") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-id": "push-1"])
        },
        RejectionCase(name: "two apns-topic headers", status: 400, reason: "DuplicateHeaders") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), extra: [("apns-topic", fixture.topic)])
        },
        RejectionCase(name: "apns-collapse-id over 64 bytes", status: 400, reason: "BadCollapseId") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), ["apns-collapse-id": String(repeating: "c", count: 65)])
        },
        RejectionCase(name: "token not hex", status: 400, reason: "BadDeviceToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), token: "not-a-hex-token")
        },
        RejectionCase(name: "unknown token", status: 400, reason: "BadDeviceToken") { fixture in
            fixture.push(payload(timestamp: fixture.clock.seconds), token: String(repeating: "ab", count: 32))
        },
        RejectionCase(name: "empty body", status: 400, reason: "PayloadEmpty") { fixture in
            fixture.push([])
        },
        RejectionCase(name: "4097-byte body", status: 413, reason: "PayloadTooLarge") { fixture in
            let base = payload(timestamp: fixture.clock.seconds, contentState: ["pad": ""]).count
            return fixture.push(payload(timestamp: fixture.clock.seconds, contentState: ["pad": .string(String(repeating: "x", count: 4097 - base))]))
        },
    ]

    @Test("Rejections carry Apple's status and reason", arguments: rejections)
    func rejection(_ rejection: RejectionCase) async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let response = try await connection.send(rejection.request(fixture))
            #expect(response.status == rejection.status)
            #expect(response.reason == rejection.reason)
            #expect(response.header("content-type")?.hasPrefix("application/json") == true)
            let apnsID = try #require(response.apnsID)
            #expect(UUID(uuidString: apnsID) != nil)

            let recorded = try #require(fixture.emulator.pushes(limit: 1).last)
            #expect(recorded.status == rejection.status)
            #expect(recorded.reason == rejection.reason)
            #expect(recorded.verdict == nil)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 0)
            #expect(fixture.emulator.display(token: fixture.token)?.contentState == nil)
            #expect(fixture.emulator.statistics.byReason[rejection.reason] == 1)
            #expect(fixture.emulator.statistics.accepted == 0)
            await connection.close()
        }
    }

    @Test("An expired device token gets 410 Unregistered with the time it expired, in milliseconds")
    func unregistered() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            #expect(try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds))).status == 200)
            fixture.clock.advance(by: 12.345)
            let expiredAt = fixture.clock.now
            fixture.emulator.expireDevice(token: fixture.token)
            fixture.clock.advance(by: 30)
            let response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds)))
            #expect(response.status == 410)
            #expect(response.reason == "Unregistered")
            #expect(response.json?.objectValue?["timestamp"] == .integer(Int64(expiredAt.timeIntervalSince1970 * 1000)))
            #expect(fixture.emulator.display(token: fixture.token)?.unregisteredAt == expiredAt)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 1)
            await connection.close()
        }
    }

    @Test("Priority-10 pushes in the last hour are counted per token; priority 5 is not")
    func priorityBudget() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let start = fixture.clock.seconds
            #expect(try await connection.send(fixture.push(payload(timestamp: start + 1))).status == 200)
            #expect(try await connection.send(fixture.push(payload(timestamp: start + 2), ["apns-priority": "5"])).status == 200)
            #expect(try await connection.send(fixture.push(payload(timestamp: start + 3), ["apns-priority": nil])).status == 200)
            // An ignored push (stale timestamp) was still delivered, so it still counts.
            #expect(try await connection.send(fixture.push(payload(timestamp: start + 1))).status == 200)
            #expect(fixture.emulator.display(token: fixture.token)?.priority10LastHour == 3)
            fixture.clock.advance(by: 30 * 60)
            #expect(try await connection.send(fixture.push(payload(timestamp: start + 4))).status == 200)
            #expect(fixture.emulator.display(token: fixture.token)?.priority10LastHour == 4)
            fixture.clock.advance(by: 31 * 60)
            #expect(fixture.emulator.display(token: fixture.token)?.priority10LastHour == 1)
            await connection.close()
        }
    }

    @Test("Device tokens are matched case-insensitively")
    func uppercaseToken() async throws {
        try await withEmulator { fixture in
            let connection = try await fixture.connect()
            let response = try await connection.send(fixture.push(payload(timestamp: fixture.clock.seconds), token: fixture.token.uppercased()))
            #expect(response.status == 200)
            #expect(fixture.emulator.display(token: fixture.token)?.appliedCount == 1)
            await connection.close()
        }
    }
}
