import Foundation

/// Which webhook URLs a tenant may give, so that it cannot make the server call into its own network (SSRF): https
/// only, and no host that is, or resolves to, a loopback, private, link-local, shared, multicast or reserved address —
/// unless the operator allows private networks (`liveline.webhooks.allowPrivateNetworks`, e.g. for local development),
/// which also allows http. Pure, apart from the resolver it is given.
public struct WebhookURLPolicy: Sendable {
    /// Allows http and addresses in private ranges.
    public var allowsPrivateNetworks: Bool

    public init(allowsPrivateNetworks: Bool) {
        self.allowsPrivateNetworks = allowsPrivateNetworks
    }

    /// Why a URL is refused.
    public struct Refusal: Error, Sendable, Hashable, CustomStringConvertible {
        public var description: String
        public init(_ description: String) { self.description = description }
    }

    /// Checks the URL's form and, when the host is an address, the address.
    public func check(_ text: String) throws(Refusal) -> URL {
        guard text.utf8.count <= 2048 else { throw Refusal("url must be at most 2,048 bytes.") }
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), let host = url.host, !host.isEmpty
        else { throw Refusal("url must be an absolute https:// URL.") }
        guard url.user == nil, url.password == nil else { throw Refusal("url must not carry credentials.") }
        guard scheme == "https" || (allowsPrivateNetworks && scheme == "http") else {
            throw Refusal(allowsPrivateNetworks ? "url must be http:// or https://." : "url must be https://.")
        }
        if !allowsPrivateNetworks {
            // A name's one trailing dot (the root) names the same host: `localhost.`, `127.0.0.1.`.
            var lowered = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
            if lowered.hasSuffix("."), lowered.count > 1 { lowered.removeLast() }
            if lowered == "localhost" || lowered.hasSuffix(".localhost") || lowered.hasSuffix(".local") || lowered.hasSuffix(".internal") {
                throw Refusal("url's host is on a local network; webhooks go to public endpoints.")
            }
            if let address = Self.parse(lowered), !Self.isPublic(address) {
                throw Refusal("url's host is a loopback, private or reserved address; webhooks go to public endpoints.")
            }
        }
        return url
    }

    /// Checks the addresses a host resolved to (at each delivery, so a name cannot later point inward).
    public func check(resolved addresses: [[UInt8]]) throws(Refusal) {
        guard !allowsPrivateNetworks else { return }
        guard !addresses.isEmpty else { throw Refusal("the host did not resolve.") }
        for address in addresses where !Self.isPublic(address) {
            throw Refusal("the host resolves to a loopback, private or reserved address.")
        }
    }

    /// An IPv4 (4 bytes) or IPv6 (16 bytes) literal, or nil. IPv4 in every form the resolver and the HTTP client accept
    /// as an address (`inet_aton`'s): dotted quads, and the shorter, decimal, octal and hexadecimal forms such as
    /// `127.1`, `2130706433` and `0x7f.1`, which all name 127.0.0.1.
    public static func parse(_ host: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 { return withUnsafeBytes(of: v4) { Array($0) } }
        if !host.isEmpty, host.utf8.allSatisfy({ $0 == 0x2E || ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x66) || $0 | 0x20 == 0x78 }),
           inet_aton(host, &v4) != 0 {
            return withUnsafeBytes(of: v4) { Array($0) }
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 { return withUnsafeBytes(of: v6) { Array($0) } }
        return nil
    }

    /// An address as text (`93.184.216.34`, `2001:db8::1`), or nil for bytes that are neither IPv4 nor IPv6.
    public static func text(of address: [UInt8]) -> String? {
        let family: Int32
        switch address.count {
        case 4: family = AF_INET
        case 16: family = AF_INET6
        default: return nil
        }
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let written = address.withUnsafeBytes { bytes in inet_ntop(family, bytes.baseAddress, &buffer, socklen_t(buffer.count)) }
        guard written != nil else { return nil }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The order a name's addresses are tried in: IPv4 ones first (a server without an IPv6 route is commoner than one
    /// without IPv4), each family in the resolver's order, without repeats.
    public static func connectionOrder(_ addresses: [[UInt8]]) -> [[UInt8]] {
        var seen: Set<[UInt8]> = []
        let unique = addresses.filter { seen.insert($0).inserted }
        return unique.filter { $0.count == 4 } + unique.filter { $0.count != 4 }
    }

    /// Whether an address is a public unicast one.
    public static func isPublic(_ address: [UInt8]) -> Bool {
        if address.count == 4 { return isPublicV4(address) }
        guard address.count == 16 else { return false }
        // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible forms: judge the IPv4 address.
        if address[0..<10].allSatisfy({ $0 == 0 }), address[10] == 0xff, address[11] == 0xff { return isPublicV4(Array(address[12...])) }
        if address[0..<12].allSatisfy({ $0 == 0 }) { return false }  // ::, ::1 and the deprecated compatible form
        if address[0] & 0xfe == 0xfc { return false }  // fc00::/7 unique local
        if address[0] == 0xfe, address[1] & 0xc0 == 0x80 { return false }  // fe80::/10 link-local
        if address[0] == 0xfe, address[1] & 0xc0 == 0xc0 { return false }  // fec0::/10 site-local (deprecated, RFC 3879)
        if address[0] == 0x20, address[1] == 0x02 { return isPublicV4(Array(address[2..<6])) }  // 6to4: its IPv4 address
        if address[0] == 0xff { return false }  // multicast
        if address[0] == 0x20, address[1] == 0x01, address[2] == 0x0d, address[3] == 0xb8 { return false }  // 2001:db8::/32
        // IPv4-translated (::ffff:0:a.b.c.d, SIIT): its IPv4 address.
        if address[0..<8].allSatisfy({ $0 == 0 }), address[8] == 0xff, address[9] == 0xff, address[10] == 0, address[11] == 0 {
            return isPublicV4(Array(address[12...]))
        }
        if address[0] == 0x00, address[1] == 0x64, address[2] == 0xff, address[3] == 0x9b {
            // 64:ff9b::/96, the well-known NAT64 prefix: its IPv4 address. Anything else under 64:ff9b::/32 is the
            // local-use 64:ff9b:1::/48 (RFC 8215), translated by the operator's own gateway, with the IPv4 address
            // where its prefix length puts it: refused.
            guard address[4..<12].allSatisfy({ $0 == 0 }) else { return false }
            return isPublicV4(Array(address[12...]))
        }
        if address[0] == 0x20, address[1] == 0x01, address[2] == 0, address[3] == 0 { return false }  // 2001::/32 Teredo
        if address[0] == 0x01, address[1..<8].allSatisfy({ $0 == 0 }) { return false }  // 100::/64 discard-only
        return true
    }

    private static func isPublicV4(_ a: [UInt8]) -> Bool {
        switch (a[0], a[1]) {
        case (0, _), (10, _), (127, _): return false
        case (100, 64...127): return false  // shared address space
        case (169, 254): return false
        case (172, 16...31): return false
        case (192, 168): return false
        case (192, 0) where a[2] == 0 || a[2] == 2: return false
        case (198, 18...19): return false
        case (198, 51) where a[2] == 100: return false
        case (203, 0) where a[2] == 113: return false
        case (224...255, _): return false  // multicast, reserved, broadcast
        default: return true
        }
    }
}
