import Foundation
import LivelineStore
import LivelineTestSupport
import Testing

@Suite("The master key file")
struct MasterKeyFileTests {
    @Test("created readable by its owner alone, with nothing left beside it; read back the same; creators at once agree on one key")
    func createdPrivately() async throws {
        let root = uniqueTemporaryURL(prefix: "liveline-master")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let path = root.appendingPathComponent("master.key").path
        let key = try CredentialSealer.loadOrCreateMasterKey(at: path)
        #expect(key.count == 32)
        let permissions = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(permissions == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: root.path) == ["master.key"])
        #expect(try CredentialSealer.loadOrCreateMasterKey(at: path) == key)

        let racing = root.appendingPathComponent("racing.key").path
        let keys = try await withThrowingTaskGroup(of: [UInt8].self) { group in
            for _ in 0..<8 { group.addTask { try CredentialSealer.loadOrCreateMasterKey(at: racing) } }
            return try await group.reduce(into: [[UInt8]]()) { $0.append($1) }
        }
        #expect(Set(keys).count == 1)
    }
}
