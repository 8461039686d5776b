import Foundation
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("The SQLite database file")
struct DatabaseFileTests {
    @Test("created readable by its owner alone, and so are its WAL and shared-memory files; an existing file keeps its permissions")
    func createdPrivately() async throws {
        try await withTemporaryDirectory(prefix: "liveline-database-file") { root in
            let path = root.appendingPathComponent("liveline.sqlite").path
            let store = try await SQLStore.open(path: path)
            // A write, so the WAL has frames and the shared memory is in use.
            try await store.createApp(AppRecord(id: "app_file", name: "File", bundleID: "com.example.file", androidPackage: nil, createdAt: Date()), keys: [])
            for file in [path, path + "-wal", path + "-shm"] {
                let permissions = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
                #expect(permissions == 0o600, "\(file): \(String(permissions ?? 0, radix: 8))")
            }
            try await store.close()

            // An operator's own choice for an existing file stands.
            let shared = root.appendingPathComponent("shared.sqlite").path
            #expect(FileManager.default.createFile(atPath: shared, contents: nil, attributes: [.posixPermissions: 0o640]))
            let other = try await SQLStore.open(path: shared)
            try await other.close()
            #expect(try FileManager.default.attributesOfItem(atPath: shared)[.posixPermissions] as? Int == 0o640)
        }
    }
}
