import Foundation
import Logging
import ServiceLifecycle

/// Keeps an emulator's simulated phones in a JSON file in its data directory, so a restarted emulator shows every
/// phone as it was.
///
/// Changes are signalled with ``markChanged()``; the file is written (to a temporary file, then renamed over the old
/// one) at most once per ``debounce``, and once more at shutdown. Runs as a `Service` beside the control API.
final class PhoneFile: Service, Sendable {
    /// The file's path.
    let path: String
    /// The longest a change waits before it is written.
    let debounce: Duration
    private let encode: @Sendable () throws -> Data
    private let logger: Logger
    private let changes: ChangeSignal

    init(
        path: String, changes: ChangeSignal, debounce: Duration = .milliseconds(200), logger: Logger,
        encode: @escaping @Sendable () throws -> Data
    ) {
        self.path = path
        self.debounce = debounce
        self.encode = encode
        self.logger = logger
        self.changes = changes
    }

    /// Writes the file now (atomically: a temporary file renamed over the old one).
    func save() {
        do {
            let data = try encode()
            let url = URL(fileURLWithPath: path)
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try data.write(to: url, options: .atomic)
        } catch {
            logger.error("Could not save the simulated phones", metadata: ["path": "\(path)", "error": "\(error)"])
        }
    }

    /// The phone file `fileName` in `directory`, its phones already handed to `load`, or `nil` when phones are not kept.
    static func open(
        fileName: String, in directory: String, persists: Bool, changes: ChangeSignal, logger: Logger,
        load: (Data) throws -> Void, encode: @escaping @Sendable () throws -> Data
    ) throws -> PhoneFile? {
        guard persists else { return nil }
        let path = (directory as NSString).appendingPathComponent(fileName)
        if let data = try read(path) { try load(data) }
        return PhoneFile(path: path, changes: changes, logger: logger, encode: encode)
    }

    /// The file's contents, or `nil` when there is no file yet.
    static func read(_ path: String) throws -> Data? {
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        return try Data(contentsOf: URL(fileURLWithPath: path))
    }

    func run() async {
        for await _ in changes.stream.cancelOnGracefulShutdown() {
            try? await Task.sleep(for: debounce)
            save()
        }
        save()
    }
}

/// "Something changed", coalesced: many marks before the reader looks count as one.
final class ChangeSignal: Sendable {
    let stream: AsyncStream<Void>
    private let continuation: AsyncStream<Void>.Continuation

    init() {
        let made = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        stream = made.stream
        continuation = made.continuation
    }

    func mark() {
        continuation.yield()
    }
}
