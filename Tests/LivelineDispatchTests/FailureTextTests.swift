import LivelineDispatch
import Testing

/// The text of a failure without an answer, as API users read it (``FailureText``).
@Suite("Failure text")
struct FailureTextTests {
    /// NIOSSL's description of a failed handshake, as the server printed it (the build directory was `/srv/liveline`).
    static let handshakeFailure =
        "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 268435581 error:1000007d:SSL routines:OPENSSL_internal:"
        + "CERTIFICATE_VERIFY_FAILED at /srv/liveline/.build/checkouts/swift-nio-ssl/Sources/CNIOBoringSSL/ssl/handshake.cc:393]))"

    @Test("BoringSSL's source locations are left out, its reason kept")
    func handshake() {
        #expect(
            FailureText.withoutSourceLocations(Self.handshakeFailure)
                == "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 268435581 error:1000007d:SSL routines:OPENSSL_internal:"
                + "CERTIFICATE_VERIFY_FAILED]))"
        )
        let two = "sslError([Error: 1 a:B at /x/y.cc:1, Error: 2 c:D at /x/z.c:22])"
        #expect(FailureText.withoutSourceLocations(two) == "sslError([Error: 1 a:B, Error: 2 c:D])")
        #expect(FailureText.withoutSourceLocations("FCM could not be reached: x at /a/b.swift:7") == "FCM could not be reached: x")
    }

    @Test("text that is not a source location is kept as it is")
    func keeps() {
        for text in [
            "connection refused (errno: 111)", "timed out at /v1/projects/p/messages:send", "at /a/b:12", "rate at /a/b:x7",
            "HTTP 503", "", " at /", " at /:5",
        ] {
            #expect(FailureText.withoutSourceLocations(text) == text, "\(text)")
        }
    }

    @Test("an error's description goes through the same rule")
    func error() {
        struct Described: Error, CustomStringConvertible {
            var description: String { FailureTextTests.handshakeFailure }
        }
        let text = FailureText.of(Described())
        #expect(text.hasSuffix("CERTIFICATE_VERIFY_FAILED]))"))
        #expect(!text.contains("/srv/liveline"))
    }
}
