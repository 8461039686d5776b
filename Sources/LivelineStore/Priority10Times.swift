/// How instances' priority-10 pushes were kept before ``Priority10Tally`` (SQLite schema step 18, PostgreSQL step 6):
/// in `instances.priority10_sent`, seconds since 1970, comma-separated, padded with spaces. A row written before then
/// is read through here until its first tally replaces it.
enum Priority10Times {
    /// The times in the column's text (padded or not).
    static func decode(_ text: String?) -> [Int64] {
        guard let text else { return [] }
        return text.utf8.split(whereSeparator: { $0 == UInt8(ascii: ",") || $0 == UInt8(ascii: " ") }).compactMap {
            Int64(Substring($0))
        }
    }
}
