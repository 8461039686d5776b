import LivelineCore
import NIOCore
import NIOPosix

/// An answer from the control API.
struct ControlResponse: Sendable {
    var status: Int
    var body: [UInt8]
    var json: JSONValue? { try? JSONValue(parsing: body) }
    var errorCode: String? { json?.objectValue?["error"]?.objectValue?["code"]?.stringValue }
    var errorField: String? { json?.objectValue?["error"]?.objectValue?["field"]?.stringValue }
}

/// A one-request-per-connection HTTP/1.1 client for the control API (`Connection: close`, the
/// answer is read to the end of the stream).
func controlRequest(port: Int, _ method: String, _ path: String, body: String? = nil) async throws -> ControlResponse {
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            }
        }
    return try await channel.executeThenClose { inbound, outbound in
        var request = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
        if let body {
            request += "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        } else {
            request += "Content-Length: 0\r\n\r\n"
        }
        try await outbound.write(ByteBuffer(string: request))
        var received: [UInt8] = []
        for try await buffer in inbound { received.append(contentsOf: buffer.readableBytesView) }
        return try parseHTTP1Response(received)
    }
}

struct MalformedHTTPResponse: Error {}

private func parseHTTP1Response(_ bytes: [UInt8]) throws -> ControlResponse {
    let separator: [UInt8] = [13, 10, 13, 10]
    guard let headEnd = (0..<max(0, bytes.count - 3)).first(where: { Array(bytes[$0..<$0 + 4]) == separator }) else {
        throw MalformedHTTPResponse()
    }
    let head = String(decoding: bytes[..<headEnd], as: UTF8.self)
    let statusLine = head.split(separator: "\r\n").first ?? ""
    let parts = statusLine.split(separator: " ")
    guard parts.count >= 2, let status = Int(parts[1]) else { throw MalformedHTTPResponse() }
    var body = Array(bytes[(headEnd + 4)...])
    let isChunked = head.lowercased().contains("transfer-encoding: chunked")
    if isChunked { body = try dechunk(body) }
    return ControlResponse(status: status, body: body)
}

private func dechunk(_ bytes: [UInt8]) throws -> [UInt8] {
    var out: [UInt8] = []
    var index = 0
    while index < bytes.count {
        guard let lineEnd = (index..<bytes.count - 1).first(where: { bytes[$0] == 13 && bytes[$0 + 1] == 10 }),
            let size = Int(String(decoding: bytes[index..<lineEnd], as: UTF8.self), radix: 16)
        else { throw MalformedHTTPResponse() }
        if size == 0 { break }
        out.append(contentsOf: bytes[(lineEnd + 2)..<(lineEnd + 2 + size)])
        index = lineEnd + 2 + size + 2
    }
    return out
}
