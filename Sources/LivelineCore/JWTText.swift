/// The text of a JSON Web Token (RFC 7519) as a signer writes it: JSON string literals for its header and claims,
/// the signing input `base64url(header) "." base64url(claims)`, and the compact token with the signature appended.
///
/// Only the text: the signing itself (ES256 for APNs provider tokens, RS256 for Google OAuth assertions) stays with
/// the module that holds the key.
public enum JWTText {
    /// `value` as a JSON string literal, quotes included, escaped as ``JSONValue`` writes strings.
    public static func quoted(_ value: String) -> String {
        var out = [UInt8]()
        out.reserveCapacity(value.utf8.count + 2)
        JSONValue.appendString(value, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// The JWS signing input: the base64url of the header's JSON text, a period, the base64url of the claims' JSON
    /// text. This is what the signature is computed over.
    public static func signingInput(header: String, claims: String) -> String {
        Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(claims.utf8))
    }

    /// The compact token: `signingInput`, a period, and the base64url of `signature`.
    public static func token(signingInput: String, signature: some Collection<UInt8>) -> String {
        signingInput + "." + Base64URL.encode(signature)
    }
}
