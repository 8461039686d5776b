import AsyncHTTPClient
import Foundation
import LivelineDispatch
import LivelineEmulator
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// Where the benchmark's pushes go: an HTTP/2 + TLS endpoint on loopback that counts what it received.
protocol BenchSink: Sendable {
    /// The base URL the APNs client is pointed at.
    var baseURL: String { get }
    /// The CA certificate the client trusts for it.
    var caCertificatePEM: String { get }
    /// Pushes received so far.
    func received() async throws -> Int
    /// What the sink answered, when it keeps count (`status: count`).
    func answers() async -> String
    /// Stops the sink.
    func shutdown() async throws
    /// The pushes to side phones received so far (``BenchRequests/sideToken(_:)``), with the time each arrived; nil
    /// for a sink that does not tell them apart.
    func sideArrivals() async throws -> SideArrivals?
    /// The CPU seconds the sink's processes have spent so far; nil for a sink that runs in the bench's own process.
    /// A sink does the same work for every round of a fan-out: where its CPU a push rises in a round with the server's,
    /// the machine ran slower in that round, not the server.
    func cpuSeconds() -> Double?
}

extension BenchSink {
    func sideArrivals() async throws -> SideArrivals? { nil }
    func cpuSeconds() -> Double? { nil }
}

/// The pushes a sink received for side phones: each phone's arrival times (seconds since 1970, ascending).
struct SideArrivals: Sendable {
    var byPhone: [Int: [Double]] = [:]

    /// How many pushes reached side phones.
    var count: Int { byPhone.values.reduce(0) { $0 + $1.count } }

    /// Takes one line of the sink's side log, `<seconds since 1970> <path>`; false for a line that is not one.
    mutating func add(line: Substring) -> Bool {
        let fields = line.split(separator: " ")
        guard fields.count == 2, let at = Double(fields[0]), let phone = BenchRequests.sidePhone(path: fields[1]) else { return false }
        byPhone[phone, default: []].append(at)
        return true
    }
}

/// The strict APNs emulator, in this process: every push is checked as Apple would and applied to a simulated phone.
struct EmulatorSink: BenchSink {
    let emulator: APNsEmulator
    let baseURL: String

    var caCertificatePEM: String { emulator.caCertificatePEM }

    func received() async throws -> Int { emulator.statistics.accepted }

    func answers() async -> String {
        emulator.statistics.byStatus.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
    }

    func shutdown() async throws { try await emulator.shutdown() }
}

/// nginx (Debian's `nginx-light` or `nginx`) as a separate process: HTTP/2 over TLS on loopback, answering 200 with an
/// `apns-id` to every `POST /3/device/…` (the request's, or, as APNs does for a request without one, one made up: the
/// same one each time), as h2load's reference figure does. It checks nothing, so it costs
/// the machine little and the figure is mostly Liveline's own work. Pushes are counted by nginx's `stub_status`.
final class NginxSink: BenchSink {
    let baseURL: String
    let caCertificatePEM: String
    private let statusURL: String
    private let process: Process
    private let http: HTTPClient
    private let statusPolls = NIOLockedValueBox(0)
    /// nginx's log of the side phones' pushes, and what has been read of it.
    private let sideLogPath: String
    private let sideLog = NIOLockedValueBox(SideLogReading())

