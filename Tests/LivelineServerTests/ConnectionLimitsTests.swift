import Foundation
import Hummingbird
import LivelineServer
import LivelineStore
import LivelineTestSupport
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ServiceLifecycle
import Testing

/// The connection deadlines and cap over real sockets on 127.0.0.1, with deadlines of a second and wide margins: a
/// connection is expected closed not before most of its deadline, and before a trickle that outlasts the deadline
/// several times over has ended. The test suite runs many servers at once on two cores, so nothing here assumes a
/// timer fires on time.
@Suite("Connection limits over real sockets", .tags(.slow), .unlessSkippingSlowTests, .serialized)
struct ConnectionLimitsTests {
    static let short = TimeAmount.seconds(1)
    static let long = TimeAmount.seconds(60)

    @Test("a header block trickled a byte every 100 ms is cut off at the header deadline, without an answer")
    func slowHeaders() async throws {
        try await withServer(ConnectionLimits(headerTimeout: Self.short, bodyTimeout: Self.long, idleTimeout: Self.long)) { port, _ in
            let connection = try await RawConnection.open(port: port)
            let opened = ContinuousClock.now
            try await connection.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            let trickled = try await connection.trickle("X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", every: .milliseconds(100))
            let elapsed = ContinuousClock.now - opened
            #expect(!trickled, "the connection was still open after the whole trickle")
            #expect(elapsed >= .milliseconds(800))
            #expect(elapsed < .seconds(20))
            #expect(connection.received.isEmpty)
        }
    }

    @Test("a body trickled a byte every 100 ms is answered 408 request_timeout at the body deadline, then closed")
    func slowBody() async throws {
        try await withServer(ConnectionLimits(headerTimeout: Self.long, bodyTimeout: Self.short, idleTimeout: Self.long)) { port, app in
            let connection = try await RawConnection.open(port: port)
            // Before the header block is sent: the body deadline runs from its arrival, never earlier.
            let started = ContinuousClock.now
            try await connection.send(
                "POST /v1/activities/o1/updates HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(app.secretKey)\r\n"
                    + "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"contentState\": {\"eta\": \""
            )
            let trickled = try await connection.trickle(String(repeating: "x", count: 60), every: .milliseconds(100))
            let elapsed = ContinuousClock.now - started
            #expect(!trickled, "the connection was still open after the whole trickle")
            #expect(elapsed >= .milliseconds(800))
            #expect(elapsed < .seconds(20))
            let answer = connection.received
            #expect(answer.hasPrefix("HTTP/1.1 408"), "\(answer)")
            #expect(answer.contains(#""code":"request_timeout""#), "\(answer)")
            #expect(answer.contains(#""field":null"#), "\(answer)")
        }
    }

    @Test(
        "bytes that are not HTTP/1.1 are answered with the API's JSON error and the connection closed",
        arguments: [
            ("FOO /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", "400", "malformed_request"),
            ("GET /" + String(repeating: "a", count: 100_000) + " HTTP/1.1\r\nHost: localhost\r\n\r\n", "431", "header_fields_too_large"),
            ("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\nNOT HTTP\r\n\r\n", "400", nil),
        ] as [(String, String, String?)]
    )
    func notHTTP(request: String, status: String, code: String?) async throws {
        try await withServer(ConnectionLimits(headerTimeout: Self.long, bodyTimeout: Self.long, idleTimeout: Self.long)) { port, _ in
            let connection = try await RawConnection.open(port: port)
            try await connection.send(request)
            #expect(try await connection.closed(within: .seconds(10)) != nil, "the connection is closed")
            let answer = connection.received
            if let code {
                #expect(answer.hasPrefix("HTTP/1.1 \(status)"), "\(answer)")
                #expect(answer.contains(#""code":"\#(code)""#), "\(answer)")
                #expect(answer.contains("Content-Type: application/json"), "\(answer)")
            } else {
                // Garbage behind a request that is being answered: that answer first, whole, then the API's JSON refusal.
                #expect(answer.hasPrefix("HTTP/1.1 200 OK"), "\(answer)")
                #expect(answer.contains(#"{"status":"ok"}HTTP/1.1 \#(status)"#), "\(answer)")
                #expect(answer.contains(#""code":"malformed_request""#), "\(answer)")
                #expect(answer.components(separatedBy: "Content-Type: application/json").count == 3, "both answers are JSON: \(answer)")
            }
        }
    }

    @Test("a body that breaks off as something that is not HTTP/1.1 is answered 400 malformed_request, not 500, and the connection closed")
    func brokenChunkedBody() async throws {
        try await withServer(ConnectionLimits(headerTimeout: Self.long, bodyTimeout: Self.long, idleTimeout: Self.long)) { port, app in
            let connection = try await RawConnection.open(port: port)
            try await connection.send(
                "POST /v1/activities/o1/updates HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(app.secretKey)\r\n"
                    + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
            )
            #expect(try await connection.closed(within: .seconds(10)) != nil, "the connection is closed")
            let answer = connection.received
            #expect(answer.hasPrefix("HTTP/1.1 400"), "\(answer)")
            #expect(answer.contains(#""code":"malformed_request""#), "\(answer)")
            #expect(answer.contains("Connection: close"), "\(answer)")
        }
    }

