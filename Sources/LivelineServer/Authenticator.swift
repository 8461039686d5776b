import Foundation
import Hummingbird
import LivelineStore

/// The app a request acts for, and with which key scope.
struct Caller: Sendable {
    var appID: String
    var scope: APIKeyScope
}

/// Who may call a route.
enum RouteAccess {
    /// The backend only (`sk_…`).
    case secret
    /// The app on a phone (`pk_…`) or the backend.
    case publishableOrSecret
}

/// Checks `Authorization: Bearer <key>` against stored key hashes.
struct Authenticator: Sendable {
    let keys: APIKeyCache

    func authenticate(_ request: Request, access: RouteAccess) async throws -> Caller {
        guard let key = Self.bearerToken(request) else { throw APIError.unauthorized }
        guard let (scope, lookup) = APIKeys.parse(key),
            let record = try await keys.record(lookup: lookup),
            record.scope == scope,
            APIKeys.verify(key, against: record)
        else { throw APIError.invalidKey }
        if access == .secret, scope != .secret { throw APIError.secretKeyRequired }
        return Caller(appID: record.appID, scope: scope)
    }

    static func bearerToken(_ request: Request) -> String? {
        request.headers[.authorization].flatMap(bearerToken(header:))
    }

    /// The credentials of an `Authorization` value of the `Bearer` scheme (RFC 6750), named in any case: what follows
    /// the scheme and its spaces, without the spaces and tabs around it (RFC 9110's whitespace); `nil` for another
    /// scheme or no credentials. Read byte by byte: Foundation's string functions cost a measurable share of every
    /// request on Linux.
    static func bearerToken(header: String) -> String? {
        let bytes = header.utf8
        let blank: (UInt8) -> Bool = { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
        guard let schemeStart = bytes.firstIndex(where: { !blank($0) }),
            let schemeEnd = bytes[schemeStart...].firstIndex(where: blank)
        else { return nil }
        let scheme = bytes[schemeStart..<schemeEnd]
        guard scheme.count == 6, zip(scheme, "bearer".utf8).allSatisfy({ $0 | 0x20 == $1 }) else { return nil }
        guard let tokenStart = bytes[schemeEnd...].firstIndex(where: { !blank($0) }),
            let tokenLast = bytes[tokenStart...].lastIndex(where: { !blank($0) })
        else { return nil }
        return String(Substring(header.utf8[tokenStart...tokenLast]))
    }
}

