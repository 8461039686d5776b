import Foundation

/// The text of a failure that had no answer from a service (a refused connection, a failed TLS handshake, a timeout),
/// as it is recorded where API users read it: a delivery's reason in the timeline, a webhook attempt's error, a
/// channel request's failure.
///
/// An error's own description may name where it was raised in the server's build: BoringSSL's errors (through
/// NIOSSL) end with the source file and line of the check that failed, for example `…:CERTIFICATE_VERIFY_FAILED at
/// /home/build/liveline/.build/checkouts/swift-nio-ssl/Sources/CNIOBoringSSL/ssl/handshake.cc:393`. That path tells an
/// API user nothing about the failure and shows them the operator's build directory: it is left out, and the rest
/// (`CERTIFICATE_VERIFY_FAILED`) kept.
public enum FailureText {
    /// `error`'s description without the source locations in it.
    public static func of(_ error: any Error) -> String {
        withoutSourceLocations("\(error)")
    }

    /// `text` without its ` at /some/path/file.ext:123` parts: an absolute path that ends with a colon and a line number.
    /// Anything else after ` at ` is kept.
    public static func withoutSourceLocations(_ text: String) -> String {
        let marker = " at /"
        var result = ""
        var rest = Substring(text)
        while let found = rest.range(of: marker) {
            let pathStart = rest.index(before: found.upperBound)
            let after = rest[pathStart...]
            let end = after.firstIndex(where: { $0 == " " || $0 == ")" || $0 == "]" || $0 == "," || $0 == "\"" || $0 == "\n" }) ?? after.endIndex
            let location = after[..<end]
            if isSourceLocation(location) {
                result += rest[..<found.lowerBound]
                rest = after[end...]
            } else {
                result += rest[..<found.upperBound]
                rest = rest[found.upperBound...]
            }
        }
        result += rest
        return result
    }

    /// Whether `text` is `/path:line`: a path, a colon, and digits only after it.
    private static func isSourceLocation(_ text: Substring) -> Bool {
        guard let colon = text.lastIndex(of: ":") else { return false }
        let line = text[text.index(after: colon)...]
        return text.index(after: text.startIndex) < colon && !line.isEmpty && line.allSatisfy(\.isASCIIDigit)
    }
}

extension Character {
    fileprivate var isASCIIDigit: Bool { isASCII && isWholeNumber }
}
