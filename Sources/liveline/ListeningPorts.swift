#if canImport(Glibc)
import Glibc
#endif
import Foundation
import LivelineServer

/// The ports `liveline serve` is about to listen on, each with what listens there, checked free before anything
/// starts: a port in use is named in one line (the operator of `--dev`'s six ports is told which one), rather than
/// NIO's `bind(descriptor:ptr:bytes:): Address already in use` after the demo app's keys were printed.
struct ListeningPorts {
    struct Busy: Error, CustomStringConvertible {
        var description: String
    }

    /// The ports of `configuration`, with their owners and hosts: the API's, and the emulators' when they run. Port 0
    /// (the kernel picks one) is never busy and is left out.
    static func planned(_ configuration: LivelineConfiguration) -> [(host: String, port: Int, owner: String)] {
        var ports = [(configuration.host, configuration.port, "the HTTP API (liveline.port, --port)")]
        if configuration.emulator {
            ports += [
                ("127.0.0.1", configuration.emulatorPort, "the APNs emulator (liveline.emulatorPort, --emulator-port)"),
                ("127.0.0.1", configuration.emulatorControlPort, "the APNs emulator's control API (liveline.emulatorControlPort, --emulator-control-port)"),
                ("127.0.0.1", configuration.emulatorChannelsPort, "the APNs emulator's channel management (liveline.emulatorChannelsPort, --emulator-channels-port)"),
                ("127.0.0.1", configuration.fcmEmulatorPort, "the FCM emulator (liveline.fcmEmulatorPort, --fcm-emulator-port)"),
                ("127.0.0.1", configuration.fcmEmulatorControlPort, "the FCM emulator's control API (liveline.fcmEmulatorControlPort, --fcm-emulator-control-port)"),
            ]
        }
        return ports.filter { $0.1 != 0 }.map { (host: $0.0, port: $0.1, owner: $0.2) }
    }

    /// Throws ``Busy`` for the first planned port another process listens on, or one given twice.
    static func checkFree(_ configuration: LivelineConfiguration) throws {
        var seen: [Int: String] = [:]
        for planned in planned(configuration) {
            if let other = seen[planned.port] {
                throw Busy(description: "Port \(planned.port) is given to both \(other) and \(planned.owner).")
            }
            seen[planned.port] = planned.owner
            if inUse(host: planned.host, port: planned.port) {
                throw Busy(description: "Cannot listen on \(planned.host):\(planned.port) for \(planned.owner): another process is listening there. Stop it, or choose another port.")
            }
        }
    }

    /// Whether binding `host:port` fails with "address in use" now (an IPv4 literal host; others are left to the bind
    /// itself). `SO_REUSEADDR`, as the server's own sockets: a port in TIME_WAIT is free to them.
    static func inUse(host: String, port: Int) -> Bool {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { return false }
        address.sin_port = UInt16(port).bigEndian
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return bound != 0 && errno == EADDRINUSE
    }
}
