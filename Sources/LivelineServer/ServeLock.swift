#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// The one `liveline serve` on a SQLite database: an exclusive `flock` on `<database>.serve-lock`, held for the
/// process's life (the kernel lets go of it when the process ends, however it ends).
///
/// A second server on the same file is refused rather than left to run: on SQLite an engine starts by taking back every
/// claim on the database (those its own crash left), so it would take the running server's fan-outs from under it, and
/// every phone would get their pushes twice. One-shot commands (`liveline apps …`) take no lock: they run beside a
/// server, as the database allows. Nodes that share their work share a PostgreSQL database instead, where claims are
/// leased and no node takes back another's.
public final class ServeLock: Sendable {
    /// The lock file's path.
    public let path: String
    private let descriptor: Int32

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
    }

    /// The lock file of the SQLite database at `databasePath`.
    public static func lockPath(forDatabase databasePath: String) -> String { databasePath + ".serve-lock" }

    /// Takes the lock of the SQLite database at `databasePath`, or throws ``Refusal`` naming the process that holds it.
    public static func acquire(databasePath: String) throws -> ServeLock {
        let path = lockPath(forDatabase: databasePath)
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw Refusal("Cannot open the lock file \(path): \(String(cString: strerror(errno))).")
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let failure = errno
            var holder = ""
            var bytes = [UInt8](repeating: 0, count: 32)
            let count = pread(descriptor, &bytes, bytes.count, 0)
            if count > 0 { holder = String(decoding: bytes[0..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) }
            close(descriptor)
            guard failure == EWOULDBLOCK else {
                throw Refusal("Cannot lock \(path): \(String(cString: strerror(failure))).")
            }
            throw Refusal(
                "Another `liveline serve`\(holder.isEmpty ? "" : " (pid \(holder))") is running on the SQLite database \(databasePath): "
                    + "two servers on one SQLite file would take each other's deliveries and send them twice. Stop it first; "
                    + "for several nodes, share a PostgreSQL database (--database-url postgres://…)."
            )
        }
        // Who holds it, for the message a second server prints.
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(descriptor, 0)
        _ = pwrite(descriptor, pid, pid.count, 0)
        return ServeLock(path: path, descriptor: descriptor)
    }

    /// Lets go of the lock (also done by the kernel when the process ends).
    public func release() {
        close(descriptor)
    }

    /// Why the lock was not taken.
    public struct Refusal: Error, CustomStringConvertible {
        public var description: String
        init(_ description: String) { self.description = description }
    }
}
