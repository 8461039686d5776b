import Foundation
import Logging
import NIOCore
import PostgresNIO

/// Wake-ups between the nodes that share a PostgreSQL database, over `LISTEN` / `NOTIFY` on the channel
/// `liveline_wake`: an update accepted on node A is sent at once by whichever node's engine is free.
///
/// A node ``announce()``s after it committed work for the engines (the API calls it beside waking its own engine);
/// announcements made while one is being sent are folded into the next, so a burst of writes costs a few `NOTIFY`s,
/// not one each, and no write's commit carries one (a `NOTIFY` inside a writing transaction would serialize the
/// server's commits). Every node hears each announcement, this one too, and is told whose it was: an announcement
/// carries its node's id.
public final class NodeWakeChannel: Sendable {
    /// The `LISTEN` / `NOTIFY` channel.
    static let channel = "liveline_wake"

    /// Whose announcement was heard.
    public enum Announcer: Sendable, Hashable {
        /// This node's own: whatever it committed woke its own engines when it was committed.
        case thisNode
        /// Another node's, or any node's while this one was not listening (heard after a reconnection).
        case anotherNode
    }

    /// This node's announcements' payload, which tells them apart from the other nodes'.
    private let nodeID = UUID().uuidString.lowercased()

    private let url: PostgresDatabaseURL
    private let logger: Logger
    private let announcements: AsyncStream<Void>
    private let announcer: AsyncStream<Void>.Continuation

    init(url: PostgresDatabaseURL, logger: Logger) {
        self.url = url
        self.logger = logger
        (announcements, announcer) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Tells every node (this one too) that work was committed. Returns at once.
    public func announce() {
        announcer.yield()
    }

    /// Listens and sends announcements until cancelled, calling `onWake` for each announcement heard, with whose it
    /// was; reconnects (after a second) when the connection is lost, and calls `onWake(.anotherNode)` then. Run it
    /// once per process.
    public func run(onWake: @escaping @Sendable (Announcer) -> Void) async {
        var id = 0
        while !Task.isCancelled {
            id += 1
            do {
                let connection = try await PostgresConnection.connect(configuration: try url.configuration(), id: id, logger: logger)
                do {
                    try await serve(on: connection, onWake: onWake)
                } catch {
                    try? await connection.close()
                    throw error
                }
                try? await connection.close()
            } catch {
                if Task.isCancelled { return }
                logger.warning("Wake-ups between nodes lost their connection; reconnecting", metadata: ["error": "\(String(reflecting: error))"])
                try? await Task.sleep(for: .seconds(1))
            }
            // Whatever happened while disconnected: look for work at once.
            onWake(.anotherNode)
        }
    }

    private func serve(on connection: PostgresConnection, onWake: @escaping @Sendable (Announcer) -> Void) async throws {
        let logger = self.logger
        let announcements = self.announcements
        let nodeID = self.nodeID
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for try await notification in try await connection.listen(Self.channel) {
                    onWake(notification.payload == nodeID ? .thisNode : .anotherNode)
                }
            }
            group.addTask {
                for await _ in announcements {
                    try await connection.query("SELECT pg_notify('liveline_wake', \(nodeID))", logger: logger)
                }
            }
            // Either ends only when the connection fails (or the task is cancelled): then both go.
            try await group.next()
            group.cancelAll()
        }
    }
}
