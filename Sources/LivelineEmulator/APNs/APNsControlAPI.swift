import Crypto
import Foundation
import Hummingbird
import LivelineCore
import NIOCore

/// The APNs emulator's control and inspection API (HTTP/1.1, JSON):
///
/// | route | does |
/// |---|---|
/// | `GET /healthz` | `{"status":"ok"}` |
/// | `GET /pushes?token=&limit=` | received requests, newest last (`limit` default 100) |
/// | `GET /devices` | every device with its display |
/// | `GET /devices/{token}` | one device's display |
/// | `POST /devices` `{"bundleId", "token"?}` | 201 `{"token"}` |
/// | `POST /devices/{token}/expire` | later pushes get 410 Unregistered |
/// | `POST /devices/{token}/dismiss` | the user dismisses the activity |
/// | `GET /faults`, `PUT /faults` | the injected ``APNsFaults`` |
/// | `POST /keys` `{"teamId","keyId","publicKeyPem"}` | trust a signing key (public key or .p8 PEM) |
/// | `POST /bundles` `{"bundleId"}` | allow a topic |
/// | `GET /statistics` | ``EmulatorStatistics`` |
struct APNsControlAPI: Sendable {
    let emulator: APNsEmulator

    func makeRouter() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: ControlErrorMiddleware())
        router.get("healthz") { _, _ in try ControlAPI.json(["status": "ok"] as [String: String]) }
        router.get("pushes") { request, _ in
            let limit = try ControlAPI.limit(request)
            let token = request.uri.queryParameters.get("token").flatMap { $0.isEmpty ? nil : $0 }
            return try ControlAPI.json(["pushes": emulator.pushes(token: token, limit: limit)])
        }
        router.get("devices") { _, _ in try ControlAPI.json(["devices": emulator.devices()]) }
        router.get("devices/:token") { _, context in
            let token = try context.parameters.require("token")
            guard let display = emulator.display(token: token) else { throw ControlAPIError.deviceNotFound(token) }
            return try ControlAPI.json(display)
        }
        router.post("devices") { request, _ in
            let body = try await ControlAPI.readObject(request, allowed: ["bundleId", "token"])
            let bundleID = try ControlAPI.requiredString(body, "bundleId")
            var token: String?
            if let value = body["token"], value != .null {
                guard let text = value.stringValue, APNsEmulatorCore.isHexToken(text) else {
                    throw ControlAPIError.badRequest(
                        "invalid_token", "token must be a non-empty, even-length hex string.", field: "token"
                    )
                }
                token = text
            }
            let created = emulator.addDevice(bundleID: bundleID, token: token)
            return try ControlAPI.json(["token": created], status: .created)
        }
        router.post("devices/:token/expire") { _, context in
            let token = try context.parameters.require("token")
            guard emulator.core.expireDevice(token: token.lowercased()), let display = emulator.display(token: token) else {
                throw ControlAPIError.deviceNotFound(token)
            }
            return try ControlAPI.json(display)
        }
        router.post("devices/:token/dismiss") { _, context in
            let token = try context.parameters.require("token")
            guard emulator.dismissActivity(token: token), let display = emulator.display(token: token) else {
                throw ControlAPIError.deviceNotFound(token)
            }
            return try ControlAPI.json(display)
        }
        router.get("faults") { _, _ in try ControlAPI.json(emulator.faults) }
        router.put("faults") { request, _ in
            let faults = try await ControlAPI.readFaults(request, as: APNsFaults.self)
            emulator.setFaults(faults)
            return try ControlAPI.json(faults)
        }
        router.post("keys") { request, _ in
            let body = try await ControlAPI.readObject(request, allowed: ["teamId", "keyId", "publicKeyPem"])
            let teamID = try ControlAPI.requiredString(body, "teamId")
            let keyID = try ControlAPI.requiredString(body, "keyId")
            let pem = try ControlAPI.requiredString(body, "publicKeyPem")
            let publicKey: P256.Signing.PublicKey
            if let key = try? P256.Signing.PublicKey(pemRepresentation: pem) {
                publicKey = key
            } else if let key = try? P256.Signing.PrivateKey(pemRepresentation: pem) {
                publicKey = key.publicKey
            } else {
                throw ControlAPIError.badRequest(
                    "invalid_key", "publicKeyPem must be a P-256 public key or .p8 private key in PEM form.", field: "publicKeyPem"
                )
            }
            emulator.registerSigningKey(teamID: teamID, keyID: keyID, publicKey: publicKey)
            return try ControlAPI.json(["teamId": teamID, "keyId": keyID], status: .created)
        }
        router.post("bundles") { request, _ in
            let body = try await ControlAPI.readObject(request, allowed: ["bundleId"])
            let bundleID = try ControlAPI.requiredString(body, "bundleId")
            emulator.registerBundleID(bundleID)
            return try ControlAPI.json(["bundleId": bundleID], status: .created)
        }
        router.get("statistics") { _, _ in try ControlAPI.json(emulator.statistics) }
        return router
    }
}
