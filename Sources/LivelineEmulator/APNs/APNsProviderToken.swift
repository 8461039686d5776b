import Crypto
import Foundation
import LivelineCore

/// A signing key APNs trusts: a team's .p8 key, known by its key id.
struct RegisteredSigningKey: Sendable {
    var teamID: String
    var keyID: String
    var publicKey: P256.Signing.PublicKey
}

/// A provider token whose signature checked out.
struct VerifiedProviderToken: Sendable, Hashable {
    var keyID: String
    var teamID: String
    /// The `iat` claim, seconds since 1970.
    var issuedAt: Double
}

/// The result of checking a provider token's form and signature, which does not change while the
/// set of registered keys does not; the token's age is checked per request.
enum ProviderTokenCheck: Sendable {
    case valid(VerifiedProviderToken)
    /// Why the token is not valid, for the log; APNs answers `InvalidProviderToken`.
    case invalid(String)
}

/// Checks an APNs provider token: a JWS (RFC 7515) compact serialization signed with ES256,
/// as "Establishing a token-based connection to APNs" describes it.
enum ProviderTokenVerifier {
    static func check(_ token: String, keys: [String: RegisteredSigningKey]) -> ProviderTokenCheck {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return .invalid("not three dot-separated parts") }
        guard let headerBytes = base64URLDecode(parts[0]), let claimsBytes = base64URLDecode(parts[1]),
            let signatureBytes = base64URLDecode(parts[2])
        else { return .invalid("a part is not unpadded base64url") }
        guard let header = try? JSONValue(parsing: headerBytes), let headerMembers = header.objectValue else {
            return .invalid("the header is not a JSON object")
        }
        guard headerMembers["alg"]?.stringValue == "ES256" else { return .invalid("alg is not ES256") }
        guard let keyID = headerMembers["kid"]?.stringValue else { return .invalid("kid is missing or not a string") }
        guard let key = keys[keyID] else { return .invalid("kid \(keyID) is not a registered key") }
        guard let claims = try? JSONValue(parsing: claimsBytes), let claimMembers = claims.objectValue else {
            return .invalid("the claims are not a JSON object")
        }
        guard let issuer = claimMembers["iss"]?.stringValue else { return .invalid("iss is missing or not a string") }
        guard issuer == key.teamID else { return .invalid("iss \(issuer) is not the team of key \(keyID)") }
        let issuedAt: Double
        switch claimMembers["iat"] {
        case .integer(let value): issuedAt = Double(value)
        case .number(let value): issuedAt = value
        default: return .invalid("iat is missing or not a number")
        }
        guard signatureBytes.count == 64,
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes)
        else { return .invalid("the signature is not a 64-byte ES256 (r||s) signature") }
        let signingInput = Array(token.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        guard key.publicKey.isValidSignature(signature, for: signingInput) else {
            return .invalid("the signature does not verify with key \(keyID)")
        }
        return .valid(VerifiedProviderToken(keyID: keyID, teamID: issuer, issuedAt: issuedAt))
    }

    /// Decodes unpadded base64url (RFC 4648 §5), as JWS requires; anything else is refused.
    static func base64URLDecode(_ text: Substring) -> [UInt8]? {
        guard !text.isEmpty, text.utf8.count % 4 != 1 else { return nil }
        var base64 = ""
        base64.reserveCapacity(text.utf8.count + 3)
        for character in text.unicodeScalars {
            switch character {
            case "A"..."Z", "a"..."z", "0"..."9": base64.unicodeScalars.append(character)
            case "-": base64.append("+")
            case "_": base64.append("/")
            default: return nil
            }
        }
        while base64.utf8.count % 4 != 0 { base64.append("=") }
        guard let data = Data(base64Encoded: base64) else { return nil }
        return Array(data)
    }
}
