import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The `liveline` executable: `LIVELINE_BINARY` when set, otherwise the one SwiftPM built next to the tests.
///
/// SwiftPM puts every product of a build, the test bundle and `liveline` alike, in one directory
/// (`.build/<triple>/<configuration>`, or under `--scratch-path`), so the executable is found beside the running
/// test binary whatever the configuration, triple or scratch path.
public func livelineExecutable() -> URL {
    if let path = ProcessInfo.processInfo.environment["LIVELINE_BINARY"], !path.isEmpty {
        return URL(fileURLWithPath: path)
    }
    return builtProductsDirectory().appendingPathComponent("liveline")
}

/// The directory the running tests were built into.
public func builtProductsDirectory() -> URL {
    #if os(macOS)
    // Xcode's `xctest` runner loads the tests as a bundle: `<products>/livelinePackageTests.xctest`.
    if let bundle = Bundle.allBundles.first(where: { $0.bundleURL.pathExtension == "xctest" }) {
        return bundle.bundleURL.deletingLastPathComponent()
    }
    #endif
    // On Linux the tests are an executable of their own: `<products>/livelinePackageTests.xctest`.
    let executable = Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
    return executable.resolvingSymlinksInPath().deletingLastPathComponent()
}

/// A port on 127.0.0.1 the kernel says is free now (it picks one for a socket bound to port 0).
public func freePort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
    _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Starts the `liveline` executable (``livelineExecutable()``) with `arguments` and `environment` laid over this
/// process's, writing what it prints (both streams) to a new file at `output`.
public func runLiveline(_ arguments: [String], environment: [String: String] = [:], output: URL) throws -> ChildProcess {
    try ChildProcess(executable: livelineExecutable(), arguments: arguments, environment: environment, output: output)
}

/// Whether something on 127.0.0.1 accepts a TCP connection on `port` now.
public func acceptsConnections(_ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    let length = socklen_t(MemoryLayout<sockaddr_in>.size)
    return withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, length) } } == 0
}

/// `liveline serve --dev` would not start.
public struct ServeDevProcessFailure: Error, CustomStringConvertible {
    public var description: String
}

/// A running `liveline serve --dev` child process (SQLite in `root/data`, the built-in emulators), as a newcomer runs
/// it, and the ports it was given; what it prints goes to `output`.
public struct ServeDevProcess {
    public var process: ChildProcess
    public var output: URL
    /// The six ports it was given, in ``start(root:ports:environment:)``'s order.
    public var ports: [Int]
    /// The API's port and base URL (`http://127.0.0.1:PORT`).
    public var apiPort: Int
    public var api: String
    /// The base URLs of the APNs and FCM emulators' control APIs.
    public var apnsControl: String
    public var fcmControl: String

    /// Starts the server with `ports`: API, APNs emulator, its control API, FCM emulator, its control API, channel
    /// management (six free ports when nil), and `environment` laid over this process's.
    public static func start(root: URL, ports: [Int]? = nil, environment: [String: String] = [:]) throws -> ServeDevProcess {
        let ports = ports ?? (0..<6).map { _ in freePort() }
        let output = root.appendingPathComponent("serve-\(UUID().uuidString).log")
        let process = try runLiveline(
            [
                "serve", "--dev", "--data-dir", root.appendingPathComponent("data").path, "--port", "\(ports[0])",
                "--emulator-port", "\(ports[1])", "--emulator-control-port", "\(ports[2])",
                "--fcm-emulator-port", "\(ports[3])", "--fcm-emulator-control-port", "\(ports[4])",
                "--emulator-channels-port", "\(ports[5])",
            ],
            environment: environment, output: output
        )
        return ServeDevProcess(
            process: process, output: output, ports: ports, apiPort: ports[0], api: "http://127.0.0.1:\(ports[0])",
            apnsControl: "http://127.0.0.1:\(ports[2])", fcmControl: "http://127.0.0.1:\(ports[4])"
        )
    }

    /// Starts the server for the first time in `root` on fresh free ports and returns once all six accept connections.
    /// A port found free can be taken by another test before the server binds it (tests run side by side, and CI saw
    /// `Address already in use`): the server then exits, and is started again on other ports, up to `attempts` times,
    /// in a data directory emptied again: the attempt that exited may have made the demo app first, and printed its keys
    /// to its own output, where a test reading the next attempt's would never find them (CI saw that too). Throws with
    /// the end of what the server printed when it exits for another reason or is not listening within `timeout`.
    public static func startListening(
        root: URL, environment: [String: String] = [:], attempts: Int = 4, timeout: Duration = .seconds(60)
    ) async throws -> ServeDevProcess {
        var attempt = 1
        while true {
            let ports = (0..<6).map { _ in freePort() }
            let server = try start(root: root, ports: ports, environment: environment)
            let deadline = ContinuousClock.now + timeout
            while server.process.isRunning, !ports.allSatisfy(acceptsConnections), ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
            }
            if server.process.isRunning, ports.allSatisfy(acceptsConnections) { return server }
            server.stop()
            let printed = (try? String(contentsOf: server.output, encoding: .utf8)) ?? ""
            if printed.contains("Address already in use"), attempt < attempts {
                attempt += 1
                try? FileManager.default.removeItem(at: root.appendingPathComponent("data"))
                continue
            }
            throw ServeDevProcessFailure(description: "liveline serve --dev did not start: \(printed.suffix(2000))")
        }
    }

    /// The value of `export NAME=value` in what the server printed, once it has.
    public func exported(_ name: String) -> String? {
        guard let text = try? String(contentsOf: output, encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("export \(name)=") { return String(trimmed.dropFirst("export \(name)=".count)) }
        }
        return nil
    }

    /// Stops it with SIGTERM and waits for it to exit.
    public func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}
