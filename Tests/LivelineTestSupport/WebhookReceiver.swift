import Foundation
import HTTPTypes
import Hummingbird
import Synchronization

/// A backend's webhook endpoint on 127.0.0.1: records each request and answers with the next scripted answer (200 once
/// the script is used up).
public final class WebhookReceiver: Sendable {
    public struct Received: Sendable {
        public var headers: HTTPFields
        public var body: [UInt8]
        /// The request's `Host` (its authority): the name in the URL, whatever address the request went to.
        public var authority: String? = nil
    }

    /// How the receiver answers one request.
    public enum Answer: Sendable {
        /// This status, with these header fields.
        case status(HTTPResponse.Status, HTTPFields = [:])
        /// No answer at all, for as long as the client waits.
        case hang
        /// 200 with a body of 1,000 bytes announced, sent a byte a second.
        case trickle
    }

    private let state = Mutex<(received: [Received], script: [Answer])>(([], []))
    private let task: Task<Void, any Error>
    public let port: Int

    public var received: [Received] { state.withLock { $0.received } }
    public func answer(with statuses: [HTTPResponse.Status]) { state.withLock { $0.script = statuses.map { .status($0) } } }
    public func answer(with answers: [Answer]) { state.withLock { $0.script = answers } }

    private init(port: Int, task: Task<Void, any Error>) {
        self.port = port
        self.task = task
    }

    public static func start() async throws -> (WebhookReceiver, stop: @Sendable () async -> Void) {
        let box = Mutex<WebhookReceiver?>(nil)
        let router = Router()
        router.post("hook") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1 << 20)
            let receiver = box.withLock { $0 }
            let answer = receiver?.state.withLock { state -> Answer in
                state.received.append(Received(headers: request.headers, body: Array(buffer: body), authority: request.head.authority))
                return state.script.isEmpty ? .status(.ok) : state.script.removeFirst()
            } ?? .status(.ok)
            switch answer {
            case .status(let status, let fields):
                return Response(status: status, headers: fields)
            case .hang:
                try await Task.sleep(for: .seconds(3600))
                return Response(status: .ok)
            case .trickle:
                return Response(status: .ok, body: ResponseBody(contentLength: 1000) { writer in
                    for _ in 0..<1000 {
                        try await writer.write(ByteBuffer(string: "x"))
                        try await Task.sleep(for: .seconds(1))
                    }
                    try await writer.finish(nil)
                })
            }
        }
        let (portStream, portContinuation) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in portContinuation.yield(channel.localAddress?.port ?? 0) }
        )
        let task = Task { try await app.runService() }
        var iterator = portStream.makeAsyncIterator()
        let port = await iterator.next() ?? 0
        let receiver = WebhookReceiver(port: port, task: task)
        box.withLock { $0 = receiver }
        return (receiver, { task.cancel(); _ = await task.result })
    }

    public var url: String { "http://127.0.0.1:\(port)/hook" }
}

/// Verifies a Standard Webhooks signature with Python's hmac module: an implementation independent of Liveline's.
public func verifiedByPython(secret: String, id: String, timestamp: String, body: [UInt8], signature: String) throws -> Bool {
    let script = """
        import base64, hashlib, hmac, sys
        secret, msg_id, timestamp, signature = sys.argv[1:5]
        body = sys.stdin.buffer.read()
        key = base64.b64decode(secret[len("whsec_"):])
        expected = base64.b64encode(hmac.new(key, msg_id.encode() + b"." + timestamp.encode() + b"." + body, hashlib.sha256).digest()).decode()
        sys.exit(0 if any(part == "v1," + expected for part in signature.split(" ")) else 1)
        """
    let process = try ChildProcess(
        executable: URL(fileURLWithPath: "/usr/bin/env"), arguments: ["python3", "-c", script, secret, id, timestamp, signature],
        environment: ProcessInfo.processInfo.environment, output: nil, input: body
    )
    process.waitUntilExit()
    return process.terminationStatus == 0
}

