import Foundation
import LivelineServer
import Testing

/// `Expect: 100-continue` over real sockets: the interim answer comes at once, only where it is owed, and never inside
/// another answer.
@Suite("Expect: 100-continue over real sockets")
struct ExpectContinueTests {
    static let limits = ConnectionLimits(headerTimeout: .seconds(30), bodyTimeout: .seconds(30), idleTimeout: .seconds(30))

    static func update(_ secretKey: String, version: String = "1.1", expect: String? = "100-continue") -> (head: String, body: String) {
        let body = #"{"contentState": {"eta": 5}}"#
        let head =
            "POST /v1/activities/o1/updates HTTP/\(version)\r\nHost: localhost\r\nAuthorization: Bearer \(secretKey)\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n" + (expect.map { "Expect: \($0)\r\n" } ?? "") + "\r\n"
        return (head, body)
    }

    /// Waits (up to 20 s) until the server has sent `text`.
    static func waitUntil(_ connection: RawConnection, received text: String) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(20)
        while !connection.received.contains(text) {
            guard ContinuousClock.now < deadline else { return false }
            try await Task.sleep(for: .milliseconds(10))
        }
        return true
    }

    @Test("a client that expects 100-continue gets it before it sends the body, then the answer")
    func continues() async throws {
        try await withServer(Self.limits) { port, app in
            let connection = try await RawConnection.open(port: port)
            let request = Self.update(app.secretKey, expect: "100-Continue")
            try await connection.send(request.head)
            #expect(try await Self.waitUntil(connection, received: "HTTP/1.1 100 Continue\r\n\r\n"), "\(connection.received)")
            #expect(!connection.received.contains("202"))
            try await connection.send(request.body)
            try await connection.waitForAnswers(2)
            #expect(connection.received.hasPrefix("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\n"), "\(connection.received)")
            #expect(connection.isOpen)
        }
    }

    @Test("no 100 Continue for an HTTP/1.0 request or one that does not ask for it")
    func onlyWhenOwed() async throws {
        try await withServer(Self.limits) { port, app in
            for request in [Self.update(app.secretKey, version: "1.0"), Self.update(app.secretKey, expect: nil)] {
                let connection = try await RawConnection.open(port: port)
                try await connection.send(request.head + request.body)
                #expect(try await Self.waitUntil(connection, received: "202 Accepted"), "\(connection.received)")
                #expect(!connection.received.contains("100 Continue"), "\(connection.received)")
            }
        }
    }

    @Test("behind a pipelined request, the 100 Continue waits for the whole answer before it")
    func pipelined() async throws {
        try await withServer(Self.limits) { port, app in
            let connection = try await RawConnection.open(port: port)
            let request = Self.update(app.secretKey)
            try await connection.send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n" + request.head)
            #expect(try await Self.waitUntil(connection, received: "100 Continue"), "\(connection.received)")
            let answers = connection.received
            #expect(answers.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(answers)")
            #expect(answers.hasSuffix(#"{"status":"ok"}HTTP/1.1 100 Continue\#r\#n\#r\#n"#), "\(answers)")
            try await connection.send(request.body)
            #expect(try await Self.waitUntil(connection, received: "202 Accepted"), "\(connection.received)")
        }
    }
}
