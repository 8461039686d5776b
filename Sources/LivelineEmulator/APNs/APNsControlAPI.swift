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
/// | `GET /pushes?token=&channelId=&limit=` | received requests, newest last (`limit` default 100); each has `kind` (`token` or `broadcast`) and `channelId` |
/// | `GET /devices` | every device with its display |
/// | `GET /devices/{token}` | one device's display |
/// | `POST /devices` `{"bundleId", "token"?}` | 201 `{"token"}` |
/// | `POST /devices/{token}/expire` | later pushes get 410 Unregistered |
/// | `POST /devices/{token}/dismiss` | the user dismisses the activity |
/// | `GET /faults`, `PUT /faults` | the injected ``APNsFaults`` |
/// | `POST /keys` `{"teamId","keyId","publicKeyPem"}` | trust a signing key (public key or .p8 PEM) |
/// | `POST /bundles` `{"bundleId"}` | allow a topic |
/// | `GET /statistics` | ``EmulatorStatistics`` |
/// | `POST /phones` `{"attributesTypes": [..], "id"?, "deviceId"?, "userId"?, "tags"?, "bundleId"?, "osVersion"? (default "18.0"), "registerWith"?: {"url", "publishableKey"} or null}` | 201, a simulated iPhone with a push-to-start token per attributes type |
/// | `GET /phones`, `GET /phones/{id}` | phones with their push-to-start tokens and Live Activities |
/// | `POST /phones/{id}/push-to-start-tokens/{attributesType}/rotate` | a new token; the old one answers 410 |
/// | `POST /phones/{id}/activities/{activityId}/rotate-token` | the phone's Live Activity for that Liveline activity gets a new update token (re-registered with `registerWith`); the old one answers 410 |
/// | `GET /channels` | `{"channels": [{"channelId", "bundleId", "storagePolicy", "createdAt", "subscribers", "broadcasts"}]}`, deleted channels excluded |
/// | `GET /channels/{channelId}` | the same object plus `"subscribersByTimestamp": {"<timestamp>" or "none": n}`, `"ended"`, `"stale"` |
/// | `POST /channels/{channelId}/subscribers` `{"count": N, "attributesType"?}` | 201 `{"channelId", "created", "subscribers"}`: N anonymous iOS 18 Live Activities subscribed (memory only; N ≤ 200,000 a call) |
/// | `GET /channels/{channelId}/subscribers?limit=` | the first subscribers' displays (`limit` default 100) |
///
/// Channel ids are base64 and may hold `/` and `+`: percent-encode them in the path (`%2F`, `%2B`).
struct APNsControlAPI: Sendable {
    let emulator: APNsEmulator

