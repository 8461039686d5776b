import Foundation
import LivelineServer
import Testing

/// Which requests keep their connection open (RFC 9112, section 9.3), over real sockets.
@Suite("Persistent connections over real sockets")
struct ConnectionPersistenceTests {
    static let limits = ConnectionLimits(headerTimeout: .seconds(30), bodyTimeout: .seconds(30), idleTimeout: .seconds(30))
    static let health = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"

    @Test(
        "a request that does not keep the connection is answered with Connection: close, then the connection is closed and nothing pipelined after it is answered",
        arguments: [
            "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n",
            "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive, Close\r\n\r\n",
        ]
    )
    func closesAfterTheAnswer(request: String) async throws {
        try await withServer(Self.limits) { port, _ in
            let connection = try await RawConnection.open(port: port)
            try await connection.send(request + Self.health)
            try await connection.waitForAnswers(1)
            #expect(try await connection.closed(within: .seconds(20)) != nil, "the connection stayed open")
            let received = connection.received
            #expect(received.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(received)")
            #expect(received.lowercased().contains("\r\nconnection: close\r\n"), "\(received)")
            #expect(received.components(separatedBy: "HTTP/1.1 ").count - 1 == 1, "the pipelined request was answered: \(received)")
        }
    }

    @Test("a CONNECT (a tunnel no route makes) is refused, and the connection closed after the answer, which has no body")
    func connect() async throws {
        try await withServer(Self.limits) { port, _ in
            for target in ["127.0.0.1:9", "/admin/v1/apps"] {
                let connection = try await RawConnection.open(port: port)
                try await connection.send("CONNECT \(target) HTTP/1.1\r\nHost: localhost\r\n\r\n" + Self.health)
                #expect(try await connection.closed(within: .seconds(20)) != nil, "the connection stayed open")
                let received = connection.received
                #expect(received.hasPrefix("HTTP/1.1 404 ") || received.hasPrefix("HTTP/1.1 405 "), "\(received)")
                #expect(received.lowercased().contains("\r\nconnection: close\r\n"), "\(received)")
                #expect(received.components(separatedBy: "HTTP/1.1 ").count - 1 == 1, "the pipelined request was answered: \(received)")
            }
        }
    }

    @Test("a body announced over the limit is refused with 413 at once, not after the body timeout")
    func announcedTooLarge() async throws {
        try await withServer(Self.limits) { port, app in
            let connection = try await RawConnection.open(port: port)
            let started = ContinuousClock.now
            try await connection.send(
                "POST /v1/activities/o1/updates HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(app.secretKey)\r\n"
                    + "Content-Type: application/json\r\nContent-Length: 99999999\r\n\r\n{"
            )
            try await connection.waitForAnswers(1)
            #expect(started.duration(to: .now) < .seconds(20), "answered before the 30 s body timeout")
            let received = connection.received
            #expect(received.hasPrefix("HTTP/1.1 413 "), "\(received)")
            #expect(received.contains(#""code":"body_too_large""#), "\(received)")
        }
    }

    @Test(
        "an HTTP/1.0 request with keep-alive, and an HTTP/1.1 request, keep the connection open for the next",
        arguments: ["GET /healthz HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n", health]
    )
    func keepsTheConnection(request: String) async throws {
        try await withServer(Self.limits) { port, _ in
            let connection = try await RawConnection.open(port: port)
            try await connection.send(request)
            try await connection.waitForAnswers(1)
            try await connection.send(Self.health)
            try await connection.waitForAnswers(2)
            #expect(!connection.received.lowercased().contains("connection: close"), "\(connection.received)")
            #expect(connection.isOpen)
        }
    }
}
