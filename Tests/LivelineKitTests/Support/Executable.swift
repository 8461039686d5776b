import Foundation

#if canImport(Glibc)
import Glibc
#endif

// The same helpers as LivelineDispatchTests' (a test target cannot import another's).

/// The `liveline` executable: `LIVELINE_BINARY` when set, otherwise the one SwiftPM built next to the tests.
func livelineExecutable() -> URL {
    if let path = ProcessInfo.processInfo.environment["LIVELINE_BINARY"], !path.isEmpty {
        return URL(fileURLWithPath: path)
    }
    return builtProductsDirectory().appendingPathComponent("liveline")
}

/// The directory the running tests were built into.
func builtProductsDirectory() -> URL {
    #if os(macOS)
    if let bundle = Bundle.allBundles.first(where: { $0.bundleURL.pathExtension == "xctest" }) {
        return bundle.bundleURL.deletingLastPathComponent()
    }
    #endif
    let executable = Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
    return executable.resolvingSymlinksInPath().deletingLastPathComponent()
}

/// A port the kernel says is free now.
func freePort() -> Int {
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
