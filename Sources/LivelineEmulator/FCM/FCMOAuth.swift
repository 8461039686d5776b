import Crypto
import Foundation
import LivelineCore
import _CryptoExtras

/// A service account the FCM emulator's token endpoint trusts: its client email, the public half of its key, and the
/// Firebase project it sends for.
struct RegisteredServiceAccount: Sendable {
    var clientEmail: String
    var projectID: String
    var publicKey: _RSA.Signing.PublicKey
    /// When set, an assertion's `kid` must equal it.
    var privateKeyID: String?
}

/// A refused token request: Google's OAuth error, `{"error": …, "error_description": …}`.
struct OAuthRefusal: Error, Sendable, Hashable {
    var status: Int
    var error: String
    var errorDescription: String

    init(_ error: String, _ errorDescription: String, status: Int = 400) {
        self.status = status
        self.error = error
        self.errorDescription = errorDescription
    }

    var body: [UInt8] {
        JSONValue.object(["error": .string(error), "error_description": .string(errorDescription)]).encoded
    }
}

/// Checks an OAuth 2.0 JWT bearer assertion (RFC 7523) the way Google's token endpoint describes it in "Using OAuth
/// 2.0 for Server to Server Applications": an RS256 JWS whose claims are `iss` (the service account's email), `scope`
/// (space-separated), `aud` (the token endpoint's URI), `iat` and `exp` (seconds since 1970, `exp` at most one hour
/// after `iat`).
enum AssertionVerifier {
    /// The scope FCM requires; `cloud-platform` also grants it.
    static let messagingScope = "https://www.googleapis.com/auth/firebase.messaging"
    static let cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"
    static let maximumLifetime: Double = 3600

    static let timeframe =
        "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."

    static func verify(
        _ assertion: String, accounts: [String: RegisteredServiceAccount], audience: String, now: Date, skew: TimeInterval
    ) -> Result<RegisteredServiceAccount, OAuthRefusal> {
        let parts = assertion.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerBytes = ProviderTokenVerifier.base64URLDecode(parts[0]),
            let claimsBytes = ProviderTokenVerifier.base64URLDecode(parts[1]),
            let signatureBytes = ProviderTokenVerifier.base64URLDecode(parts[2])
        else { return .failure(OAuthRefusal("invalid_grant", "Invalid JWT: not three unpadded base64url parts.")) }
        guard let header = (try? JSONValue(parsing: headerBytes))?.objectValue else {
            return .failure(OAuthRefusal("invalid_grant", "Invalid JWT: the header is not a JSON object."))
        }
        guard header["alg"]?.stringValue == "RS256" else {
            return .failure(OAuthRefusal("invalid_grant", "Invalid JWT: the alg must be RS256."))
        }
        if let type = header["typ"], type.stringValue?.uppercased() != "JWT" {
            return .failure(OAuthRefusal("invalid_grant", "Invalid JWT: the typ must be JWT."))
        }
        guard let claims = (try? JSONValue(parsing: claimsBytes))?.objectValue else {
            return .failure(OAuthRefusal("invalid_grant", "Invalid JWT: the claim set is not a JSON object."))
        }
        guard let issuer = claims["iss"]?.stringValue, let account = accounts[issuer] else {
            return .failure(OAuthRefusal("invalid_grant", "Invalid grant: account not found"))
        }
        if let keyID = account.privateKeyID, let kid = header["kid"], kid.stringValue != keyID {
            return .failure(OAuthRefusal("invalid_grant", "Invalid JWT Signature."))
        }
        let signingInput = Array(assertion.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        let signature = _RSA.Signing.RSASignature(rawRepresentation: signatureBytes)
        guard account.publicKey.isValidSignature(signature, for: SHA256.hash(data: signingInput), padding: .insecurePKCS1v1_5)
        else { return .failure(OAuthRefusal("invalid_grant", "Invalid JWT Signature.")) }
        guard let audienceClaim = claims["aud"]?.stringValue, audienceClaim == audience else {
            return .failure(
                OAuthRefusal("invalid_grant", "Invalid JWT: Failed audience check. The expected audience is \(audience).")
            )
        }
        let scopes = claims["scope"]?.stringValue?.split(separator: " ").map(String.init) ?? []
        guard scopes.contains(messagingScope) || scopes.contains(cloudPlatformScope) else {
            return .failure(OAuthRefusal("invalid_scope", "Invalid OAuth scope or ID token audience provided."))
        }
        guard let issuedAt = claims["iat"].flatMap(seconds), let expiresAt = claims["exp"].flatMap(seconds) else {
            return .failure(OAuthRefusal("invalid_grant", "Invalid JWT: iat and exp must be numbers of seconds since 1970."))
        }
        let nowSeconds = now.timeIntervalSince1970
        guard issuedAt <= nowSeconds + skew, expiresAt > nowSeconds, expiresAt > issuedAt,
            expiresAt - issuedAt <= maximumLifetime
        else { return .failure(OAuthRefusal("invalid_grant", timeframe)) }
        return .success(account)
    }

    private static func seconds(_ value: JSONValue) -> Double? {
        switch value {
        case .integer(let value): Double(value)
        case .number(let value): value
        default: nil
        }
    }

    /// Decodes an `application/x-www-form-urlencoded` body: `+` is a space, `%XX` a byte. `nil` when a pair is
    /// malformed or a name repeats.
    static func formFields(_ body: [UInt8]) -> [String: String]? {
        var fields: [String: String] = [:]
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = decode(parts[0]), let value = decode(parts.count == 2 ? parts[1] : ""), fields[name] == nil else {
                return nil
            }
            fields[name] = value
        }
        return fields
    }

    private static func decode(_ text: Substring) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }
}
