import LivelineCore
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL

/// An answer as the test client received it.
struct TestResponse: Sendable {
    var streamID: Int
    var headers: HPACKHeaders
    var body: [UInt8]

    var status: Int { headers.first(name: ":status").flatMap(Int.init) ?? -1 }
    var apnsID: String? { headers.first(name: "apns-id") }
    var json: JSONValue? { body.isEmpty ? nil : try? JSONValue(parsing: body) }
    var reason: String? { json?.objectValue?["reason"]?.stringValue }
    func header(_ name: String) -> String? { headers.first(name: name) }
}

/// A `GOAWAY` frame as received.
struct ReceivedGoAway: Sendable {
    var lastStreamID: Int
    var errorCode: HTTP2ErrorCode
    var debugData: String
}

enum TestClientError: Error, Equatable {
    /// The connection closed before the answer came.
    case connectionClosed
    /// The server's `GOAWAY` said this stream would not be processed.
    case refusedByGoAway
    /// The server reset the stream.
    case streamReset
}

/// A request the test client sends.
struct TestRequest: Sendable {
    var method = "POST"
    var path: String
    var headers: [(String, String)] = []
    var body: [UInt8]?

    init(method: String = "POST", path: String, headers: [(String, String)] = [], body: [UInt8]? = nil) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
    }
}

/// A minimal HTTP/2 client written for these tests with swift-nio-http2 at the frame level, so the
/// emulator is never tested through Liveline's sender. It can send headers a proper client never
/// would (duplicates, odd methods), sees `GOAWAY` frames, and keeps many streams in flight.
final class HTTP2TestClientHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    private struct Pending {
        var promise: EventLoopPromise<TestResponse>
        var headers: HPACKHeaders?
        var body: [UInt8] = []
    }

    private var context: ChannelHandlerContext?
    private var nextStreamID = 1
    private var pending: [HTTP2StreamID: Pending] = [:]
    private var closed = false
    private var unacknowledgedBytes = 0
    private(set) var goAway: ReceivedGoAway?
    let goAwayPromise: EventLoopPromise<ReceivedGoAway>
    /// Every `SETTINGS_MAX_CONCURRENT_STREAMS` the server sent, in order.
    private(set) var streamLimits: [Int] = []

    init(eventLoop: any EventLoop) {
        goAwayPromise = eventLoop.makePromise(of: ReceivedGoAway.self)
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        failEverything()
    }

    func send(_ request: TestRequest, promise: EventLoopPromise<TestResponse>) {
        guard let context, !closed else { return promise.fail(TestClientError.connectionClosed) }
        guard goAway == nil else { return promise.fail(TestClientError.refusedByGoAway) }
        let streamID = HTTP2StreamID(nextStreamID)
        nextStreamID += 2
        pending[streamID] = Pending(promise: promise)
        var headers = HPACKHeaders([
            (":method", request.method), (":scheme", "https"), (":path", request.path), (":authority", "127.0.0.1"),
        ])
        for (name, value) in request.headers { headers.add(name: name, value: value) }
        let hasBody = !(request.body ?? []).isEmpty
        context.write(
            wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .headers(.init(headers: headers, endStream: !hasBody)))),
            promise: nil
        )
        if let body = request.body, hasBody {
            var buffer = context.channel.allocator.buffer(capacity: body.count)
            buffer.writeBytes(body)
            context.write(
                wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .data(.init(data: .byteBuffer(buffer), endStream: true)))),
                promise: nil
            )
        }
    }

    func flush() { context?.flush() }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch frame.payload {
        case .headers(let headers):
            guard pending[frame.streamID] != nil else { return }
            if pending[frame.streamID]!.headers == nil { pending[frame.streamID]!.headers = headers.headers }
            if headers.endStream { complete(frame.streamID) }
        case .data(let payload):
            if case .byteBuffer(let buffer) = payload.data {
                unacknowledgedBytes += buffer.readableBytes
                pending[frame.streamID]?.body.append(contentsOf: buffer.readableBytesView)
            }
            if payload.endStream { complete(frame.streamID) }
        case .settings(.settings(let settings)):
            for setting in settings where setting.parameter == .maxConcurrentStreams { streamLimits.append(setting.value) }
        case .rstStream:
            pending.removeValue(forKey: frame.streamID)?.promise.fail(TestClientError.streamReset)
        case .goAway(let lastStreamID, let errorCode, let opaqueData):
            let received = ReceivedGoAway(
                lastStreamID: Int(lastStreamID), errorCode: errorCode,
                debugData: opaqueData.map { String(buffer: $0) } ?? ""
            )
            goAway = received
            goAwayPromise.succeed(received)
            for streamID in pending.keys where streamID > lastStreamID {
                pending.removeValue(forKey: streamID)?.promise.fail(TestClientError.refusedByGoAway)
            }
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if unacknowledgedBytes > 0 {
            context.write(
                wrapOutboundOut(HTTP2Frame(streamID: .rootStream, payload: .windowUpdate(windowSizeIncrement: unacknowledgedBytes))),
                promise: nil
            )
            unacknowledgedBytes = 0
        }
        context.flush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        failEverything()
        context.fireChannelInactive()
    }

    private func failEverything() {
        closed = true
        let waiting = pending
        pending.removeAll()
        for (_, entry) in waiting { entry.promise.fail(TestClientError.connectionClosed) }
        goAwayPromise.fail(TestClientError.connectionClosed)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Stream errors reset the stream; connection errors close the channel (channelInactive).
    }

    private func complete(_ streamID: HTTP2StreamID) {
        guard let entry = pending.removeValue(forKey: streamID) else { return }
        entry.promise.succeed(TestResponse(streamID: Int(streamID), headers: entry.headers ?? [:], body: entry.body))
    }
}

