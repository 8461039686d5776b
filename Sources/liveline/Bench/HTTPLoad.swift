import NIOCore
import NIOHTTP1
import NIOPosix

/// One request of a load run. The bodies are small JSON texts built from the request's index.
struct LoadRequest: Sendable {
    var method: HTTPMethod
    var uri: String
    var authorization: String
    var body: String?
}

/// What a load run saw: every answered request's latency (nanoseconds, sorted), the count of each status, the first
/// body of each non-2xx status, requests that got no answer (their connection failed), and how long the run took.
struct LoadResult: Sendable {
    var latencies: [UInt64] = []
    var statuses: [UInt: Int] = [:]
    var errorSamples: [UInt: String] = [:]
    var unanswered = 0
    var elapsed: Duration = .zero

    var succeeded: Int { statuses.filter { (200..<300).contains($0.key) }.reduce(0) { $0 + $1.value } }
    var errors: Int { statuses.filter { !(200..<300).contains($0.key) }.reduce(0) { $0 + $1.value } + unanswered }
    var summary: LatencySummary { LatencySummary(sortedNanoseconds: latencies) }

    /// `none`, or `409: 3 (first: {...}), unanswered: 1`.
    var errorText: String {
        var parts = statuses.filter { !(200..<300).contains($0.key) }.sorted { $0.key < $1.key }.map { status, count in
            "\(status): \(count)" + (errorSamples[status].map { " (first: \($0.prefix(200)))" } ?? "")
        }
        if unanswered > 0 { parts.append("no answer: \(unanswered)") }
        return parts.isEmpty ? "none" : parts.joined(separator: ", ")
    }
}

/// A lean HTTP/1.1 load generator on swift-nio: N keep-alive connections on one event loop, each sending its next
/// request when the previous answer has arrived (`run`), or requests sent at a steady rate whether or not earlier ones
/// were answered (`startPaced`). The latency of a request runs from when it was due to its answer's end.
///
/// All mutable state lives on the one event loop: the class is `@unchecked Sendable` because every method that
/// touches it hops there first.
final class HTTPLoad: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    let eventLoop: any EventLoop
    private let hostHeader: String
    private var idle: [LoadConnection] = []
    private var open = 0
    fileprivate var job: LoadJob?

    private init(eventLoop: any EventLoop, hostHeader: String) {
        self.eventLoop = eventLoop
        self.hostHeader = hostHeader
    }

    /// Opens `connections` keep-alive connections to `host:port` on `eventLoop`.
    static func connect(host: String, port: Int, connections: Int, eventLoop: any EventLoop) async throws -> HTTPLoad {
        try await connect(host: host, ports: [port], connections: connections, eventLoop: eventLoop)
    }

    /// Opens `connections` keep-alive connections on `eventLoop`, spread round-robin over `ports` (several nodes of
    /// one Liveline): connection i goes to `ports[i % ports.count]`. Each connection sends its next request when its
    /// previous one is answered, so the requests are spread as the connections are (evenly while the nodes keep up).
    static func connect(host: String, ports: [Int], connections: Int, eventLoop: any EventLoop) async throws -> HTTPLoad {
        precondition(!ports.isEmpty, "HTTPLoad needs at least one port.")
        let load = HTTPLoad(eventLoop: eventLoop, hostHeader: "\(host):\(ports[0])")
        for connection in 0..<connections {
            let port = ports[Bench.roundRobin(connection, over: ports.count)]
            // ClientBootstrap sets TCP_NODELAY by default.
            let channel = try await ClientBootstrap(group: eventLoop)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(LoadConnection(load: load))
                    }
                }
                .connect(host: host, port: port).get()
            _ = channel
        }
        return load
    }

    /// Sends `count` requests, `make(i)` for i in 0..<count, each connection sending its next when the previous is
    /// answered, and waits for every answer.
    func run(count: Int, make: @escaping @Sendable (Int) -> LoadRequest) async throws -> LoadResult {
        let promise = eventLoop.makePromise(of: LoadResult.self)
        eventLoop.execute {
            self.begin(LoadJob(make: make, total: count, promise: promise))
            self.dispatch()
        }
        return try await promise.futureResult.get()
    }

    /// Sends `perSecond` requests a second, each due at its time whatever the answers to earlier ones, until the
    /// returned run is stopped.
    func startPaced(perSecond: Int, make: @escaping @Sendable (Int) -> LoadRequest) -> PacedRun {
        let promise = eventLoop.makePromise(of: LoadResult.self)
        let interval = TimeAmount.nanoseconds(Int64(1_000_000_000 / max(1, perSecond)))
        let task = eventLoop.scheduleRepeatedTask(initialDelay: .zero, delay: interval) { _ in
            guard let job = self.job, !job.stopped else { return }
            job.due.append((job.issued, NIODeadline.now().uptimeNanoseconds))
            job.issued += 1
            self.dispatch()
        }
        eventLoop.execute { self.begin(LoadJob(make: make, total: nil, promise: promise)) }
        return PacedRun(load: self, task: task, result: promise.futureResult)
    }

    /// Closes every connection.
    func close() async {
        let channels = try? await eventLoop.submit { self.idle.compactMap(\.channel) }.get()
        for channel in channels ?? [] { try? await channel.close() }
    }

    // MARK: On the event loop

    private func begin(_ newJob: LoadJob) {
        precondition(job == nil, "One load run at a time per HTTPLoad.")
        guard open > 0 else {
            newJob.promise.fail(Failure(description: "No connection to the server is open."))
            return
        }
        job = newJob
        if newJob.total == 0 { finish() }
    }

    /// Gives idle connections their next request.
    private func dispatch() {
        guard let job else { return }
        while let connection = idle.last {
            let index: Int
            let due: UInt64
            if let total = job.total {
                guard job.issued < total else { return }
                index = job.issued
                job.issued += 1
                due = NIODeadline.now().uptimeNanoseconds
            } else {
                guard let next = job.due.popFirst() else { return }
                index = next.0
                due = next.1
            }
            idle.removeLast()
            connection.send(job.make(index), host: hostHeader, due: due)
        }
    }

    fileprivate func connected(_ connection: LoadConnection) {
        open += 1
        idle.append(connection)
    }

    fileprivate func answered(_ connection: LoadConnection, status: UInt, latency: UInt64, body: String?) {
        idle.append(connection)
        guard let job else { return }
        job.result.latencies.append(latency)
        job.result.statuses[status, default: 0] += 1
        if let body, job.result.errorSamples[status] == nil { job.result.errorSamples[status] = body }
        job.completed += 1
        if job.isDone { finish() } else { dispatch() }
    }

    fileprivate func closed(_ connection: LoadConnection, wasBusy: Bool) {
        open -= 1
        idle.removeAll { $0 === connection }
        guard let job else { return }
        if wasBusy {
            job.result.unanswered += 1
            job.completed += 1
        }
        if job.isDone {
            finish()
        } else if open == 0 {
            job.promise.fail(Failure(description: "Every connection to the server closed with \(job.remaining) requests left."))
            self.job = nil
        }
    }

    fileprivate func stopPaced() {
        guard let job else { return }
        job.stopped = true
        if job.isDone { finish() }
    }

    private func finish() {
        guard let job else { return }
        self.job = nil
        job.result.latencies.sort()
        job.result.elapsed = .nanoseconds(Int64(NIODeadline.now().uptimeNanoseconds - job.started))
        job.promise.succeed(job.result)
    }
}

