import NIOCore
import NIOPosix
import Synchronization

/// A TCP relay on 127.0.0.1 in front of a server, which a test can cut (the phone goes offline: open connections are
/// closed and new ones are closed as soon as they arrive) and restore.
final class TCPRelay: Sendable {
    private struct State {
        var online = true
        var connections: [any Channel] = []
    }

    private let state = Mutex(State())
    private let listener: any Channel
    /// The port the relay listens on.
    let port: Int

    private init(listener: any Channel, port: Int) {
        self.listener = listener
        self.port = port
    }

    /// Starts relaying 127.0.0.1:`targetPort`.
    static func start(targetPort: Int) async throws -> TCPRelay {
        let box = Mutex<TCPRelay?>(nil)
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                guard let relay = box.withLock({ $0 }), relay.admit(inbound) else { return inbound.close() }
                return ClientBootstrap(group: inbound.eventLoop).connect(host: "127.0.0.1", port: targetPort).flatMapThrowing { outbound in
                    relay.track(outbound)
                    try outbound.pipeline.syncOperations.addHandler(Forwarder(peer: inbound))
                    try inbound.pipeline.syncOperations.addHandler(Forwarder(peer: outbound))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let relay = TCPRelay(listener: listener, port: listener.localAddress?.port ?? 0)
        box.withLock { $0 = relay }
        return relay
    }

    /// Whether a new connection is relayed (it is tracked, to be closed by ``cut()``).
    private func admit(_ channel: any Channel) -> Bool {
        state.withLock { state in
            guard state.online else { return false }
            state.connections.append(channel)
            return true
        }
    }

    private func track(_ channel: any Channel) {
        let online = state.withLock { state in
            if state.online { state.connections.append(channel) }
            return state.online
        }
        if !online { channel.close(promise: nil) }
    }

    /// Offline: every open connection is closed, new ones are refused.
    func cut() {
        let open = state.withLock { state in
            state.online = false
            defer { state.connections = [] }
            return state.connections
        }
        for channel in open { channel.close(promise: nil) }
    }

    /// Online again.
    func restore() {
        state.withLock { $0.online = true }
    }

    func close() async {
        cut()
        try? await listener.close()
    }
}

/// Writes what one side of the relay reads to the other, and closes the other when this one closes.
private final class Forwarder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    let peer: any Channel

    init(peer: any Channel) { self.peer = peer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        peer.writeAndFlush(unwrapInboundIn(data), promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        peer.close(promise: nil)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
