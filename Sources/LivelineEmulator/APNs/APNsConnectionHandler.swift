import Logging
import NIOCore
import NIOHTTP2

/// Serves APNs requests on one HTTP/2 connection, at the frame level: it gathers each stream's
/// HEADERS and DATA, asks ``APNsEmulatorCore`` for the answer and writes it back. Working on frames
/// (rather than a channel per stream) keeps the cost per push low enough for a benchmark sink, and
/// lets the handler own what APNs keeps per connection: the provider token in use, the request
/// count for `GOAWAY`, and flow-control credit.
final class APNsConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    private struct PendingStream {
        var headers: [ReceivedPush.Header]
        var body: [UInt8] = []
        var bodyLength = 0
    }

    private enum GoAway {
        case none
        /// Streams above `lastStreamID` are not served; the frame goes out once the rest are answered.
        case planned(lastStreamID: HTTP2StreamID, reason: String)
        case sent
    }

    /// Which of the emulator's HTTP/2 listeners the connection came to.
    enum Listener: Sendable {
        /// Apple's push endpoint: `/3/device/<token>` and `/4/broadcasts/apps/<bundle id>`.
        case push
        /// Apple's channel management endpoint: `/1/apps/<bundle id>/channels` and `/all-channels`.
        case channelManagement
    }

    private let core: APNsEmulatorCore
    private let listener: Listener
    private let logger: Logger
    private var context: ChannelHandlerContext?
    private var streams: [HTTP2StreamID: PendingStream] = [:]
    private var tokenState = ConnectionTokenState()
    private var requestCount = 0
    private var unanswered = 0
    private var highestStreamID = HTTP2StreamID.rootStream
    private var highestServedStreamID = HTTP2StreamID.rootStream
    private var goAway = GoAway.none
    private var unacknowledgedConnectionBytes = 0
    private var needsFlush = false
    private var inRead = false
    /// Whether the connection's stream limit was raised after its first valid provider token (push listener).
    private var streamsRaised = false

    /// The push listener's first SETTINGS: one stream at a time. Apple ("Establishing a connection to APNs"): "if
    /// you're using an authentication token, APNs allows only one stream until you post a request with a valid
    /// authentication token." The channel management listener starts at ``openedStreamLimit``.
    static let streamLimitBeforeToken = 1
    /// The stream limit once a request carried a valid provider token.
    static let openedStreamLimit = 1000

    init(core: APNsEmulatorCore, listener: Listener = .push, logger: Logger) {
        self.core = core
        self.listener = listener
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        inRead = true
        let frame = unwrapInboundIn(data)
        let streamID = frame.streamID
        switch frame.payload {
        case .headers(let headers):
            if let pending = streams[streamID] {
                // Trailers: APNs requests carry none, so they end the request and are otherwise unused.
                if headers.endStream {
                    streams[streamID] = nil
                    serve(streamID: streamID, pending)
                }
                return
            }
            if case .planned(let lastStreamID, _) = goAway, streamID > lastStreamID { return }
            if case .sent = goAway { return }
            if streamID > highestStreamID { highestStreamID = streamID }
            var fields: [ReceivedPush.Header] = []
            fields.reserveCapacity(headers.headers.count)
            for (name, value, _) in headers.headers { fields.append(ReceivedPush.Header(name: name, value: value)) }
            let pending = PendingStream(headers: fields)
            if headers.endStream {
                serve(streamID: streamID, pending)
            } else {
                streams[streamID] = pending
            }
        case .data(let payload):
            let length: Int
            switch payload.data {
            case .byteBuffer(let buffer):
                length = buffer.readableBytes
                if streams[streamID] != nil {
                    streams[streamID]!.bodyLength += length
                    let room = APNsEmulatorCore.keptBodyBytes - streams[streamID]!.body.count
                    if room > 0 { streams[streamID]!.body.append(contentsOf: buffer.readableBytesView.prefix(room)) }
                }
            case .fileRegion(let region):
                length = region.readableBytes
            }
            let flowControlled = length + (payload.paddingBytes.map { $0 + 1 } ?? 0)
            unacknowledgedConnectionBytes += flowControlled
            if payload.endStream {
                if let pending = streams.removeValue(forKey: streamID) { serve(streamID: streamID, pending) }
            } else if flowControlled > 0, streams[streamID] != nil {
                context.write(
                    wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .windowUpdate(windowSizeIncrement: flowControlled))),
                    promise: nil
                )
                needsFlush = true
            }
        case .rstStream:
            streams[streamID] = nil
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        inRead = false
        if unacknowledgedConnectionBytes > 0 {
            context.write(
                wrapOutboundOut(
                    HTTP2Frame(streamID: .rootStream, payload: .windowUpdate(windowSizeIncrement: unacknowledgedConnectionBytes))
                ),
                promise: nil
            )
            unacknowledgedConnectionBytes = 0
            needsFlush = true
        }
        flushIfNeeded()
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // NIOHTTP2Handler resets failed streams and closes failed connections itself.
        logger.debug("APNs emulator connection error", metadata: ["error": "\(error)"])
    }

    /// Starts a graceful close: `GOAWAY` with `{"reason":"Shutdown"}` once in-flight requests are answered.
    func shutDownGracefully() {
        guard case .none = goAway else { return }
        goAway = .planned(lastStreamID: highestStreamID, reason: "Shutdown")
        sendGoAwayIfReady()
    }

    private func serve(streamID: HTTP2StreamID, _ pending: PendingStream) {
        requestCount += 1
        let request = APNsRequest(headers: pending.headers, body: pending.body, bodyLength: pending.bodyLength)
        let outcome =
            switch listener {
            case .push: core.handle(request, connection: &tokenState)
            case .channelManagement: core.handleChannelManagement(request, connection: &tokenState)
            }
        if case .push = listener, !streamsRaised, tokenState.token != nil, let context {
            // The first valid provider token opens the connection to many concurrent streams.
            streamsRaised = true
            let settings: HTTP2Settings = [HTTP2Setting(parameter: .maxConcurrentStreams, value: Self.openedStreamLimit)]
            context.write(wrapOutboundOut(HTTP2Frame(streamID: .rootStream, payload: .settings(.settings(settings)))), promise: nil)
            needsFlush = true
        }
        if streamID > highestServedStreamID { highestServedStreamID = streamID }
        if case .none = goAway, let limit = outcome.goAwayAfterRequests, requestCount >= limit {
            // Requests complete out of stream order, so the GOAWAY names the highest stream served;
            // streams above it are dropped unserved, which the frame tells the client.
            goAway = .planned(lastStreamID: highestServedStreamID, reason: "Shutdown")
            streams = streams.filter { $0.key <= highestServedStreamID }
        }
        unanswered += 1
        if outcome.delayMilliseconds > 0, let context {
            context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(Int64(outcome.delayMilliseconds))) {
                self.answer(streamID: streamID, outcome.answer)
                self.flushIfNeeded()
            }
        } else {
            answer(streamID: streamID, outcome.answer)
            if !inRead { flushIfNeeded() }
        }
    }

    private func answer(streamID: HTTP2StreamID, _ answer: APNsOutcome.Answer) {
        unanswered -= 1
        guard let context else { return }
        switch answer {
        case .drop:
            context.close(promise: nil)
            return
        case .respond(let status, let headers, let body, let retryAfter):
            var head = HTTP2Frame.FramePayload.Headers(headers: [":status": String(status)], endStream: body == nil)
            for header in headers { head.headers.add(name: header.name, value: header.value) }
            if let retryAfter { head.headers.add(name: "retry-after", value: String(retryAfter)) }
            if let body {
                head.headers.add(name: "content-type", value: "application/json; charset=utf-8")
                head.headers.add(name: "content-length", value: String(body.count))
            }
            context.write(wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .headers(head))), promise: nil)
            if let body {
                var buffer = context.channel.allocator.buffer(capacity: body.count)
                buffer.writeBytes(body)
                context.write(
                    wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .data(.init(data: .byteBuffer(buffer), endStream: true)))),
                    promise: nil
                )
            }
            needsFlush = true
        }
        sendGoAwayIfReady()
    }

    /// Sends a planned `GOAWAY` once every stream it promises to serve was answered, then closes.
    private func sendGoAwayIfReady() {
        guard case .planned(let lastStreamID, let reason) = goAway, unanswered == 0, let context else { return }
        guard !streams.keys.contains(where: { $0 <= lastStreamID }) else { return }
        goAway = .sent
        var debugData = context.channel.allocator.buffer(capacity: 32)
        debugData.writeString("{\"reason\":\"\(reason)\"}")
        let frame = HTTP2Frame(
            streamID: .rootStream, payload: .goAway(lastStreamID: lastStreamID, errorCode: .noError, opaqueData: debugData)
        )
        needsFlush = false
        context.writeAndFlush(wrapOutboundOut(frame)).assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    private func flushIfNeeded() {
        guard needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }
}
