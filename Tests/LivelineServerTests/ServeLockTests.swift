import Foundation
import LivelineServer
import LivelineTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("One liveline serve on a SQLite database")
struct ServeLockTests {
    /// Polls `condition` every 50 ms until it holds or `timeout` passes; returns whether it held.
    private func waitFor(timeout: Duration, _ condition: () -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try await Task.sleep(for: .milliseconds(50))
        }
        return condition()
    }

    @Test("the lock is taken once: a second taker is refused with the holder's pid, and takes it once it is let go")
    func lockInProcess() throws {
        let root = uniqueTemporaryURL(prefix: "liveline-lock")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let database = root.appendingPathComponent("liveline.sqlite").path
        let first = try ServeLock.acquire(databasePath: database)
        // flock belongs to the open file: a second open in the same process is refused as another process would be.
        #expect {
            _ = try ServeLock.acquire(databasePath: database)
        } throws: { error in
            "\(error)".contains("Another `liveline serve` (pid \(getpid()))") && "\(error)".contains(database)
        }
        first.release()
        let again = try ServeLock.acquire(databasePath: database)
        again.release()
    }

    @Test("a second serve on the same SQLite file exits with an error naming the first; the first serves on; after it ends, a new one starts")
    func secondServeRefused() async throws {
        guard FileManager.default.isExecutableFile(atPath: livelineExecutable().path) else {
            Issue.record("Build the executable first (swift build --build-tests), or set LIVELINE_BINARY: \(livelineExecutable().path) is missing")
            return
        }
        let root = uniqueTemporaryURL(prefix: "liveline-lock")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        func serve(port: Int, output: String) throws -> ChildProcess {
            try runLiveline(
                ["serve", "--data-dir", root.path, "--port", "\(port)", "--no-emulator", "--log-level", "warning"],
                output: root.appendingPathComponent(output)
            )
        }
        let firstPort = freePort()
        let first = try serve(port: firstPort, output: "first.log")
        defer { first.signal(SIGKILL) }
        #expect(try await waitFor(timeout: .seconds(60)) { acceptsConnections(firstPort) })

        let second = try serve(port: freePort(), output: "second.log")
        defer { second.signal(SIGKILL) }
        #expect(try await waitFor(timeout: .seconds(60)) { !second.isRunning }, "the second server is still running")
        #expect(second.terminationStatus != 0)
        let printed = (try? String(contentsOf: root.appendingPathComponent("second.log"), encoding: .utf8)) ?? ""
        #expect(printed.contains("Another `liveline serve` (pid \(first.processIdentifier))"), "\(printed)")
        #expect(acceptsConnections(firstPort))

        first.terminate()
        first.waitUntilExit()
        let thirdPort = freePort()
        let third = try serve(port: thirdPort, output: "third.log")
        defer { third.signal(SIGKILL) }
        #expect(try await waitFor(timeout: .seconds(60)) { acceptsConnections(thirdPort) })
        third.terminate()
        third.waitUntilExit()
    }
}
