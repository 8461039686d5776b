import Foundation
import Logging
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOSSL

/// One HTTP/2 connection to APNs: the last handler of the channel, after TLS and `NIOHTTP2Handler`.
///
/// It multiplexes requests itself rather than through a child channel per stream: each request writes one
/// `HEADERS` frame and one `DATA` frame (the shared payload buffer, not copied) on the next odd stream id, and the
/// response frames are matched back by stream id. That keeps the per-request cost to a few small allocations.
/// `NIOHTTP2Handler` still owns the protocol state machine, flow control and HPACK.
///
/// Its bookkeeping (streams, the queue, readiness, retiring, flushing, keepalive) is an
/// ``APNsConnectionStateMachine``; this handler reports the channel's events to it and performs what it answers:
/// it writes frames, completes requests, hands requests to the slot and closes the channel.
///
/// All state is confined to the channel's event loop.
final class APNsConnection: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame
    typealias StateMachine = APNsConnectionStateMachine<PendingRequest>

    let slot: ConnectionSlot
    let name: String
    var channelFuture: EventLoopFuture<any Channel>?

    private let shared: ClientContext
    private let logger: Logger
    private var context: ChannelHandlerContext?
    private var state: StateMachine
    /// Which of the headers whose value changes from request to request this connection has sent once (Apple's HPACK
    /// rule, ``ChangingHeaders``).
    private var changingHeaders = ChangingHeaders()

    init(slot: ConnectionSlot, name: String) {
        self.slot = slot
        self.name = name
        self.shared = slot.shared
        var logger = slot.shared.logger
        logger[metadataKey: "apns.connection"] = "\(name)"
        self.logger = logger
        self.state = StateMachine(configuration: .init(slot.shared.configuration), now: .now())
    }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        state.frameReceived()
        switch frame.payload {
        case .headers(let headers):
            receiveHeaders(streamID: frame.streamID, headers)
        case .data(let data):
            receiveData(streamID: frame.streamID, data)
        case .rstStream(let code):
            perform(
                state.streamReset(frame.streamID, code: code),
                failing: APNsTransportError("APNs reset the stream (\(code)) before answering.")
            )
        case .settings(.settings(let settings)):
            var limit: Int?
            for setting in settings where setting.parameter == .maxConcurrentStreams {
                limit = setting.value
                logger.trace("APNs allows \(setting.value) concurrent streams")
            }
            perform(state.settingsReceived(maxConcurrentStreams: limit))
        case .goAway(let lastStreamID, let errorCode, let opaqueData):
            receiveGoAway(lastStreamID: lastStreamID, errorCode: errorCode, debugData: opaqueData)
        case .ping(_, ack: true):
            state.pingAcknowledged()
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if state.readComplete() == .flushNow {
            context.flush()
        }
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case let closed as StreamClosedEvent:
            // Normally the final frame already completed the stream; this catches streams closed any other way.
            let reason = closed.reason.map { "\($0)" } ?? "no error code"
            perform(
                state.streamReset(closed.streamID, code: closed.reason),
                failing: APNsTransportError("The HTTP/2 stream closed before APNs answered (\(reason)).")
            )
        case let window as NIOHTTP2WindowUpdatedEvent where window.streamID == .rootStream:
            if let increment = state.inboundWindowChanged(to: window.inboundWindowSize) {
                write(HTTP2Frame(streamID: .rootStream, payload: .windowUpdate(windowSizeIncrement: increment)))
                markNeedsFlush()
            }
        default:
            break
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let streamError = error as? NIOHTTP2Errors.StreamError {
            // One stream failed (for example a late frame on a stream we reset); the connection carries on.
            perform(
                state.streamFailed(streamError.streamID),
                failing: APNsTransportError("HTTP/2 stream error: \(streamError.baseError)")
            )
            return
        }
        logger.debug("APNs connection error", metadata: ["error": "\(error)"])
        perform(state.errorCaught(error))
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let closed = state.channelInactive() {
            let failure = APNsTransportError(
                "The connection to \(shared.endpoint.host):\(shared.endpoint.port) closed before APNs answered (\(closed.reason))."
            )
            for request in closed.failing {
                request.finish(.failure(failure))
            }
            slot.connectionClosed(self, unsent: closed.moving, reason: closed.reason)
        }
        context.fireChannelInactive()
    }

    // MARK: Performing the machine's actions

    private func perform(_ action: StateMachine.ConnectionAction) {
        switch action {
        case .none:
            break
        case .sendQueued:
            sendQueued()
        case .notifyReady:
            slot.connectionReady(self)
            sendQueued()
        case .retire(let moving, let closeNow):
            logger.debug("Retiring APNs connection", metadata: ["reason": "\(state.closeDescription)"])
            slot.connectionRetired(self, requests: moving)
            if closeNow {
                closeChannel()
            }
        case .close:
            closeChannel()
        }
    }

    private func perform(
        _ action: StateMachine.UnansweredStreamAction,
        failing failure: @autoclosure () -> APNsTransportError
    ) {
        switch action {
        case .none:
            break
        case .failRequest(let request, let then):
            request.finish(.failure(failure()))
            perform(then)
        case .moveRequest(let request, let then):
            slot.move(request)
            perform(then)
        }
    }

    private func closeChannel() {
        guard !state.isClosed else { return }
        if let context {
            context.close(promise: nil)
        } else {
            channelFuture?.whenSuccess { $0.close(promise: nil) }
        }
    }

    // MARK: Sending

    /// Takes a request: writes it at once when a stream is free, otherwise queues it.
    func submit(_ request: PendingRequest) {
        assert(state.isReady && !state.isRetiring && !state.isClosed, "requests go only to ready connections")
        switch state.submit(request, now: .now()) {
        case .write(let write):
            send(write)
        case .queued:
            break
        case .moveToAnotherConnection(let request):
            slot.move(request)
        case .tooLate(let request):
            request.finish(.failure(tooLateError()))
        }
    }

    /// Writes queued requests while streams are free.
    private func sendQueued() {
        let now = NIODeadline.now()
        while let write = state.nextQueuedWrite(now: now) {
            send(write)
        }
        let unsendable = state.takeUnsendable()
        if !unsendable.isEmpty {
            let error = tooLateError()
            for request in unsendable {
                request.finish(.failure(error))
            }
        }
    }

    /// For a request not sent because too little of its time was left for an answer.
    private func tooLateError() -> APNsTransportError {
        let answerTime = state.streamLimit.smoothedAnswer.map { "\($0.nanoseconds / 1_000_000) ms" } ?? "none yet"
        return APNsTransportError(
            "Not sent: it spent most of its \(shared.configuration.requestTimeout) waiting for a connection or a free HTTP/2 stream, and less than \(state.streamLimit.answerAllowance.nanoseconds / 1_000_000) ms was left for an answer (APNs answers in \(answerTime) now; this connection keeps at most \(state.openStreamLimit) requests on the wire)."
        )
    }

    private func send(_ write: StateMachine.StreamWrite) {
        let request = write.request
        let streamID = write.streamID
        guard let context else {
            // Not in a pipeline (unreachable: the slot submits only while the channel is active). Never leave a
            // request on a stream nobody answers; the stream's follow-up is skipped, as nothing can be written.
            _ = state.streamResetByClient(streamID)
            slot.move(request)
            perform(write.then)
            return
        }
        let token = shared.tokens.currentIssued()
        request.tokenUsed = token.token
        request.streamID = streamID
        if let head = request.other {
            send(head, streamID: streamID, authorization: token.authorization, context: context)
            perform(write.then)
            return
        }
        let notification = request.notification

        let hasBody = notification.payload.readableBytes > 0
        let block = HTTP2Frame.FramePayload.Headers(
            headers: Self.deviceRequestHeaders(
                request, authority: shared.authority, authorization: token.authorization, changing: &changingHeaders
            ),
            endStream: !hasBody
        )

        context.write(wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .headers(block))), promise: nil)
        if hasBody {
            context.write(
                wrapOutboundOut(
                    HTTP2Frame(streamID: streamID, payload: .data(.init(data: .byteBuffer(notification.payload), endStream: true)))
                ),
                promise: nil
            )
        }
        markNeedsFlush()
        perform(write.then)
    }

    /// Writes a request other than a device push (a broadcast, a channel management request).
    private func send(
        _ head: APNsRequestHead,
        streamID: HTTP2StreamID,
        authorization: String,
        context: ChannelHandlerContext
    ) {
        let body = head.body.flatMap { $0.readableBytes > 0 ? $0 : nil }
        let block = HTTP2Frame.FramePayload.Headers(
            headers: Self.requestHeaders(
                head, authority: shared.authority, authorization: authorization, hasBody: body != nil, changing: &changingHeaders
            ),
            endStream: body == nil
        )
        context.write(wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .headers(block))), promise: nil)
        if let body {
            context.write(
                wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .data(.init(data: .byteBuffer(body), endStream: true)))),
                promise: nil
            )
        }
        markNeedsFlush()
    }

    /// The header block of a device push, encoded as Apple asks ("Sending notification requests to APNs": APNs keeps a
    /// small HPACK dynamic table): `:path` and `authorization` as literals without indexing; `apns-id` and
    /// `apns-expiration`, whose values change from request to request, with incremental indexing the first time on the
    /// connection and as literals without indexing after that (``ChangingHeaders``); every other field (method, scheme,
    /// authority, push type, topic, priority) with incremental indexing, so that it costs a byte from the second request
    /// on. A notification without an `apns-id` sends none (APNs makes one up), and no request carries a header Apple
    /// does not document for it (a `content-type` was sent before: each header is looked up in both HPACK tables on
    /// every request).
    static func deviceRequestHeaders(
        _ request: PendingRequest, authority: String, authorization: String, changing: inout ChangingHeaders
    ) -> HPACKHeaders {
        let notification = request.notification
        var headers = HPACKHeaders()
        headers.reserveCapacity(11)
        headers.add(name: ":method", value: "POST")
        headers.add(name: ":scheme", value: "https")
        headers.add(name: ":path", value: request.path, indexing: .nonIndexable)
        headers.add(name: ":authority", value: authority)
        headers.add(name: "authorization", value: authorization, indexing: .nonIndexable)
        headers.add(name: "apns-push-type", value: notification.pushType)
        headers.add(name: "apns-topic", value: notification.topic)
        headers.add(name: "apns-priority", value: request.priorityString)
        if let expiration = notification.expiration {
            headers.add(name: "apns-expiration", value: String(expiration), indexing: changing.indexing(.expiration))
        }
        if let apnsID = request.apnsIDString {
            headers.add(name: "apns-id", value: apnsID, indexing: changing.indexing(.apnsID))
        }
        return headers
    }

    /// The header block of a request other than a device push (a broadcast, a channel management request), encoded
    /// as ``deviceRequestHeaders(_:authority:authorization:changing:)``: `:path` and `authorization` as literals without
    /// indexing, `apns-expiration` and the per-request `apns-request-id` as the changing headers of a device push
    /// (``ChangingHeaders``), the rest with incremental indexing.
    static func requestHeaders(
        _ head: APNsRequestHead, authority: String, authorization: String, hasBody: Bool, changing: inout ChangingHeaders
    ) -> HPACKHeaders {
        var headers = HPACKHeaders()
        headers.reserveCapacity(6 + head.headers.count)
        headers.add(name: ":method", value: head.method)
        headers.add(name: ":scheme", value: "https")
        headers.add(name: ":path", value: head.path, indexing: .nonIndexable)
        headers.add(name: ":authority", value: authority)
        headers.add(name: "authorization", value: authorization, indexing: .nonIndexable)
        for (name, value) in head.headers {
            let indexing: HPACKIndexing =
                switch name {
                case "apns-request-id": changing.indexing(.requestID)
                case "apns-expiration": changing.indexing(.expiration)
                default: .indexable
                }
            headers.add(name: name, value: value, indexing: indexing)
        }
        if hasBody {
            headers.add(name: "content-type", value: "application/json")
        }
        return headers
    }

    private func write(_ frame: HTTP2Frame) {
        context?.write(wrapOutboundOut(frame), promise: nil)
    }

    /// Flushes at the end of the current read, or once after the requests submitted in this event loop tick.
    private func markNeedsFlush() {
        guard let context, state.writeNeedsFlush() == .scheduleFlush else { return }
        context.eventLoop.assumeIsolated().execute {
            self.state.scheduledFlushRan()
            self.context?.flush()
        }
    }

    // MARK: Receiving

    private func receiveHeaders(streamID: HTTP2StreamID, _ payload: HTTP2Frame.FramePayload.Headers) {
        guard let request = state.request(on: streamID) else { return }
        if request.status == nil {
            var status: Int?
            for (name, value, _) in payload.headers {
                switch name {
                case ":status":
                    status = Int(value)
                case "apns-id":
                    request.echoedAPNsID = value
                case "apns-unique-id":
                    request.apnsUniqueID = value
                case "retry-after":
                    request.retryAfter = Int64(value.trimmingCharacters(in: .whitespaces)).map { .seconds($0) }
                case "apns-request-id":
                    request.requestID = value
                case "apns-channel-id":
                    request.channelID = value
                default:
                    break
                }
            }
            guard let status else {
                failStream(streamID, request, "APNs answered without a :status")
                return
            }
            if (100..<200).contains(status) {
                // Informational; the real response follows.
                return
            }
            request.status = status
        }
        if payload.endStream {
            complete(streamID, request)
        }
    }

    private func receiveData(streamID: HTTP2StreamID, _ payload: HTTP2Frame.FramePayload.Data) {
        guard let request = state.request(on: streamID) else { return }
        if request.other != nil, !payload.endStream, case .byteBuffer(let buffer) = payload.data {
            // A channel list can be longer than the stream's initial window: give back what was read so the server
            // can send the rest. (Device push answers are tiny and end in their first frame.)
            let consumed = buffer.readableBytes + (payload.paddingBytes ?? 0)
            if consumed > 0 {
                write(HTTP2Frame(streamID: streamID, payload: .windowUpdate(windowSizeIncrement: consumed)))
                markNeedsFlush()
            }
        }
        if case .byteBuffer(var buffer) = payload.data, buffer.readableBytes > 0 {
            if request.body == nil {
                request.body = buffer
            } else if request.body!.readableBytes < request.maximumBodyBytes {
                request.body!.writeBuffer(&buffer)
            }
        }
        if payload.endStream {
            complete(streamID, request)
        }
    }

    private func complete(_ streamID: HTTP2StreamID, _ request: PendingRequest) {
        guard let status = request.status else {
            let then = state.responseEnded(on: streamID, now: .now())
            request.finish(.failure(APNsTransportError("APNs ended the stream without a response status.")))
            perform(then)
            return
        }
        var response = APNsResponse(
            status: status,
            apnsID: request.echoedAPNsID,
            apnsUniqueID: request.apnsUniqueID,
            retryAfter: request.retryAfter,
            requestID: request.requestID
        )
        if !(200..<300).contains(status), let body = request.body {
            let parsed = ErrorBody(body)
            response.reason = parsed.reason.map(APNsErrorReason.init(rawValue:))
            response.tokenInvalidSince = parsed.timestampMilliseconds.map { Date(timeIntervalSince1970: $0 / 1000) }
        }
        var retirement = StateMachine.ConnectionAction.none
        if status == 403, let reason = response.reason {
            switch reason {
            case .expiredProviderToken, .invalidProviderToken:
                if let usedToken = request.tokenUsed {
                    let renewal = shared.tokens.refresh(replacing: usedToken)
                    response.providerTokenReplaced = renewal.replacedRefusedToken
                    switch renewal {
                    case .renewed:
                        logger.notice("APNs refused the provider token; a new one will be used", metadata: ["reason": "\(reason)"])
                    case .kept(_, let age, firstRefusal: true):
                        logger.warning(
                            "APNs refused a provider token signed less than 20 minutes ago; it is kept, since Apple allows one renewal in 20 minutes and a new token from the same key would be refused alike: check the key, its key id and team id, the environment, and this machine's clock",
                            metadata: ["reason": "\(reason)", "tokenAge": "\(age)"]
                        )
                    case .kept, .alreadyReplaced:
                        break
                    }
                }
            case .unrelatedKeyIdInToken:
                retirement = state.retire(because: .unrelatedKeyIDInToken)
            default:
                break
            }
        }
        request.finish(.success(response))
        let then = state.responseEnded(on: streamID, now: .now())
        perform(retirement)
        perform(then)
    }

    private func failStream(_ streamID: HTTP2StreamID, _ request: PendingRequest, _ description: String) {
        let then = state.streamResetByClient(streamID)
        write(HTTP2Frame(streamID: streamID, payload: .rstStream(.protocolError)))
        markNeedsFlush()
        request.finish(.failure(APNsTransportError(description)))
        perform(then)
    }

    private func receiveGoAway(lastStreamID: HTTP2StreamID, errorCode: HTTP2ErrorCode, debugData: ByteBuffer?) {
        let debugText = debugData.map { String(buffer: $0) } ?? ""
        let reason = debugData.flatMap { ErrorBody($0).reason }
        logger.warning(
            "APNs sent GOAWAY",
            metadata: [
                "apns.goaway.error": "\(errorCode)",
                "apns.goaway.reason": "\(reason ?? debugText)",
                "apns.goaway.lastStreamID": "\(lastStreamID)",
            ]
        )
        perform(state.goAwayReceived(lastStreamID: lastStreamID, errorCode: errorCode, reason: reason))
    }

    // MARK: Closing

    /// Closes the channel; in-flight requests fail with ``APNsTransportError`` saying why (`reason`, unless the
    /// connection already knows a reason).
    func close(because reason: StateMachine.CloseReason) {
        if state.close(because: reason) {
            closeChannel()
        }
    }

    /// Closes for client shutdown; the future completes when the channel is closed.
    func shutdown() -> EventLoopFuture<Void> {
        let mustClose = state.clientShutDown()
        if let context {
            let channel = context.channel
            if mustClose {
                context.close(promise: nil)
            }
            return channel.closeFuture
        }
        guard let channelFuture else {
            return slot.eventLoop.makeSucceededVoidFuture()
        }
        return channelFuture.flatMap { channel in
            channel.close(promise: nil)
            return channel.closeFuture
        }.recover { _ in }
    }

    /// Resets the stream carrying `request`, if it is on this connection. Returns whether it was.
    func cancelStream(of request: PendingRequest) -> Bool {
        guard let streamID = request.streamID, let found = state.request(on: streamID), found === request else {
            return false
        }
        let then = state.streamResetByClient(streamID)
        write(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel)))
        markNeedsFlush()
        perform(then)
        return true
    }

    // MARK: Deadlines and keepalive

    /// Fails requests past their deadline, closes a connection that never got ready or stopped answering PINGs,
    /// and PINGs one that has been quiet.
    func sweep(now: NIODeadline) {
        guard let context else { return }
        let actions = state.timerFired(now: now)
        if actions.flush {
            context.flush()
        }
        if !actions.timedOutStreams.isEmpty {
            let timeout = APNsTransportError(
                "APNs did not answer within \(shared.configuration.requestTimeout); the stream was reset."
            )
            for (streamID, request) in actions.timedOutStreams {
                write(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel)))
                request.finish(.failure(timeout))
            }
        }
        if let cut = actions.streamLimitCut {
            logger.notice(
                "APNs answers slowly: fewer requests on the wire",
                metadata: [
                    "apns.streams.from": "\(cut.from)", "apns.streams.to": "\(cut.to)",
                    "apns.answer.smoothedMs": "\(cut.smoothedAnswer.nanoseconds / 1_000_000)",
                    "apns.answer.slowMarkMs": "\(cut.slowMark.nanoseconds / 1_000_000)",
                ]
            )
        }
        if !actions.timedOutQueued.isEmpty {
            let limit = state.openStreamLimit < state.maxConcurrentStreams
                ? "the server allows \(state.maxConcurrentStreams); it answers slowly, and this connection keeps at most \(state.openStreamLimit) on the wire"
                : "the server allows \(state.maxConcurrentStreams)"
            let timeout = APNsTransportError(
                "Timed out after \(shared.configuration.requestTimeout) waiting for a free HTTP/2 stream (\(limit))."
            )
            for request in actions.timedOutQueued {
                request.finish(.failure(timeout))
            }
        }
        if !actions.timedOutStreams.isEmpty {
            markNeedsFlush()
        }
        perform(actions.then)
        if let ping = actions.ping {
            write(HTTP2Frame(streamID: .rootStream, payload: .ping(ping, ack: false)))
            markNeedsFlush()
        }
    }
}

