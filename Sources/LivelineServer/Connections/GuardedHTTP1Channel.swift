import HTTPTypes
import Hummingbird
import HummingbirdCore
import LivelineCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes

/// Liveline's HTTP/1.1 child channel: Hummingbird's `HTTP1Channel` with a connection's deadlines
/// (``ConnectionLimits``) kept in its pipeline.
///
/// Two handlers do it: ``ConnectionBytesObserver``, first in the pipeline, sees bytes arrive before the HTTP decoder
/// (a header block that never completes yields no HTTP part at all), and ``ConnectionTimeoutHandler``, after the
/// decoder, sees request and answer parts, keeps the ``ConnectionDeadlines`` state machine and its timer, and closes
/// the connection — or answers 408 first — when a deadline passes.
struct GuardedHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value

    let http1: HTTP1Channel

    init(responder: @escaping HTTPChannelHandler.Responder, limits: ConnectionLimits, logger: Logger) {
        http1 = HTTP1Channel(
            responder: responder,
            configuration: HTTP1Channel.Configuration(additionalChannelHandlers: [ConnectionTimeoutHandler(limits: limits, logger: logger)])
        )
    }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        // Called on the channel's event loop, as HTTP1Channel's own setup is.
        do {
            try channel.pipeline.syncOperations.addHandler(ConnectionBytesObserver(), position: .first)
        } catch {
            return channel.eventLoop.makeFailedFuture(error)
        }
        return http1.setup(channel: channel, logger: logger).flatMapThrowing { value in
            // Right after the HTTP/1 decoder, where the request's HTTP version is still known (before the parts become
            // HTTP types).
            let operations = channel.pipeline.syncOperations
            let decoder = try operations.context(handlerType: ByteToMessageHandler<HTTPRequestDecoder>.self)
            try operations.addHandler(ContinueHandler(), position: .after(decoder.handler))
            try operations.addHandler(ConnectionPersistenceHandler(), position: .after(decoder.handler))
            return value
        }
    }

    func handle(value: Value, logger: Logger) async {
        // The connection's requests are handled on its own event loop, not in the cooperative pool the delivery
        // engine fills during a fan-out (``EventLoopTaskExecutor``).
        await withTaskExecutorPreference(EventLoopTaskExecutor(value.channel.eventLoop)) {
            await http1.handle(value: value, logger: logger)
        }
    }
}

extension HTTPServerBuilder {
    /// HTTP/1.1 with Liveline's connection deadlines.
    static func guardedHTTP1(limits: ConnectionLimits, logger: Logger) -> HTTPServerBuilder {
        HTTPServerBuilder { responder in GuardedHTTP1Channel(responder: responder, limits: limits, logger: logger) }
    }
}

/// Answers a request that expects `100-continue` with `100 Continue` once its header block has arrived, so the client
/// sends its body at once (RFC 9110, section 10.1.1: a server that receives it "ought to" send an immediate
/// 100 (Continue) or a final status code). Without it such a client waits before sending its body anyway: curl a whole
/// second, for every request. An HTTP/1.0 request's expectation is ignored, as the RFC requires; any other
/// expectation is left to the route (none is met).
///
/// Requests on a connection are answered one after the other, and a client may send the next before the answer to the
/// one before has been written (pipelining): an interim answer then waits for the end of the answers before it, so it
/// never lands inside one of them; a final answer to the request written before its interim one went out stands
/// instead of it. The request's parts pass on unchanged.
final class ContinueHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// The requests whose answer has not ended, oldest first: the version of each one still owed a `100 Continue`.
    private var unanswered: [HTTPVersion?] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = unwrapInboundIn(data) {
            unanswered.append(Self.expectsContinue(head) ? head.version : nil)
            if unanswered.count == 1 { sendContinueIfOwed(context: context) }
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head(let head) where head.status.code >= 200 || head.status == .switchingProtocols:
            // The final answer has begun: no 100 is owed any longer.
            if !unanswered.isEmpty { unanswered[0] = nil }
            context.write(data, promise: promise)
        case .end:
            context.write(data, promise: promise)
            if !unanswered.isEmpty {
                unanswered.removeFirst()
                sendContinueIfOwed(context: context)
            }
        default:
            context.write(data, promise: promise)
        }
    }

    /// Writes the `100 Continue` the oldest unanswered request is owed, if any.
    private func sendContinueIfOwed(context: ChannelHandlerContext) {
        guard let first = unanswered.first, let version = first else { return }
        unanswered[0] = nil
        context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: version, status: .continue))), promise: nil)
    }

    /// Whether `head` is an HTTP/1.1 (or later) request whose `Expect` is `100-continue` (compared without case).
    static func expectsContinue(_ head: HTTPRequestHead) -> Bool {
        guard head.version.major > 1 || (head.version.major == 1 && head.version.minor >= 1) else { return false }
        return head.headers[canonicalForm: "expect"].contains { $0.lowercased() == "100-continue" }
    }
}

