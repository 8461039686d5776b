import Crypto
import Foundation
import LivelineCore
import _CryptoExtras

/// An OAuth 2.0 access token the token endpoint granted.
public struct FCMAccessToken: Sendable, Hashable {
    /// The bearer token (`access_token`). A secret: never log it.
    public var value: String
    /// How long it is valid from when it was granted (`expires_in`, seconds).
    public var expiresIn: TimeInterval

    /// Creates a grant.
    public init(value: String, expiresIn: TimeInterval) {
        self.value = value
        self.expiresIn = expiresIn
    }
}

/// The token endpoint refused the assertion (an OAuth error such as `invalid_grant`), or answered with
/// something that is not a token. Its text never includes the assertion or a token.
public struct FCMAuthenticationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The HTTP status of the token endpoint's answer.
    public var status: Int
    /// The OAuth `error`, for example `invalid_grant` (or a description of what was wrong with the answer).
    public var error: String
    /// The OAuth `error_description`, when given.
    public var errorDescription: String?

    /// Creates an error.
    public init(status: Int, error: String, errorDescription: String? = nil) {
        self.status = status
        self.error = error
        self.errorDescription = errorDescription
    }

    /// Whether trying again later may help: the endpoint was overloaded or failing (429, 5xx). Otherwise the
    /// service account itself is refused.
    public var isRetryable: Bool { status == 429 || (500...599).contains(status) }

    public var description: String {
        "The OAuth token endpoint answered \(status) \(error)" + (errorDescription.map { ": \($0)" } ?? "")
    }
}

/// Exchanges a signed assertion for an access token at a token endpoint (RFC 7523 JWT bearer grant).
public protocol FCMTokenExchange: Sendable {
    /// POSTs `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<assertion>` to `tokenURI`.
    ///
    /// - Throws: ``FCMAuthenticationError`` when the endpoint refuses; ``FCMTransportError`` when no answer came.
    func exchange(assertion: String, tokenURI: String) async throws -> FCMAccessToken
}

