import Foundation
import NIOCore
import NIOPosix

/// A sink as far away as APNs is from a server: the APNs client is pointed at a ``DelayingProxy`` in front of it, which
/// holds every byte for half of `roundTrip` on its way there and again on its way back (`bench api --sink-round-trip-ms`).
/// A loopback sink answers within microseconds, where APNs answers from tens of milliseconds away; whatever waits for
/// its answers (the delivery engine's workers do, one activity each) shows here what it does against the real one.
final class DistantSink: BenchSink {
    private let sink: any BenchSink
    private let proxy: DelayingProxy

    /// Starts a proxy in front of `sink` (whose ``BenchSink/baseURL`` names a port on 127.0.0.1).
    init(_ sink: any BenchSink, roundTrip: TimeAmount) async throws {
        guard let port = URL(string: sink.baseURL)?.port else {
            throw Failure(description: "the sink's URL \(sink.baseURL) names no port")
        }
        self.sink = sink
        proxy = try await DelayingProxy.start(
            forwardingTo: port, oneWay: .nanoseconds(roundTrip.nanoseconds / 2), group: MultiThreadedEventLoopGroup.singleton
        )
    }

    /// The proxy's: the sink's TLS passes through it unread, so the sink's certificate still names this host.
    var baseURL: String { "https://127.0.0.1:\(proxy.port)" }
    var caCertificatePEM: String { sink.caCertificatePEM }
    func received() async throws -> Int { try await sink.received() }
    func answers() async -> String { await sink.answers() }
    func sideArrivals() async throws -> SideArrivals? { try await sink.sideArrivals() }
    /// The sink's own (the proxy runs in the bench's process).
    func cpuSeconds() -> Double? { sink.cpuSeconds() }

    func shutdown() async throws {
        try? await proxy.close()
        try await sink.shutdown()
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }
}

/// A TCP proxy on 127.0.0.1 that forwards each connection to a port on 127.0.0.1 and holds every byte for `oneWay` in
/// each direction, in order. It reads nothing of what it carries.
final class DelayingProxy: Sendable {
    let port: Int
    private let listener: any Channel

    private init(port: Int, listener: any Channel) {
        self.port = port
        self.listener = listener
    }

    static func start(forwardingTo targetPort: Int, oneWay: TimeAmount, group: any EventLoopGroup) async throws -> DelayingProxy {
        let listener = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            // Nothing is read from a client until its connection to the target is made.
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { inbound in
                // Both ends on the client's event loop: each relay writes to the other end directly.
                ClientBootstrap(group: inbound.eventLoop)
                    .channelInitializer { outbound in
                        outbound.eventLoop.makeCompletedFuture {
                            try outbound.pipeline.syncOperations.addHandler(DelayedRelay(to: inbound, after: oneWay))
                        }
                    }
                    .connect(host: "127.0.0.1", port: targetPort)
                    .flatMapThrowing { outbound in
                        try inbound.pipeline.syncOperations.addHandler(DelayedRelay(to: outbound, after: oneWay))
                    }
                    .flatMap { inbound.setOption(.autoRead, value: true) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = listener.localAddress?.port else {
            try? await listener.close()
            throw DistantSink.Failure(description: "the delaying proxy has no port")
        }
        return DelayingProxy(port: port, listener: listener)
    }

    /// Stops taking connections (those open end with the sink's).
    func close() async throws {
        try await listener.close()
    }
}

/// Passes what one end of a proxied connection reads to the other end `delay` later, in the order read; the end of
/// the connection too.
private final class DelayedRelay: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private let partner: any Channel
    private let delay: TimeAmount
    /// What waits to be passed on, oldest first, with when it is due; nil bytes: the connection's end.
    private var held = CircularBuffer<(due: NIODeadline, bytes: ByteBuffer?)>()

    init(to partner: any Channel, after delay: TimeAmount) {
        self.partner = partner
        self.delay = delay
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        hold(unwrapInboundIn(data), context: context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        hold(nil, context: context)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func hold(_ bytes: ByteBuffer?, context: ChannelHandlerContext) {
        held.append((due: .now() + delay, bytes: bytes))
        context.eventLoop.assumeIsolated().scheduleTask(in: delay) { self.passOnWhatIsDue() }
    }

    private func passOnWhatIsDue() {
        let now = NIODeadline.now()
        while let first = held.first, first.due <= now {
            held.removeFirst()
            guard let bytes = first.bytes else {
                partner.close(promise: nil)
                return
            }
            partner.write(bytes, promise: nil)
        }
        partner.flush()
    }
}
