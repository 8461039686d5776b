import NIOCore

/// Gathers the bytes written between two flushes into one buffer, so that TLS seals them as one write: between
/// `NIOHTTP2Handler` and `NIOSSLHandler`.
///
/// `NIOHTTP2Handler` writes each frame as its own buffer (a `DATA` frame as two: its 9-byte header and the payload), and
/// `NIOSSLHandler` hands each buffer to BoringSSL as its own `SSL_write`: one TLS record, with its header, its
/// authentication tag and a sealing of its own, for each. A push is a `HEADERS` frame and a `DATA` frame, so three
/// records a push, and the server opens three. Gathered, the pushes of one flush go out as one write, which BoringSSL
/// cuts into records of up to 16 KB.
///
/// A buffer of ``passThroughSize`` bytes or more is not copied: what is gathered before it goes first, then the buffer as
/// it is. Anything but a buffer (a file region) goes the same way. The promises of gathered writes complete with
/// the write they went out in; writes not yet flushed when the channel closes fail as NIO fails unflushed writes.
///
/// All state is confined to the channel's event loop.
final class WriteCoalescer: ChannelOutboundHandler {
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    /// Buffers of this size or more go through as they are (a copy would cost more than the write it saves).
    static let passThroughSize = 16_384

    /// The bytes written since the last flush, not yet passed on.
    private var gathered: ByteBuffer?
    /// The promises of the writes in ``gathered``, oldest first.
    private var promises: [EventLoopPromise<Void>] = []
    /// The size of the last gathered write: the next one's buffer starts with that much room (at most
    /// ``largestStartingCapacity``; it grows as needed).
    private var lastSize = 1_024
    /// The most room a gathered write starts with: one large flush does not make every later one allocate as much.
    static let largestStartingCapacity = 65_536

    init() {}

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .byteBuffer(var buffer) where buffer.readableBytes < Self.passThroughSize:
            // Copied into a buffer of our own, so the writer's buffer is free again at once (`NIOHTTP2Handler`
            // clears and reuses its frame buffer when nobody else holds it).
            if gathered == nil {
                gathered = context.channel.allocator.buffer(capacity: max(lastSize, buffer.readableBytes))
            }
            gathered!.writeBuffer(&buffer)
            if let promise { promises.append(promise) }
        case let other:
            passOnGathered(context: context)
            context.write(wrapOutboundOut(other), promise: promise)
        }
    }

    func flush(context: ChannelHandlerContext) {
        passOnGathered(context: context)
        context.flush()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode != .input {
            // What is gathered was never flushed: fail it as the channel fails its own unflushed writes on close.
            failGathered(ChannelError.ioOnClosedChannel)
        }
        context.close(mode: mode, promise: promise)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        // The channel closed (the handler is never taken out of an open one): what is gathered was never flushed.
        failGathered(ChannelError.ioOnClosedChannel)
    }

    /// Passes the gathered bytes on as one write, their promises completing with it.
    private func passOnGathered(context: ChannelHandlerContext) {
        guard let buffer = gathered else { return }
        gathered = nil
        lastSize = min(buffer.readableBytes, Self.largestStartingCapacity)
        let promise: EventLoopPromise<Void>?
        switch promises.count {
        case 0:
            promise = nil
        case 1:
            promise = promises[0]
        default:
            let all = context.eventLoop.makePromise(of: Void.self)
            for waiting in promises { all.futureResult.cascade(to: waiting) }
            promise = all
        }
        promises.removeAll(keepingCapacity: true)
        context.write(wrapOutboundOut(.byteBuffer(buffer)), promise: promise)
    }

    private func failGathered(_ error: any Error) {
        gathered = nil
        let failed = promises
        promises.removeAll()
        for promise in failed { promise.fail(error) }
    }
}
