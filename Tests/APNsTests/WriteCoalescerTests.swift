@testable import APNs
import NIOCore
import NIOEmbedded
import Testing

/// The bytes written between two flushes leave as one write (one `SSL_write`, so TLS records of up to 16 KB instead
/// of one a frame), in the order written, and nothing leaves before the flush.
@Suite("Writes between two flushes go out as one")
struct WriteCoalescerTests {
    static func channel() throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(WriteCoalescer())
        return channel
    }

    static func outbound(_ channel: EmbeddedChannel) throws -> [ByteBuffer] {
        var written: [ByteBuffer] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { written.append(buffer) }
        return written
    }

    @Test("frames written before a flush leave as one buffer, in order, and their promises succeed with it")
    func gathersUntilFlush() throws {
        let channel = try Self.channel()
        let first = channel.eventLoop.makePromise(of: Void.self)
        let second = channel.eventLoop.makePromise(of: Void.self)
        channel.write(ByteBuffer(string: "HEADERS"), promise: first)
        channel.write(ByteBuffer(string: "DATA-header"), promise: nil)
        channel.write(ByteBuffer(string: "payload"), promise: second)
        #expect(try Self.outbound(channel).isEmpty)
        channel.flush()
        #expect(try Self.outbound(channel) == [ByteBuffer(string: "HEADERSDATA-headerpayload")])
        try first.futureResult.wait()
        try second.futureResult.wait()

        // The next flush gathers anew.
        channel.write(ByteBuffer(string: "PING"), promise: nil)
        channel.flush()
        channel.flush()
        #expect(try Self.outbound(channel) == [ByteBuffer(string: "PING")])
        _ = try channel.finish()
    }

    @Test("a buffer of 16 KB or more is not copied: what was gathered before it leaves first, then it")
    func largeBufferPassesThrough() throws {
        let channel = try Self.channel()
        let large = ByteBuffer(repeating: 0x61, count: WriteCoalescer.passThroughSize)
        channel.write(ByteBuffer(string: "a"), promise: nil)
        channel.write(ByteBuffer(string: "b"), promise: nil)
        channel.write(large, promise: nil)
        channel.write(ByteBuffer(string: "c"), promise: nil)
        channel.flush()
        let written = try Self.outbound(channel)
        #expect(written == [ByteBuffer(string: "ab"), large, ByteBuffer(string: "c")])
        // The large buffer left as the very bytes written, not a copy of them.
        if written.count == 3 {
            let sent = written[1].withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
            let original = large.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
            #expect(sent == original)
        }
        _ = try channel.finish()
    }

    @Test("writes never flushed fail when the channel closes, as the channel's own unflushed writes do")
    func unflushedWritesFailOnClose() throws {
        let channel = try Self.channel()
        let promise = channel.eventLoop.makePromise(of: Void.self)
        channel.write(ByteBuffer(string: "never flushed"), promise: promise)
        try channel.close().wait()
        #expect(throws: ChannelError.ioOnClosedChannel) { try promise.futureResult.wait() }
        #expect(try Self.outbound(channel).isEmpty)
    }
}
