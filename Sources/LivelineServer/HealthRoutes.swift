import Hummingbird
import LivelineCore
import LivelineStore

/// Liveness, readiness and the API description.
struct HealthRoutes<Context: RequestContext>: Sendable {
    let store: any Store

    func add(to router: Router<Context>) {
        router.get("healthz") { _, _ in Response.json(["status": "ok"]) }
        router.get("readyz") { _, context in
            do {
                try await store.ping()
                return Response.json(["status": "ready"])
            } catch {
                context.logger.warning("Readiness check failed", metadata: ["error": "\(error)"])
                return Response.json(
                    APIError(.serviceUnavailable, code: "not_ready", message: "The database is not reachable.").json,
                    status: .serviceUnavailable
                )
            }
        }
        router.get("openapi.json") { _, _ in
            var buffer = ByteBuffer()
            buffer.writeString(OpenAPIDocument.json)
            return Response(status: .ok, headers: [.contentType: "application/json; charset=utf-8"], body: ResponseBody(byteBuffer: buffer))
        }
    }
}
