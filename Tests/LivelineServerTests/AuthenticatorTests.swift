import Testing

@testable import LivelineServer

@Suite("Authorization header")
struct AuthenticatorTests {
    @Test("an Authorization value gives its Bearer credentials: the scheme in any case, spaces and tabs around them")
    func bearerCredentials() {
        for (header, expected) in [
            ("Bearer sk_abc", "sk_abc"), ("bearer sk_abc", "sk_abc"), ("BEARER sk_abc", "sk_abc"),
            ("  Bearer \t sk_abc \t ", "sk_abc"), ("Bearer\tsk_abc", "sk_abc"), ("Bearer a b", "a b"),
        ] {
            #expect(Authenticator.bearerToken(header: header) == expected, "\(header)")
        }
        for header in ["", "Bearer", "Bearer   ", "Basic sk_abc", "Bearers sk_abc", "Bear sk_abc", "sk_abc", "Bearér sk_abc"] {
            #expect(Authenticator.bearerToken(header: header) == nil, "\(header)")
        }
    }
}
