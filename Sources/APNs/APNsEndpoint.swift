/// A mistake in how the APNs client was configured: an endpoint URL, a signing key, a CA certificate.
public struct APNsConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What is wrong, and what was expected instead.
    public var description: String

    /// Creates an error with the given explanation.
    public init(_ description: String) {
        self.description = description
    }
}

/// Where pushes are sent: Apple's production or sandbox host, or any other HTTP/2 + TLS endpoint (the local
/// emulator, a test sink) with an optional extra CA certificate to trust.
public struct APNsEndpoint: Sendable, Hashable {
    /// The host name or IP address to connect to (IPv6 without brackets).
    public var host: String
    /// The TCP port.
    public var port: Int
    /// PEM of extra CA certificates to trust in addition to the system trust store; `nil` = the system trust
    /// store only.
    public var trustedCAPEM: String?

    /// Apple's production environment, `api.push.apple.com:443`.
    public static let production = APNsEndpoint(host: "api.push.apple.com", port: 443)
    /// Apple's development environment, `api.sandbox.push.apple.com:443`.
    public static let sandbox = APNsEndpoint(host: "api.sandbox.push.apple.com", port: 443)
    /// Apple's production channel management host for broadcast channels, `api-manage-broadcast.push.apple.com:2196`
    /// ("Sending channel management requests to APNs"). Use it with ``APNsChannelManager``.
    public static let channelManagementProduction = APNsEndpoint(host: "api-manage-broadcast.push.apple.com", port: 2196)
    /// Apple's development channel management host for broadcast channels,
    /// `api-manage-broadcast.sandbox.push.apple.com:2195` ("Sending channel management requests to APNs"). Use it
    /// with ``APNsChannelManager``.
    public static let channelManagementSandbox = APNsEndpoint(
        host: "api-manage-broadcast.sandbox.push.apple.com",
        port: 2195
    )

    /// Creates an endpoint from its parts.
    public init(host: String, port: Int, trustedCAPEM: String? = nil) {
        self.host = host
        self.port = port
        self.trustedCAPEM = trustedCAPEM
    }

    /// Parses `"https://host[:port]"`, for example `"https://127.0.0.1:8443"` or `"https://[::1]:2197"`.
    ///
    /// Only `https` is accepted; the port defaults to 443; a single trailing `/` is tolerated. A path, query,
    /// fragment, user info, another scheme, an empty host or an invalid port throws ``APNsConfigurationError``.
    public init(baseURL: String, trustedCAPEM: String? = nil) throws {
        let prefix = "https://"
        guard baseURL.count > prefix.count, baseURL.lowercased().hasPrefix(prefix) else {
            throw APNsConfigurationError(
                "APNs base URL \"\(baseURL)\" must look like https://host[:port] (only https is supported)."
            )
        }
        var rest = Substring(baseURL.dropFirst(prefix.count))
        if rest.hasSuffix("/") {
            rest = rest.dropLast()
        }
        if rest.contains(where: { "/?#@ \t\r\n".contains($0) }) {
            throw APNsConfigurationError(
                "APNs base URL \"\(baseURL)\" must be only https://host[:port], without a path, query, fragment or user info."
            )
        }

        let hostPart: Substring
        let portPart: Substring?
        if rest.hasPrefix("[") {
            // An IPv6 literal: [address] or [address]:port.
            guard let close = rest.firstIndex(of: "]") else {
                throw APNsConfigurationError("APNs base URL \"\(baseURL)\" has an unterminated IPv6 address.")
            }
            hostPart = rest[rest.index(after: rest.startIndex)..<close]
            let afterClose = rest[rest.index(after: close)...]
            if afterClose.isEmpty {
                portPart = nil
            } else if afterClose.hasPrefix(":") {
                portPart = afterClose.dropFirst()
            } else {
                throw APNsConfigurationError("APNs base URL \"\(baseURL)\" has characters after the IPv6 address.")
            }
            guard !hostPart.isEmpty, hostPart.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else {
                throw APNsConfigurationError("APNs base URL \"\(baseURL)\" has an invalid IPv6 address.")
            }
        } else {
            let parts = rest.split(separator: ":", omittingEmptySubsequences: false)
            guard parts.count <= 2 else {
                throw APNsConfigurationError(
                    "APNs base URL \"\(baseURL)\" has more than one ':'; write IPv6 addresses in brackets."
                )
            }
            hostPart = parts[0]
            portPart = parts.count == 2 ? parts[1] : nil
            let allowed = hostPart.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == ".") }
            guard !hostPart.isEmpty, allowed, !hostPart.hasPrefix("."), !hostPart.hasPrefix("-") else {
                throw APNsConfigurationError("APNs base URL \"\(baseURL)\" has an invalid host \"\(hostPart)\".")
            }
        }

        var port = 443
        if let portPart {
            guard !portPart.isEmpty, portPart.count <= 5, portPart.allSatisfy({ $0.isASCII && $0.isNumber }),
                let parsed = Int(portPart), (1...65535).contains(parsed)
            else {
                throw APNsConfigurationError(
                    "APNs base URL \"\(baseURL)\" has an invalid port \"\(portPart)\" (expected 1 to 65535)."
                )
            }
            port = parsed
        }
        self.init(host: String(hostPart).lowercased(), port: port, trustedCAPEM: trustedCAPEM)
    }

    /// The `:authority` pseudo-header value: the host, with the port when it is not 443.
    var authority: String {
        let hostText = host.contains(":") ? "[\(host)]" : host
        return port == 443 ? hostText : "\(hostText):\(port)"
    }

    /// Whether ``host`` is an IPv4 or IPv6 literal (which must not be sent as TLS SNI).
    var hostIsIPAddress: Bool {
        if host.contains(":") {
            return true
        }
        let labels = host.split(separator: ".", omittingEmptySubsequences: false)
        return labels.count == 4
            && labels.allSatisfy { label in
                !label.isEmpty && label.count <= 3 && label.allSatisfy { $0.isASCII && $0.isNumber }
                    && Int(label).map { $0 <= 255 } == true
            }
    }
}
