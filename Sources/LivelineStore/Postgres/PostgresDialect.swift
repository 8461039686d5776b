import SQLiteNIO
import Synchronization

/// How the Store's SQL, written in SQLite's spelling, is said to PostgreSQL: a pure rewrite of the text, made once per
/// statement and kept.
///
/// What differs and is rewritten:
/// - placeholders: `?` → `$1`, `$2`, … (outside quoted strings and identifiers);
/// - SQLite's scalar `MAX(a, b)` / `MIN(a, b)` (two or more arguments) → `GREATEST(a, b)` / `LEAST(a, b)`; the
///   aggregates `MAX(x)` / `MIN(x)` stay;
/// - `json_each(?)`, a JSON array bound as text → `json_array_elements_text(CAST(? AS json))`, whose column is also
///   named `value`;
/// - SQLite's planner hints go: `INDEXED BY name`, and `CROSS JOIN … ON` (SQLite's way to fix the join order) is a
///   plain `JOIN … ON`.
///
/// Everything else is written so that both databases read it alike: integer columns (0/1 for flags, milliseconds for
/// times), `UPDATE … FROM (VALUES …)` whose columns both name `column1`, `column2`, …, `ON CONFLICT`, `RETURNING`.
/// The few statements that must differ (a claim that skips rows another node has locked) ask ``SQLConnection/dialect``.
public enum PostgresDialect {
    /// The advisory lock nodes take, one at a time, to bring the schema up to date.
    static let migrationLockKey: Int64 = 0x4C49_5645_4C49_4E45  // "LIVELINE"

    /// `statements` as one PostgreSQL statement, or `nil` when they are not two or more plain inserts, updates or
    /// deletes: all but the last become `WITH` queries of the last (`WITH s1 AS (…), s2 AS (…) …`), their placeholders
    /// in the same order, so the binds follow one another.
    ///
    /// PostgreSQL runs a statement's `WITH` queries and its main query on one snapshot, in no set order, none seeing
    /// the others' changes: only for statements that touch rows of their own and read nothing another writes (see
    /// ``SQLConnection/executeTogether(_:)``). A statement that starts with its own `WITH`, or that returns rows, is
    /// not joined.
    static func together(_ statements: [(sql: String, binds: [SQLiteData])]) -> (sql: String, binds: [SQLiteData])? {
        guard statements.count > 1 else { return nil }
        // The sets join the same few statements again and again: each joining is worked out once (or its refusal).
        guard let joined = joinings.value(for: statements.map(\.sql), computing: join) else { return nil }
        return (joined, statements.flatMap(\.binds))
    }

    /// The text of ``together(_:)``, or nil.
    private static func join(_ texts: [String]) -> String? {
        var parts: [String] = []
        for sql in texts {
            let text = String(sql.drop(while: \.isWhitespace))
            let verb = text.prefix(while: { !$0.isWhitespace }).uppercased()
            guard ["INSERT", "UPDATE", "DELETE"].contains(verb), !text.uppercased().contains("RETURNING") else { return nil }
            parts.append(text)
        }
        let last = parts.removeLast()
        let with = parts.enumerated().map { "s\($0.offset + 1) AS (\($0.element))" }.joined(separator: ", ")
        return "WITH \(with) \(last)"
    }

    private static let joinings = TextMemo<[String], String?>(limit: 256)

    /// `sql` as PostgreSQL reads it.
    public static func translate(_ sql: String) -> String {
        translate(sql, parameterTypes: [])
    }

    /// `translate(sql)` with each placeholder cast to the type of the value bound to it (`$1::int8`), where that type is
    /// known: a statement prepared once and bound many times reads its values as the types an unprepared statement's
    /// values carry, rather than types PostgreSQL infers from where they stand.
    static func translate(_ sql: String, parameterTypes: [PostgresParameterType]) -> String {
        let rewritten = rewriteScalarExtremes(
            in: sql.replacingOccurrences(of: "json_each(?)", with: "json_array_elements_text(CAST(? AS json))")
                .replacingOccurrences(of: "CROSS JOIN", with: "JOIN")
                .replacing(/\s+INDEXED BY\s+\w+/, with: "")
        )
        return numberPlaceholders(in: rewritten, casts: parameterTypes.map(\.cast))
    }

