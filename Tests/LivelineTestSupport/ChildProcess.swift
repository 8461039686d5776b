import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A child process started with `posix_spawn`, for the tests that run `liveline` (or another program) beside them.
///
/// Not Foundation's `Process`: on Linux its `run()` lists `/proc/self/fd` with a 256-byte copy of each directory entry,
/// which reads past the end of glibc's buffer when an entry sits at its end and the next page is unmapped, and the
/// test process dies of a bad pointer dereference (swift-corelibs-foundation pull request 5472, after Swift 6.3.1).
/// A suite that starts many processes while holding many sockets met it (`KitEndToEndTests`, 2026-11-26).
///
/// The child gets `/dev/null` (or the given bytes, through a pipe) on its standard input, the output file (created or
/// emptied) on its standard output and error, and no other descriptor of this process.
public final class ChildProcess: Sendable {
    /// The child's process id.
    public let processIdentifier: pid_t
    /// nil while it runs; its `waitpid` status once it has exited and been reaped.
    private let exitStatus = Mutex<Int32?>(nil)

    /// Starts `executable` with `arguments` and `environment` (the whole environment, not laid over this process's),
    /// writing both its output streams to `output` (nothing when nil), and, when `input` is given, writing it to the
    /// child's standard input and closing that.
    public init(executable: URL, arguments: [String], environment: [String: String], output: URL?, input: [UInt8]? = nil) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var pipeEnds: [Int32] = [-1, -1]
        if input != nil {
            guard pipe(&pipeEnds) == 0 else { throw ChildProcessError(call: "pipe", errno: errno) }
            for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
            posix_spawn_file_actions_adddup2(&actions, pipeEnds[0], 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        posix_spawn_file_actions_addopen(&actions, 1, output?.path ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Sockets, files and pipes of the test process stay out of the child (glibc 2.34 and later; before, only those
        // opened close-on-exec, as NIO's sockets and SQLite's files are).
        if let closeFrom = Self.closeFrom { _ = closeFrom(&actions, 3) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // A process group of its own, as Foundation's Process gives it: a signal to the tests' group does not reach it.
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
        posix_spawnattr_setpgroup(&attributes, 0)

        let argv = ([executable.path] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable.path, &actions, &attributes, argv, envp)
        if input != nil { close(pipeEnds[0]) }
        guard spawned == 0 else {
            if input != nil { close(pipeEnds[1]) }
            throw ChildProcessError(call: "posix_spawn \(executable.path)", errno: spawned)
        }
        processIdentifier = pid
        if let input {
            var written = 0
            while written < input.count {
                let count = input[written...].withUnsafeBytes { write(pipeEnds[1], $0.baseAddress, $0.count) }
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { break }
                written += count
            }
            close(pipeEnds[1])
        }
    }

    /// Starts `executable` with `arguments`, and `environment` laid over this process's.
    public convenience init(executable: URL, arguments: [String], environment: [String: String] = [:], output: URL?) throws {
        try self.init(
            executable: executable, arguments: arguments,
            environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, output: output, input: nil
        )
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np`, which Swift's Glibc module does not declare.
    private static let closeFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

    /// Whether the child is still running (one that has exited is reaped here).
    public var isRunning: Bool {
        exitStatus.withLock { status in
            guard status == nil else { return false }
            var raw: Int32 = 0
            let reaped = waitpid(processIdentifier, &raw, WNOHANG)
            if reaped == processIdentifier {
                status = raw
            } else if reaped < 0, errno != EINTR {
                // Not a child of ours any more: nothing to wait for.
                status = 0
            }
            return status == nil
        }
    }

    /// Sends SIGTERM.
    public func terminate() {
        signal(SIGTERM)
    }

    /// Sends `number` to the child, unless it has been reaped already (its id may be another process's by then).
    public func signal(_ number: Int32) {
        exitStatus.withLock { status in
            if status == nil { _ = kill(processIdentifier, number) }
        }
    }

    /// Blocks until the child has exited.
    public func waitUntilExit() {
        while isRunning { usleep(5_000) }
    }

    /// Its exit code, or the number of the signal that ended it (as Foundation's `Process` reports it); 0 while it
    /// runs.
    public var terminationStatus: Int32 {
        guard let raw = exitStatus.withLock({ $0 }) else { return 0 }
        let signal = raw & 0x7f
        return signal == 0 ? (raw >> 8) & 0xff : signal
    }
}

/// A call that starts a child process failed.
public struct ChildProcessError: Error, CustomStringConvertible {
    public var call: String
    public var errno: Int32
    public var description: String { "\(call) failed: \(String(cString: strerror(errno)))" }
}
