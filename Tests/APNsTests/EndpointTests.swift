import Testing

@testable import APNs

@Suite("APNsEndpoint")
struct EndpointTests {
    @Test("Apple's hosts")
    func appleHosts() {
        #expect(APNsEndpoint.production.host == "api.push.apple.com")
        #expect(APNsEndpoint.production.port == 443)
        #expect(APNsEndpoint.production.trustedCAPEM == nil)
        #expect(APNsEndpoint.sandbox.host == "api.sandbox.push.apple.com")
        #expect(APNsEndpoint.sandbox.port == 443)
    }

    @Test(
        "parses https://host[:port]",
        arguments: [
            ("https://127.0.0.1:8443", "127.0.0.1", 8443),
            ("https://api.push.apple.com", "api.push.apple.com", 443),
            ("https://api.push.apple.com/", "api.push.apple.com", 443),
            ("HTTPS://Api.Sandbox.Push.Apple.com:2197", "api.sandbox.push.apple.com", 2197),
            ("https://localhost:1", "localhost", 1),
            ("https://[::1]:2197", "::1", 2197),
            ("https://[::1]", "::1", 443),
            ("https://emulator.internal:65535", "emulator.internal", 65535),
        ]
    )
    func parses(url: String, host: String, port: Int) throws {
        let endpoint = try APNsEndpoint(baseURL: url, trustedCAPEM: "PEM")
        #expect(endpoint.host == host)
        #expect(endpoint.port == port)
        #expect(endpoint.trustedCAPEM == "PEM")
    }

    @Test(
        "rejects anything else",
        arguments: [
            "http://127.0.0.1:8443",
            "127.0.0.1:8443",
            "https://",
            "https://:8443",
            "https://host:0",
            "https://host:65536",
            "https://host:",
            "https://host:84a3",
            "https://host:8443/3/device",
            "https://host?x=1",
            "https://host#frag",
            "https://user@host",
            "https://host:1:2",
            "https://::1",
            "https://[::1",
            "https://[::1]x",
            "https://ho st",
            "https://-host",
            "ftp://host",
            "",
        ]
    )
    func rejects(url: String) {
        #expect(throws: APNsConfigurationError.self) {
            try APNsEndpoint(baseURL: url)
        }
    }

    @Test("authority and SNI rules")
    func authority() throws {
        #expect(APNsEndpoint.production.authority == "api.push.apple.com")
        #expect(try APNsEndpoint(baseURL: "https://127.0.0.1:8443").authority == "127.0.0.1:8443")
        #expect(try APNsEndpoint(baseURL: "https://[::1]:8443").authority == "[::1]:8443")
        #expect(try APNsEndpoint(baseURL: "https://127.0.0.1:8443").hostIsIPAddress)
        #expect(try APNsEndpoint(baseURL: "https://[::1]:8443").hostIsIPAddress)
        #expect(!APNsEndpoint.sandbox.hostIsIPAddress)
        #expect(!APNsEndpoint(host: "1.2.3.4.example", port: 443).hostIsIPAddress)
    }
}