/// Closes the connection after the answer to a request that does not keep it open (RFC 9112, section 9.3): an HTTP/1.0
/// request without the `keep-alive` connection option, or any request with `close` among its `Connection` options, in
/// any case; and a `CONNECT`. Hummingbird keeps a connection open unless the header is exactly `close`, and an HTTP/1.0
/// client that reads its answer to the close waited for the idle timeout. That answer says `Connection: close` (section
/// 9.6), and bytes pipelined after such a request are neither read nor answered: the server "SHOULD NOT process further
/// requests received on that connection". An answer the server itself sends with `Connection: close` closes the
/// connection the same way.
final class ConnectionPersistenceHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// How long a closing connection reads what the client still sends before it closes all the same.
    static let lingering: TimeAmount = .seconds(5)

    /// Whether each request whose answer has not ended keeps the connection open, oldest first.
    private var keepsConnection: [Bool] = []
    /// A request that does not keep the connection has arrived whole: nothing after it is read.
    private var lastRequestRead = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !lastRequestRead else { return }
        switch unwrapInboundIn(data) {
        case .head(let head):
            // A CONNECT asks for a tunnel, which no route makes: the decoder reads nothing after it, and the encoder
            // sends its answer without a body (RFC 9112, 6.3), so the close is what ends that answer.
            keepsConnection.append(head.isKeepAlive && head.method != .CONNECT)
        case .body:
            break
        case .end:
            if keepsConnection.last == false { lastRequestRead = true }
        }
        context.fireChannelRead(data)
    }

    /// Bytes after such a request are not read: the decoder's complaint about them ("data received after completed
    /// connection: close message") is not an error to answer.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard lastRequestRead, error is HTTPParserError else { return context.fireErrorCaught(error) }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head(var head) where head.status.code >= 200 && !keepsConnection.isEmpty:
            if !keepsConnection[0] {
                head.headers.replaceOrAdd(name: "connection", value: "close")
            } else if head.headers[canonicalForm: "connection"].contains(where: { $0.lowercased() == "close" }) {
                // The server's own close (a body too large to read, say): "A server that sends a "close" connection
                // option MUST initiate closure of the connection" after that answer (section 9.6), and reads no more.
                keepsConnection[0] = false
                lastRequestRead = true
            }
            context.write(wrapOutboundOut(.head(head)), promise: promise)
        case .end where !keepsConnection.isEmpty:
            let keeps = keepsConnection.removeFirst()
            guard !keeps else { return context.write(data, promise: promise) }
            // The answer's end is written (and flushed by its writer); then the connection is closed, a lingering close
            // (RFC 9112, 9.6): this side first, while what the client still sends (the rest of a body too large to
            // read) is read and dropped, so that its data arriving at a closed socket does not reset the connection
            // before the client has read the answer; all of it once the client closes, or after ``lingering``.
            let written = promise ?? context.eventLoop.makePromise()
            let channel = context.channel
            written.futureResult.whenComplete { _ in
                channel.close(mode: .output).whenFailure { _ in channel.close(promise: nil) }
                channel.eventLoop.scheduleTask(in: Self.lingering) { channel.close(promise: nil) }
            }
            context.write(data, promise: written)
        default:
            context.write(data, promise: promise)
        }
    }
}

/// First in a connection's pipeline: tells the connection's ``ConnectionTimeoutHandler`` that bytes arrived, before
/// the HTTP decoder has made anything of them.
final class ConnectionBytesObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// Set by the timeout handler when it joins the pipeline.
    weak var timeouts: ConnectionTimeoutHandler?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        timeouts?.bytesReceived()
        context.fireChannelRead(data)
    }
}

