#if canImport(Glibc)
import Glibc
#endif
import Foundation
import LivelineServer
import LivelineTestSupport
import Testing

@testable import liveline

@Suite("serve's ports, checked before it starts")
struct ListeningPortsTests {
    /// A socket listening on 127.0.0.1 at a port the kernel picks; returns it and its port.
    private func listeningSocket() -> (fd: Int32, port: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        _ = listen(fd, 1)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return (fd, Int(UInt16(bigEndian: address.sin_port)))
    }

    @Test("a port another process listens on is named with what was to listen there; a port given twice too; free ones pass")
    func busyPortsNamed() throws {
        let (fd, busy) = listeningSocket()
        defer { close(fd) }
        // Six distinct free ports (the kernel could hand one out twice).
        var free: [Int] = []
        while free.count < 6 {
            let port = freePort()
            if port != busy, !free.contains(port) { free.append(port) }
        }
        var configuration = LivelineConfiguration()
        configuration.emulator = true
        configuration.port = free[0]
        configuration.emulatorPort = free[1]
        configuration.emulatorControlPort = free[2]
        configuration.emulatorChannelsPort = free[3]
        configuration.fcmEmulatorPort = free[4]
        configuration.fcmEmulatorControlPort = busy
        #expect {
            try ListeningPorts.checkFree(configuration)
        } throws: { error in
            "\(error)".contains("127.0.0.1:\(busy)") && "\(error)".contains("the FCM emulator's control API")
        }
        configuration.fcmEmulatorControlPort = configuration.emulatorPort
        #expect {
            try ListeningPorts.checkFree(configuration)
        } throws: { error in
            "\(error)".contains("Port \(configuration.emulatorPort) is given to both the APNs emulator")
        }
        configuration.fcmEmulatorControlPort = free[5]
        try ListeningPorts.checkFree(configuration)
        // Without the emulators only the API's port counts.
        configuration.emulator = false
        configuration.fcmEmulatorControlPort = busy
        try ListeningPorts.checkFree(configuration)
    }
}
