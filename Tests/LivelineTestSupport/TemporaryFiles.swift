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

/// A database the Store runs on, for tests that run on each.
public enum StoreKind: String, CaseIterable, Sendable, CustomStringConvertible {
    case sqlite
    case postgres

    /// The kinds this run can test: SQLite always; PostgreSQL when `LIVELINE_TEST_POSTGRES_URL` names a server (CI
    /// starts one, and a test fails there when it is missing).
    public static var available: [StoreKind] {
        PostgresTestServer.url == nil ? [.sqlite] : [.sqlite, .postgres]
    }

    public var description: String { rawValue }

    /// The store the end-to-end tests run on: `LIVELINE_TEST_STORE` (`sqlite`, the default, or `postgres`, which
    /// needs `LIVELINE_TEST_POSTGRES_URL`).
    public static var underTest: StoreKind {
        StoreKind(rawValue: ProcessInfo.processInfo.environment["LIVELINE_TEST_STORE"] ?? "") ?? .sqlite
    }
}

/// Runs `body` with a fresh store of `kind` (a SQLite file in a temporary directory of its own, or a new database on
/// the test PostgreSQL server) and where it is (the file's path, or the database's URL); closes the store and removes
/// its directory or database afterwards, whether `body` returns or throws.
public func withTemporaryStore<T>(
    _ kind: StoreKind = .sqlite, prefix: String = "liveline-store", _ body: (SQLStore, String) async throws -> T
) async throws -> T {
    switch kind {
    case .sqlite:
        return try await withTemporaryDirectory(prefix: prefix) { directory in
            let path = directory.appendingPathComponent("liveline.sqlite").path
            return try await withOpen(try await SQLStore.open(path: path), at: path, body)
        }
    case .postgres:
        return try await withTemporaryPostgresDatabase { url in
            // Small pools: many tests run at once against one server.
            try await withOpen(try await SQLStore.open(postgres: try PostgresDatabaseURL(url), writers: 3, readers: 2), at: url, body)
        }
    }
}

private func withOpen<T>(_ store: SQLStore, at location: String, _ body: (SQLStore, String) async throws -> T) async throws -> T {
    do {
        let result = try await body(store, location)
        try await store.close()
        return result
    } catch {
        try? await store.close()
        throw error
    }
}
