import Foundation
import Hummingbird
import LivelineCore
import NIOCore
import _CryptoExtras

/// The FCM emulator's control and inspection API (HTTP/1.1, JSON):
///
/// | route | does |
/// |---|---|
/// | `GET /healthz` | `{"status":"ok"}` |
/// | `POST /devices` `{"projectId"?, "token"?, "deviceId"?, "userId"?, "tags"?, "registerWith"?: {"url", "publishableKey"} or null}` | registers a phone; 201 `{"token", "projectId", "deviceId"}` |
/// | `GET /devices` | every phone with its notifications |
/// | `GET /devices/{token}` | one phone and its notifications |
/// | `POST /devices/{token}/unregister` | later messages get 404 `UNREGISTERED` |
/// | `POST /devices/{token}/dismiss?activity=ID` | the user dismisses that activity's notification |
/// | `GET /messages?token=&limit=` | received `messages:send` requests, newest last (`limit` default 100) |
/// | `GET /faults`, `PUT /faults`, `DELETE /faults` | the injected ``FCMFaults`` |
/// | `POST /service-accounts` `{"clientEmail", "projectId", "publicKeyPem", "privateKeyId"?}` | trusts a service account (public or private RSA key PEM) |
/// | `GET /service-accounts/demo` | the demo service account's path, project, client email and token URI |
/// | `POST /access-tokens/revoke` | every issued access token stops working |
/// | `GET /statistics` | ``FCMEmulatorStatistics`` |
struct FCMControlAPI: Sendable {
    let emulator: FCMEmulator

    func makeRouter() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: ControlErrorMiddleware())
        router.get("healthz") { _, _ in try ControlAPI.json(["status": "ok"] as [String: String]) }
        router.post("devices") { request, _ in
            let body = try await ControlAPI.readObject(
                request, allowed: ["projectId", "token", "deviceId", "userId", "tags", "registerWith"]
            )
            let projectID = try Self.optionalString(body, "projectId")
            let token = try Self.optionalString(body, "token")
            if let token, token.contains(where: { $0.isWhitespace || $0 == "/" }) {
                throw ControlAPIError.badRequest("invalid_token", "token must not contain spaces or slashes.", field: "token")
            }
            let created = emulator.addDevice(
                projectID: projectID, token: token, deviceID: try ControlAPI.optionalString(body, "deviceId"),
                userID: try ControlAPI.optionalString(body, "userId"), tags: try ControlAPI.optionalObject(body, "tags"),
                registerWith: try ControlAPI.registerWith(body)
            )
            let device = emulator.device(token: created)
            return try ControlAPI.json(
                ["token": created, "projectId": device?.projectID ?? "", "deviceId": device?.deviceID ?? created], status: .created
            )
        }
        router.get("devices") { _, _ in try ControlAPI.json(["devices": emulator.devices()]) }
        router.get("devices/:token") { _, context in
            let token = try Self.token(context)
            guard let device = emulator.device(token: token) else { throw ControlAPIError.deviceNotFound(token) }
            return try ControlAPI.json(device)
        }
        router.post("devices/:token/unregister") { _, context in
            let token = try Self.token(context)
            guard emulator.unregisterDevice(token: token), let device = emulator.device(token: token) else {
                throw ControlAPIError.deviceNotFound(token)
            }
            return try ControlAPI.json(device)
        }
        router.post("devices/:token/dismiss") { request, context in
            let token = try Self.token(context)
            guard let activityID = request.uri.queryParameters.get("activity"), !activityID.isEmpty else {
                throw ControlAPIError.badRequest("missing_field", "The activity query parameter is required.", field: "activity")
            }
            guard emulator.dismissNotification(token: token, activityID: activityID), let device = emulator.device(token: token) else {
                throw ControlAPIError.deviceNotFound(token)
            }
            return try ControlAPI.json(device)
        }
        router.get("messages") { request, _ in
            let limit = try ControlAPI.limit(request)
            let token = request.uri.queryParameters.get("token").flatMap { $0.isEmpty ? nil : $0 }
            return try ControlAPI.json(["messages": emulator.messages(token: token, limit: limit)])
        }
        router.get("faults") { _, _ in try ControlAPI.json(emulator.faults) }
        router.put("faults") { request, _ in
            let faults = try await ControlAPI.readFaults(request, as: FCMFaults.self)
            emulator.setFaults(faults)
            return try ControlAPI.json(faults)
        }
        router.delete("faults") { _, _ in
            emulator.setFaults(.none)
            return try ControlAPI.json(FCMFaults.none)
        }
        router.post("service-accounts") { request, _ in
            let body = try await ControlAPI.readObject(request, allowed: ["clientEmail", "projectId", "publicKeyPem", "privateKeyId"])
            let clientEmail = try ControlAPI.requiredString(body, "clientEmail")
            let projectID = try ControlAPI.requiredString(body, "projectId")
            let pem = try ControlAPI.requiredString(body, "publicKeyPem")
            let privateKeyID = try Self.optionalString(body, "privateKeyId")
            let publicKey: _RSA.Signing.PublicKey
            if let key = try? _RSA.Signing.PublicKey(pemRepresentation: pem) {
                publicKey = key
            } else if let key = try? _RSA.Signing.PrivateKey(pemRepresentation: pem) {
                publicKey = key.publicKey
            } else {
                throw ControlAPIError.badRequest(
                    "invalid_key", "publicKeyPem must be an RSA public or private key (2048 bits or more) in PEM form.",
                    field: "publicKeyPem"
                )
            }
            emulator.registerServiceAccount(clientEmail: clientEmail, projectID: projectID, publicKey: publicKey, privateKeyID: privateKeyID)
            return try ControlAPI.json(["clientEmail": clientEmail, "projectId": projectID], status: .created)
        }
        router.get("service-accounts/demo") { _, _ in
            let account = try emulator.demoServiceAccount()
            return try ControlAPI.json([
                "path": account.path, "projectId": account.projectID, "clientEmail": account.clientEmail,
                "privateKeyId": account.privateKeyID, "tokenUri": account.tokenURI,
            ])
        }
        router.post("access-tokens/revoke") { _, _ in
            emulator.revokeAccessTokens()
            return try ControlAPI.json(["revoked": true])
        }
        router.get("statistics") { _, _ in try ControlAPI.json(emulator.statistics) }
        return router
    }

    /// The `{token}` path parameter, percent-decoded (FCM tokens contain `:`, which clients may encode).
    static func token(_ context: BasicRequestContext) throws -> String {
        let raw = try context.parameters.require("token")
        return raw.removingPercentEncoding ?? raw
    }

    static func optionalString(_ body: [String: JSONValue], _ field: String) throws -> String? {
        guard let value = body[field], value != .null else { return nil }
        guard let text = value.stringValue, !text.isEmpty else {
            throw ControlAPIError.badRequest("invalid_type", "\(field) must be a non-empty string.", field: field)
        }
        return text
    }
}
