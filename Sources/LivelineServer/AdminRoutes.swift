import Hummingbird
import LivelineCore
import LivelineStore

/// The operator's API under `/admin/v1`, guarded by the admin token from configuration.
/// Without a configured token the admin API refuses every call.
struct AdminRoutes<Context: RequestContext>: Sendable {
    let administration: AppAdministration
    let adminToken: String?

    func add(to router: Router<Context>) {
        let admin = router.group("admin/v1")
        admin.post("apps", use: createApp)
        admin.get("apps", use: listApps)
        admin.post("apps/:appId/keys/rotate", use: rotateKeys)
    }

    func authorize(_ request: Request) throws {
        guard let adminToken else {
            throw APIError(
                .forbidden, code: "admin_api_disabled",
                message: "The admin API is off: set LIVELINE_ADMIN_TOKEN (or --admin-token-file) to turn it on."
            )
        }
        guard let presented = Authenticator.bearerToken(request) else { throw APIError.unauthorized }
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

    @Sendable func rotateKeys(_ request: Request, context: Context) async throws -> Response {
        try authorize(request)
        guard let appID = context.parameters.get("appId") else { throw StoreError.appNotFound }
        return Response.json(Self.appWithKeys(try await administration.rotateKeys(appID: appID)))
    }

    static func appWithKeys(_ value: AppAdministration.AppWithKeys) -> JSONValue {
        .object([
            "app": Representation.app(value.app),
            "secretKey": .string(value.secretKey),
            "publishableKey": .string(value.publishableKey),
        ])
    }
}
