import Dispatch
import LivelineTestSupport
import NIOPosix
import Testing

@testable import LivelineStore

/// Where the Store's connections to PostgreSQL do their I/O: `liveline serve` runs the delivery engine on NIO's shared
/// event loops at a lower priority, and the API's reads and writes must not wait behind it.
@Suite("PostgreSQL connections' event loops", .enabled(if: PostgresTestServer.url != nil, "LIVELINE_TEST_POSTGRES_URL is not set"))
struct PostgresEventLoopTests {
    @Test("writes and reads are answered while every thread of NIO's shared event loops is busy")
    func notOnTheSharedEventLoops() async throws {
        try await withTemporaryPostgresPool(count: 1) { pool, _ in
            _ = try await pool.write(durability: .full) { db in try db.query("CREATE TABLE t (k BIGINT NOT NULL)") }
            // Each thread of the shared group held, as the engine's work holds them during a fan-out (here for good,
            // until the write and the read are answered or 10 s have passed).
            let loops = Array(MultiThreadedEventLoopGroup.singleton.makeIterator())
            let held = DispatchSemaphore(value: 0)
            for loop in loops { loop.execute { held.wait() } }
            let answered = await withTaskGroup(of: Bool.self) { group in
                group.addTask {
                    do {
                        _ = try await pool.write(durability: .full) { db in try db.query("INSERT INTO t (k) VALUES (1)") }
                        return try await pool.read { db in try db.query("SELECT k FROM t") }.count == 1
                    } catch {
                        return false
                    }
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(10))
                    return false
                }
                let first = await group.next() ?? false
                for _ in loops { held.signal() }
                group.cancelAll()
                return first
            }
            #expect(answered, "the Store's write and read waited for NIO's shared event loops")
        }
    }
}