    /// `translate(sql)`, remembered: the Store says the same few statements again and again.
    static func cachedTranslation(_ sql: String) -> String {
        translations.value(for: sql) { translate($0) }
    }

    private static let translations = TextMemo<String, String>(limit: 1024)

    /// `?` → `$n`, skipping quoted text (`'…'`, `"…"`) and comments (`-- …`); `$n::type` where `casts` names a type
    /// for the n-th.
    static func numberPlaceholders(in sql: String, casts: [String?] = []) -> String {
        var output = ""
        output.reserveCapacity(sql.utf8.count + 16)
        var number = 0
        var quote: Character?
        var inComment = false
        for character in sql {
            if inComment {
                output.append(character)
                if character == "\n" { inComment = false }
                continue
            }
            if let open = quote {
                output.append(character)
                if character == open { quote = nil }
                continue
            }
            switch character {
            case "'", "\"":
                quote = character
                output.append(character)
            case "-" where output.last == "-":
                inComment = true
                output.append(character)
            case "?":
                number += 1
                output += "$\(number)"
                if number <= casts.count, let cast = casts[number - 1] { output += "::\(cast)" }
            default:
                output.append(character)
            }
        }
        return output
    }

    /// `MAX(a, b)` → `GREATEST(a, b)` and `MIN(a, b)` → `LEAST(a, b)`; one-argument aggregates stay.
    static func rewriteScalarExtremes(in sql: String) -> String {
        var characters = Array(sql)
        var index = 0
        while index < characters.count {
            for (name, replacement) in [("MAX(", "GREATEST("), ("MIN(", "LEAST(")] {
                let pattern = Array(name)
                guard index + pattern.count <= characters.count, Array(characters[index..<index + pattern.count]) == pattern else { continue }
                if index > 0, characters[index - 1].isLetter || characters[index - 1].isNumber || characters[index - 1] == "_" { continue }
                if hasTopLevelComma(characters, openingAt: index + pattern.count - 1) {
                    characters.replaceSubrange(index..<index + pattern.count, with: Array(replacement))
                    index += replacement.count - 1
                }
                break
            }
            index += 1
        }
        return String(characters)
    }

    /// Whether the parenthesis at `open` holds a comma outside any nested parentheses or quotes before it closes.
    private static func hasTopLevelComma(_ characters: [Character], openingAt open: Int) -> Bool {
        var depth = 0
        var quote: Character?
        var index = open
        while index < characters.count {
            let character = characters[index]
            if let open = quote {
                if character == open { quote = nil }
            } else {
                switch character {
                case "'", "\"": quote = character
                case "(": depth += 1
                case ")":
                    depth -= 1
                    if depth == 0 { return false }
                case "," where depth == 1: return true
                default: break
                }
            }
            index += 1
        }
        return false
    }
}

/// What a pure function of statement text gave, kept for the texts the Store says again and again (``PostgresDialect``'s
/// rewrites). Past `limit` texts it starts again rather than grow: only lists of bound values vary in length.
final class TextMemo<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private let limit: Int
    private let values = Mutex<[Key: Value]>([:])

    init(limit: Int) {
        self.limit = limit
    }

    /// What `compute` gives for `key`: kept from an earlier call, or computed now (outside the lock) and kept.
    func value(for key: Key, computing compute: (Key) -> Value) -> Value {
        if let known = values.withLock({ $0[key] }) { return known }
        let value = compute(key)
        values.withLock { values in
            if values.count >= limit { values.removeAll(keepingCapacity: true) }
            values[key] = value
        }
        return value
    }
}
