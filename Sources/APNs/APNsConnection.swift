import Foundation
import Logging
import NIOCore
import NIOHTTP2
import NIOSSL

/// One HTTP/2 connection to APNs: the last handler of the channel, after TLS and `NIOHTTP2Handler`.
///
/// It multiplexes requests itself rather than through a child channel per stream: each request writes one
/// `HEADERS` frame and one `DATA` frame (the shared payload buffer, not copied) on the next odd stream id, and the
/// response frames are matched back by stream id. That keeps the per-request cost to a few small allocations.
/// `NIOHTTP2Handler` still owns the protocol state machine, flow control and HPACK.
///
/// All state is confined to the channel's event loop.
final class APNsConnection: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    /// The connection-level receive window kept open for responses.
    static let targetReceiveWindow = 1 << 20
    /// The most of an error body kept; APNs' bodies are tiny JSON objects.
    static let maximumBodyBytes = 16 * 1024

    let slot: ConnectionSlot
    let name: String
    var channelFuture: EventLoopFuture<any Channel>?

    private let shared: ClientContext
    private let logger: Logger
    private let createdAt = NIODeadline.now()
    private var context: ChannelHandlerContext?

    /// Requests on the wire, by stream id.
    private var streams = StreamTable()
    /// Requests waiting for a free stream (the server's concurrency limit is reached), oldest first.
    private var pending = CircularBuffer<PendingRequest>()
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS. 100 (what swift-nio-http2 assumes) until the server says.
    private var maxConcurrentStreams = 100
    private var nextStreamID: Int32 = 1

    /// The server's first SETTINGS frame arrived.
    private(set) var isReady = false
    /// No new streams: GOAWAY received, stream ids exhausted, or the credentials call for a new connection.
    private var isRetiring = false
    private var isClosed = false

    private var inRead = false
    private var needsFlush = false
    private var flushScheduled = false

    private var sawFrame = false
    private var lastFrameAt: NIODeadline
    private var pingSentAt: NIODeadline?

    /// Why the connection is closing, when we know better than the channel.
    private var closeReason: String?
    private var firstError: (any Error)?

    init(slot: ConnectionSlot, name: String) {
        self.slot = slot
        self.name = name
        self.shared = slot.shared
        var logger = slot.shared.logger
        logger[metadataKey: "apns.connection"] = "\(name)"
        self.logger = logger
        self.lastFrameAt = createdAt
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
        sawFrame = true
        inRead = true
        switch frame.payload {
        case .headers(let headers):
            receiveHeaders(streamID: frame.streamID, headers)
        case .data(let data):
            receiveData(streamID: frame.streamID, data)
        case .rstStream(let code):
            receiveReset(streamID: frame.streamID, code: code)
        case .settings(.settings(let settings)):
            receiveSettings(settings)
        case .goAway(let lastStreamID, let errorCode, let opaqueData):
            receiveGoAway(lastStreamID: lastStreamID, errorCode: errorCode, debugData: opaqueData)
        case .ping(_, ack: true):
            pingSentAt = nil
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        inRead = false
        if needsFlush {
            needsFlush = false
            context.flush()
        }
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case let closed as StreamClosedEvent:
            // Normally the final frame already completed the stream; this catches streams closed any other way.
            if let request = streams.removeValue(forKey: closed.streamID) {
                if closed.reason == .refusedStream {
                    slot.move(request)
                } else {
                    let reason = closed.reason.map { "\($0)" } ?? "no error code"
                    request.finish(.failure(APNsTransportError("The HTTP/2 stream closed before APNs answered (\(reason)).")))
                }
                streamFinished()
            }
        case let window as NIOHTTP2WindowUpdatedEvent where window.streamID == .rootStream:
            if let size = window.inboundWindowSize, size <= Self.targetReceiveWindow / 2 {
                write(HTTP2Frame(streamID: .rootStream, payload: .windowUpdate(windowSizeIncrement: Self.targetReceiveWindow - size)))
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
            if let request = streams.removeValue(forKey: streamError.streamID) {
                request.finish(.failure(APNsTransportError("HTTP/2 stream error: \(streamError.baseError)")))
                streamFinished()
            }
            return
        }
        if firstError == nil {
            firstError = error
        }
        logger.debug("APNs connection error", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        isClosed = true
        let reason = closeDescription
        let failure = APNsTransportError(
            "The connection to \(shared.endpoint.host):\(shared.endpoint.port) closed before APNs answered (\(reason))."
        )
        let inFlight = streams.removeAll()
        for request in inFlight {
            request.finish(.failure(failure))
        }
        var unsent: [PendingRequest] = []
        while let request = pending.popFirst() {
            if !request.isFinished {
                unsent.append(request)
            }
        }
        slot.connectionClosed(self, unsent: unsent, reason: reason)
        context.fireChannelInactive()
    }

    private var closeDescription: String {
        if let closeReason {
            return closeReason
        }
        if let firstError {
            if !isReady, !(firstError is NIOSSLError) {
                return "\(firstError) (is the server speaking HTTP/2 over TLS with ALPN h2?)"
            }
            return "\(firstError)"
        }
        return isReady ? "the server closed the connection" : "the server closed the connection during setup"
    }

    // MARK: Sending

    /// Takes a request: writes it at once when a stream is free, otherwise queues it.
    func submit(_ request: PendingRequest) {
        assert(isReady && !isRetiring && !isClosed, "requests go only to ready connections")
        if pending.isEmpty && streams.count < maxConcurrentStreams {
            send(request)
            markNeedsFlush()
        } else {
            pending.append(request)
        }
    }

    private func send(_ request: PendingRequest) {
        guard let context else {
            pending.append(request)
            return
        }
        let streamID = HTTP2StreamID(nextStreamID)
        nextStreamID += 2

        let notification = request.notification
        let token = shared.tokens.currentIssued()
        request.tokenUsed = token.token
        request.streamID = streamID

        let hasBody = notification.payload.readableBytes > 0
        // HPACK: values that repeat (authorization, topic, ...) go into the dynamic table; per-request values
        // (path, apns-id) are sent literally without indexing so they do not churn it.
        var block = HTTP2Frame.FramePayload.Headers(headers: [:], endStream: !hasBody)
        block.headers.reserveCapacity(11)
        block.headers.add(name: ":method", value: "POST")
        block.headers.add(name: ":scheme", value: "https")
        block.headers.add(name: ":path", value: request.path, indexing: .nonIndexable)
        block.headers.add(name: ":authority", value: shared.authority)
        block.headers.add(name: "authorization", value: token.authorization)
        block.headers.add(name: "apns-push-type", value: notification.pushType)
        block.headers.add(name: "apns-topic", value: notification.topic)
        block.headers.add(name: "apns-priority", value: request.priorityString)
        if let expiration = notification.expiration {
            block.headers.add(name: "apns-expiration", value: String(expiration))
        }
        block.headers.add(name: "apns-id", value: request.apnsIDString, indexing: .nonIndexable)
        block.headers.add(name: "content-type", value: "application/json")

        streams.append(request, streamID: streamID)
        context.write(wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .headers(block))), promise: nil)
        if hasBody {
            context.write(
                wrapOutboundOut(
                    HTTP2Frame(streamID: streamID, payload: .data(.init(data: .byteBuffer(notification.payload), endStream: true)))
                ),
                promise: nil
            )
        }
        if nextStreamID > shared.configuration.maximumStreamID {
            retire(reason: "stream ids used up")
        }
    }

    /// Writes queued requests while streams are free.
    private func sendPending() {
        var sent = false
        while !isRetiring, !isClosed, streams.count < maxConcurrentStreams, let request = pending.popFirst() {
            if request.isFinished {
                continue
            }
            send(request)
            sent = true
        }
        if sent {
            markNeedsFlush()
        }
    }

    private func streamFinished() {
        if isRetiring {
            if streams.isEmpty {
                close(reason: closeReason ?? "retired")
            }
        } else {
            sendPending()
        }
    }

    private func write(_ frame: HTTP2Frame) {
        context?.write(wrapOutboundOut(frame), promise: nil)
    }

    /// Flushes at the end of the current read, or once after the requests submitted in this event loop tick.
    private func markNeedsFlush() {
        if inRead {
            needsFlush = true
            return
        }
        guard !flushScheduled, let context else { return }
        flushScheduled = true
        context.eventLoop.assumeIsolated().execute {
            self.flushScheduled = false
            self.context?.flush()
        }
    }

    // MARK: Receiving

    private func receiveHeaders(streamID: HTTP2StreamID, _ payload: HTTP2Frame.FramePayload.Headers) {
        guard let request = streams[streamID] else { return }
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
        guard let request = streams[streamID] else { return }
        if case .byteBuffer(var buffer) = payload.data, buffer.readableBytes > 0 {
            if request.body == nil {
                request.body = buffer
            } else if request.body!.readableBytes < Self.maximumBodyBytes {
                request.body!.writeBuffer(&buffer)
            }
        }
        if payload.endStream {
            complete(streamID, request)
        }
    }

    private func complete(_ streamID: HTTP2StreamID, _ request: PendingRequest) {
        streams.removeValue(forKey: streamID)
        guard let status = request.status else {
            request.finish(.failure(APNsTransportError("APNs ended the stream without a response status.")))
            streamFinished()
            return
        }
        var response = APNsResponse(
            status: status,
            apnsID: request.echoedAPNsID,
            apnsUniqueID: request.apnsUniqueID,
            retryAfter: request.retryAfter
        )
        if status != 200, let body = request.body {
            let parsed = ErrorBody(body)
            response.reason = parsed.reason.map(APNsErrorReason.init(rawValue:))
            response.tokenInvalidSince = parsed.timestampMilliseconds.map { Date(timeIntervalSince1970: $0 / 1000) }
        }
        let usedToken = request.tokenUsed
        request.finish(.success(response))

        if status == 403, let reason = response.reason {
            switch reason {
            case .expiredProviderToken, .invalidProviderToken:
                if let usedToken {
                    shared.tokens.refresh(replacing: usedToken)
                    logger.notice("APNs refused the provider token; a new one will be used", metadata: ["reason": "\(reason)"])
                }
            case .unrelatedKeyIdInToken:
                retire(reason: "APNs answered UnrelatedKeyIdInToken")
            default:
                break
            }
        }
        streamFinished()
    }

    private func failStream(_ streamID: HTTP2StreamID, _ request: PendingRequest, _ description: String) {
        streams.removeValue(forKey: streamID)
        write(HTTP2Frame(streamID: streamID, payload: .rstStream(.protocolError)))
        markNeedsFlush()
        request.finish(.failure(APNsTransportError(description)))
        streamFinished()
    }

    private func receiveReset(streamID: HTTP2StreamID, code: HTTP2ErrorCode) {
        guard let request = streams.removeValue(forKey: streamID) else { return }
        if code == .refusedStream {
            // REFUSED_STREAM guarantees the request was not processed.
            slot.move(request)
        } else {
            request.finish(.failure(APNsTransportError("APNs reset the stream (\(code)) before answering.")))
        }
        streamFinished()
    }

    private func receiveSettings(_ settings: HTTP2Settings) {
        for setting in settings where setting.parameter == .maxConcurrentStreams {
            maxConcurrentStreams = setting.value
            logger.trace("APNs allows \(setting.value) concurrent streams")
        }
        if !isReady {
            isReady = true
            slot.connectionReady(self)
        }
        sendPending()
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
        if closeReason == nil {
            closeReason = "GOAWAY \(errorCode)" + (reason.map { " \($0)" } ?? "")
        }
        guard isReady else {
            // Refused during setup: the requests waiting for this connection fail with the reason.
            close(reason: closeReason!)
            return
        }
        // Streams above lastStreamID were not processed: they may be sent again on a new connection.
        let unprocessed = streams.streamIDs { streamID, _ in streamID > lastStreamID }
        var requests: [PendingRequest] = []
        for streamID in unprocessed {
            if let request = streams.removeValue(forKey: streamID) {
                requests.append(request)
            }
        }
        retire(reason: closeReason!, moving: requests)
    }

    // MARK: Retiring and closing

    /// Takes no new requests; moves the unsent ones (and `moving`) to a new connection; closes once idle.
    private func retire(reason: String, moving requests: [PendingRequest] = []) {
        var requests = requests
        if !isRetiring {
            isRetiring = true
            logger.debug("Retiring APNs connection", metadata: ["reason": "\(reason)"])
            if closeReason == nil {
                closeReason = reason
            }
        }
        while let request = pending.popFirst() {
            if !request.isFinished {
                requests.append(request)
            }
        }
        slot.connectionRetired(self, requests: requests)
        if streams.isEmpty {
            close(reason: reason)
        }
    }

    /// Closes the channel; in-flight requests fail with ``APNsTransportError`` saying `reason`.
    func close(reason: String) {
        guard !isClosed else { return }
        if closeReason == nil {
            closeReason = reason
        }
        if let context {
            context.close(promise: nil)
        } else {
            channelFuture?.whenSuccess { $0.close(promise: nil) }
        }
    }

    /// Closes for client shutdown; the future completes when the channel is closed.
    func shutdown() -> EventLoopFuture<Void> {
        closeReason = "the client was shut down"
        if let context {
            let channel = context.channel
            if !isClosed {
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
        guard let streamID = request.streamID, let found = streams[streamID], found === request else {
            return false
        }
        streams.removeValue(forKey: streamID)
        write(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel)))
        markNeedsFlush()
        streamFinished()
        return true
    }

    // MARK: Deadlines and keepalive

    /// Fails requests past their deadline, closes a connection that never got ready or stopped answering PINGs,
    /// and PINGs one that has been quiet.
    func sweep(now: NIODeadline) {
        guard !isClosed, context != nil else { return }
        if needsFlush && !inRead {
            needsFlush = false
            context?.flush()
        }
        if !isReady {
            if now - createdAt >= shared.connectTimeout {
                close(reason: "no HTTP/2 settings from the server within \(shared.configuration.connectTimeout)")
            }
            return
        }

        let timeout = APNsTransportError(
            "APNs did not answer within \(shared.configuration.requestTimeout); the stream was reset."
        )
        let expired = streams.streamIDs { _, request in request.deadline <= now }
        for streamID in expired {
            if let request = streams.removeValue(forKey: streamID) {
                write(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel)))
                request.finish(.failure(timeout))
            }
        }
        pending.failExpired(now: now) {
            APNsTransportError(
                "Timed out after \(shared.configuration.requestTimeout) waiting for a free HTTP/2 stream (the server allows \(maxConcurrentStreams))."
            )
        }
        if !expired.isEmpty {
            markNeedsFlush()
            streamFinished()
            if isClosed { return }
        }

        if sawFrame {
            sawFrame = false
            lastFrameAt = now
        }
        if let pingSentAt {
            if now - pingSentAt >= shared.pingTimeout {
                close(reason: "no PING acknowledgement within \(shared.configuration.pingTimeout)")
            }
        } else if now - lastFrameAt >= shared.idlePingInterval {
            pingSentAt = now
            write(HTTP2Frame(streamID: .rootStream, payload: .ping(HTTP2PingData(withInteger: UInt64(now.uptimeNanoseconds)), ack: false)))
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

/// The requests on the wire of one connection, by stream id.
///
/// A client's stream ids are consecutive odd numbers, so a ring buffer indexed by `(id - first) / 2` finds a stream
/// without hashing; answered slots are cleared and trimmed from the front. (Its length spans the oldest unanswered
/// stream to the newest, which request timeouts bound.)
struct StreamTable {
    private var slots = CircularBuffer<PendingRequest?>(initialCapacity: 64)
    /// The stream id of the first slot.
    private var firstID: Int = 1
    /// How many slots hold a request.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// Adds the request for the next stream id; ids must be added in increasing order.
    mutating func append(_ request: PendingRequest, streamID: HTTP2StreamID) {
        let id = Int(streamID)
        if slots.isEmpty {
            firstID = id
        }
        assert(id == firstID + 2 * slots.count, "stream ids are added in order")
        slots.append(request)
        count += 1
    }

    private func index(of streamID: HTTP2StreamID) -> CircularBuffer<PendingRequest?>.Index? {
        let offset = Int(streamID) - firstID
        guard offset >= 0, offset & 1 == 0, offset / 2 < slots.count else { return nil }
        return slots.index(slots.startIndex, offsetBy: offset / 2)
    }

    subscript(streamID: HTTP2StreamID) -> PendingRequest? {
        guard let index = index(of: streamID) else { return nil }
        return slots[index]
    }

    @discardableResult
    mutating func removeValue(forKey streamID: HTTP2StreamID) -> PendingRequest? {
        guard let index = index(of: streamID), let request = slots[index] else { return nil }
        slots[index] = nil
        count -= 1
        while let first = slots.first, first == nil {
            slots.removeFirst()
            firstID += 2
        }
        return request
    }

    /// The ids of the streams whose request matches, in increasing order.
    func streamIDs(where matches: (HTTP2StreamID, PendingRequest) -> Bool) -> [HTTP2StreamID] {
        var result: [HTTP2StreamID] = []
        var id = firstID
        for slot in slots {
            if let request = slot, matches(HTTP2StreamID(id), request) {
                result.append(HTTP2StreamID(id))
            }
            id += 2
        }
        return result
    }

    /// Empties the table, returning the requests in stream order.
    mutating func removeAll() -> [PendingRequest] {
        let requests = slots.compactMap { $0 }
        slots.removeAll(keepingCapacity: true)
        count = 0
        return requests
    }
}
