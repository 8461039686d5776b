import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import LivelineCore
import LivelineStore
import NIOCore

/// The `Idempotency-Key` header of the `/v1` API's POSTs: the one piece a route adopts to take part.
///
/// A POST that carries a key is remembered, per app and per kind of API key (a phone's `pk_…` requests apart from the
/// backend's `sk_…` ones: ``IdempotencyKey/remembered(_:fromPublishableKey:)``), with its response, in the very
/// transaction that accepts it; the same key with the same request (method, path and body bytes) within 24 hours is answered with that first response,
/// verbatim, plus `Idempotent-Replayed: true`, and nothing is done again; the same key with another request is refused
/// with 422 `idempotency_key_reused`. Only accepted requests are remembered: a request refused with a 4xx (or failed
/// with a 5xx) leaves the key free for a corrected retry. A key that is not 1–255 printable ASCII characters (neither
/// the first nor the last a space), or is sent twice, is refused with 400 `invalid_idempotency_key`. Without the
/// header, a POST behaves as it always did.
///
/// A route adopts it in two steps:
///
/// 1. answer through ``respond(to:body:caller:store:now:represent:perform:)``: `represent` renders the write's result as
///    the response (the first response and the remembered one are the same rendering), `perform` parses and validates
///    the request and hands the claim it is given to the lifecycle, which passes it (through
///    ``IdempotencyClaim/pullback(_:)`` if the Store's result lacks something the response shows) to the Store:
///
///    ```swift
///    let caller = try await authenticator.authenticate(request, access: .secret)
///    let body = try await RequestBody.read(request)
///    return try await IdempotentPOST.respond(
///        to: request, body: body.bytes, caller: caller, store: store, now: clock.now(), represent: Self.acceptedResponse
///    ) { claim in
///        let start = … // parse and validate `body`
///        return try await lifecycle.start(start, idempotency: claim)
///    }
///    ```
///
/// 2. in the Store, run the write's transaction body inside `SQLStore.idempotently(_:appID:at:on:_:)`, which takes
///    the decision and writes the record in that transaction, and return its ``IdempotentOutcome``.
enum IdempotentPOST {
    /// `Idempotency-Key`.
    static let keyHeader = HTTPField.Name(IdempotencyKey.headerName)!
    /// `Idempotent-Replayed`, `true` on a replayed response.
    static let replayedHeader = HTTPField.Name(IdempotencyKey.replayedHeaderName)!

    /// A request's key, validated, and the fingerprint of the request it came with.
    struct RequestKey: Sendable, Hashable {
        var key: String
        /// SHA-256 of the method, the path and the body bytes.
        var fingerprint: [UInt8]

        /// The claim under which the Store performs (and remembers) the request's write.
        func claim<Result: Sendable>(_ represent: @escaping @Sendable (Result) -> StoredResponse) -> IdempotencyClaim<Result> {
            IdempotencyClaim(key: key, fingerprint: fingerprint, respond: represent)
        }
    }

    /// The request's `Idempotency-Key` (as remembered for a caller with `scope`) and fingerprint; `nil` without the
    /// header. Throws 400 `invalid_idempotency_key`.
    static func key(of request: Request, body: ByteBuffer, scope: APIKeyScope) throws -> RequestKey? {
        let values = request.headers[values: keyHeader]
        guard let key = values.first else { return nil }
        guard values.count == 1, IdempotencyKey.isValid(key) else { throw APIError.invalidIdempotencyKey }
        return RequestKey(
            key: IdempotencyKey.remembered(key, fromPublishableKey: scope == .publishable),
            fingerprint: fingerprint(method: request.method.rawValue, path: request.uri.path, body: body)
        )
    }

    /// SHA-256 of the request as it arrived: its method, a line feed, its path, a line feed, its body's bytes.
    static func fingerprint(method: String, path: String, body: ByteBuffer) -> [UInt8] {
        var hash = SHA256()
        hash.update(data: Array("\(method)\n\(path)\n".utf8))
        hash.update(data: body.readableBytesView)
        return Array(hash.finalize())
    }

    /// Answers a POST that may carry an idempotency key: a remembered request's response when the key holds this very
    /// request, 422 `idempotency_key_reused` when it holds another, or else `represent` of what `perform` does with the
    /// claim (`nil` without a key). The remembered request is looked up before `perform` validates anything, so a retry
    /// is answered even when the request would now be refused (an end, retried after it ended the activity); the Store
    /// decides again inside its transaction, which settles two requests with one new key arriving together.
    static func respond<Result: Sendable>(
        to request: Request, body: ByteBuffer, caller: Caller, store: any LifecycleStore, now: Date,
        represent: @escaping @Sendable (Result) -> StoredResponse,
        perform: (IdempotencyClaim<Result>?) async throws -> IdempotentOutcome<Result>
    ) async throws -> Response {
        let key = try key(of: request, body: body, scope: caller.scope)
        if let key, let remembered = try await store.idempotencyRecord(appID: caller.appID, key: key.key) {
            switch remembered.decision(for: key.fingerprint, now: now) {
            case .replay: return response(remembered.response, replayed: true)
            case .refuseReuse: throw APIError.idempotencyKeyReused
            case .perform: break
            }
        }
        return answer(try await perform(key?.claim(represent)), represent: represent)
    }

    /// The response to an outcome: `represent` of a performed write, or the remembered response of a replay.
    static func answer<Result: Sendable>(
        _ outcome: IdempotentOutcome<Result>, represent: (Result) -> StoredResponse
    ) -> Response {
        switch outcome {
        case .performed(let result): response(represent(result), replayed: false)
        case .replayed(let stored): response(stored, replayed: true)
        }
    }

    /// A stored response as an HTTP response; a replay says so in `Idempotent-Replayed: true`.
    static func response(_ stored: StoredResponse, replayed: Bool) -> Response {
        var headers: HTTPFields = [.contentType: "application/json; charset=utf-8"]
        if replayed { headers[replayedHeader] = "true" }
        let body = ResponseBody(byteBuffer: ByteBuffer(bytes: stored.body))
        return Response(status: HTTPResponse.Status(code: stored.status), headers: headers, body: body)
    }
}