    func makeRouter() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: ControlErrorMiddleware())
        router.get("healthz") { _, _ in try ControlAPI.json(["status": "ok"] as [String: String]) }
        router.get("pushes") { request, _ in
            let limit = try ControlAPI.limit(request)
            let token = request.uri.queryParameters.get("token").flatMap { $0.isEmpty ? nil : $0 }
            let channelID = request.uri.queryParameters.get("channelId").flatMap { $0.isEmpty ? nil : $0 }
            let pushes =
                if let channelID {
                    emulator.core.pushes(channelID: channelID, limit: limit)
                } else {
                    emulator.pushes(token: token, limit: limit)
                }
            return try ControlAPI.json(["pushes": pushes])
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
        router.get("phones") { _, _ in try ControlAPI.json(["phones": emulator.phones()]) }
        router.get("phones/:id") { _, context in
            let id = try context.parameters.require("id")
            guard let phone = emulator.phone(id: id) else { throw ControlAPIError.phoneNotFound(id) }
            return try ControlAPI.json(phone)
        }
        router.post("phones") { request, _ in
            let body = try await ControlAPI.readObject(
                request, allowed: ["id", "deviceId", "userId", "tags", "bundleId", "attributesTypes", "registerWith", "osVersion"]
            )
            guard let types = body["attributesTypes"]?.arrayValue, !types.isEmpty else {
                throw ControlAPIError.badRequest(
                    "missing_field", "attributesTypes must be a non-empty array of Swift type names.", field: "attributesTypes"
                )
            }
            let attributesTypes = try types.map { value -> String in
                guard let text = value.stringValue, !text.isEmpty else {
                    throw ControlAPIError.badRequest("invalid_type", "attributesTypes must hold non-empty strings.", field: "attributesTypes")
                }
                return text
            }
            let id = try ControlAPI.optionalString(body, "id")
            let deviceID = try ControlAPI.optionalString(body, "deviceId")
            let userID = try ControlAPI.optionalString(body, "userId")
            let tags = try ControlAPI.optionalObject(body, "tags")
            let bundleID = try ControlAPI.optionalString(body, "bundleId")
            let registerWith = try ControlAPI.registerWith(body)
            let osVersion = try ControlAPI.optionalString(body, "osVersion") ?? "18.0"
            guard SimulatedIPhone.majorVersion(osVersion) > 0 else {
                throw ControlAPIError.badRequest("invalid_value", "osVersion must be an iOS version such as \"18.0\".", field: "osVersion")
            }
            let phone: SimulatedPhoneDisplay
            do throws(APNsEmulator.PhoneCreationError) {
                phone = try emulator.createPhone(
                    id: id, deviceID: deviceID, userID: userID, tags: tags, bundleID: bundleID, attributesTypes: attributesTypes,
                    registerWith: registerWith, osVersion: osVersion
                )
            } catch {
                throw ControlAPIError(.conflict, "phone_exists", error.description, field: "id")
            }
            return try ControlAPI.json(phone, status: .created)
        }
        router.post("phones/:id/push-to-start-tokens/:type/rotate") { _, context in
            let id = try context.parameters.require("id")
            let type = try context.parameters.require("type")
            guard emulator.phone(id: id) != nil else { throw ControlAPIError.phoneNotFound(id) }
            guard let phone = emulator.rotatePushToStartToken(phoneID: id, attributesType: type) else {
                throw ControlAPIError(.notFound, "attributes_type_not_found", "Phone \(id) has no push-to-start token for \(type).", field: "type")
            }
            return try ControlAPI.json(phone)
        }
        router.post("phones/:id/activities/:activityId/rotate-token") { _, context in
            let id = try context.parameters.require("id")
            let activityID = try context.parameters.require("activityId")
            let phone: SimulatedPhoneDisplay
            do throws(APNsEmulator.ActivityTokenRotationError) {
                phone = try emulator.rotateActivityToken(phoneID: id, activityID: activityID)
            } catch {
                switch error {
                case .noPhone: throw ControlAPIError.phoneNotFound(id)
                case .noActivity: throw ControlAPIError(.notFound, "activity_not_found", error.description, field: "activityId")
                case .noUpdateToken: throw ControlAPIError(.conflict, "no_update_token", error.description, field: "activityId")
                }
            }
            return try ControlAPI.json(phone)
        }
        router.get("channels") { _, _ in try ControlAPI.json(["channels": emulator.channels()]) }
        router.get("channels/:channelId") { _, context in
            let id = try Self.channelID(context)
            guard let detail = emulator.channel(id: id) else { throw Self.channelNotFound(id) }
            return try ControlAPI.json(detail)
        }
        router.get("channels/:channelId/subscribers") { request, context in
            let id = try Self.channelID(context)
            let limit = try ControlAPI.limit(request)
            guard let subscribers = emulator.channelSubscribers(id: id, limit: limit) else { throw Self.channelNotFound(id) }
            return try ControlAPI.json(["subscribers": subscribers])
        }
        router.post("channels/:channelId/subscribers") { request, context in
            let id = try Self.channelID(context)
            let body = try await ControlAPI.readObject(request, allowed: ["count", "attributesType"])
            guard case .integer(let count) = body["count"] ?? .null, count >= 1,
                count <= Int64(APNsEmulatorCore.maximumSubscribersPerCall)
            else {
                throw ControlAPIError.badRequest(
                    "invalid_value", "count must be an integer from 1 to \(APNsEmulatorCore.maximumSubscribersPerCall).", field: "count"
                )
            }
            let attributesType = try ControlAPI.optionalString(body, "attributesType")
            guard let added = emulator.addSubscribers(channelID: id, count: Int(count), attributesType: attributesType) else {
                throw Self.channelNotFound(id)
            }
            return try ControlAPI.json(
                ["channelId": .string(id), "created": .integer(Int64(added.created)), "subscribers": .integer(Int64(added.total))] as JSONValue,
                status: .created
            )
        }
        return router
    }

    /// The path's channel id, percent-decoded (base64 holds `/` and `+`).
    static func channelID(_ context: BasicRequestContext) throws -> String {
        let raw = try context.parameters.require("channelId")
        return raw.removingPercentEncoding ?? raw
    }

    static func channelNotFound(_ id: String) -> ControlAPIError {
        ControlAPIError(.notFound, "channel_not_found", "No live broadcast channel with id \(id).", field: "channelId")
    }
}