    @Test("an idle keep-alive connection is closed after the idle timeout, and one that never sends anything too")
    func idle() async throws {
        // Eight seconds rather than one: the request must reach the server before the connection's first idle
        // deadline, and a test process running many servers on two cores can stall for seconds.
        try await withServer(ConnectionLimits(headerTimeout: Self.long, bodyTimeout: Self.long, idleTimeout: .seconds(8))) { port, _ in
            let silent = try await RawConnection.open(port: port)
            let used = try await RawConnection.open(port: port)
            // The idle deadline runs from the end of the answer, which is after the request was sent: measured from
            // the sending, the connection lives at least the deadline, however late this task sees the answer.
            let sent = ContinuousClock.now
            try await used.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try await used.waitForAnswers(1)
            let closedAfter = try await used.closed(within: .seconds(20))
            #expect(closedAfter != nil)
            #expect((ContinuousClock.now - sent) >= .milliseconds(7900))
            #expect(try await silent.closed(within: .seconds(20)) != nil)
            #expect(silent.received.isEmpty)
        }
    }

    @Test("a keep-alive client's requests, pipelined ones and a body sent in pieces within the limits are all answered")
    func wellBehaved() async throws {
        // Deadlines far beyond what the client's pauses add up to, even when a busy machine stretches them.
        let limits = ConnectionLimits(headerTimeout: .seconds(15), bodyTimeout: .seconds(15), idleTimeout: .seconds(15))
        try await withServer(limits) { port, app in
            let connection = try await RawConnection.open(port: port)
            for round in 1...4 {
                try await connection.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                try await connection.waitForAnswers(round)
                try await Task.sleep(for: .milliseconds(300))
            }
            // Two requests in one write.
            try await connection.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\nGET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try await connection.waitForAnswers(6)
            // A body in five pieces over a second, within the body deadline.
            let body = #"{"contentState": {"eta": 5}}"#
            try await connection.send(
                "POST /v1/activities/o1/updates HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(app.secretKey)\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n"
            )
            let pieces = stride(from: 0, to: body.count, by: 6).map { String(body.dropFirst($0).prefix(6)) }
            for piece in pieces {
                try await Task.sleep(for: .milliseconds(200))
                try await connection.send(piece)
            }
            try await connection.waitForAnswers(7)
            let answers = connection.received.components(separatedBy: "HTTP/1.1 ").dropFirst()
            #expect(answers.count == 7)
            #expect(answers.prefix(6).allSatisfy { $0.hasPrefix("200") }, "\(answers)")
            #expect(!(answers.last ?? "").hasPrefix("408"), "\(answers.last ?? "")")
            #expect(connection.isOpen)
        }
    }

    @Test("beyond the cap a new connection is not served; the open ones are, and the waiting one is once a slot frees")
    func cap() async throws {
        let limits = ConnectionLimits(headerTimeout: .seconds(30), bodyTimeout: .seconds(30), idleTimeout: .seconds(30), maximumConnections: 2)
        try await withServer(limits) { port, _ in
            let first = try await RawConnection.open(port: port)
            try await first.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try await first.waitForAnswers(1)
            let second = try await RawConnection.open(port: port)
            try await second.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try await second.waitForAnswers(1)

            let third = try await RawConnection.open(port: port)
            try await third.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try await Task.sleep(for: .seconds(1))
            #expect(third.received.isEmpty, "a third connection was served with a cap of two")

            try await first.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try await first.waitForAnswers(2)

            await second.close()
            try await third.waitForAnswers(1)
            #expect(third.received.hasPrefix("HTTP/1.1 200"))
        }
    }

    @Test("/healthz answers while a hundred connections trickle half a header block, and they are all cut off")
    func healthUnderSlowloris() async throws {
        let limits = ConnectionLimits(headerTimeout: .seconds(1), bodyTimeout: .seconds(1), idleTimeout: .seconds(1))
        try await withServer(limits) { port, _ in
            var slow: [RawConnection] = []
            for _ in 0..<100 {
                let connection = try await RawConnection.open(port: port)
                do {
                    try await connection.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                } catch {
                    // On a loaded machine the 1 s header deadline can pass between the open and the send: the server
                    // has already cut this one off, which is what the test checks for all of them.
                }
                slow.append(connection)
            }
            // The probe too may be cut off between its open and its send on a loaded machine (by the same 1 s deadline):
            // one cut off unanswered is opened again; the first answer is the check.
            var answer: String?
            for _ in 0..<5 where answer == nil {
                let probe = try await RawConnection.open(port: port)
                do {
                    try await probe.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    try await probe.waitForAnswers(1)
                    answer = probe.received
                } catch where probe.received.isEmpty && !probe.isOpen {
                    continue
                }
            }
            #expect(answer?.hasPrefix("HTTP/1.1 200") == true, "\(answer ?? "no probe of 5 answered")")
            let deadline = ContinuousClock.now + .seconds(20)
            var stillOpen = 0
            for connection in slow where try await connection.closed(within: max(.zero, deadline - .now)) == nil {
                stillOpen += 1
            }
            #expect(stillOpen == 0, "\(stillOpen) of 100 half-header connections still open 20 s after the last was opened")
        }
    }
}

