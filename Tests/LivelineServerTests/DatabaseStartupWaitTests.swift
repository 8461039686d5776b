import Foundation
@testable import LivelineStore
import LivelineTestSupport
import Logging
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import LivelineServer

@Suite("Waiting at the start for a PostgreSQL database that does not answer yet")
struct DatabaseStartupWaitTests {
    @Test("the pauses double from a quarter second up to five, and the last one ends at the limit")
    func pauses() {
        let wait = DatabaseStartupWait(limit: .seconds(60))
        let pauses = (1...8).map { wait.decision(afterAttempt: $0, elapsed: .seconds(1), mayPass: true) }
        #expect(pauses == [0.25, 0.5, 1, 2, 4, 5, 5, 5].map { .tryAgain(after: .milliseconds(Int($0 * 1000))) })
        #expect(wait.decision(afterAttempt: 20, elapsed: .milliseconds(59_900), mayPass: true) == .tryAgain(after: .milliseconds(100)))
        #expect(wait.decision(afterAttempt: 21, elapsed: .seconds(60), mayPass: true) == .giveUp)
        #expect(wait.decision(afterAttempt: 1000, elapsed: .seconds(61), mayPass: true) == .giveUp)
    }

    @Test("a refusal that waiting cannot mend, or no wait at all, gives up at the first failure")
    func givesUp() {
        #expect(DatabaseStartupWait(limit: .seconds(60)).decision(afterAttempt: 1, elapsed: .zero, mayPass: false) == .giveUp)
        #expect(DatabaseStartupWait(limit: .zero).decision(afterAttempt: 1, elapsed: .zero, mayPass: true) == .giveUp)
    }

    @Test("the configuration's wait: a minute by default, seconds from LIVELINE_DATABASE_STARTUP_WAIT, refused past an hour")
    func configuration() async throws {
        func configured(_ environment: [String: String]) async throws -> LivelineConfiguration {
            try LivelineConfiguration(reader: await LivelineConfiguration.reader(flags: [:], file: nil, environment: environment))
        }
        #expect(try await configured([:]).databaseStartupWait == .seconds(60))
        #expect(try await configured(["LIVELINE_DATABASE_STARTUP_WAIT": "0"]).databaseStartupWait == .zero)
        #expect(try await configured(["LIVELINE_DATABASE_STARTUP_WAIT": "15"]).databaseStartupWait == .seconds(15))
        await #expect(throws: ConfigurationError.self) { try await configured(["LIVELINE_DATABASE_STARTUP_WAIT": "3601"]) }
        await #expect(throws: ConfigurationError.self) { try await configured(["LIVELINE_DATABASE_STARTUP_WAIT": "-1"]) }
    }

    @Test("an opening that fails while the database is unreachable is tried again until it succeeds")
    func triesAgain() async throws {
        var wait = DatabaseStartupWait(limit: .seconds(30))
        wait.firstPause = .milliseconds(1)
        let attempts = Atomic(0)
        let opened = try await LivelineApplication.waitingForDatabase(wait, logger: Logger(label: "test"), clock: ContinuousClock()) {
            let attempt = attempts.add(1, ordering: .relaxed).newValue
            if attempt < 3 { throw PostgresFailure(sqlState: "57P03", message: "the database system is starting up", isConnectionLost: true) }
            return "open"
        }
        #expect(opened == "open")
        #expect(attempts.load(ordering: .relaxed) == 3)
    }

    @Test("a wrong password, or any error not of an unreachable database, ends the wait at once")
    func refusalsEndIt() async throws {
        var wait = DatabaseStartupWait(limit: .seconds(30))
        wait.firstPause = .milliseconds(1)
        let attempts = Atomic(0)
        await #expect(throws: PostgresFailure.self) {
            try await LivelineApplication.waitingForDatabase(wait, logger: Logger(label: "test"), clock: ContinuousClock()) {
                attempts.add(1, ordering: .relaxed)
                throw PostgresFailure(sqlState: "28P01", message: "password authentication failed", isConnectionLost: false)
            }
        }
        await #expect(throws: CancellationError.self) {
            try await LivelineApplication.waitingForDatabase(wait, logger: Logger(label: "test"), clock: ContinuousClock()) {
                attempts.add(1, ordering: .relaxed)
                throw CancellationError()
            }
        }
        #expect(attempts.load(ordering: .relaxed) == 2)
    }
}

/// The same over real sockets, against the test server (`LIVELINE_TEST_POSTGRES_URL`).
@Suite(
    "A server started before its PostgreSQL database", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set")
)
struct DatabaseStartupTests {
    /// The configuration of `liveline serve` on the database at `url`, reached through `port` of loopback when given,
    /// with its data directory in `directory` (the server creates it; the test removes it).
    static func configuration(
        _ url: String, port: Int? = nil, database: String? = nil, wait: Duration, in directory: URL
    ) throws -> LivelineConfiguration {
        var through = try PostgresDatabaseURL(url)
        if let port { through.port = port }
        if let database { through = through.with(database: database) }
        var configuration = LivelineConfiguration(
            dataDirectory: directory.appendingPathComponent("data-\(UUID().uuidString)").path, database: through.urlString
        )
        configuration.databaseStartupWait = wait
        return configuration
    }

