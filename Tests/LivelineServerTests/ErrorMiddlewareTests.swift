import HTTPTypes
import Hummingbird
@testable import LivelineStore
import NIOCore
import Testing

@testable import LivelineServer

@Suite("Errors of the database as the API answers them")
struct ErrorMiddlewareTests {
    let request = Request(
        head: HTTPRequest(method: .post, scheme: "http", authority: "localhost", path: "/v1/activities/a/updates"),
        body: RequestBody(buffer: ByteBuffer())
    )

    @Test("a lost database connection is 503 database_unavailable; lost at the commit, the answer says it may be stored")
    func lostConnection() {
        let lost = PostgresFailure(sqlState: "57P01", message: "terminating connection due to administrator command", isConnectionLost: true)
        let beforeCommit = ErrorMiddleware<BasicRequestContext>.apiError(for: lost, request: request)
        #expect(beforeCommit.status == .serviceUnavailable && beforeCommit.code == "database_unavailable")
        #expect(beforeCommit.message.contains("nothing was stored"))
        let atCommit = ErrorMiddleware<BasicRequestContext>.apiError(for: PostgresFailure.commitUnknown(lost), request: request)
        #expect(atCommit.status == .serviceUnavailable && atCommit.code == "database_unavailable")
        #expect(atCommit.message.contains("may or may not have been stored"))
        #expect(!atCommit.message.contains("administrator"), "the database's own words stay in the log")
        let busy = ErrorMiddleware<BasicRequestContext>.apiError(for: PostgresFailure(sqlState: "40001", message: "x"), request: request)
        #expect(busy.status == .serviceUnavailable && busy.code == "database_busy")
    }
}
