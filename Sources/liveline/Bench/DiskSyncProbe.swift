import Foundation
import LivelineCore
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The disk's own sync latency, measured beside a fan-out's side accepts: the reference for their tail, as h2load is
/// for the pushes' rate.
///
/// An accepted update is answered once its commit is synced to disk, so no accept can be quicker than the disk's
/// sync at that moment. On this kind of machine the disk alone, with nothing else running, took 0.3 ms for most syncs
/// and up to 93 ms for a few (2026-12-02); a round in which one of the server's syncs meets such a stall shows it in
/// the side accepts' p99. The probe writes a 4 KB block in place in a file of its own beside the server's data (a
/// block the file already has, as SQLite's WAL once it has reached its size) and times that write with its
/// `fdatasync`, a few times a second, on a thread of its own.
final class DiskSyncProbe: Sendable {
    /// The block written each time, and how many the file holds (written in turn).
    static let blockSize = 4096
    static let blocks = 256

    private let path: String
    private let descriptor: Int32
    private let interval: Duration
    private let state = Mutex(State())
    /// Signalled by the probe's thread as it ends.
    private let ended = DispatchSemaphore(value: 0)

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    private struct State {
        /// Each sync's time (the write and its `fdatasync`), in nanoseconds, since the last ``take()``.
        var latencies: [UInt64] = []
        /// Whether the thread was started, and whether it was asked to stop.
        var started = false
        var stopping = false
        /// The first failure, after which the probe stops.
        var failure: String?
    }

    /// Creates the probe's file in `directory`, at its full size and synced, so that every timed write lands in
    /// blocks the file already has; `perSecond` syncs a second once started.
    init(directory: URL, perSecond: Int) throws {
        precondition(perSecond > 0, "a probe syncs at least once a second")
        path = directory.appendingPathComponent("disk-sync-probe").path
        descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw Failure(description: "Could not create \(path): \(String(cString: strerror(errno))).") }
        interval = .seconds(1) / perSecond
        let zeros = [UInt8](repeating: 0, count: Self.blockSize * Self.blocks)
        let written = zeros.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        guard written == zeros.count, fsync(descriptor) == 0 else {
            let reason = String(cString: strerror(errno))
            _ = close(descriptor)
            throw Failure(description: "Could not prepare \(path): \(reason).")
        }
    }

    /// A probe syncing `perSecond` times a second in `directory`, started; nil when `perSecond` is 0 (the benches'
    /// `--disk-syncs 0`). The caller stops it.
    static func started(in directory: URL, perSecond: Int) throws -> DiskSyncProbe? {
        guard perSecond > 0 else { return nil }
        let probe = try DiskSyncProbe(directory: directory, perSecond: perSecond)
        probe.start()
        return probe
    }

    /// Starts syncing on a thread of its own, until ``stop()``; once at most.
    func start() {
        let first = state.withLock { state in
            defer { state.started = true }
            return !state.started && !state.stopping
        }
        guard first else { return }
        let thread = Thread { [self] in
            run()
            ended.signal()
        }
        thread.name = "disk-sync-probe"
        thread.start()
    }

    /// The syncs' times since the last call, in nanoseconds, in the order they were taken; throws if the probe
    /// failed (and stopped).
    func take() throws -> [UInt64] {
        let (latencies, failure) = state.withLock { state in
            defer { state.latencies = [] }
            return (state.latencies, state.failure)
        }
        if let failure { throw Failure(description: "The disk sync probe failed: \(failure).") }
        return latencies
    }

    /// Stops the probe's thread, waits for it, and removes its file; once at most.
    func stop() {
        let (first, started) = state.withLock { state in
            defer { state.stopping = true }
            return (!state.stopping, state.started)
        }
        guard first else { return }
        if started { ended.wait() }
        _ = close(descriptor)
        _ = unlink(path)
    }

    /// On the probe's thread: a block written and synced every `interval`, starting again from the next interval
    /// when a sync ran past it (a slow sync delays the next, it never brings on a burst).
    private func run() {
        var block = [UInt8](repeating: 0, count: Self.blockSize)
        var next = ContinuousClock.now
        var count = 0
        while !state.withLock({ $0.stopping }) {
            count += 1
            // A different block each time, with different contents.
            withUnsafeBytes(of: UInt64(count)) { bytes in block.replaceSubrange(0..<8, with: bytes) }
            let offset = off_t((count % Self.blocks) * Self.blockSize)
            let started = DispatchTime.now().uptimeNanoseconds
            let written = block.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, offset) }
            guard written == Self.blockSize, fdatasync(descriptor) == 0 else {
                let reason = String(cString: strerror(errno))
                state.withLock { $0.failure = $0.failure ?? reason }
                return
            }
            let took = DispatchTime.now().uptimeNanoseconds - started
            state.withLock { $0.latencies.append(took) }
            next = Swift.max(next + interval, ContinuousClock.now)
            let wait = next - ContinuousClock.now
            if wait > .zero { Thread.sleep(forTimeInterval: wait.seconds) }
        }
    }
}
