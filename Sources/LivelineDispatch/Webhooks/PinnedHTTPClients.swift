import AsyncHTTPClient
import Foundation
import NIOConcurrencyHelpers

/// HTTP clients that connect a host name to one address chosen beforehand (AsyncHTTPClient's `dnsOverride`), so that a
/// webhook's request goes to the address its URL check saw, never to one the name resolves to a moment later (DNS
/// rebinding). The TLS server name and the `Host` header stay the name.
///
/// One client per (name, address), kept for the next deliveries to it (their connections are reused); past
/// `capacity`, the least recently used is closed once the attempts it may carry are over.
final class PinnedHTTPClients: Sendable {
    private struct Entry {
        var client: HTTPClient
        var lastUsed: UInt64
    }

    private let configuration: HTTPClient.Configuration
    private let capacity: Int
    /// How long after eviction a client is closed: the longest an attempt on it may still run.
    private let drain: Duration
    private let state = NIOLockedValueBox<(entries: [String: Entry], uses: UInt64, closed: Bool)>(([:], 0, false))

    init(configuration: HTTPClient.Configuration, capacity: Int = 32, drain: Duration) {
        self.configuration = configuration
        self.capacity = max(capacity, 1)
        self.drain = drain
    }

    /// The client that connects `host` to `address` (an IP address as text).
    func client(host: String, address: String) throws -> HTTPClient {
        let key = host + "|" + address
        let (client, evicted) = try state.withLockedValue { state -> (HTTPClient, HTTPClient?) in
            guard !state.closed else { throw WebhookSendError("the webhook deliverer is shut down") }
            state.uses += 1
            if var entry = state.entries[key] {
                entry.lastUsed = state.uses
                state.entries[key] = entry
                return (entry.client, nil)
            }
            var evicted: HTTPClient?
            if state.entries.count >= capacity, let oldest = state.entries.min(by: { $0.value.lastUsed < $1.value.lastUsed }) {
                evicted = oldest.value.client
                state.entries[oldest.key] = nil
            }
            var pinned = configuration
            pinned.dnsOverride = [host: address]
            let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: pinned)
            state.entries[key] = Entry(client: client, lastUsed: state.uses)
            return (client, evicted)
        }
        if let evicted {
            let drain = self.drain
            Task {
                try? await Task.sleep(for: drain)
                try? await evicted.shutdown()
            }
        }
        return client
    }

    /// Closes every client; later asks fail.
    func shutdown() async {
        let clients = state.withLockedValue { state in
            state.closed = true
            defer { state.entries.removeAll() }
            return state.entries.values.map(\.client)
        }
        for client in clients { try? await client.shutdown() }
    }
}
