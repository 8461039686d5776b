import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization

/// Wake-ups between the nodes that share a PostgreSQL database, over `LISTEN` / `NOTIFY` on the channel
/// `liveline_wake`: an update accepted on node A is sent at once by whichever node's engine is free.
///
/// A node ``announce()``s after it committed work for the engines (the API calls it beside waking its own engine);
/// announcements made while one is being sent are folded into the next, so a burst of writes costs a few `NOTIFY`s,
/// not one each, and no write's commit carries one (a `NOTIFY` inside a writing transaction would serialize the
/// server's commits). Every node hears each announcement, this one too, and is told whose it was: an announcement
/// carries its node's id.
///
/// The same connection listens for the ``AppNotice``s the Store sends on `liveline_apps` (keys revoked, an app deleted).
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
    /// The current connection's announcements to send, and whether one was made while there was none (it is sent
    /// on the next). Each connection has a stream of its own: a stream's consumer cancelled when its connection was
    /// lost ends the stream for good, and a single stream kept for the process then sent nothing ever again.
    private let outbox = Mutex<(announcer: AsyncStream<Void>.Continuation?, missed: Bool)>((nil, false))

    init(url: PostgresDatabaseURL, logger: Logger) {
        self.url = url
        self.logger = logger
    }

    /// Tells every node (this one too) that work was committed. Returns at once.
    public func announce() {
        outbox.withLock { outbox in
            if let announcer = outbox.announcer { announcer.yield() } else { outbox.missed = true }
        }
    }

    /// A new stream of announcements for a new connection (with one waiting if any was made meanwhile); `finish` ends
    /// it, and announcements wait for the next one.
    private func openAnnouncements() -> (AsyncStream<Void>, finish: @Sendable () -> Void) {
        let (stream, announcer) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        outbox.withLock { outbox in
            outbox.announcer = announcer
            if outbox.missed {
                outbox.missed = false
                announcer.yield()
            }
        }
        return (stream, { [self] in
            outbox.withLock { $0.announcer = nil }
            announcer.finish()
        })
    }

    /// The connection ended without an error.
    struct ConnectionEnded: Error, CustomStringConvertible {
        var description: String { "the connection ended" }
    }

    /// Listens and sends announcements until cancelled, calling `onWake` for each announcement heard, with whose it
    /// was, and `onAppNotice` for each ``AppNotice`` the Store sent (from any node, this one too); reconnects (after a
    /// second) when the connection is lost, and calls `onWake(.anotherNode)` then, and `onAppNotice(.mayHaveMissed)`
    /// once the new connection listens again (a notice sent before that was not heard; one sent after it will be).
    /// Run it once per process.
    public func run(
        onWake: @escaping @Sendable (Announcer) -> Void, onAppNotice: @escaping @Sendable (AppNotice) -> Void = { _ in }
    ) async {
        var id = 0
        while !Task.isCancelled {
            id += 1
            do {
                let connection = try await PostgresConnection.connect(configuration: try url.configuration(), id: id, logger: logger)
                do {
                    try await serve(on: connection, reconnected: id > 1, onWake: onWake, onAppNotice: onAppNotice)
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

    private func serve(
        on connection: PostgresConnection, reconnected: Bool, onWake: @escaping @Sendable (Announcer) -> Void,
        onAppNotice: @escaping @Sendable (AppNotice) -> Void
    ) async throws {
        let logger = self.logger
        let (announcements, finish) = openAnnouncements()
        let lostAnswers = LostAnswers(connection)
        defer { finish() }
        let nodeID = self.nodeID
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await connection.listen(on: Self.channel) { notifications in
                    for try await notification in notifications {
                        onWake(notification.payload == nodeID ? .thisNode : .anotherNode)
                    }
                }
            }
            group.addTask {
                try await connection.listen(on: AppNotice.channel) { notices in
                    // Listening from here on: whatever was sent while this node was not is read again from the Store.
                    if reconnected { onAppNotice(.mayHaveMissed) }
                    for try await notification in notices {
                        if let notice = AppNotice(wire: notification.payload) { onAppNotice(notice) }
                    }
                }
            }
            group.addTask {
                for await _ in announcements {
                    // Not PostgresNIO's async query: one written after the connection closed would never return, and this
                    // group, waiting for it, would never reconnect (``LostAnswers``).
                    let notify: EventLoopFuture<PostgresQueryResult> = connection.query("SELECT pg_notify('liveline_wake', \(nodeID))", logger: logger)
                    _ = try await lostAnswers.guarding(notify).get()
                }
            }
            // Each ends only when the connection fails or ends (or the task is cancelled): then all go, and a
            // connection that ended without an error counts as lost (reconnected after a pause, not at once).
            try await group.next()
            group.cancelAll()
            if !Task.isCancelled { throw ConnectionEnded() }
        }
    }
}
