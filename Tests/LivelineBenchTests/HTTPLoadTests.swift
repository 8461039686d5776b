import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import liveline

/// A tiny HTTP/1.1 server on loopback: 202 to `POST /ok`, 404 with a body to anything else.
private final class AnswerHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private var ok = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            ok = head.method == .POST && head.uri == "/ok" && head.headers["authorization"].first == "Bearer k"
        case .body:
            break
        case .end:
            let body = ok ? "" : #"{"error":"not_found"}"#
            var headers = HTTPHeaders()
            headers.add(name: "content-length", value: String(body.utf8.count))
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: ok ? .accepted : .notFound, headers: headers))), promise: nil)
            if !body.isEmpty { context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: body)))), promise: nil) }
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }
}

private func withServer(_ body: (Int) async throws -> Void) async throws {
    let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .childChannelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                try channel.pipeline.syncOperations.addHandler(AnswerHandler())
            }
        }
        .bind(host: "127.0.0.1", port: 0).get()
    do {
        try await body(channel.localAddress?.port ?? 0)
    } catch {
        try? await channel.close()
        throw error
    }
    try await channel.close()
}

@Suite struct HTTPLoadTests {
    @Test func closedLoopAnswersEveryRequestAndCountsStatuses() async throws {
        try await withServer { port in
            let load = try await HTTPLoad.connect(
                host: "127.0.0.1", port: port, connections: 4, eventLoop: MultiThreadedEventLoopGroup.singleton.next()
            )
            let result = try await load.run(count: 500) { index in
                LoadRequest(method: .POST, uri: index % 100 == 0 ? "/missing" : "/ok", authorization: "Bearer k", body: #"{"n":\#(index)}"#)
            }
            #expect(result.latencies.count == 500)
            #expect(result.latencies == result.latencies.sorted())
            #expect(result.statuses == [202: 495, 404: 5])
            #expect(result.succeeded == 495)
            #expect(result.errors == 5)
            #expect(result.errorSamples[404] == #"{"error":"not_found"}"#)
            #expect(result.unanswered == 0)

            // The same connections serve a second run.
            let again = try await load.run(count: 10) { _ in LoadRequest(method: .POST, uri: "/ok", authorization: "Bearer k", body: nil) }
            #expect(again.statuses == [202: 10])
            await load.close()
        }
    }

    @Test func pacedRunSendsAtItsRateUntilStopped() async throws {
        try await withServer { port in
            let load = try await HTTPLoad.connect(
                host: "127.0.0.1", port: port, connections: 2, eventLoop: MultiThreadedEventLoopGroup.singleton.next()
            )
            let started = ContinuousClock.now
            let paced = load.startPaced(perSecond: 100) { _ in LoadRequest(method: .POST, uri: "/ok", authorization: "Bearer k", body: "{}") }
            // At least 300 ms, and until the first request is sent (a busy machine may take longer to send any).
            try await Task.sleep(for: .milliseconds(300))
            while try await paced.issued() == 0, ContinuousClock.now - started < .seconds(20) { try await Task.sleep(for: .milliseconds(20)) }
            let result = try await paced.stop()
            let elapsed = ContinuousClock.now - started
            // At most one request per 10 ms that passed (and the first, due at once); a busy machine may send fewer.
            let allowed = Int(elapsed / .milliseconds(10)) + 1
            #expect((1...allowed).contains(result.latencies.count), "\(result.latencies.count) in \(elapsed)")
            #expect(result.errors == 0)
            await load.close()
        }
    }

    @Test func zeroRequestsFinishAtOnce() async throws {
        try await withServer { port in
            let load = try await HTTPLoad.connect(
                host: "127.0.0.1", port: port, connections: 1, eventLoop: MultiThreadedEventLoopGroup.singleton.next()
            )
            let result = try await load.run(count: 0) { _ in LoadRequest(method: .POST, uri: "/ok", authorization: "Bearer k", body: nil) }
            #expect(result.latencies.isEmpty)
            await load.close()
        }
    }
}
