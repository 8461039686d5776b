import Foundation
import LivelineCore

/// A response as the API answered it: what is remembered under an idempotency key and replayed verbatim.
public struct StoredResponse: Sendable, Hashable {
    /// The HTTP status code.
    public var status: Int
    /// The body's bytes (JSON).
    public var body: [UInt8]

    /// Creates a stored response.
    public init(status: Int, body: [UInt8]) {
        self.status = status
        self.body = body
    }
}

/// What is remembered under one idempotency key of one app: the accepted request's fingerprint and its response.
public struct IdempotencyRecord: Sendable, Hashable {
    public var appID: String
    public var key: String
    /// SHA-256 of the accepted request's method, path and body.
    public var fingerprint: [UInt8]
    /// The first response, replayed to every retry.
    public var response: StoredResponse
    /// When the request was accepted; the key is free again ``IdempotencyKey/retention`` later.
    public var acceptedAt: Date

    /// Creates a record.
    public init(appID: String, key: String, fingerprint: [UInt8], response: StoredResponse, acceptedAt: Date) {
        self.appID = appID
        self.key = key
        self.fingerprint = fingerprint
        self.response = response
        self.acceptedAt = acceptedAt
    }

    /// What to do with a request of fingerprint `fingerprint` that carries this record's key, at `now`.
    public func decision(for fingerprint: [UInt8], now: Date) -> IdempotencyDecision {
        IdempotencyDecision.decide(remembered: (self.fingerprint, acceptedAt), fingerprint: fingerprint, now: now)
    }
}

/// A write that carries an idempotency key: the key, the request's fingerprint, and how the write's result is answered.
///
/// The Store takes the decision (``IdempotencyDecision``) and remembers the response in the very transaction of the
/// write, so an accepted request and its record commit together or not at all: a crash between them cannot let a retry
/// be accepted twice. The response is rendered there, from the write's result, by ``respond``; the API answers the
/// first request with the same rendering, so a replay is byte for byte the first response.
public struct IdempotencyClaim<Result: Sendable>: Sendable {
    /// The `Idempotency-Key`, already validated (``IdempotencyKey/isValid(_:)``).
    public var key: String
    /// SHA-256 of the request's method, path and body.
    public var fingerprint: [UInt8]
    /// The response the API answers the write's result with.
    public var respond: @Sendable (Result) -> StoredResponse

    /// Creates a claim.
    public init(key: String, fingerprint: [UInt8], respond: @escaping @Sendable (Result) -> StoredResponse) {
        self.key = key
        self.fingerprint = fingerprint
        self.respond = respond
    }

    /// The same claim for a write whose result becomes this claim's `Result` through `transform` (the Store's result
    /// before the caller adds what only it knows, such as warnings).
    public func pullback<Other: Sendable>(_ transform: @escaping @Sendable (Other) -> Result) -> IdempotencyClaim<Other> {
        let respond = self.respond
        return IdempotencyClaim<Other>(key: key, fingerprint: fingerprint) { other in respond(transform(other)) }
    }
}

/// What became of a write that may carry an idempotency key.
public enum IdempotentOutcome<Result: Sendable>: Sendable {
    /// The write was performed (and, with a key, remembered with its response).
    case performed(Result)
    /// The same request had been accepted under the key: nothing was done; this is its response.
    case replayed(StoredResponse)

    /// The outcome with a performed result transformed.
    public func map<Other: Sendable>(_ transform: (Result) throws -> Other) rethrows -> IdempotentOutcome<Other> {
        switch self {
        case .performed(let result): .performed(try transform(result))
        case .replayed(let response): .replayed(response)
        }
    }
}