    @Test("the database comes up two seconds after the server starts: the server waits for it, migrates it and opens")
    func databaseComesUpLater() async throws {
        try await withTemporaryPostgresDatabase { url in
            try await withTemporaryDirectory(prefix: "liveline-startup") { directory in
                let target = try PostgresDatabaseURL(url)
                let port = try await Relay.freePort()
                let configuration = try Self.configuration(url, port: port, wait: .seconds(30), in: directory)
                let relay = Task {
                    try await Task.sleep(for: .seconds(2))
                    return try await Relay.start(port: port, to: target.host, port: target.port)
                }
                let started = ContinuousClock.now
                let store = try await LivelineApplication.openStore(configuration, waitingForDatabase: true, logger: Logger(label: "test"))
                let waited = started.duration(to: .now)
                #expect(try await store.schemaVersion() > 0)
                #expect(waited >= .seconds(2))
                try await store.close()
                try await relay.value.close()
            }
        }
    }

    @Test("with nothing listening, the server gives up once its wait has passed, and at once without a wait")
    func nothingListening() async throws {
        let url = try #require(PostgresTestServer.url)
        try await withTemporaryDirectory(prefix: "liveline-startup") { directory in
            let port = try await Relay.freePort()
            let started = ContinuousClock.now
            await #expect(throws: PostgresFailure.self) {
                try await LivelineApplication.openStore(
                    try Self.configuration(url, port: port, wait: .seconds(2), in: directory), waitingForDatabase: true,
                    logger: Logger(label: "test")
                )
            }
            let waited = started.duration(to: .now)
            #expect(waited >= .seconds(2) && waited < .seconds(25))
            let again = ContinuousClock.now
            // The one-shot commands open without waiting (a refused connection fails in milliseconds; the wait would be 30 s).
            await #expect(throws: PostgresFailure.self) {
                try await LivelineApplication.openStore(
                    try Self.configuration(url, port: port, wait: .seconds(30), in: directory), logger: Logger(label: "test")
                )
            }
            #expect(again.duration(to: .now) < .seconds(15))
        }
    }

    @Test("a database that does not exist fails at once, whatever the wait")
    func noSuchDatabase() async throws {
        let url = try #require(PostgresTestServer.url)
        try await withTemporaryDirectory(prefix: "liveline-startup") { directory in
            let configuration = try Self.configuration(
                url, database: "liveline_no_such_\(UInt32.random(in: 0...UInt32.max))", wait: .seconds(30), in: directory
            )
            let started = ContinuousClock.now
            let failure = await #expect(throws: PostgresFailure.self) {
                try await LivelineApplication.openStore(configuration, waitingForDatabase: true, logger: Logger(label: "test"))
            }
            #expect(failure?.sqlState == "3D000")
            // Well within the 30 s it may wait: it did not wait (5.19 s once, when every core ran the rest of the suite).
            #expect(started.duration(to: .now) < .seconds(15))
        }
    }
}

/// A TCP relay on loopback: what a PostgreSQL that starts late looks like to the server, without restarting the test
/// server. Each connection it accepts is joined to a new connection to the target.
private final class Relay: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer

    /// The other side; set on the connection's event loop, which both sides share.
    var partner: (any Channel)?

    init(partner: (any Channel)? = nil) {
        self.partner = partner
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        partner?.writeAndFlush(unwrapInboundIn(data), promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        partner?.close(promise: nil)
        context.fireChannelInactive()
    }

    /// A port of loopback nothing listens on, below the range the system gives outgoing connections (32768 – 60999 on
    /// Linux): the server's own attempts to connect to it meanwhile, and other tests' connections, take their local
    /// ports from that range, and one of them taking this port (or connecting to itself on it) kept the relay from
    /// listening there once in a full run of the suite, the server refused for its whole wait.
    static func freePort() async throws -> Int {
        for _ in 0..<100 {
            let port = Int.random(in: 20_000..<32_000)
            guard let channel = try? await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: port).get()
            else { continue }
            try await channel.close()
            return port
        }
        Issue.record("no free port below the ephemeral range")
        throw CancellationError()
    }

    /// Listens on `port` and relays every connection to `host`:`targetPort`.
    static func start(port: Int, to host: String, port targetPort: Int) async throws -> any Channel {
        try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { inbound in
                let inboundSide = Relay()
                return inbound.pipeline.addHandler(inboundSide).flatMap {
                    ClientBootstrap(group: inbound.eventLoop)
                        .channelInitializer { outbound in outbound.pipeline.addHandler(Relay(partner: inbound)) }
                        .connect(host: host, port: targetPort)
                }.flatMap { outbound in
                    inboundSide.partner = outbound
                    return inbound.setOption(.autoRead, value: true)
                }
            }
            .bind(host: "127.0.0.1", port: port).get()
    }
}
