import Foundation
import Hummingbird
import LivelineCore
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// One call a stand-in Liveline received.
struct RegistrationCall: Sendable, Equatable {
    var method: String
    var path: String
    var authorization: String?
    var body: JSONValue?
}

/// The calls a stand-in Liveline received, in arrival order.
final class RecordedRegistrations: Sendable {
    private let calls = Mutex<[RegistrationCall]>([])

    func append(_ call: RegistrationCall) { calls.withLock { $0.append(call) } }
    var all: [RegistrationCall] { calls.withLock { $0 } }
}

/// Runs a tiny Hummingbird server on 127.0.0.1 standing in for Liveline's `PUT /v1/devices/{id}` and
/// `PUT /v1/activities/{id}/instances/{deviceId}`: it records every call and answers `204`, or `401` when the
/// bearer is not `Bearer <acceptedKey>`.
func withRegistrationServer(
    acceptedKey: String = "pk_test_emulator", _ body: (_ url: String, _ calls: RecordedRegistrations) async throws -> Void
) async throws {
    let recorded = RecordedRegistrations()
    let router = Router()
    let handler: @Sendable (Request, BasicRequestContext) async throws -> Response = { request, _ in
        let bytes = try await request.body.collect(upTo: 64 * 1024)
        let authorization = request.headers[.authorization]
        recorded.append(
            RegistrationCall(
                method: request.method.rawValue, path: request.uri.path, authorization: authorization,
                body: try? JSONValue(parsing: Array(bytes.readableBytesView))
            )
        )
        return Response(status: authorization == "Bearer \(acceptedKey)" ? .noContent : .unauthorized)
    }
    router.put("v1/devices/:deviceId", use: handler)
    router.put("v1/activities/:activityId/instances/:deviceId", use: handler)
    var logger = Logger(label: "registration-server")
    logger.logLevel = .warning
    let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
    let application = Application(
        router: router, configuration: ApplicationConfiguration(address: .hostname("127.0.0.1", port: 0)),
        onServerRunning: { channel in continuation.yield(channel.localAddress?.port ?? 0) }, logger: logger
    )
    let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [application], logger: logger))
    try await withThrowingTaskGroup(of: Void.self) { tasks in
        tasks.addTask { try await group.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else { return }
        do {
            try await body("http://127.0.0.1:\(port)", recorded)
        } catch {
            await group.triggerGracefulShutdown()
            throw error
        }
        await group.triggerGracefulShutdown()
        try await tasks.waitForAll()
    }
}
