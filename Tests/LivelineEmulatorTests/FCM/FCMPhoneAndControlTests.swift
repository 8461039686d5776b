import Foundation
import LivelineCore
import LivelineTestSupport
import Testing

@testable import LivelineEmulator

/// The simulated Android phone: FCM accepts (200), the app applies or silently ignores.
@Suite("FCM emulator phones, faults and control API")
struct FCMPhoneAndControlTests {
    /// Sends the bodies in order on one connection; every answer must be 200. Returns the phone's verdicts.
    func deliver(_ bodies: [[UInt8]], _ fixture: FCMFixture) async throws -> [PhoneVerdict?] {
        let connection = try await fixture.connect()
        var verdicts: [PhoneVerdict?] = []
        for body in bodies {
            let response = try await connection.send(fixture.send(body))
            #expect(response.status == 200)
            verdicts.append(fixture.emulator.messages(token: fixture.token, limit: 1).last?.verdict)
        }
        await connection.close()
        return verdicts
    }

    @Test("the phone keeps the newest sequence; older or equal ones are ignored")
    func newestSequence() async throws {
        try await withFCMEmulator { fixture in
            let verdicts = try await deliver(
                [
                    liveUpdateBody(token: fixture.token, sequence: 2, state: #"{"eta":10}"#),
                    liveUpdateBody(token: fixture.token, sequence: 2, state: #"{"eta":9}"#),
                    liveUpdateBody(token: fixture.token, sequence: 1, state: #"{"eta":8}"#),
                    liveUpdateBody(token: fixture.token, sequence: 5, state: #"{"eta":7}"#),
                ], fixture)
            #expect(verdicts == [.applied, .ignored("stale sequence"), .ignored("stale sequence"), .applied])
            let notification = try #require(fixture.emulator.device(token: fixture.token)?.notification(activityID: "order-1234"))
            #expect(notification.contentState == ["eta": 7])
            #expect(notification.sequence == 5)
            #expect(notification.visible)
            #expect(notification.appliedCount == 2)
            #expect(notification.ignoredCount == 2)
            #expect(fixture.emulator.statistics.ignored == 2)
            #expect(fixture.emulator.device(token: fixture.token)?.highPriorityWithoutNotificationCount == 2)
        }
    }

    @Test("end ends the notification for good; its dismissal date removes it")
    func endStaysEnded() async throws {
        try await withFCMEmulator { fixture in
            let now = Int(fixture.clock.seconds)
            let verdicts = try await deliver(
                [
                    liveUpdateBody(token: fixture.token, sequence: 1),
                    liveUpdateBody(
                        token: fixture.token, event: "end", sequence: 2, state: #"{"eta":0}"#,
                        extraData: ["liveline_dismissal_date": .string(String(now + 600))]
                    ),
                    liveUpdateBody(token: fixture.token, sequence: 3, state: #"{"eta":4}"#),
                ], fixture)
            #expect(verdicts == [.applied, .applied, .ignored("ended")])
            var notification = try #require(fixture.emulator.device(token: fixture.token)?.notification(activityID: "order-1234"))
            #expect(notification.ended)
            #expect(notification.contentState == ["eta": 0])
            #expect(notification.lastEvent == "end")
            #expect(notification.visible)
            fixture.clock.advance(by: 600)
            notification = try #require(fixture.emulator.device(token: fixture.token)?.notification(activityID: "order-1234"))
            #expect(!notification.visible)
        }
    }

    @Test("after the user dismisses an activity nothing more shows for it; other activities are unaffected")
    func dismissal() async throws {
        try await withFCMEmulator { fixture in
            _ = try await deliver([liveUpdateBody(token: fixture.token, sequence: 1)], fixture)
            let dismissed = try await controlRequest(port: fixture.controlPort, "POST", "/devices/\(fixture.token)/dismiss?activity=order-1234")
            #expect(dismissed.status == 200)
            let verdicts = try await deliver(
                [
                    liveUpdateBody(token: fixture.token, sequence: 2),
                    liveUpdateBody(token: fixture.token, activity: "match-42", sequence: 1),
                ], fixture)
            #expect(verdicts == [.ignored("dismissed"), .applied])
            let device = try #require(fixture.emulator.device(token: fixture.token))
            #expect(device.notification(activityID: "order-1234")?.visible == false)
            #expect(device.notification(activityID: "order-1234")?.dismissedByUser == true)
            #expect(device.notification(activityID: "match-42")?.visible == true)
            #expect(device.notifications.map(\.activityID) == ["order-1234", "match-42"])
            // The dismissed activity's high-priority update showed nothing: what FCM counts against an app.
            #expect(device.highPriorityWithoutNotificationCount == 1)
        }
    }

    @Test("stale after the stale date; start keeps its attributes; alerts are counted")
    func staleStartAndAlert() async throws {
        try await withFCMEmulator { fixture in
            let now = Int(fixture.clock.seconds)
            _ = try await deliver(
                [
                    liveUpdateBody(
                        token: fixture.token, event: "start", sequence: 1,
                        extraData: [
                            "liveline_attributes_type": "DeliveryAttributes", "liveline_attributes": #"{"order":"1234"}"#,
                            "liveline_stale_date": .string(String(now + 60)), "liveline_alert_title": "On its way",
                            "liveline_alert_body": "Ana picked up your order",
                        ]
                    )
                ], fixture)
            var notification = try #require(fixture.emulator.device(token: fixture.token)?.notification(activityID: "order-1234"))
            #expect(notification.attributesType == "DeliveryAttributes")
            #expect(notification.attributes == ["order": "1234"])
            #expect(notification.alertCount == 1)
            #expect(notification.lastAlertTitle == "On its way")
            #expect(!notification.isStale)
            fixture.clock.advance(by: 61)
            notification = try #require(fixture.emulator.device(token: fixture.token)?.notification(activityID: "order-1234"))
            #expect(notification.isStale)
        }
    }

    @Test("a message an app cannot read is accepted by FCM and dropped by the app")
    func unusable() async throws {
        try await withFCMEmulator { fixture in
            let verdicts = try await deliver(
                [
                    Array(#"{"message":{"token":"\#(fixture.token)","data":{"hello":"world"}}}"#.utf8),
                    liveUpdateBody(token: fixture.token, sequence: 1, state: "not json"),
                    liveUpdateBody(token: fixture.token, event: "pause", sequence: 1),
                    liveUpdateBody(token: fixture.token, sequence: 1, extraData: ["liveline_sequence": "seven"]),
                    liveUpdateBody(token: fixture.token, sequence: 1, extraData: ["liveline_dismissal_date": "5"]),
                    liveUpdateBody(token: fixture.token, event: "start", sequence: 1),
                ], fixture)
            #expect(verdicts.allSatisfy { $0?.isApplied == false })
            let device = try #require(fixture.emulator.device(token: fixture.token))
            #expect(device.acceptedCount == 6)
            #expect(device.unusableCount == 6)
            #expect(device.notification(activityID: "order-1234")?.visible == false)
            #expect(device.notification(activityID: "order-1234")?.ignoredCount == 5)
        }
    }

    @Test("injected faults: 500, 503 and 429 in Google's shape, with Retry-After; none without a valid token")
    func faults() async throws {
        try await withFCMEmulator { fixture in
            let body = liveUpdateBody(token: fixture.token, sequence: 1)
            let cases: [(FCMFaults, Int, String, String?)] = [
                (FCMFaults(internalErrorRate: 1), 500, "INTERNAL", nil),
                (FCMFaults(unavailableRate: 1, retryAfterSeconds: 9), 503, "UNAVAILABLE", "9"),
                (FCMFaults(quotaExceededRate: 1, retryAfterSeconds: 30), 429, "QUOTA_EXCEEDED", "30"),
                (FCMFaults(quotaExceededRate: 1), 429, "QUOTA_EXCEEDED", nil),
            ]
            for (faults, status, code, retryAfter) in cases {
                fixture.emulator.setFaults(faults)
                let response = try await fixture.answer(fixture.send(body))
                #expect(response.status == status)
                #expect(response.fcmErrorCode == code)
                #expect(response.header("retry-after") == retryAfter)
            }
            let unauthenticated = try await fixture.answer(fixture.send(body, authorization: .some(nil)))
            #expect(unauthenticated.status == 401)
            fixture.emulator.setFaults(.none)
            #expect(try await fixture.answer(fixture.send(body)).status == 200)
            #expect(fixture.emulator.statistics.byStatus == [500: 1, 503: 1, 429: 2, 401: 1, 200: 1])
        }
    }

    @Test("the control API registers devices and service accounts, unregisters, dismisses, lists messages and sets faults")
    func controlAPI() async throws {
        try await withFCMEmulator { fixture in
            let port = fixture.controlPort
            let created = try await controlRequest(port: port, "POST", "/devices", body: #"{"projectId":"demo-project"}"#)
            #expect(created.status == 201)
            let token = try #require(created.json?.objectValue?["token"]?.stringValue)
            #expect(token.contains(":APA91b"))
            let chosen = try await controlRequest(port: port, "POST", "/devices", body: #"{"token":"my-token"}"#)
            #expect(chosen.json?.objectValue?["projectId"] == "liveline-demo")
            #expect(try await controlRequest(port: port, "POST", "/devices", body: #"{"projectId":5}"#).status == 400)

            let listed = try await controlRequest(port: port, "GET", "/devices")
            #expect(listed.json?.objectValue?["devices"].map { value -> Int in if case .array(let items) = value { items.count } else { 0 } } == 3)

            #expect(try await fixture.answer(fixture.send(liveUpdateBody(token: token, sequence: 1))).status == 200)
            let device = try await controlRequest(port: port, "GET", "/devices/\(token)")
            #expect(device.status == 200)
            let notifications = device.json?.objectValue?["notifications"]
            guard case .array(let items) = notifications else {
                Issue.record("no notifications array")
                return
            }
            #expect(items.first?.objectValue?["activityId"] == "order-1234")
            #expect(items.first?.objectValue?["contentState"] == ["eta": 5])

            let messages = try await controlRequest(port: port, "GET", "/messages?token=\(token)")
            guard case .array(let received) = messages.json?.objectValue?["messages"] else {
                Issue.record("no messages array")
                return
            }
            #expect(received.count == 1)
            #expect(received.first?.objectValue?["status"] == 200)

            #expect(try await controlRequest(port: port, "POST", "/devices/\(token)/unregister").status == 200)
            #expect(try await fixture.answer(fixture.send(liveUpdateBody(token: token, sequence: 2))).status == 404)
            #expect(try await controlRequest(port: port, "POST", "/devices/nobody/unregister").status == 404)
            #expect(try await controlRequest(port: port, "POST", "/devices/\(token)/dismiss").status == 400)

            let faults = try await controlRequest(port: port, "PUT", "/faults", body: #"{"unavailableRate":1,"retryAfterSeconds":3}"#)
            #expect(faults.status == 200)
            #expect(fixture.emulator.faults == FCMFaults(unavailableRate: 1, retryAfterSeconds: 3))
            #expect(try await controlRequest(port: port, "PUT", "/faults", body: #"{"unavailableRate":2}"#).status == 400)
            #expect(try await controlRequest(port: port, "PUT", "/faults", body: #"{"dropRate":1}"#).status == 400)
            #expect(try await controlRequest(port: port, "DELETE", "/faults").status == 200)
            #expect(fixture.emulator.faults == .none)

            // A service account registered through the API can get tokens.
            let registered = try await controlRequest(
                port: port, "POST", "/service-accounts",
                body: JSONValue.object([
                    "clientEmail": "second@other.iam.gserviceaccount.com", "projectId": "other",
                    "publicKeyPem": .string(fcmStrangerKey.publicKey.pemRepresentation),
                ]).encodedString
            )
            #expect(registered.status == 201)
            let second = TestServiceAccount(clientEmail: "second@other.iam.gserviceaccount.com", projectID: "other")
            let assertion = second.assertion(audience: fixture.tokenURI, issuedAt: fixture.clock.seconds, signingKey: fcmStrangerKey)
            #expect(try await fixture.answer(fixture.tokenRequest(TestServiceAccount.grant(assertion))).status == 200)
            let badKey = try await controlRequest(
                port: port, "POST", "/service-accounts", body: #"{"clientEmail":"x@y","projectId":"p","publicKeyPem":"nope"}"#
            )
            #expect(badKey.status == 400)

            #expect(try await controlRequest(port: port, "POST", "/access-tokens/revoke").status == 200)
            #expect(try await fixture.answer(fixture.send(liveUpdateBody(token: fixture.token, sequence: 1))).status == 401)

            let statistics = try await controlRequest(port: port, "GET", "/statistics")
            #expect(statistics.json?.objectValue?["tokensIssued"] == 2)
        }
    }

    @Test("the demo service account is generated once (mode 0600) with the emulator's token URI, and reused")
    func demoServiceAccount() async throws {
        try await withFCMEmulator { fixture in
            let first = try fixture.emulator.demoServiceAccount()
            #expect(first.generated)
            #expect(first.tokenURI == fixture.tokenURI)
            #expect(first.projectID == "liveline-demo")
            let attributes = try FileManager.default.attributesOfItem(atPath: first.path)
            #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
            let object = try #require(try JSONValue(parsing: Array(first.json.utf8)).objectValue)
            #expect(object["type"] == "service_account")
            #expect(object["token_uri"] == .string(fixture.tokenURI))
            #expect(object["private_key"]?.stringValue?.hasPrefix("-----BEGIN PRIVATE KEY-----") == true)
            let viaAPI = try await controlRequest(port: fixture.controlPort, "GET", "/service-accounts/demo")
            #expect(viaAPI.json?.objectValue?["clientEmail"] == .string(first.clientEmail))
            #expect(viaAPI.json?.objectValue?["privateKey"] == nil)

            // Another emulator on the same directory (another port) keeps the key and rewrites token_uri.
            var configuration = FCMEmulatorConfiguration(dataDirectory: fixture.directory)
            configuration.now = { fixture.clock.now }
            let other = try FCMEmulator(configuration: configuration, logger: .init(label: "other"))
            try await other.start()
            let reloaded = try other.demoServiceAccount()
            #expect(!reloaded.generated)
            #expect(reloaded.privateKeyID == first.privateKeyID)
            #expect(reloaded.tokenURI == other.tokenURI)
            #expect(reloaded.tokenURI != first.tokenURI)
            #expect(try String(contentsOfFile: reloaded.path, encoding: .utf8).contains(reloaded.tokenURI))
            try await other.shutdown()
        }
    }
}
