import Hummingbird
import LivelineCore
import LivelineDispatch
import LivelineStore

/// The operator's API under `/admin/v1`, guarded by the admin token from configuration.
/// A missing or wrong token is 401; without a configured token no token is right, and every call is
/// 401 `admin_api_disabled`, which says how to turn the admin API on.
struct AdminRoutes<Context: RequestContext>: Sendable {
    let administration: AppAdministration
    let adminToken: String?

    func add(to router: Router<Context>) {
        let admin = router.group("admin/v1")
        admin.post("apps", use: createApp)
        admin.get("apps", use: listApps)
        admin.delete("apps/:appId", use: deleteApp)
        admin.post("apps/:appId/keys/rotate", use: rotateKeys)
        admin.put("apps/:appId/credentials/apns", use: setAPNs)
        admin.put("apps/:appId/credentials/fcm", use: setFCM)
        admin.put("apps/:appId/budget", use: setBudget)
        admin.put("apps/:appId/broadcast", use: setBroadcastDefaults)
        admin.put("apps/:appId/devices", use: setDeviceRules)
        admin.get("apps/:appId/credentials", use: credentials)
    }

    func authorize(_ request: Request) throws {
        guard let adminToken else {
            throw APIError(
                .unauthorized, code: "admin_api_disabled",
                message: "The admin API is off: set LIVELINE_ADMIN_TOKEN (or --admin-token-file) to turn it on."
            )
        }
        guard let presented = Authenticator.bearerToken(request) else {
            throw APIError(.unauthorized, code: "unauthorized", message: "Send the admin token as 'Authorization: Bearer <admin token>'.")
        }
        guard APIKeys.constantTimeEquals(APIKeys.hash(presented), APIKeys.hash(adminToken)) else {
            throw APIError(.unauthorized, code: "invalid_admin_token", message: "The admin token is not valid.")
        }
    }

    @Sendable func createApp(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        let body = try await RequestBody.read(request)
        try body.allowOnly(["name", "bundleId", "androidPackage"])
        let created = try await administration.createApp(
            name: try body.requiredString("name"), bundleID: try body.requiredString("bundleId"),
            androidPackage: try body.string("androidPackage")
        )
        return Response.json(Self.appWithKeys(created), status: .created)
    }

    @Sendable func listApps(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        let apps = try await administration.listApps()
        return Response.json(.object(["data": .array(apps.map(Representation.app))]))
    }

    /// Deletes the app with all its data (``AppAdministration/deleteApp(appID:leavingChannels:)``). Its broadcast
    /// channels are deleted at APNs first; `?leaveChannels=true` deletes the app even if some cannot be, leaving them.
    @Sendable func deleteApp(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        // Its one option is in the query; a body that is sent must be a JSON object without members, not ignored.
        try await RequestBody.read(request, allowEmpty: true).allowOnly([])
        try QueryParameters.refuseUnknown(in: request, allowed: ["leaveChannels"])
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let leavingChannels: Bool
        switch request.uri.queryParameters["leaveChannels"] {
        case nil, "false": leavingChannels = false
        case "true": leavingChannels = true
        default: throw APIError.badRequest("invalid_type", "leaveChannels must be true or false.", field: "leaveChannels")
        }
        let deleted = try await administration.deleteApp(appID: appID, leavingChannels: leavingChannels)
        return Response.json(.object([
            "app": Representation.app(deleted.deletion.app),
            "activitiesDeleted": .integer(Int64(deleted.deletion.activities)),
            "devicesDeleted": .integer(Int64(deleted.deletion.devices)),
            "channelsDeleted": .integer(Int64(deleted.channelsDeleted)),
            "channelsLeft": .array(deleted.deletion.channelsLeft.map(JSONValue.string)),
        ]))
    }

    @Sendable func rotateKeys(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        // It takes no body; one that is sent must still be a JSON object without members, not ignored.
        try await RequestBody.read(request, allowEmpty: true).allowOnly([])
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        return Response.json(Self.appWithKeys(try await administration.rotateKeys(appID: appID)))
    }

    @Sendable func setAPNs(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let body = try await RequestBody.read(request)
        try body.allowOnly(["teamId", "keyId", "privateKey", "environment", "baseUrl", "channelManagementBaseUrl", "broadcastBaseUrl", "caCertificate"])
        let environmentName = try body.requiredString("environment")
        guard let environment = APNsEnvironmentName(rawValue: environmentName) else {
            throw ValidationError(code: "invalid_environment", message: "environment must be 'sandbox' or 'production'.", field: "environment")
        }
        let stored = try await administration.setAPNsCredentials(
            appID: appID,
            APNsCredentials(
                teamID: try body.requiredString("teamId"), keyID: try body.requiredString("keyId"),
                privateKeyPEM: try body.requiredString("privateKey"), environment: environment,
                baseURL: try body.string("baseUrl"), caCertificatePEM: try body.string("caCertificate"),
                channelManagementBaseURL: try body.string("channelManagementBaseUrl"), broadcastBaseURL: try body.string("broadcastBaseUrl")
            )
        )
        return Response.json(Representation.credentials(stored))
    }