/// Keeps a connection's deadlines: feeds what it sees to ``ConnectionDeadlines`` and performs its actions — sets and
/// cancels one timer, closes the connection, answers 408.
final class ConnectionTimeoutHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private var deadlines: ConnectionDeadlines
    private let logger: Logger
    private var context: ChannelHandlerContext?
    private var timer: Scheduled<Void>?
    /// A request's head arrived and its response's end has not been written: an answer of this handler's own would
    /// cross the route's.
    private var requestOpen = false
    /// A request's head arrived and its end has not: a parse error now is about its body, which its route reads.
    private var requestArriving = false
    /// Bytes that are not HTTP/1.1 arrived after a whole request whose answer is not written yet: answered after it.
    private var malformedAfterRequest: HTTPParserError?
    /// The connection is being answered and closed by this handler.
    private var closing = false

    init(limits: ConnectionLimits, logger: Logger) {
        deadlines = ConnectionDeadlines(limits: limits)
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if let observer = try? context.pipeline.syncOperations.handler(type: ConnectionBytesObserver.self) {
            observer.timeouts = self
        }
        if context.channel.isActive { perform(deadlines.opened(at: .now())) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        perform(deadlines.opened(at: .now()))
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        perform(deadlines.closed())
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            requestOpen = true
            requestArriving = true
            perform(deadlines.requestHeadReceived(at: .now()))
        case .body: break
        case .end:
            requestArriving = false
            perform(deadlines.requestEndReceived(at: .now()))
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head: perform(deadlines.responseHeadWritten(at: .now()))
        case .body: break
        case .end:
            requestOpen = false
            perform(deadlines.responseEndWritten(at: .now()))
        }
        context.write(data, promise: promise)
        // Bytes that are not HTTP/1.1 came after this request (pipelined): answered now that its answer is written.
        if case .end = unwrapOutboundIn(data), let malformed = malformedAfterRequest {
            malformedAfterRequest = nil
            answerAndClose(APIError.malformedRequest(malformed), context: context)
        }
    }

    /// Bytes that are not HTTP/1.1 (an unknown method, a header block over the decoder's limit, a broken request
    /// line) arriving between requests are answered with the API's JSON error (``APIError/malformedRequest(_:)``) and
    /// the connection is closed, where Hummingbird would answer an empty 400. Within a request (its route may be
    /// answering) the error goes on to Hummingbird: the route reading the body sees it thrown, ``ErrorMiddleware``
    /// answers the same JSON error, and Hummingbird closes the connection.
    ///
    /// Bytes that are not HTTP/1.1 pipelined after a whole request, while its answer is still being made, are answered
    /// the same way once that answer is written.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let parseError = error as? HTTPParserError, !requestArriving else { return context.fireErrorCaught(error) }
        guard !closing else { return }
        closing = true
        logger.debug("Answering a request that is not HTTP/1.1 and closing the connection", metadata: ["error": "\(parseError)"])
        if requestOpen {
            malformedAfterRequest = parseError
        } else {
            answerAndClose(APIError.malformedRequest(parseError), context: context)
        }
    }

    /// Bytes arrived, as ``ConnectionBytesObserver`` saw them.
    func bytesReceived() {
        perform(deadlines.bytesReceived(at: .now()))
    }

    private func perform(_ action: ConnectionDeadlines.TimerAction) {
        switch action {
        case .keep:
            break
        case .disarm:
            timer?.cancel()
            timer = nil
        case .arm(let deadline):
            timer?.cancel()
            guard let context else { timer = nil; return }
            timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in self.timerFired() }
        }
    }

    private func timerFired() {
        timer = nil
        guard let context else { return }
        switch deadlines.timerFired(at: .now()) {
        case .nothing:
            break
        case .rearm(let deadline):
            perform(.arm(deadline))
        case .close(let kind):
            logger.debug("Closing a connection: \(kind.sentence)", metadata: ["remote": "\(context.channel.remoteAddress?.description ?? "-")"])
            context.close(promise: nil)
        case .answerTimeoutAndClose:
            logger.debug("Answering 408 and closing a connection: \(ConnectionDeadlines.Kind.body.sentence)",
                         metadata: ["remote": "\(context.channel.remoteAddress?.description ?? "-")"])
            answerTimeout(context: context)
        }
    }

    /// Writes the 408 answer, then closes the connection — at once if the write cannot finish within a second.
    private func answerTimeout(context: ChannelHandlerContext) {
        answerAndClose(.requestTimeout, context: context)
    }

    /// Writes `error` as the API's JSON error, then closes the connection — at once if the write cannot finish within
    /// a second.
    private func answerAndClose(_ error: APIError, context: ChannelHandlerContext) {
        let body = ByteBuffer(string: error.json.encodedString)
        var fields = HTTPFields()
        fields[.contentType] = "application/json"
        fields[.contentLength] = String(body.readableBytes)
        fields[.connection] = "close"
        context.write(wrapOutboundOut(.head(HTTPResponse(status: error.status, headerFields: fields))), promise: nil)
        context.write(wrapOutboundOut(.body(body)), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
        channel.eventLoop.scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
    }
}

extension ConnectionDeadlines.Kind {
    /// What happened, for the log.
    var sentence: String {
        switch self {
        case .header: "the request's header block did not complete in time"
        case .body: "the request's body did not complete in time"
        case .idle: "idle for too long"
        }
    }
}

extension APIError {
    /// The answer to bytes that are not an HTTP/1.1 request: 431 `header_fields_too_large` for a request line and
    /// headers over the decoder's limit, 400 `malformed_request` otherwise.
    static func malformedRequest(_ error: HTTPParserError) -> APIError {
        switch error {
        case .headerOverflow:
            APIError(
                HTTPResponse.Status(code: 431, reasonPhrase: "Request Header Fields Too Large"), code: "header_fields_too_large",
                message: "The request line and headers are larger than this server accepts; the connection is closed."
            )
        case .invalidMethod:
            APIError(.badRequest, code: "malformed_request", message: "The request's method is not an HTTP method; the connection is closed.")
        default:
            APIError(.badRequest, code: "malformed_request", message: "The request is not valid HTTP/1.1 (\(error)); the connection is closed.")
        }
    }

    /// The answer to a request whose body did not arrive within the body timeout.
    static let requestTimeout = APIError(
        .requestTimeout, code: "request_timeout", message: "The request's body did not arrive in time; the connection is closed."
    )
}