/// OAuth 2.0 access tokens for FCM, obtained with a service account's signed JWT assertion.
///
/// The assertion is an RS256 JWT: header `{"alg":"RS256","typ":"JWT","kid":<private_key_id>}`, claims
/// `{"iss":<client_email>,"scope":"https://www.googleapis.com/auth/firebase.messaging","aud":<token_uri>,"iat":…,"exp":iat+3600}`,
/// signed with RSASSA-PKCS1-v1_5 and SHA-256. It is exchanged at the `token_uri` for an access token valid for about
/// an hour (`expires_in`).
///
/// One access token is cached and shared by every caller until ``refreshMargin`` before it expires (but at least half
/// its lifetime). Concurrent callers that find no usable token share one exchange (single flight). After FCM refuses
/// a token (401), ``invalidate(_:)`` drops it so the next caller gets a fresh one. The clock is injected, so tests
/// cover hours without sleeping.
public actor FCMAccessTokens {
    /// The OAuth scope FCM requires.
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"
    /// The JWT bearer grant type (RFC 7523).
    public static let grantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    /// How long an assertion is valid: Google accepts at most one hour.
    public static let assertionLifetime: Int64 = 3600

    /// The account assertions are made for.
    public nonisolated let serviceAccount: FCMServiceAccount
    /// How long before a token's expiry it is replaced.
    public nonisolated let refreshMargin: Duration

    private let exchange: any FCMTokenExchange
    private let now: @Sendable () -> Date
    private var cached: Cached?
    private var inFlight: Task<Cached, any Error>?

    /// How many exchanges were started; for tests and statistics.
    public private(set) var exchangeCount = 0

    private struct Cached: Sendable {
        var token: String
        var refreshAt: Date
        var expiresAt: Date
    }

    /// Creates a token source.
    ///
    /// - Parameters:
    ///   - serviceAccount: The account whose key signs the assertions.
    ///   - exchange: Performs the token request (``FCMHTTPTokenExchange`` for a real endpoint).
    ///   - refreshMargin: How long before expiry a token is replaced; defaults to 5 minutes.
    ///   - now: The wall clock; `iat` and expiry decisions read it. Tests inject their own.
    public init(
        serviceAccount: FCMServiceAccount,
        exchange: any FCMTokenExchange,
        refreshMargin: Duration = .seconds(300),
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.serviceAccount = serviceAccount
        self.exchange = exchange
        self.refreshMargin = refreshMargin
        self.now = now
    }

    /// A usable access token: the cached one, or a fresh one from one shared exchange.
    ///
    /// - Throws: ``FCMAuthenticationError`` when the endpoint refuses the assertion; ``FCMTransportError`` when it
    ///   could not be reached. A failed exchange is not cached: the next call tries again. A failed refresh of a token
    ///   still valid for more than a minute keeps that token in use, and tries again after 30 seconds.
    public func current() async throws -> String {
        if let cached, now() < cached.refreshAt { return cached.token }
        let task: Task<Cached, any Error>
        if let inFlight {
            task = inFlight
        } else {
            let startedAt = now()
            let assertion = try makeAssertion(issuedAt: startedAt)
            let exchange = self.exchange
            let tokenURI = serviceAccount.tokenURI
            let margin = refreshMargin.seconds
            exchangeCount += 1
            // Unstructured on purpose (a documented exception): one exchange is shared by every caller that needs a
            // token meanwhile, so it must not belong to (nor be cancelled with) whichever caller started it. It is
            // bounded by the exchange's own timeout and always awaited by at least that caller.
            task = Task {
                let granted = try await exchange.exchange(assertion: assertion, tokenURI: tokenURI)
                let lifetime = max(0, granted.expiresIn)
                let keep = max(lifetime - margin, lifetime / 2)
                return Cached(
                    token: granted.value, refreshAt: startedAt + keep, expiresAt: startedAt + lifetime
                )
            }
            inFlight = task
        }
        do {
            let fresh = try await task.value
            if inFlight == task {
                inFlight = nil
                cached = fresh
            }
            return fresh.token
        } catch {
            if inFlight == task { inFlight = nil }
            // A refresh that failed while the token it replaces is still good for a while (the refresh margin is five
            // minutes): FCM still takes that one, so it is used until then, and the exchange tried again a little later
            // rather than by every send meanwhile.
            if var kept = cached, now() + Self.expiryGuard < kept.expiresAt {
                kept.refreshAt = min(now() + Self.refreshRetry, kept.expiresAt - Self.expiryGuard)
                cached = kept
                return kept.token
            }
            throw error
        }
    }

    /// How soon a refresh that failed is tried again while the cached token stays in use.
    static let refreshRetry: TimeInterval = 30
    /// A cached token is not used this close to its expiry (a send takes time to arrive).
    static let expiryGuard: TimeInterval = 60

    /// Drops the cached token because FCM refused it (401), so the next ``current()`` makes a new exchange.
    /// When `token` is given and is no longer the cached one (another caller already replaced it), nothing changes:
    /// N concurrent refusals of one token cause one exchange.
    public func invalidate(_ token: String? = nil) {
        guard let cached else { return }
        if let token, token != cached.token { return }
        self.cached = nil
    }

    /// When the cached token expires, or `nil` when none is cached.
    public var expiresAt: Date? { cached?.expiresAt }

    /// When the cached token will be replaced, or `nil` when none is cached.
    public var refreshAt: Date? { cached?.refreshAt }

    /// The signed JWT assertion for `issuedAt` (whole seconds; `exp` one hour later).
    public nonisolated func makeAssertion(issuedAt: Date) throws -> String {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let header = #"{"alg":"RS256","typ":"JWT","kid":"# + JWTText.quoted(serviceAccount.privateKeyID) + "}"
        let claims =
            #"{"iss":"# + JWTText.quoted(serviceAccount.clientEmail) + #","scope":"# + JWTText.quoted(Self.scope)
            + #","aud":"# + JWTText.quoted(serviceAccount.tokenURI) + #","iat":"# + String(iat) + #","exp":"#
            + String(iat + Self.assertionLifetime) + "}"
        let signingInput = JWTText.signingInput(header: header, claims: claims)
        let signature: _RSA.Signing.RSASignature
        do {
            signature = try serviceAccount.privateKey.signature(
                for: SHA256.hash(data: Array(signingInput.utf8)), padding: .insecurePKCS1v1_5
            )
        } catch {
            throw FCMConfigurationError("Signing the OAuth assertion with the service account's key failed.")
        }
        return JWTText.token(signingInput: signingInput, signature: signature.rawRepresentation)
    }
}