    @Sendable func setFCM(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let body = try await RequestBody.read(request)
        try body.allowOnly(["serviceAccount", "baseUrl", "caCertificate"])
        let serviceAccountJSON: String
        switch body.value("serviceAccount") {
        case .object(let members)?:
            serviceAccountJSON = JSONValue.object(members).encodedString
        case .string(let text)?:
            serviceAccountJSON = text
        case nil, .null?:
            throw APIError.badRequest("missing_field", "serviceAccount is required: the service-account JSON (an object, or its text).", field: "serviceAccount")
        default:
            throw APIError.badRequest("invalid_type", "serviceAccount must be the service-account JSON object (or its text).", field: "serviceAccount")
        }
        let stored = try await administration.setFCMCredentials(
            appID: appID,
            FCMCredentials(
                serviceAccountJSON: serviceAccountJSON, baseURL: try body.string("baseUrl"), caCertificatePEM: try body.string("caCertificate")
            )
        )
        return Response.json(Representation.credentials(stored))
    }

    @Sendable func setBudget(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let body = try await RequestBody.read(request)
        try body.allowOnly(["hourly", "hourlyWithFrequentPushes"])
        func count(_ field: String) throws -> Int? {
            guard let given = body.value(field) else { return nil }
            guard let value = RequestBody.integral(given) else {
                throw APIError.badRequest("invalid_type", "\(field) must be an integer or null (the server's default).", field: field)
            }
            guard (0...3600).contains(value) else {
                throw ValidationError(code: "invalid_budget", message: "\(field) must be between 0 and 3600 pushes an hour.", field: field)
            }
            return Int(value)
        }
        let budget = BudgetOverride(hourly: try count("hourly"), hourlyWithFrequentPushes: try count("hourlyWithFrequentPushes"))
        if let hourly = budget.hourly, let frequent = budget.hourlyWithFrequentPushes, frequent < hourly {
            throw ValidationError(
                code: "invalid_budget", message: "hourlyWithFrequentPushes must be at least hourly.", field: "hourlyWithFrequentPushes"
            )
        }
        let app = try await administration.setBudget(appID: appID, budget)
        return Response.json(Representation.app(app))
    }

    /// The app's broadcast defaults: how its activities are delivered when a start or first update does not say, and
    /// what their channels store; `null` (or absent) falls back to the server's configuration.
    @Sendable func setBroadcastDefaults(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let body = try await RequestBody.read(request)
        try body.allowOnly(["defaultDelivery", "messageStoragePolicy"])
        var defaults = BroadcastDefaults()
        if let name = try body.string("defaultDelivery") {
            guard let delivery = ActivityDelivery(rawValue: name) else {
                throw ValidationError(code: "invalid_delivery", message: "defaultDelivery must be 'token', 'broadcast' or null.", field: "defaultDelivery")
            }
            defaults.delivery = delivery
        }
        if let name = try body.string("messageStoragePolicy") {
            guard let policy = ChannelStoragePolicy(rawValue: name) else {
                throw ValidationError(
                    code: "invalid_storage_policy", message: "messageStoragePolicy must be 'mostRecent', 'none' or null.",
                    field: "messageStoragePolicy"
                )
            }
            defaults.storagePolicy = policy
        }
        let app = try await administration.setBroadcastDefaults(appID: appID, defaults)
        return Response.json(Representation.app(app))
    }

    /// Who may set the app's devices' audience fields (`userId`, `tags`): `app` (its publishable key, the default) or
    /// `backend` (only its secret key).
    @Sendable func setDeviceRules(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let body = try await RequestBody.read(request)
        try body.allowOnly(["audienceFrom"])
        let name = try body.requiredString("audienceFrom")
        guard let source = AudienceSource(rawValue: name) else {
            throw ValidationError(code: "invalid_audience_from", message: "audienceFrom must be 'app' or 'backend'.", field: "audienceFrom")
        }
        let app = try await administration.setAudienceFrom(appID: appID, source)
        return Response.json(Representation.app(app))
    }

    @Sendable func credentials(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        let all = try await administration.credentials(appID: appID)
        return Response.json(.object(["data": .array(all.map(Representation.credentials))]))
    }

    static func appWithKeys(_ value: AppAdministration.AppWithKeys) -> JSONValue {
        .object([
            "app": Representation.app(value.app),
            "secretKey": .string(value.secretKey),
            "publishableKey": .string(value.publishableKey),
        ])
    }
}
