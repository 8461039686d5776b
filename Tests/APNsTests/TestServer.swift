import Crypto
import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization
import X509

@testable import APNs

/// A CA and a server certificate for 127.0.0.1 / localhost signed by it, made fresh for each test server.
struct TestCertificates: Sendable {
    let caPEM: String
    let serverCertificate: NIOSSLCertificate
    let serverKey: NIOSSLPrivateKey

    static func make() throws -> TestCertificates {
        let now = Date()
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName { CommonName("Liveline APNs Test CA") }
        let ca = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: .init(caKey.publicKey),
            notValidBefore: now - 3600,
            notValidAfter: now + 86400,
            issuer: caName,
            subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true))
            },
            issuerPrivateKey: .init(caKey)
        )
        let serverKey = P256.Signing.PrivateKey()
        let server = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: .init(serverKey.publicKey),
            notValidBefore: now - 3600,
            notValidAfter: now + 86400,
            issuer: caName,
            subject: try DistinguishedName { CommonName("localhost") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([.dnsName("localhost"), .ipAddress(.init(contentBytes: [127, 0, 0, 1]))])
            },
            issuerPrivateKey: .init(caKey)
        )
        return TestCertificates(
            caPEM: try ca.serializeAsPEM().pemString,
            serverCertificate: try NIOSSLCertificate(bytes: Array(try server.serializeAsPEM().pemString.utf8), format: .pem),
            serverKey: try NIOSSLPrivateKey(bytes: Array(serverKey.pemRepresentation.utf8), format: .pem)
        )
    }
}

/// One request as the test server received it.
struct RecordedRequest: Sendable {
    var connection: Int
    var streamID: Int
    var headers: [(name: String, value: String)]
    var body: [UInt8]

    /// The only value of a header; nil when absent.
    func header(_ name: String) -> String? {
        headers.first { $0.name == name }?.value
    }

    func count(of name: String) -> Int {
        headers.filter { $0.name == name }.count
    }
}

/// What the test server does with a request.
enum ServerAction: Sendable {
    /// Answers at once. `apns-id` is echoed unless `headers` has one.
    case respond(status: Int, headers: [(String, String)] = [], body: String? = nil)
    /// Keeps the stream open until ``TestAPNsServer/releaseHeld(status:)`` or the connection ends.
    case hold
    /// Closes the whole connection without answering.
    case closeConnection
    /// Resets the stream.
    case reset(HTTP2ErrorCode)

    static let ok = ServerAction.respond(status: 200)
}

/// A minimal HTTP/2 + TLS server on 127.0.0.1 standing in for APNs: it records requests and answers as scripted.
final class TestAPNsServer: Sendable {
    typealias Script = @Sendable (RecordedRequest) -> ServerAction

    struct HeldStream: Sendable {
        var channel: any Channel
        var apnsID: String?
    }

    struct ConnectionRecord: Sendable {
        var channel: any Channel
        var openStreams = 0
        var maxOpenStreams = 0
        var pings = 0
        var streamErrors = 0
        var raised = false
        var closed = false
    }

    struct State: Sendable {
        var script: Script
        var requests: [RecordedRequest] = []
        var requestCount = 0
        var held: [HeldStream] = []
        var connections: [Int: ConnectionRecord] = [:]
        var nextConnectionID = 0
    }

    let port: Int
    let caPEM: String
    let initialMaxConcurrentStreams: Int
    /// After the first answered request on a connection, advertise this limit (as APNs does).
    let raisedMaxConcurrentStreams: Int?
    /// Whether requests are kept (false for throughput runs: only counted).
    let recordRequests: Bool
    /// Whether a request is answered as soon as its headers arrive, before its body, and its stream then reset with
    /// RST_STREAM(NO_ERROR), as RFC 9113 §8.1 allows and nginx does. Such requests are recorded without a body.
    let answersBeforeBody: Bool
    private let group: MultiThreadedEventLoopGroup
    private let serverChannel: any Channel
    let state: Mutex<State>

