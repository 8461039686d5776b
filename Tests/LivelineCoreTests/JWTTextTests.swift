import Foundation
import LivelineCore
import Testing

@Suite("Base64url and JWT text")
struct JWTTextTests {
    @Test("base64url encodes RFC 4648's test vectors without padding", arguments: [
        ("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy"),
    ])
    func rfc4648Vectors(text: String, encoded: String) {
        #expect(Base64URL.encode(Array(text.utf8)) == encoded)
        #expect(Base64URL.decode(encoded) == Array(text.utf8))
    }

    @Test("base64url uses - and _ where base64 has + and /")
    func urlAlphabet() {
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(Base64URL.encode([0xFB, 0xEF, 0xBE]) == "----")
        #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
    }

    @Test("every byte string of up to 64 bytes comes back as it went, and agrees with Foundation's base64")
    func roundTrip() {
        var generator = SystemRandomNumberGenerator()
        for length in 0...64 {
            let bytes = (0..<length).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
            let encoded = Base64URL.encode(bytes)
            let foundation = Data(bytes).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            #expect(encoded == foundation)
            #expect(Base64URL.decode(encoded) == bytes)
        }
    }

    @Test("base64url decoding refuses padding, other alphabets, impossible lengths and stray low bits", arguments: [
        "Zg==", "Zm8=", "Zm+v", "Zm/v", "Zm9v YQ", "Z", "Zm9vY", "Zh", "Zm9",
    ])
    func refusals(text: String) {
        #expect(Base64URL.decode(text) == nil)
    }

    @Test("the signing input is RFC 7515's example: the base64url of header and claims, joined by a period")
    func signingInput() {
        let header = "{\"typ\":\"JWT\",\r\n \"alg\":\"HS256\"}"
        let claims = "{\"iss\":\"joe\",\r\n \"exp\":1300819380,\r\n \"http://example.com/is_root\":true}"
        #expect(
            JWTText.signingInput(header: header, claims: claims)
                == "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9"
                + ".eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
        )
        #expect(JWTText.token(signingInput: "a.b", signature: [0xFB, 0xFF]) == "a.b.-_8")
    }

    @Test("quoted strings are JSON string literals that read back as the same string")
    func quoted() throws {
        #expect(JWTText.quoted("KEY1234567") == "\"KEY1234567\"")
        #expect(JWTText.quoted("a\"b\\c\nd\re\tf\u{01}g") == #""a\"b\\c\nd\re\tf\u0001g""#)
        for value in ["sender@demo-project.iam.gserviceaccount.com", "é ü 日本", "\u{1F}x\"\\"] {
            let parsed = try JSONSerialization.jsonObject(with: Data(JWTText.quoted(value).utf8), options: [.fragmentsAllowed])
            #expect(parsed as? String == value)
        }
    }
}
