import Crypto
import Foundation
import LivelineCore
import Synchronization

/// APNs provider authentication tokens: ES256 JSON Web Tokens signed with the team's key.
///
/// A token has the header `{"alg":"ES256","kid":<key id>}` and the claims `{"iss":<team id>,"iat":<epoch seconds>}`
/// (`iat` is a JSON number), base64url-encoded without padding and signed with ECDSA P-256 / SHA-256; the signature
/// is the raw `r || s` form JWS requires.
///
/// Apple rejects tokens older than an hour (403 `ExpiredProviderToken`) and tokens renewed more often than every
/// 20 minutes (429 `TooManyProviderTokenUpdates`). So one token is cached and shared by every request and connection
/// until it is ``refreshAfter`` old; the only earlier renewal is the one ``refresh(replacing:)`` forces after APNs
/// refused the current token, and only once that token is 20 minutes old. The clock is injected, so tests can cover
/// hours without sleeping.
///
/// Thread-safe: all methods may be called concurrently from any thread.
public final class APNsProviderTokens: Sendable {
    /// The shortest allowed refresh age (Apple: no more often than every 20 minutes).
    public static let minimumRefreshAge: Duration = .seconds(20 * 60)
    /// The longest allowed refresh age (Apple: tokens older than an hour are rejected).
    public static let maximumRefreshAge: Duration = .seconds(60 * 60)

    /// The key tokens are signed with.
    public let signingKey: APNsSigningKey
    /// The age at which a token is replaced, clamped to ``minimumRefreshAge``...``maximumRefreshAge``.
    public let refreshAfter: Duration

    private let now: @Sendable () -> Date
    private let state: Mutex<Issued?>

    /// One signed token and the `authorization` header value carrying it.
    struct Issued: Sendable {
        var token: String
        var authorization: String
        var issuedAt: Date
        /// Whether APNs has refused it and it was kept (too young to be renewed).
        var refusedAndKept = false
    }

    /// What ``refresh(replacing:)`` did about a token APNs refused.
    public enum Renewal: Sendable, Equatable {
        /// A new token was signed: the refused one was the current one and at least 20 minutes old, or the current
        /// one was due anyway. Requests refused with the old token may be sent again with `token`.
        case renewed(token: String)
        /// The refused token had already been replaced (by an earlier refusal, or by age): `token` is the current one,
        /// and requests refused with the old one may be sent again with it.
        case alreadyReplaced(token: String)
        /// The refused token is the current one and younger than 20 minutes, so it is kept: renewing it would break
        /// Apple's rule of one renewal in 20 minutes (429 `TooManyProviderTokenUpdates`), and a token signed now with
        /// the same key, ids and clock is refused for the same reason (a revoked key, a wrong team or key id, a clock
        /// an hour off). `firstRefusal` is true for the first refusal of this token, so that it is reported once.
        case kept(token: String, age: Duration, firstRefusal: Bool)

        /// The token to use from now on.
        public var token: String {
            switch self {
            case .renewed(let token), .alreadyReplaced(let token), .kept(let token, _, _): token
            }
        }

        /// Whether the current token differs from the refused one, so that one more try may succeed.
        public var replacedRefusedToken: Bool {
            if case .kept = self { return false }
            return true
        }
    }

    /// Creates a token source.
    ///
    /// - Parameters:
    ///   - signingKey: The team's key.
    ///   - refreshAfter: The token age at which a new one is made; values outside 20...60 minutes are clamped into
    ///     that range. Defaults to 50 minutes.
    ///   - now: The wall clock; `iat` is taken from it. Tests inject their own.
    public init(
        signingKey: APNsSigningKey,
        refreshAfter: Duration = .seconds(50 * 60),
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.signingKey = signingKey
        self.refreshAfter = min(max(refreshAfter, Self.minimumRefreshAge), Self.maximumRefreshAge)
        self.now = now
        self.state = Mutex(nil)
    }

    /// The current bearer token (the JWT string, without `bearer `), creating or refreshing it when due.
    public func current() -> String {
        currentIssued().token
    }

    /// When the current token was issued (`nil` before the first).
    public var issuedAt: Date? {
        state.withLock { $0?.issuedAt }
    }

    /// Asks for a new token because APNs refused `staleToken` (403 `ExpiredProviderToken` or `InvalidProviderToken`).
    ///
    /// When `staleToken` was already replaced, the current token is returned (refreshed only if it is itself due), so
    /// N concurrent refusals of one token cause one refresh. When it is the current token, a new one is signed only
    /// if it is at least ``minimumRefreshAge`` (20 minutes) old; a younger one is kept (``Renewal/kept(token:age:firstRefusal:)``).
    ///
    /// - Returns: What was done, and the token to use from now on.
    @discardableResult
    public func refresh(replacing staleToken: String) -> Renewal {
        state.withLock { issued in
            let now = self.now()
            if let current = issued, !isDue(current, now: now) {
                if current.token != staleToken {
                    return .alreadyReplaced(token: current.token)
                }
                let age = Duration.seconds(now.timeIntervalSince(current.issuedAt))
                if age < Self.minimumRefreshAge {
                    let first = !current.refusedAndKept
                    issued?.refusedAndKept = true
                    return .kept(token: current.token, age: age, firstRefusal: first)
                }
            }
            let fresh = makeToken(issuedAt: now)
            issued = fresh
            return .renewed(token: fresh.token)
        }
    }

    /// The current token with its header value; signs a new one when none exists or the current one is due.
    func currentIssued() -> Issued {
        state.withLock { issued in
            let now = self.now()
            if let current = issued, !isDue(current, now: now) {
                return current
            }
            let fresh = makeToken(issuedAt: now)
            issued = fresh
            return fresh
        }
    }

    private func isDue(_ issued: Issued, now: Date) -> Bool {
        let age = now.timeIntervalSince(issued.issuedAt)
        return age >= refreshAfter.seconds
    }

    private func makeToken(issuedAt: Date) -> Issued {
        // iat is whole seconds; the issue time kept for refresh decisions is the same whole second.
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let header = #"{"alg":"ES256","kid":"# + JWTText.quoted(signingKey.keyID) + "}"
        let claims = #"{"iss":"# + JWTText.quoted(signingKey.teamID) + #","iat":"# + String(iat) + "}"
        let signingInput = JWTText.signingInput(header: header, claims: claims)
        let signature: P256.Signing.ECDSASignature
        do {
            signature = try signingKey.privateKey.signature(for: Array(signingInput.utf8))
        } catch {
            // BoringSSL only fails ECDSA signing when it cannot allocate memory.
            preconditionFailure("ES256 signing of an APNs provider token failed: \(error)")
        }
        let token = JWTText.token(signingInput: signingInput, signature: signature.rawRepresentation)
        return Issued(token: token, authorization: "bearer " + token, issuedAt: Date(timeIntervalSince1970: Double(iat)))
    }
}