    var endpoint: APNsEndpoint {
        APNsEndpoint(host: "127.0.0.1", port: port, trustedCAPEM: caPEM)
    }

    private init(
        port: Int,
        caPEM: String,
        initialMaxConcurrentStreams: Int,
        raisedMaxConcurrentStreams: Int?,
        recordRequests: Bool,
        answersBeforeBody: Bool,
        group: MultiThreadedEventLoopGroup,
        serverChannel: any Channel,
        state: State
    ) {
        self.port = port
        self.caPEM = caPEM
        self.initialMaxConcurrentStreams = initialMaxConcurrentStreams
        self.raisedMaxConcurrentStreams = raisedMaxConcurrentStreams
        self.recordRequests = recordRequests
        self.answersBeforeBody = answersBeforeBody
        self.group = group
        self.serverChannel = serverChannel
        self.state = Mutex(state)
    }

    /// Starts a server. Its event loops are its own threads, apart from the client's.
    static func start(
        maxConcurrentStreams: Int = 1000,
        raiseMaxConcurrentStreamsTo raised: Int? = nil,
        recordRequests: Bool = true,
        answersBeforeBody: Bool = false,
        threads: Int = 1,
        script: @escaping Script = { _ in .ok }
    ) async throws -> TestAPNsServer {
        let certificates = try TestCertificates.make()
        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(certificates.serverCertificate)],
            privateKey: .privateKey(certificates.serverKey)
        )
        tls.applicationProtocols = ["h2"]
        let sslContext = try NIOSSLContext(configuration: tls)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let box = ServerBox()
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard let server = box.server else { throw ChannelError.ioOnClosedChannel }
                    let connectionID = server.register(channel)
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(NIOSSLServerHandler(context: sslContext))
                    var connectionConfiguration = NIOHTTP2Handler.ConnectionConfiguration()
                    connectionConfiguration.initialSettings = [
                        HTTP2Setting(parameter: .maxConcurrentStreams, value: maxConcurrentStreams),
                        HTTP2Setting(parameter: .maxHeaderListSize, value: 16384),
                    ]
                    connectionConfiguration.maximumRecentlyResetStreams = 10_000
                    var streamConfiguration = NIOHTTP2Handler.StreamConfiguration()
                    streamConfiguration.streamResetFrameRateLimit.maximumCount = 100_000
                    streamConfiguration.streamErrorRateLimit.maximumCount = 100_000
                    _ = try pipeline.configureHTTP2Pipeline(
                        mode: .server,
                        connectionConfiguration: connectionConfiguration,
                        streamConfiguration: streamConfiguration
                    ) { stream in
                        stream.eventLoop.makeCompletedFuture {
                            try stream.pipeline.syncOperations.addHandler(
                                StreamHandler(server: server, connectionID: connectionID)
                            )
                        }
                    }
                    try pipeline.addHandler(ConnectionObserver(server: server, connectionID: connectionID))
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        let server = TestAPNsServer(
            port: channel.localAddress!.port!,
            caPEM: certificates.caPEM,
            initialMaxConcurrentStreams: maxConcurrentStreams,
            raisedMaxConcurrentStreams: raised,
            recordRequests: recordRequests,
            answersBeforeBody: answersBeforeBody,
            group: group,
            serverChannel: channel,
            state: State(script: script)
        )
        box.server = server
        return server
    }

    func shutdown() async throws {
        let channels = state.withLock { $0.connections.values.map(\.channel) }
        for channel in channels {
            try? await channel.close()
        }
        try? await serverChannel.close()
        try await group.shutdownGracefully()
    }

    // MARK: Script and records

    func setScript(_ script: @escaping Script) {
        state.withLock { $0.script = script }
    }

    var requests: [RecordedRequest] {
        state.withLock { $0.requests }
    }

    /// How many requests arrived (recorded or not).
    var requestCount: Int {
        state.withLock { $0.requestCount }
    }

    var connections: [Int: ConnectionRecord] {
        state.withLock { $0.connections }
    }

    var heldCount: Int {
        state.withLock { $0.held.count }
    }

    /// Waits until `condition` holds, polling; fails the test after `timeout`.
    func wait(
        for what: String,
        timeout: Duration = .seconds(10),
        _ condition: @Sendable (TestAPNsServer) -> Bool
    ) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while !condition(self) {
            if clock.now > deadline {
                throw TestFailure("timed out waiting for \(what)")
            }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    /// Answers every held stream that is still open.
    func releaseHeld(status: Int = 200) {
        releaseOldest(Int.max, status: status)
    }

    /// Answers the `count` held streams held longest (fewer if fewer are held), `status` each; returns how many.
    @discardableResult
    func releaseOldest(_ count: Int, status: Int = 200) -> Int {
        let oldest = state.withLock { state in
            let taken = Array(state.held.prefix(count))
            state.held.removeFirst(taken.count)
            return taken
        }
        for stream in oldest {
            var headers = HPACKHeaders([(":status", String(status))])
            if let apnsID = stream.apnsID {
                headers.add(name: "apns-id", value: apnsID)
            }
            stream.channel.writeAndFlush(
                HTTP2Frame.FramePayload.headers(.init(headers: headers, endStream: true)),
                promise: nil
            )
        }
        return oldest.count
    }

    /// Sends GOAWAY on a connection.
    func goAway(connection: Int, lastStreamID: Int, errorCode: HTTP2ErrorCode = .noError, debug: String?) async throws {
        guard let channel = connections[connection]?.channel else {
            throw TestFailure("no connection \(connection)")
        }
        let frame = HTTP2Frame(
            streamID: .rootStream,
            payload: .goAway(
                lastStreamID: HTTP2StreamID(lastStreamID),
                errorCode: errorCode,
                opaqueData: debug.map { ByteBuffer(string: $0) }
            )
        )
        try await channel.writeAndFlush(frame)
    }

    /// Closes every connection from the server side.
    func closeConnections() async {
        let channels = state.withLock { $0.connections.values.filter { !$0.closed }.map(\.channel) }
        for channel in channels {
            try? await channel.close()
        }
    }

    /// Closes one connection from the server side.
    func close(connection: Int) async {
        guard let channel = connections[connection]?.channel else { return }
        try? await channel.close()
    }

    // MARK: Called from the pipeline

    fileprivate func register(_ channel: any Channel) -> Int {
        state.withLock { state in
            state.nextConnectionID += 1
            state.connections[state.nextConnectionID] = ConnectionRecord(channel: channel)
            return state.nextConnectionID
        }
    }

    fileprivate func streamOpened(connection: Int) {
        state.withLock { state in
            state.connections[connection]?.openStreams += 1
            if let record = state.connections[connection] {
                state.connections[connection]?.maxOpenStreams = max(record.maxOpenStreams, record.openStreams)
            }
        }
    }

    fileprivate func streamClosed(connection: Int) {
        state.withLock { $0.connections[connection]?.openStreams -= 1 }
    }

    fileprivate func received(_ request: RecordedRequest, channel: any Channel) -> ServerAction {
        state.withLock { state in
            state.requestCount += 1
            if recordRequests {
                state.requests.append(request)
            }
            let action = state.script(request)
            if case .hold = action {
                state.held.append(HeldStream(channel: channel, apnsID: request.header("apns-id")))
            }
            return action
        }
    }

    /// Whether to advertise the raised stream limit now (once per connection, after its first answer).
    fileprivate func shouldRaise(connection: Int) -> Int? {
        guard let raised = raisedMaxConcurrentStreams else { return nil }
        return state.withLock { state in
            guard state.connections[connection]?.raised == false else { return nil }
            state.connections[connection]?.raised = true
            return raised
        }
    }

    fileprivate func pinged(connection: Int) {
        state.withLock { $0.connections[connection]?.pings += 1 }
    }

    fileprivate func streamError(connection: Int) {
        state.withLock { $0.connections[connection]?.streamErrors += 1 }
    }

    fileprivate func connectionClosed(_ connection: Int) {
        state.withLock { $0.connections[connection]?.closed = true }
    }
}

