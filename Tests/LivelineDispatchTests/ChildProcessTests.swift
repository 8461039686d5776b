import Foundation
import LivelineTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The tests' own process launcher (``ChildProcess``), which replaces Foundation's `Process` on Linux.
@Suite("Child processes of the tests")
struct ChildProcessTests {
    private let shell = URL(fileURLWithPath: "/bin/sh")

    @Test("exit codes, signals, standard input, and the output file")
    func statusInputOutput() throws {
        let exited = try ChildProcess(executable: shell, arguments: ["-c", "exit 7"], output: nil)
        exited.waitUntilExit()
        #expect(!exited.isRunning && exited.terminationStatus == 7)

        let sleeping = try ChildProcess(executable: shell, arguments: ["-c", "sleep 30"], output: nil)
        #expect(sleeping.isRunning)
        sleeping.signal(SIGKILL)
        sleeping.waitUntilExit()
        #expect(sleeping.terminationStatus == SIGKILL)

        let output = FileManager.default.temporaryDirectory.appendingPathComponent("child-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: output) }
        let echoing = try ChildProcess(
            executable: shell, arguments: ["-c", "tr a-z A-Z; echo err >&2"], environment: [:], output: output, input: Array("hello".utf8)
        )
        echoing.waitUntilExit()
        #expect(echoing.terminationStatus == 0)
        #expect(try String(contentsOf: output, encoding: .utf8) == "HELLOerr\n")
    }

    @Test("the child inherits no descriptor of the test process beyond its three streams")
    func noInheritedDescriptors() throws {
        // A descriptor open here, without close-on-exec.
        let held = open("/dev/null", O_RDONLY)
        defer { close(held) }
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("child-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: output) }
        let listing = try ChildProcess(executable: shell, arguments: ["-c", "ls /proc/$$/fd"], output: output)
        listing.waitUntilExit()
        let descriptors = try String(contentsOf: output, encoding: .utf8).split(separator: "\n").compactMap { Int32($0) }
        #expect(descriptors.contains(2))
        #expect(!descriptors.contains(held), "\(descriptors)")
        #expect(descriptors.allSatisfy { $0 <= 2 || $0 >= 10 }, "\(descriptors)")
    }
}