/// The JSON body of an APNs error response (`{"reason": "...", "timestamp": ...}`) or a GOAWAY's debug data.
struct ErrorBody: Decodable {
    var reason: String?
    var timestampMilliseconds: Double?

    private enum CodingKeys: String, CodingKey {
        case reason
        case timestamp
    }

    init(_ buffer: ByteBuffer) {
        let data = Data(buffer.readableBytesView)
        if let decoded = try? JSONDecoder().decode(ErrorBody.self, from: data) {
            self = decoded
        } else {
            reason = nil
            timestampMilliseconds = nil
        }
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        reason = try? container.decodeIfPresent(String.self, forKey: .reason)
        if let number = try? container.decodeIfPresent(Double.self, forKey: .timestamp) {
            timestampMilliseconds = number
        } else if let text = try? container.decodeIfPresent(String.self, forKey: .timestamp) {
            timestampMilliseconds = Double(text)
        } else {
            timestampMilliseconds = nil
        }
    }
}

/// Apple's HPACK rule for the headers whose value changes from request to request ("Sending notification requests to
/// APNs": "Encode the apns-id, apns-expiration, and apns-collapse-id values differently based on whether this is an
/// initial or subsequent request. The first time you send these headers, encode them with incremental indexing to add
/// the header fields to the dynamic table. For subsequent requests, encode these headers as literal header fields
/// without indexing."). A broadcast's `apns-request-id` is new on every request too, and follows the same rule. After
/// the first request the name is one index into the table (while its entry stays there), and no new value ever
/// crowds the other entries out of APNs' small table. One per connection: each has its own table.
struct ChangingHeaders {
    /// A header whose value changes from request to request.
    enum Name: Int, CaseIterable {
        case apnsID
        case expiration
        case requestID
    }

    /// The names sent once on this connection, one bit each.
    private var sent: UInt8 = 0

    /// How to encode `name` on the next request: with incremental indexing the first time, then without indexing.
    mutating func indexing(_ name: Name) -> HPACKIndexing {
        let bit = UInt8(1) << UInt8(name.rawValue)
        if sent & bit != 0 { return .nonIndexable }
        sent |= bit
        return .indexable
    }
}