    private struct SideLogReading {
        /// The log, opened at the first read and kept open: each read takes what nginx appended since the last one.
        var handle: FileHandle?
        /// The start of a line nginx had not finished writing.
        var partial: [UInt8] = []
        var arrivals = SideArrivals()
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Writes a configuration and a certificate into `directory` and starts `nginx` there.
    init(directory: URL) async throws {
        guard let executable = Self.findNginx() else {
            throw Failure(description: "--sink nginx needs nginx (Debian: apt-get install nginx-light); it was not found in PATH, /usr/sbin or /usr/local/sbin.")
        }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let identity = try EmulatorTLSIdentity.loadOrCreate(in: directory.path)
        let certificatePath = directory.appendingPathComponent("server.pem").path
        let keyPath = directory.appendingPathComponent("server-key.pem").path
        try Data((identity.serverCertificatePEM + "\n" + identity.caCertificatePEM).utf8).write(to: URL(fileURLWithPath: certificatePath))
        guard FileManager.default.createFile(atPath: keyPath, contents: Data(identity.serverPrivateKeyPEM.utf8), attributes: [.posixPermissions: 0o600])
        else { throw Failure(description: "Could not write \(keyPath).") }

        let sideLogPath = directory.appendingPathComponent("side.log").path
        let pushPort = try await Self.freePort()
        let statusPort = try await Self.freePort()
        let configuration = """
            worker_processes 1;
            daemon off;
            pid \(directory.path)/nginx.pid;
            error_log \(directory.path)/error.log warn;
            events { worker_connections 1024; }
            http {
                access_log off;
                log_format side '$msec $uri';
                # APNs answers every request with an apns-id: the request's own, or a UUID it makes up when the request
                # has none. Here one made-up UUID for all of those: answered as a literal each time, as a fresh one
                # would be, at no cost to nginx (one made per request from nginx's request id with a regular expression
                # slowed nginx, the limit of `bench client`: docs/benchmarks.md, 2026-12-05 23:23).
                map $http_apns_id $apns_id {
                    "" "5f3c2a1e-7b4d-4c8e-9a6f-0d2e1b3c4a5f";
                    default $http_apns_id;
                }
                client_body_temp_path \(directory.path)/body;
                proxy_temp_path \(directory.path)/proxy;
                fastcgi_temp_path \(directory.path)/fastcgi;
                uwsgi_temp_path \(directory.path)/uwsgi;
                scgi_temp_path \(directory.path)/scgi;
                # APNs allows 1,000 concurrent streams per connection.
                http2_max_concurrent_streams \(APNsTransportDirectory.streamsPerConnection);
                keepalive_requests 100000000;
                server {
                    listen 127.0.0.1:\(pushPort) ssl http2;
                    ssl_certificate \(certificatePath);
                    ssl_certificate_key \(keyPath);
                    client_body_buffer_size 8k;
                    location /3/device/ {
                        add_header apns-id $apns_id always;
                        return 200;
                    }
                    # The side phones' pushes, each logged with the time it was read (bench fanout --side-deliveries).
                    location /3/device/\(BenchRequests.sideTokenPrefix) {
                        access_log \(sideLogPath) side;
                        add_header apns-id $apns_id always;
                        return 200;
                    }
                    location / { return 404; }
                }
                server {
                    listen 127.0.0.1:\(statusPort);
                    location = /status { stub_status; }
                }
            }
            """
        let configurationPath = directory.appendingPathComponent("nginx.conf").path
        try Data(configuration.utf8).write(to: URL(fileURLWithPath: configurationPath))

        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = ["-c", configurationPath, "-p", directory.path, "-e", directory.appendingPathComponent("error.log").path]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        BenchChildren.shared.add(process.processIdentifier)

        self.process = process
        self.baseURL = "https://127.0.0.1:\(pushPort)"
        self.caCertificatePEM = identity.caCertificatePEM
        self.statusURL = "http://127.0.0.1:\(statusPort)/status"
        self.sideLogPath = sideLogPath
        self.http = HTTPClient(eventLoopGroupProvider: .singleton)

        // Ready once the status listener answers.
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            if !process.isRunning {
                let log = (try? String(contentsOfFile: directory.appendingPathComponent("error.log").path, encoding: .utf8)) ?? ""
                try? await http.shutdown()
                throw Failure(description: "nginx exited at start: \(log.trimmingCharacters(in: .whitespacesAndNewlines))")
            }
            if (try? await requestsSoFar()) != nil { break }
            if ContinuousClock.now > deadline {
                try? await shutdown()
                throw Failure(description: "nginx did not start listening within 10 s.")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    func received() async throws -> Int {
        // stub_status counts every request, the status requests too: take those away.
        try await requestsSoFar() - statusPolls.withLockedValue { $0 }
    }

    func answers() async -> String { "200 to every push (nginx checks nothing)" }

    /// nginx's master and its worker, from /proc.
    func cpuSeconds() -> Double? {
        ProcessTimes.treeTicks(root: process.processIdentifier, in: ProcessTimes.all()).map(ProcessTimes.seconds(ticks:))
    }

    /// What nginx has appended to its side log since the last call, added to what it had logged before: a read of the
    /// new bytes alone, so that asking often during a round costs little.
    func sideArrivals() async throws -> SideArrivals? {
        try sideLog.withLockedValue { reading in
            let handle = try reading.handle ?? FileHandle(forReadingFrom: URL(fileURLWithPath: sideLogPath))
            reading.handle = handle
            reading.partial += try handle.readToEnd() ?? Data()
            guard let lastNewline = reading.partial.lastIndex(of: UInt8(ascii: "\n")) else { return reading.arrivals }
            let complete = String(decoding: reading.partial[...lastNewline], as: UTF8.self)
            reading.partial.removeSubrange(...lastNewline)
            for line in complete.split(separator: "\n") where !reading.arrivals.add(line: line) {
                throw Failure(description: "nginx's side log holds a line that is not `<seconds> <path>`: \(line)")
            }
            return reading.arrivals
        }
    }

    func shutdown() async throws {
        try? sideLog.withLockedValue { try $0.handle?.close() }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        BenchChildren.shared.remove(process.processIdentifier)
        try await http.shutdown()
    }

    /// All requests nginx has read, from `stub_status` ("server accepts handled requests" then the three counts).
    private func requestsSoFar() async throws -> Int {
        statusPolls.withLockedValue { $0 += 1 }
        let response = try await http.execute(HTTPClientRequest(url: statusURL), timeout: .seconds(5))
        let body = String(buffer: try await response.body.collect(upTo: 4096))
        let lines = body.split(separator: "\n")
        guard response.status == .ok, let header = lines.firstIndex(where: { $0.contains("accepts handled requests") }),
            header + 1 < lines.count, let requests = lines[header + 1].split(separator: " ").last.flatMap({ Int($0) })
        else { throw Failure(description: "nginx's stub_status answered something unexpected: \(body)") }
        return requests
    }

    /// nginx's executable: in `PATH`, `/usr/sbin`, `/usr/local/sbin` or `/sbin`; nil when none is installed.
    static func findNginx() -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        let directories = path.split(separator: ":").map(String.init) + ["/usr/sbin", "/usr/local/sbin", "/sbin"]
        return directories.map { ($0 as NSString).appendingPathComponent("nginx") }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// A loopback port nobody listens on now (bound and released).
    static func freePort() async throws -> Int {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
        let port = channel.localAddress?.port ?? 0
        try await channel.close().get()
        guard port > 0 else { throw Failure(description: "Could not find a free loopback port for nginx.") }
        return port
    }
}