/// A paced run in progress.
struct PacedRun: Sendable {
    fileprivate let load: HTTPLoad
    fileprivate let task: RepeatedTask
    fileprivate let result: EventLoopFuture<LoadResult>

    /// How many requests have fallen due so far.
    func issued() async throws -> Int {
        try await load.eventLoop.submit { [load] in load.job?.issued ?? 0 }.get()
    }

    /// Stops sending, waits for the answers still due and returns what the run saw.
    func stop() async throws -> LoadResult {
        task.cancel()
        load.eventLoop.execute { load.stopPaced() }
        return try await result.get()
    }
}

/// One run's state, on the load's event loop.
private final class LoadJob {
    let make: (Int) -> LoadRequest
    /// The requests to send; nil for a paced run, which sends until stopped.
    let total: Int?
    let promise: EventLoopPromise<LoadResult>
    let started = NIODeadline.now().uptimeNanoseconds
    /// Requests handed out (closed loop) or due (paced).
    var issued = 0
    var completed = 0
    /// Paced: requests due and not yet sent, with when they were due.
    var due = CircularBuffer<(Int, UInt64)>()
    var stopped = false
    var result = LoadResult()

    init(make: @escaping (Int) -> LoadRequest, total: Int?, promise: EventLoopPromise<LoadResult>) {
        self.make = make
        self.total = total
        self.promise = promise
        if let total { result.latencies.reserveCapacity(total) }
    }

    var remaining: Int { (total ?? issued) - completed }
    var isDone: Bool {
        if let total { return completed == total }
        return stopped && due.isEmpty && completed == issued
    }
}

/// One keep-alive connection: sends a request, reads its answer, reports back, and is handed the next one.
private final class LoadConnection: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    private let load: HTTPLoad
    private var context: ChannelHandlerContext?
    private var due: UInt64 = 0
    private var status: UInt = 0
    private var errorBody: ByteBuffer?
    private var busy = false
    private var reported = false

    init(load: HTTPLoad) {
        self.load = load
    }

    var channel: (any Channel)? { context?.channel }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { reportConnected() }
    }

    func channelActive(context: ChannelHandlerContext) {
        reportConnected()
        context.fireChannelActive()
    }

    private func reportConnected() {
        guard !reported else { return }
        reported = true
        load.connected(self)
    }

    func send(_ request: LoadRequest, host: String, due: UInt64) {
        guard let context else { return }
        busy = true
        self.due = due
        var headers = HTTPHeaders()
        headers.reserveCapacity(4)
        headers.add(name: "host", value: host)
        headers.add(name: "authorization", value: request.authorization)
        if let body = request.body {
            headers.add(name: "content-type", value: "application/json")
            headers.add(name: "content-length", value: String(body.utf8.count))
        }
        context.write(wrapOutboundOut(.head(HTTPRequestHead(version: .http1_1, method: request.method, uri: request.uri, headers: headers))), promise: nil)
        if let body = request.body {
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: body)))), promise: nil)
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            status = head.status.code
            errorBody = nil
        case .body(var buffer):
            if !(200..<300).contains(status) {
                if errorBody == nil { errorBody = buffer } else { errorBody!.writeBuffer(&buffer) }
            }
        case .end:
            let latency = NIODeadline.now().uptimeNanoseconds - due
            busy = false
            let body = errorBody.map { String(buffer: $0) }
            errorBody = nil
            load.answered(self, status: status, latency: latency, body: body)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        let wasBusy = busy
        busy = false
        load.closed(self, wasBusy: wasBusy)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