/// Lets the pipeline initializer reach the server object created after `bind`.
private final class ServerBox: Sendable {
    private let lock = Mutex<TestAPNsServer?>(nil)
    var server: TestAPNsServer? {
        get { lock.withLock { $0 } }
        set { lock.withLock { $0 = newValue } }
    }
}

/// Sees the connection-level frames (PING, SETTINGS, GOAWAY) and errors after `NIOHTTP2Handler`.
private final class ConnectionObserver: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame

    let server: TestAPNsServer
    let connectionID: Int

    init(server: TestAPNsServer, connectionID: Int) {
        self.server = server
        self.connectionID = connectionID
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        if case .ping(_, ack: false) = frame.payload {
            server.pinged(connection: connectionID)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is NIOHTTP2Errors.StreamError {
            server.streamError(connection: connectionID)
        }
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        server.connectionClosed(connectionID)
        context.fireChannelInactive()
    }
}

/// One request stream on the server.
private final class StreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    let server: TestAPNsServer
    let connectionID: Int
    private var headers: HPACKHeaders?
    private var body: [UInt8] = []
    private var counted = false
    /// The request was answered; anything more on the stream is ignored.
    private var answered = false

    init(server: TestAPNsServer, connectionID: Int) {
        self.server = server
        self.connectionID = connectionID
    }

    func handlerAdded(context: ChannelHandlerContext) {
        counted = true
        server.streamOpened(connection: connectionID)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if counted {
            counted = false
            server.streamClosed(connection: connectionID)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            if headers == nil {
                headers = frame.headers
            }
            if frame.endStream {
                finish(context: context)
            } else if server.answersBeforeBody {
                finish(context: context)
                // The body is not wanted: the client may stop sending it (RFC 9113 §8.1).
                context.writeAndFlush(wrapOutboundOut(.rstStream(.noError)), promise: nil)
            }
        case .data(let frame):
            if case .byteBuffer(let buffer) = frame.data {
                body.append(contentsOf: buffer.readableBytesView)
            }
            if frame.endStream {
                finish(context: context)
            }
        default:
            break
        }
    }

    private func finish(context: ChannelHandlerContext) {
        answered = true
        let streamID = (try? context.channel.syncOptions?.getOption(HTTP2StreamChannelOptions.streamID)).map(Int.init) ?? -1
        let request = RecordedRequest(
            connection: connectionID,
            streamID: streamID,
            headers: (headers ?? [:]).map { (name: $0.name, value: $0.value) },
            body: body
        )
        switch server.received(request, channel: context.channel) {
        case .respond(let status, let extra, let body):
            var headers = HPACKHeaders([(":status", String(status))])
            if !extra.contains(where: { $0.0 == "apns-id" }), let apnsID = request.header("apns-id") {
                headers.add(name: "apns-id", value: apnsID)
            }
            for (name, value) in extra {
                headers.add(name: name, value: value)
            }
            context.write(wrapOutboundOut(.headers(.init(headers: headers, endStream: body == nil))), promise: nil)
            if let body {
                context.write(
                    wrapOutboundOut(.data(.init(data: .byteBuffer(ByteBuffer(string: body)), endStream: true))),
                    promise: nil
                )
            }
            context.flush()
            if status == 200, let raised = server.shouldRaise(connection: connectionID), let parent = context.channel.parent {
                let settings = HTTP2Frame(
                    streamID: .rootStream,
                    payload: .settings(.settings([HTTP2Setting(parameter: .maxConcurrentStreams, value: raised)]))
                )
                parent.writeAndFlush(settings, promise: nil)
            }
        case .hold:
            break
        case .closeConnection:
            context.channel.parent?.close(promise: nil)
        case .reset(let code):
            context.writeAndFlush(wrapOutboundOut(.rstStream(code)), promise: nil)
        }
    }
}
