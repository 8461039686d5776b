import AsyncHTTPClient
import Crypto
import Foundation
import LivelineCore
import LivelineDispatch
import LivelineServer
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// `liveline serve` as a separate process, as users run it: a fresh data directory, the admin API on with a
/// random token, no emulators (or `--dev`'s), and apps created through the admin API. Stopped with SIGTERM, then SIGKILL.
/// With a PostgreSQL URL its data is in that database instead of a SQLite file in its data directory; several of
/// them (``ServerNodes``) may share one database, each with its own directory and port.
final class ServerUnderTest: Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// An app created through the admin API, with its keys.
    struct App: Sendable {
        var id: String
        var secretKey: String
        var publishableKey: String
    }

    let process: Process
    let port: Int
    /// The server's SQLite database file; nil when its data is in PostgreSQL.
    let sqlitePath: String?
    private let adminToken: String
    private let http: HTTPClient
    private let logPath: String

    var pid: Int32 { process.processIdentifier }
    var baseURL: String { "http://127.0.0.1:\(port)" }

    /// An admin token and the file that holds it (mode 0600), for one server or for every node of several.
    struct AdminToken: Sendable {
        var token: String
        var path: String

        /// A fresh random token, written to `directory/admin-token`.
        static func create(in directory: URL) throws -> AdminToken {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let token = "bench-" + SymmetricKey(size: .bits256).withUnsafeBytes { Data($0) }.map { String(format: "%02x", $0) }.joined()
            let path = directory.appendingPathComponent("admin-token").path
            guard FileManager.default.createFile(atPath: path, contents: Data(token.utf8), attributes: [.posixPermissions: 0o600])
            else { throw Failure(description: "Could not write \(path).") }
            return AdminToken(token: token, path: path)
        }
    }

    /// Starts `executable serve` with its data in `directory` and waits until it answers /healthz. `adminToken`: the
    /// token file to use (a fresh one in `directory` when nil). `databaseURL`: a PostgreSQL database to keep the data
    /// in (`--database-url`); `environment`: variables added to this process's for the child (LIVELINE_MASTER_KEY).
    /// With `dev`, it runs as the README's first command runs it (`--dev`: the demo app and the built-in APNs and FCM
    /// emulators, their simulated phones registering with it), each emulator on a free port, the admin API on too.
    init(
        executable: String, directory: URL, adminToken given: AdminToken? = nil, databaseURL: String? = nil,
        environment: [String: String] = [:], dev: Bool = false
    ) async throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let token = try given ?? AdminToken.create(in: directory)
        let adminToken = token.token
        let tokenPath = token.path
        let port = try await Bench.freePort()
        let logPath = directory.appendingPathComponent("server.log").path
        guard FileManager.default.createFile(atPath: logPath, contents: nil) else { throw Failure(description: "Could not write \(logPath).") }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))

        let dataDirectory = directory.appendingPathComponent("data")
        sqlitePath = databaseURL == nil ? dataDirectory.appendingPathComponent(LivelineConfiguration.sqliteFileName).path : nil
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        var emulators = ["--no-emulator"]
        if dev {
            emulators = ["--dev"]
            for option in ["--emulator-port", "--emulator-control-port", "--emulator-channels-port", "--fcm-emulator-port", "--fcm-emulator-control-port"] {
                emulators += [option, String(try await Bench.freePort())]
            }
        }
        process.arguments = [
            "serve", "--data-dir", dataDirectory.path, "--host", "127.0.0.1", "--port", String(port),
            "--admin-token-file", tokenPath, "--log-level", "warning",
        ] + emulators + (databaseURL.map { ["--database-url", $0] } ?? [])
        // The bench reads the engine's backlog off /metrics every 100 ms (`activitiesPendingDelivery()`): the Store's
        // state is counted at every scrape, not every 5 s as by default.
        process.environment = ProcessInfo.processInfo.environment.merging(["LIVELINE_METRICS_COUNT_INTERVAL": "0"].merging(environment) { _, new in new }) { _, new in new }
        process.standardOutput = log
        process.standardError = log
        try process.run()
        BenchChildren.shared.add(process.processIdentifier)

        self.process = process
        self.port = port
        self.adminToken = adminToken
        self.logPath = logPath
        self.http = HTTPClient(eventLoopGroupProvider: .singleton)

        let deadline = ContinuousClock.now + .seconds(60)
        while true {
            if !process.isRunning {
                await stop()
                throw Failure(description: "liveline serve exited at start: \(logTail())")
            }
            if let response = try? await http.execute(HTTPClientRequest(url: "\(baseURL)/healthz"), timeout: .seconds(2)), response.status == .ok {
                break
            }
            if ContinuousClock.now > deadline {
                await stop()
                throw Failure(description: "liveline serve did not answer /healthz within 60 s: \(logTail())")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    /// Creates an app through the admin API.
    func createApp(name: String, bundleID: String) async throws -> App {
        let answer = try await admin(.POST, "/admin/v1/apps", ["name": .string(name), "bundleId": .string(bundleID)])
        guard let object = answer.objectValue, let app = object["app"]?.objectValue, let id = app["id"]?.stringValue,
            let secret = object["secretKey"]?.stringValue, let publishable = object["publishableKey"]?.stringValue
        else { throw Failure(description: "POST /admin/v1/apps answered something unexpected: \(answer.encodedString)") }
        return App(id: id, secretKey: secret, publishableKey: publishable)
    }

    /// Points the app's APNs credentials at `baseURL` (trusting `caCertificatePEM`), signing with `signingKey` as the
    /// bench's team and key (``Bench/teamID``, ``Bench/keyID``: the emulator trusts that key; nginx checks no JWT).
    /// `channelManagementBaseURL` is the channel management host, for broadcast activities.
    func setAPNs(
        appID: String, baseURL: String, caCertificatePEM: String, signingKey key: P256.Signing.PrivateKey,
        channelManagementBaseURL: String? = nil
    ) async throws {
        _ = try await admin(
            .PUT, "/admin/v1/apps/\(appID)/credentials/apns",
            [
                "teamId": .string(Bench.teamID), "keyId": .string(Bench.keyID), "privateKey": .string(key.pemRepresentation), "environment": "sandbox",
                "baseUrl": .string(baseURL), "caCertificate": .string(caCertificatePEM),
                "channelManagementBaseUrl": channelManagementBaseURL.map(JSONValue.string) ?? .null,
            ]
        )
    }

    /// The pushes this server's engine has attempted so far: the sum of `liveline_pushes_total` (every platform,
    /// status and reason) on its `GET /metrics`; nil when it cannot be read (metrics off, no answer).
    func pushesSent() async -> Int? {
        await metric(Self.pushesCounter)
    }

    /// The activities whose newest state the engine has not finished sending (`liveline_activities_pending_delivery` on
    /// `GET /metrics`, counted in the Store at the scrape: on a shared PostgreSQL database, every node's); nil when it
    /// cannot be read.
    func activitiesPendingDelivery() async -> Int? {
        await metric(MetricNames.activitiesPendingDelivery)
    }

    /// The activity's instances counted by state (`instances` of `GET /v1/activities/{activityId}`, asked with the app's
    /// secret key): `ended`, `active`, … and `total`.
    func instanceCounts(activityID: String, secretKey: String) async throws -> [String: Int] {
        var request = HTTPClientRequest(url: "\(baseURL)/v1/activities/\(activityID)")
        request.headers.add(name: "authorization", value: "Bearer \(secretKey)")
        let response = try await http.execute(request, timeout: .seconds(30))
        let bytes = try await response.body.collect(upTo: 1 << 20)
        guard response.status == .ok, let counts = try JSONValue(parsing: bytes.readableBytesView).objectValue?["instances"]?.objectValue
        else { throw Failure(description: "GET /v1/activities/\(activityID) answered \(response.status.code): \(String(buffer: bytes))") }
        return counts.compactMapValues { value in
            if case .integer(let count) = value { Int(count) } else { nil }
        }
    }

    /// The sum of the samples of `name` on this server's `GET /metrics`; nil when it cannot be read.
    private func metric(_ name: String) async -> Int? {
        guard let response = try? await http.execute(HTTPClientRequest(url: "\(baseURL)/metrics"), timeout: .seconds(10)),
            response.status == .ok, let body = try? await response.body.collect(upTo: 16 << 20)
        else { return nil }
        return Bench.counterTotal(name, inExposition: String(buffer: body))
    }

    /// The engine's push counter on /metrics.
    static let pushesCounter = DeliveryMetrics.pushesName

    /// The most resident memory the server ever had (VmHWM), in bytes; nil when /proc cannot tell.
    func peakResidentBytes() -> Int? {
        Bench.peakResidentBytes(process: String(pid))
    }

    /// User and system CPU seconds the server has used, from /proc/PID/stat; 0 when /proc cannot tell.
    func cpuSeconds() -> Double {
        ProcessTimes.read(pid)?.cpuSeconds ?? 0
    }

    /// Stops the server: SIGTERM, then SIGKILL after 10 s. Safe to call more than once.
    func stop() async {
        if process.isRunning {
            kill(pid, SIGTERM)
            let deadline = ContinuousClock.now + .seconds(10)
            while process.isRunning, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
            if process.isRunning {
                kill(pid, SIGKILL)
                process.waitUntilExit()
            }
        }
        BenchChildren.shared.remove(pid)
        try? await http.shutdown()
    }

    /// The last lines the server logged.
    func logTail() -> String {
        let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").suffix(20).joined(separator: "\n")
    }

    private func admin(_ method: HTTPMethod, _ path: String, _ body: JSONValue) async throws -> JSONValue {
        var request = HTTPClientRequest(url: baseURL + path)
        request.method = method
        request.headers.add(name: "authorization", value: "Bearer \(adminToken)")
        request.headers.add(name: "content-type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: body.encodedString))
        let response = try await http.execute(request, timeout: .seconds(30))
        let bytes = try await response.body.collect(upTo: 1 << 20)
        guard (200..<300).contains(response.status.code) else {
            throw Failure(description: "\(method) \(path) answered \(response.status.code): \(String(buffer: bytes))")
        }
        return try JSONValue(parsing: bytes.readableBytesView)
    }
}

/// The pipe the interrupt handler writes to: set once, before the handler is installed.
nonisolated(unsafe) private var interruptPipeWriteEnd: Int32 = -1

/// The processes a benchmark started (the server, nginx, h2load), stopped if the benchmark itself is interrupted, so
/// none is left behind; and the temporary directory to remove then.
final class BenchChildren: Sendable {
    static let shared = BenchChildren()
    private let pids = NIOLockedValueBox<Set<Int32>>([])
    private let directory = NIOLockedValueBox<String?>(nil)
    private let installed = NIOLockedValueBox(false)

    func add(_ pid: Int32) {
        pids.withLockedValue { _ = $0.insert(pid) }
    }

    func remove(_ pid: Int32) {
        pids.withLockedValue { _ = $0.remove(pid) }
    }

    /// A temporary directory to remove on an interrupt.
    func removeOnInterrupt(_ path: String?) {
        directory.withLockedValue { $0 = path }
    }

    /// On SIGINT or SIGTERM: SIGTERM every child still registered (nginx's master then stops its worker), SIGKILL
    /// those still running after two seconds, remove the temporary directory, and exit. The signal handler only writes a
    /// byte to a pipe; a thread of its own reads it and does the rest outside the signal's context.
    func stopOnInterrupt() {
        installed.withLockedValue { installed in
            guard !installed else { return }
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else { return }
            installed = true
            interruptPipeWriteEnd = fds[1]
            let readEnd = fds[0]
            Thread.detachNewThread { [pids, directory] in
                var byte: UInt8 = 0
                while read(readEnd, &byte, 1) != 1 {}
                let children = pids.withLockedValue { $0 }
                for pid in children { kill(pid, SIGTERM) }
                let deadline = ContinuousClock.now + .seconds(2)
                while ContinuousClock.now < deadline, children.contains(where: { kill($0, 0) == 0 && !BenchChildren.isZombie($0) }) {
                    usleep(20_000)
                }
                for pid in children where kill(pid, 0) == 0 { kill(pid, SIGKILL) }
                if let path = directory.withLockedValue({ $0 }) {
                    // nginx's worker may still be closing its files: a few tries.
                    for _ in 0..<10 where FileManager.default.fileExists(atPath: path) {
                        try? FileManager.default.removeItem(atPath: path)
                        usleep(100_000)
                    }
                }
                exit(130)
            }
            for signalNumber in [SIGINT, SIGTERM] {
                signal(signalNumber) { _ in
                    var byte: UInt8 = 1
                    _ = write(interruptPipeWriteEnd, &byte, 1)
                }
            }
        }
    }

    /// A child that has exited but not been waited for still answers `kill(pid, 0)`.
    fileprivate static func isZombie(_ pid: Int32) -> Bool {
        guard let times = ProcessTimes.read(pid) else { return true }
        return times.state == "Z"
    }
}

extension Bench {
    /// A loopback port nobody listens on now (bound and released).
    static func freePort() async throws -> Int {
        try await NginxSink.freePort()
    }

    /// Runs `body` with a fresh scratch directory under the system's temporary directory, removed when `body` ends; an
    /// interrupt (Ctrl-C, SIGTERM) stops the children the run started and removes it too (``BenchChildren``).
    static func withScratchDirectory<T>(_ body: (URL) async throws -> T) async throws -> T {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("liveline-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        BenchChildren.shared.removeOnInterrupt(root.path)
        BenchChildren.shared.stopOnInterrupt()
        return try await body(root)
    }

    /// The `liveline` executable to run as the server: this one unless told otherwise.
    static func serverExecutable(_ given: String?) -> String {
        given ?? Bundle.main.executablePath ?? CommandLine.arguments[0]
    }

    /// Bytes as `123 MB`.
    static func megabytes(_ bytes: Int?) -> String {
        bytes.map { String(format: "%.0f MB", Double($0) / 1_048_576) } ?? "unknown"
    }
}
