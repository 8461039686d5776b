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
        guard let header = request.headers[.authorization] else { return nil }
        let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        return token.isEmpty ? nil : token
    }
}

