import Foundation
import LivelineStore

/// A path in the system's temporary directory that nothing uses yet: `<prefix>-<UUID>`. Nothing is created there.
public func uniqueTemporaryURL(prefix: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)")
}

/// Runs `body` with a new, empty temporary directory, and removes the directory and everything in it afterwards,
/// whether `body` returns or throws.
public func withTemporaryDirectory<T>(prefix: String, _ body: (URL) async throws -> T) async throws -> T {
    let directory = uniqueTemporaryURL(prefix: prefix)
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    return try await body(directory)
}

/// Runs `body` with a fresh SQLite store in a temporary directory of its own, and the store file's path; closes the
/// store and removes the directory afterwards, whether `body` returns or throws.
public func withTemporaryStore<T>(
    prefix: String = "liveline-store", _ body: (SQLStore, String) async throws -> T
) async throws -> T {
    try await withTemporaryDirectory(prefix: prefix) { directory in
        let path = directory.appendingPathComponent("liveline.sqlite").path
        let store = try await SQLStore.open(path: path)
        do {
            let result = try await body(store, path)
            try await store.close()
            return result
        } catch {
            try? await store.close()
            throw error
        }
    }
}
