import Hummingbird
import LivelineCore
import LivelineStore

/// The `cursor` query parameter of the paginated lists, checked against the form the OpenAPI
/// document gives: the canonical base64url (RFC 4648 §5, without padding) of the last key of the
/// previous page, as the Store issues it. Anything else is 400 `invalid_cursor` here, so the document
/// and the server agree on every string, not just on the ones the Store happens to decode.
enum PageCursor {
    /// What the encoded key is.
    enum Key {
        /// An activity or device id: `[A-Za-z0-9._:-]{1,128}` (``Identifier/isWellFormed(_:)``: `.` and `..` included, as the
        /// document's `Cursor` pattern has them, and as ids made before they were refused may be).
        case identifier
        /// A delivery's sequence number: `[1-9][0-9]{0,17}`.
        case sequence
    }

    /// The request's `cursor`, or nil without one.
    static func query(_ request: Request, _ key: Key) throws -> String? {
        guard let cursor = request.uri.queryParameters["cursor"].map(String.init) else { return nil }
        guard let decoded = decode(cursor), isValid(decoded, key) else {
            throw APIError.badRequest("invalid_cursor", "cursor is not one this server issued.", field: "cursor")
        }
        return cursor
    }

    static func isValid(_ decoded: [UInt8], _ key: Key) -> Bool {
        switch key {
        case .identifier:
            return Identifier.isWellFormed(String(decoding: decoded, as: UTF8.self))
        case .sequence:
            guard let first = decoded.first, (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(first), decoded.count <= 18 else { return false }
            return decoded.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
        }
    }

    /// Decodes canonical unpadded base64url: only `A-Z a-z 0-9 - _`, a length that is not 1 more
    /// than a multiple of 4, and zero bits after the last byte. Nil for anything else.
    static func decode(_ text: String) -> [UInt8]? {
        var bytes: [UInt8] = []
        var accumulator: UInt32 = 0
        var bits = 0
        for character in text.utf8 {
            let value: UInt8
            switch character {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = character - UInt8(ascii: "A")
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = character - UInt8(ascii: "a") + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = character - UInt8(ascii: "0") + 52
            case UInt8(ascii: "-"): value = 62
            case UInt8(ascii: "_"): value = 63
            default: return nil
            }
            accumulator = (accumulator << 6) | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                bytes.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
                accumulator &= (1 << UInt32(bits)) - 1
            }
        }
        // 6 leftover bits: a length of 4n + 1, which no byte string encodes to; otherwise they must be 0.
        guard bits < 6, accumulator == 0 else { return nil }
        return bytes
    }
}

extension PageCursor {
    /// The cursor for a position in a sequence (a feed position, a delivery's number): the base64url of its digits.
    static func encode(position: Int64) -> String {
        Base64URL.encode(Array(String(position).utf8))
    }

    /// The position a cursor in query parameter `name` stands for, nil without one; anything else is 400 `invalid_cursor`.
    static func position(_ request: Request, _ name: String) throws -> Int64? {
        guard let cursor = request.uri.queryParameters[Substring(name)].map(String.init) else { return nil }
        guard let decoded = decode(cursor), isValid(decoded, .sequence), let position = Int64(String(decoding: decoded, as: UTF8.self)) else {
            throw APIError.badRequest("invalid_cursor", "\(name) is not a cursor this server issued.", field: name)
        }
        return position
    }
}

extension PageCursor {
    /// The cursor for one of the app's counters (a feed position, a webhook delivery's id): the base64url of the digits
    /// of the number the app sees for it (``PublicNumbers``), never the counter, which all apps share.
    static func encode(counter: Int64, _ numbers: PublicNumbers) -> String {
        encode(position: numbers.shown(counter))
    }

    /// The counter a cursor in query parameter `name` stands for, nil without one; anything that is not a cursor is 400
    /// `invalid_cursor`.
    ///
    /// A number outside the app's numbers (``PublicNumbers/numbers``) — a bare counter, as cursors were before public
    /// numbers, or any other — stands before every counter when it is below them and after every one when above, and
    /// is never read as a counter: read as one, the app's own rows after a counter it chose told it where they sit among
    /// every app's, and so how many rows the other apps wrote between two of its own. A client that kept a bare cursor
    /// across the upgrade reads its listing from the start again.
    static func counter(_ request: Request, _ name: String, _ numbers: PublicNumbers) throws -> Int64? {
        guard let position = try position(request, name) else { return nil }
        if let counter = numbers.counter(for: position) { return counter }
        return position < PublicNumbers.numbers.lowerBound ? PublicNumbers.counters.lowerBound - 1 : PublicNumbers.counters.upperBound + 1
    }
}

extension PublicNumbers {
    /// What the app is shown for `counter`: its number, or (for a counter outside ``counters``, which no database
    /// reaches) the counter itself rather than a trap.
    func shown(_ counter: Int64) -> Int64 {
        Self.counters.contains(counter) ? number(for: counter) : counter
    }
}