/// One HTTP/2 + TLS connection to the emulator's APNs listener.
final class HTTP2TestConnection: Sendable {
    let channel: any Channel
    private let handler: NIOLoopBound<HTTP2TestClientHandler>
    let goAway: EventLoopFuture<ReceivedGoAway>

    private init(channel: any Channel, handler: NIOLoopBound<HTTP2TestClientHandler>, goAway: EventLoopFuture<ReceivedGoAway>) {
        self.channel = channel
        self.handler = handler
        self.goAway = goAway
    }

    /// Connects to `host:port`, trusting only `caPEM`, negotiating `h2` with ALPN; the server's
    /// certificate must name `serverHostname`, or the IP address connected to when `nil`.
    static func connect(port: Int, caPEM: String, host: String = "127.0.0.1", serverHostname: String? = nil) async throws -> HTTP2TestConnection {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates([try NIOSSLCertificate(bytes: Array(caPEM.utf8), format: .pem)])
        tls.applicationProtocols = ["h2"]
        let sslContext = try NIOSSLContext(configuration: tls)
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(NIOSSLClientHandler(context: sslContext, serverHostname: serverHostname))
                    try pipeline.addHandler(NIOHTTP2Handler(mode: .client))
                    try pipeline.addHandler(HTTP2TestClientHandler(eventLoop: channel.eventLoop))
                }
            }
            .connect(host: host, port: port)
            .get()
        let (handler, goAway) = try await channel.eventLoop.submit {
            let handler = try channel.pipeline.syncOperations.handler(type: HTTP2TestClientHandler.self)
            return (NIOLoopBound(handler, eventLoop: channel.eventLoop), handler.goAwayPromise.futureResult)
        }.get()
        return HTTP2TestConnection(channel: channel, handler: handler, goAway: goAway)
    }

    /// Sends one request and waits for its answer.
    func send(_ request: TestRequest) async throws -> TestResponse {
        try await sendAll([request]).first!.get()
    }

    /// Sends the requests back to back on separate streams (one flush) and waits for every answer.
    func sendAll(_ requests: [TestRequest]) async throws -> [Result<TestResponse, any Error>] {
        let handler = self.handler
        let futures = try await channel.eventLoop.submit {
            let futures = requests.map { request in
                let promise = handler.value.begin(request)
                return promise.futureResult
            }
            handler.value.flush()
            return futures
        }.get()
        var results: [Result<TestResponse, any Error>] = []
        for future in futures {
            do { results.append(.success(try await future.get())) } catch { results.append(.failure(error)) }
        }
        return results
    }

    func close() async {
        try? await channel.close()
    }

    /// Every `SETTINGS_MAX_CONCURRENT_STREAMS` the server has sent so far, in order.
    var streamLimits: [Int] {
        get async throws {
            let handler = self.handler
            return try await channel.eventLoop.submit { handler.value.streamLimits }.get()
        }
    }

    var isActive: Bool { channel.isActive }
}

extension HTTP2TestClientHandler {
    /// Starts a request and returns its promise (call on the event loop).
    fileprivate func begin(_ request: TestRequest) -> EventLoopPromise<TestResponse> {
        let promise = goAwayPromise.futureResult.eventLoop.makePromise(of: TestResponse.self)
        send(request, promise: promise)
        return promise
    }
}
