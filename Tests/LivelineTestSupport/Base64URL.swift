import Foundation

/// Unpadded base64url (RFC 4648 §5) decoded, or `nil` when `text` is not base64url.
///
/// Written here from the RFC, independently of the encoders under test, so that a test reading a JWT checks the
/// sender's encoding rather than repeating it.
public func base64URLDecode(_ text: some StringProtocol) -> [UInt8]? {
    var base64 = String(text).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while base64.utf8.count % 4 != 0 { base64.append("=") }
    return Data(base64Encoded: base64).map(Array.init)
}