/// What a test server gives a test: its app's secret key.
struct ServedApp: Sendable {
    var secretKey: String
}

/// Runs a real Liveline server on an ephemeral port of 127.0.0.1 with `limits`, for as long as `body` runs.
func withServer(_ limits: ConnectionLimits, _ body: @Sendable (Int, ServedApp) async throws -> Void) async throws {
    let directory = try TemporaryDirectory()
    let store = try await SQLStore.open(path: directory.databasePath)
    let created = try await createApp(store)
    var configuration = LivelineConfiguration(port: 0)
    configuration.dataDirectory = directory.url.path
    configuration.connections = limits
    var logger = Logger(label: "connection-limits-test")
    logger.logLevel = .warning
    let (ports, portContinuation) = AsyncStream<Int>.makeStream()
    let app = LivelineApplication.makeApplication(
        configuration: configuration, store: store, logger: logger,
        onServerRunning: { channel in portContinuation.yield(channel.localAddress?.port ?? 0) }
    )
    let group = ServiceGroup(services: [app], gracefulShutdownSignals: [], logger: logger)
    do {
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            var iterator = ports.makeAsyncIterator()
            guard let port = await iterator.next() else { throw RawConnectionError.noServer }
            do {
                try await body(port, ServedApp(secretKey: created.secretKey))
            } catch {
                await group.triggerGracefulShutdown()
                throw error
            }
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
        try await store.close()
    } catch {
        try? await store.close()
        throw error
    }
}

enum RawConnectionError: Error {
    case noServer
    case notAnswered(expected: Int, received: String)
}

/// A plain TCP connection that sends exactly the bytes a test gives it and keeps everything the server sends back.
final class RawConnection: Sendable {
    private let channel: any Channel
    private let bytes: NIOLockedValueBox<[UInt8]>

    private init(channel: any Channel, bytes: NIOLockedValueBox<[UInt8]>) {
        self.channel = channel
        self.bytes = bytes
    }

    static func open(port: Int) async throws -> RawConnection {
        let bytes = NIOLockedValueBox<[UInt8]>([])
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Recorder(bytes: bytes)) }
            }
            .connect(host: "127.0.0.1", port: port)
            .get()
        return RawConnection(channel: channel, bytes: bytes)
    }

    /// Everything the server sent so far, as text.
    var received: String { String(decoding: bytes.withLockedValue { $0 }, as: UTF8.self) }

    /// Whether the connection is still open.
    var isOpen: Bool { channel.isActive }

    func send(_ text: String) async throws {
        try await channel.writeAndFlush(ByteBuffer(string: text))
    }

    /// Sends `text` one byte at a time, `every` apart, while the connection stays open; whether it was all sent.
    func trickle(_ text: String, every interval: Duration) async throws -> Bool {
        for byte in text.utf8 {
            guard channel.isActive else { return false }
            do {
                try await channel.writeAndFlush(ByteBuffer(bytes: [byte]))
            } catch {
                return false
            }
            try await Task.sleep(for: interval)
        }
        return channel.isActive
    }

    /// Waits (up to 20 s) until `count` answers have begun arriving.
    func waitForAnswers(_ count: Int) async throws {
        let start = ContinuousClock.now
        func answered() -> Bool { received.components(separatedBy: "HTTP/1.1 ").count - 1 >= count && received.hasSuffix("}") }
        while !answered() {
            // Closed by the server: nothing more will come (what came before the close is read once more).
            let closed = !channel.isActive
            guard ContinuousClock.now - start < .seconds(20), !closed else {
                if closed, answered() { return }
                throw RawConnectionError.notAnswered(expected: count, received: received)
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// How long the server took to close the connection, or nil if it did not within `timeout`.
    func closed(within timeout: Duration) async throws -> Duration? {
        let start = ContinuousClock.now
        while channel.isActive {
            guard ContinuousClock.now - start < timeout else { return nil }
            try await Task.sleep(for: .milliseconds(20))
        }
        return ContinuousClock.now - start
    }

    func close() async {
        try? await channel.close()
    }

    deinit {
        channel.close(promise: nil)
    }
}

/// Keeps what the server sends.
private final class Recorder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let bytes: NIOLockedValueBox<[UInt8]>

    init(bytes: NIOLockedValueBox<[UInt8]>) { self.bytes = bytes }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        bytes.withLockedValue { $0.append(contentsOf: buffer.readableBytesView) }
    }
}
