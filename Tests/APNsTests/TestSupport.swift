import Crypto
import Foundation
import LivelineCore
import LivelineTestSupport
import Synchronization

@testable import APNs

/// A test's own failure, thrown where a condition is awaited.
struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Where the APNs tests' clocks start: 2023-11-14T22:13:20Z.
let testStart = Date(timeIntervalSince1970: 1_700_000_000)

extension TestClock {
    /// Moves the clock `duration` forward.
    func advance(by duration: Duration) {
        advance(by: duration.seconds)
    }

    /// The clock as the `now` closure APNs types take.
    var closure: @Sendable () -> Date { { self.now } }
}

/// The three parts of a JWT, decoded.
struct DecodedJWT {
    var headerJSON: String
    var claimsJSON: String
    var signingInput: String
    var signature: Data

    init(_ token: String) throws {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3 else { throw TestFailure("a JWT has three parts, got \(parts.count)") }
        for part in parts {
            guard !part.contains("="), !part.contains("+"), !part.contains("/") else {
                throw TestFailure("\(part) is not unpadded base64url")
            }
        }
        headerJSON = String(decoding: try Self.base64URLDecode(parts[0]), as: UTF8.self)
        claimsJSON = String(decoding: try Self.base64URLDecode(parts[1]), as: UTF8.self)
        signingInput = parts[0] + "." + parts[1]
        signature = try Self.base64URLDecode(parts[2])
    }

    static func base64URLDecode(_ text: String) throws -> Data {
        guard let bytes = LivelineTestSupport.base64URLDecode(text) else { throw TestFailure("\(text) is not base64url") }
        return Data(bytes)
    }

    struct Header: Decodable, Equatable {
        var alg: String
        var kid: String
    }

    struct Claims: Decodable, Equatable {
        var iss: String
        var iat: Int64
    }

    func header() throws -> Header {
        try JSONDecoder().decode(Header.self, from: Data(headerJSON.utf8))
    }

    func claims() throws -> Claims {
        try JSONDecoder().decode(Claims.self, from: Data(claimsJSON.utf8))
    }

    func verifies(with key: P256.Signing.PublicKey) throws -> Bool {
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: signature)
        return key.isValidSignature(signature, for: Data(signingInput.utf8))
    }
}

func makeSigningKey() -> APNsSigningKey {
    APNsSigningKey(teamID: "TEAM123456", keyID: "KEY1234567", privateKey: P256.Signing.PrivateKey())
}

/// Counts calls from any thread.
final class Counter: Sendable {
    private let value = Mutex(0)

    /// Returns the count before this call, then increments it.
    func next() -> Int {
        value.withLock { value in
            defer { value += 1 }
            return value
        }
    }
}
