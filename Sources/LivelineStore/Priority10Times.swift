import LivelineCore

/// How an instance's recent priority-10 pushes are kept in `instances.priority10_sent`: seconds since 1970,
/// comma-separated, padded with spaces to a multiple of ``Priority10Times/reservedWidth`` bytes.
///
/// Every priority-10 push to an instance rewrites its row with one more time. A row that keeps its size is rewritten
/// in place; one that grows makes SQLite rebuild its cell in the page, which measured twice as slow for a fan-out's
/// progress writes. With the padding the column's size changes about once every eight pushes instead of at each.
enum Priority10Times {
    /// The column's length is a multiple of this many bytes (room for eight ten-digit times and their commas).
    static let reservedWidth = 96

    /// The column's text for `sent`.
    ///
    /// Built as bytes: every priority-10 push of a fan-out encodes one of these, and joining strings and padding with
    /// `String(repeating:count:)` cost about 3 % of a fan-out's CPU.
    static func encode(_ sent: [Int64]) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(reservedWidth * (1 + sent.count / 8))
        for (index, time) in sent.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            JSONValue.appendInteger(time, to: &bytes)
        }
        let width = max(1, (bytes.count + reservedWidth - 1) / reservedWidth) * reservedWidth
        bytes.append(contentsOf: repeatElement(UInt8(ascii: " "), count: width - bytes.count))
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The times in the column's text (also read unpadded, as written before the padding).
    static func decode(_ text: String?) -> [Int64] {
        guard let text else { return [] }
        return text.utf8.split(whereSeparator: { $0 == UInt8(ascii: ",") || $0 == UInt8(ascii: " ") }).compactMap {
            Int64(Substring($0))
        }
    }
}
