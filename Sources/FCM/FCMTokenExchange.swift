import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// No answer came from FCM or the token endpoint: connection failure, TLS failure, timeout, shutdown.
/// Worth retrying later. Its text never includes a token.
public struct FCMTransportError: Error, Sendable, CustomStringConvertible {
    /// What went wrong.
    public var description: String

    /// Creates an error.
    public init(_ description: String) { self.description = description }
}

/// The JWT bearer grant over HTTP(S) with AsyncHTTPClient, as Google's "Using OAuth 2.0 for Server to Server
/// Applications" describes it: a form-encoded POST to the token URI, answered with
/// `{"access_token": "...", "expires_in": 3599, "token_type": "Bearer"}` or an OAuth error
/// `{"error": "invalid_grant", "error_description": "..."}`.
public struct FCMHTTPTokenExchange: FCMTokenExchange {
    /// The client requests go through (its TLS configuration decides which CAs are trusted).
    public let httpClient: HTTPClient
    /// How long one exchange may take.
    public var timeout: Duration

    /// Creates an exchange over `httpClient`.
    public init(httpClient: HTTPClient, timeout: Duration = .seconds(30)) {
        self.httpClient = httpClient
        self.timeout = timeout
    }

    public func exchange(assertion: String, tokenURI: String) async throws -> FCMAccessToken {
        var request = HTTPClientRequest(url: tokenURI)
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/x-www-form-urlencoded")
        request.headers.add(name: "accept", value: "application/json")
        let form = "grant_type=" + Self.formEncoded(FCMAccessTokens.grantType) + "&assertion=" + Self.formEncoded(assertion)
        request.body = .bytes(ByteBuffer(string: form))
        let status: Int
        let body: ByteBuffer
        do {
            let response = try await httpClient.execute(request, timeout: TimeAmount(timeout))
            status = Int(response.status.code)
            body = try await response.body.collect(upTo: 256 * 1024)
        } catch let error as CancellationError {
            throw error
        } catch {
            throw FCMTransportError("The OAuth token request to \(tokenURI) failed: \(error)")
        }
        let object = (try? JSONSerialization.jsonObject(with: Data(body.readableBytesView))) as? [String: Any]
        guard (200..<300).contains(status) else {
            throw FCMAuthenticationError(
                status: status, error: object?["error"] as? String ?? "HTTP \(status)",
                errorDescription: object?["error_description"] as? String
            )
        }
        guard let object, let token = object["access_token"] as? String, !token.isEmpty else {
            throw FCMAuthenticationError(status: status, error: "The token endpoint's answer has no access_token.")
        }
        if let type = object["token_type"] as? String, type.lowercased() != "bearer" {
            throw FCMAuthenticationError(status: status, error: "The token endpoint granted a \(type) token, not a Bearer token.")
        }
        let expiresIn = (object["expires_in"] as? NSNumber)?.doubleValue ?? 3600
        return FCMAccessToken(value: token, expiresIn: expiresIn)
    }

    /// `application/x-www-form-urlencoded` encoding of one value: unreserved characters stay, everything else
    /// is percent-encoded.
    static func formEncoded(_ value: String) -> String {
        var out = ""
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = Array("0123456789ABCDEF".unicodeScalars)
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(hex[Int(byte >> 4)])
                out.unicodeScalars.append(hex[Int(byte & 0x0F)])
            }
        }
        return out
    }
}
