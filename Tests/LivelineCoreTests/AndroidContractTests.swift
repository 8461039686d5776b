import Foundation
import LivelineCore
import Testing

/// The Android data contract is written down three times: the server's encoder (`FCMLiveUpdateMessage`), the table in
/// `docs/android.md` that app developers read, and the Kotlin reference SDK's `LivelineContract.kt` that apps compile.
/// These tests read the two files (and the fixture of the Kotlin SDK's unit tests) and hold them to what the encoder puts
/// on the wire, so renaming, adding or dropping a key on any side fails here instead of on a phone.
@Suite("Android data contract: docs/android.md and the Kotlin SDK match the FCM encoder")
struct AndroidContractTests {
    /// One row of the documentation's data-contract table.
    struct DocumentedKey: Equatable {
        var key: String
        /// The table's "present" column, e.g. `always`, `` `start` only ``, `if set`.
        var presence: String

        /// A key present on every message.
        var isRequired: Bool { presence == "always" }

        /// Whether every message of `event` carries the key: `always`, or `` `start` only `` on a start (an
        /// `` `end` only, if set `` key is optional).
        func isRequired(on event: String) -> Bool {
            isRequired || (events == [event] && !presence.contains("if set"))
        }

        /// The events the key may appear on: `` `start` only `` and `` `end` only, if set `` restrict it, any other
        /// presence allows all three.
        var events: Set<String> {
            if presence.hasPrefix("`start` only") { return ["start"] }
            if presence.hasPrefix("`end` only") { return ["end"] }
            return ["start", "update", "end"]
        }

        /// Whether `message` carries the key, as the table says: by its event and, for an alert's keys ("if the
        /// alert's title is text", "… is localized"), by whether the message's alert has that part in that form.
        func belongs(on message: FCMLiveUpdateMessage) -> Bool {
            guard events.contains(message.event.rawValue) else { return false }
            for (part, text) in [("title", message.alert?.title), ("body", message.alert?.body)] where presence.contains("alert's \(part)") {
                switch text {
                case nil: return false
                case .text?: return presence.contains("is text")
                case .localized?: return presence.contains("is localized")
                }
            }
            return true
        }
    }

    /// The repository root: this file is `Tests/LivelineCoreTests/AndroidContractTests.swift`.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    static let docPath = "docs/android.md"
    static let kotlinPath = "sdk/android/liveline/src/main/kotlin/dev/liveline/LivelineContract.kt"
    static let kotlinTestPath = "sdk/android/liveline/src/test/kotlin/dev/liveline/LivelineContractTest.kt"

    static func read(_ path: String) throws -> String {
        try String(contentsOf: root.appendingPathComponent(path), encoding: .utf8)
    }

    /// The rows of the table under `## The data contract` whose first cell is a `` `liveline_…` `` key, in order.
    static func documentedKeys() throws -> [DocumentedKey] {
        let text = try read(docPath)
        let section = try #require(
            text.components(separatedBy: "\n## The data contract\n").dropFirst().first,
            "\(docPath) has no '## The data contract' section"
        )
        let body = section.components(separatedBy: "\n## ").first ?? section
        var keys: [DocumentedKey] = []
        for line in body.split(separator: "\n") where line.hasPrefix("| `liveline_") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false)
                .map { $0.trimmingCharacters(in: .whitespaces) }
            // "| key | present | value |" splits into ["", key, present, value, ""].
            try #require(cells.count == 5, "a contract row must have three cells: \(line)")
            let key = cells[1].trimmingCharacters(in: CharacterSet(charactersIn: "`"))
            keys.append(DocumentedKey(key: key, presence: cells[2]))
        }
        return keys
    }

    /// The Kotlin SDK's `const val NAME = "liveline_…"` keys, by constant name.
    static func kotlinKeys() throws -> [String: String] {
        let text = try read(kotlinPath)
        let pattern = try NSRegularExpression(pattern: #"const\s+val\s+(\w+)\s*=\s*"(liveline_[^"]*)""#)
        var keys: [String: String] = [:]
        for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            let name = String(text[Range(match.range(at: 1), in: text)!])
            let value = String(text[Range(match.range(at: 2), in: text)!])
            #expect(keys[name] == nil, "\(kotlinPath) declares \(name) twice")
            keys[name] = value
        }
        return keys
    }

    /// The constant names listed in the Kotlin SDK's `REQUIRED_KEYS = listOf(…)`.
    static func kotlinRequiredNames() throws -> [String] {
        let text = try read(kotlinPath)
        let pattern = try NSRegularExpression(pattern: #"REQUIRED_KEYS[^=]*=\s*listOf\(([^)]*)\)"#)
        let match = try #require(
            pattern.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)),
            "\(kotlinPath) has no REQUIRED_KEYS = listOf(...)"
        )
        return text[Range(match.range(at: 1), in: text)!].split(separator: ",")
            .map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }.filter { !$0.isEmpty }
    }

    /// The wire values of the Kotlin SDK's `enum class LivelineEvent`, e.g. `START("start")`.
    static func kotlinEventValues() throws -> Set<String> {
        let text = try read(kotlinPath)
        let enumBody = try #require(
            text.components(separatedBy: "enum class LivelineEvent").dropFirst().first?.components(separatedBy: ";").first,
            "\(kotlinPath) has no enum class LivelineEvent"
        )
        let pattern = try NSRegularExpression(pattern: #"[A-Z]+\("([a-z]+)"\)"#)
        return Set(
            pattern.matches(in: enumBody, range: NSRange(enumBody.startIndex..., in: enumBody))
                .map { String(enumBody[Range($0.range(at: 1), in: enumBody)!]) }
        )
    }

    // Messages as the server builds them, each with every optional field its event allows; the update's alert is
    // localized, the others' text.
    static let start = FCMLiveUpdateMessage(
        activityID: "match-42", event: .start, sequence: 1, timestamp: 1_763_700_000,
        contentState: ["home": 0, "away": 0, "minute": 1], staleDate: 1_763_703_600,
        attributesType: "MatchAttributes", attributes: ["home": "Lions", "away": "Tigers"],
        alert: LiveActivityAlert(title: "Kick-off", body: "Lions – Tigers has started")
    )
    static let update = FCMLiveUpdateMessage(
        activityID: "match-42", event: .update, sequence: 2, timestamp: 1_763_700_060,
        contentState: ["home": 1, "away": 0, "minute": 12], staleDate: 1_763_703_660,
        alert: LiveActivityAlert(
            title: .localized(key: "goal_title", arguments: []), body: .localized(key: "goal_body", arguments: ["Lions", "1–0"]),
            sound: "default"
        )
    )
    static let end = FCMLiveUpdateMessage(
        activityID: "match-42", event: .end, sequence: 3, timestamp: 1_763_705_400,
        contentState: ["home": 2, "away": 1, "minute": 90], staleDate: 1_763_709_000, dismissalDate: 1_763_706_000,
        alert: LiveActivityAlert(title: "Full time", body: "Lions win 2–1")
    )
    /// The same events with no optional field: only the keys each event requires remain.
    static let bare: [FCMLiveUpdateMessage] = [
        FCMLiveUpdateMessage(
            activityID: "a", event: .start, sequence: 1, timestamp: 1, contentState: [:], attributesType: "T", attributes: [:]
        ),
        FCMLiveUpdateMessage(activityID: "a", event: .update, sequence: 2, timestamp: 2, contentState: [:]),
        FCMLiveUpdateMessage(activityID: "a", event: .end, sequence: 3, timestamp: 3, contentState: [:]),
    ]

    /// The `data` object of the request body the encoder puts on the wire for `message`.
    static func wireData(_ message: FCMLiveUpdateMessage) throws -> [String: String] {
        try message.validate()
        let json = try JSONValue(parsing: message.requestBody(token: "fcm-token"))
        let data = try #require(json.objectValue?["message"]?.objectValue?["data"]?.objectValue)
        var strings: [String: String] = [:]
        for (key, value) in data {
            guard case .string(let string) = value else {
                Issue.record("data[\(key)] is not a string: FCM accepts only string values")
                continue
            }
            strings[key] = string
        }
        return strings
    }

    @Test("the documented keys are exactly the keys the encoder emits, each on the events the table says")
    func documentationMatchesEncoder() throws {
        let documented = try Self.documentedKeys()
        try #require(!documented.isEmpty, "no `liveline_…` rows found in \(Self.docPath)")
        #expect(Set(documented.map(\.key)).count == documented.count, "a key is documented twice")

        var emitted: Set<String> = []
        for message in [Self.start, Self.update, Self.end] {
            let keys = Set(try Self.wireData(message).keys)
            emitted.formUnion(keys)
            let expected = Set(documented.filter { $0.belongs(on: message) }.map(\.key))
            #expect(keys == expected, "\(message.event) emits \(keys.sorted()); \(Self.docPath) documents \(expected.sorted())")
        }
        #expect(emitted == Set(documented.map(\.key)))
        // The encoder's own names say the same.
        typealias Key = FCMLiveUpdateMessage.Key
        let encoderKeys: Set<String> = [
            Key.activityID, Key.event, Key.sequence, Key.timestamp, Key.contentState, Key.staleDate, Key.dismissalDate,
            Key.attributesType, Key.attributes, Key.alertTitle, Key.alertBody, Key.alertTitleLocKey, Key.alertTitleLocArgs,
            Key.alertBodyLocKey, Key.alertBodyLocArgs,
        ]
        #expect(emitted == encoderKeys)
    }

    @Test("the keys documented as always present are on every message; a bare message carries only what its event requires")
    func requiredKeys() throws {
        let required = Set(try Self.documentedKeys().filter(\.isRequired).map(\.key))
        #expect(required.count == 5)
        for message in [Self.start, Self.update, Self.end] {
            let keys = Set(try Self.wireData(message).keys)
            #expect(required.isSubset(of: keys), "\(message.event) lacks \(required.subtracting(keys).sorted())")
        }
        // With no optional field set, each event carries exactly the keys the table makes required for it.
        let documented = try Self.documentedKeys()
        for message in Self.bare {
            let expected = Set(documented.filter { $0.isRequired(on: message.event.rawValue) }.map(\.key))
            #expect(Set(try Self.wireData(message).keys) == expected, "a bare \(message.event) carries only its required keys")
        }
        #expect(Set(try Self.wireData(Self.bare[0]).keys).subtracting(required) == [
            FCMLiveUpdateMessage.Key.attributesType, FCMLiveUpdateMessage.Key.attributes,
        ])
    }

    @Test("the Kotlin SDK's constants are exactly the keys the encoder emits")
    func kotlinMatchesEncoder() throws {
        let kotlin = try Self.kotlinKeys()
        try #require(!kotlin.isEmpty, "no `const val … = \"liveline_…\"` found in \(Self.kotlinPath)")
        let values = Array(kotlin.values)
        #expect(Set(values).count == values.count, "two Kotlin constants share a value: \(values.sorted())")

        var emitted: Set<String> = []
        for message in [Self.start, Self.update, Self.end] { emitted.formUnion(try Self.wireData(message).keys) }
        #expect(Set(values) == emitted, "Kotlin: \(Set(values).sorted()); encoder: \(emitted.sorted())")
        #expect(Set(values) == Set(try Self.documentedKeys().map(\.key)))
    }

    @Test("the Kotlin SDK requires exactly the always-present keys, and knows the encoder's events")
    func kotlinRequiredKeysAndEvents() throws {
        let kotlin = try Self.kotlinKeys()
        let names = try Self.kotlinRequiredNames()
        let required = try names.map { name in try #require(kotlin[name], "REQUIRED_KEYS names \(name), which is no key constant") }
        #expect(required.count == names.count)
        #expect(Set(required) == Set(try Self.documentedKeys().filter(\.isRequired).map(\.key)))
        for message in Self.bare {
            let keys = Set(try Self.wireData(message).keys)
            #expect(Set(required).isSubset(of: keys))
            if message.event != .start { #expect(keys == Set(required), "a bare \(message.event) carries only these") }
        }

        let events = try Self.kotlinEventValues()
        #expect(events == Set([LiveActivityEvent.start, .update, .end].map(\.rawValue)))
        for message in [Self.start, Self.update, Self.end] {
            #expect(events.contains(try Self.wireData(message)[FCMLiveUpdateMessage.Key.event] ?? ""))
        }
    }

    /// The `private val start = mapOf("liveline_…" to "…", …)` fixture of the Kotlin SDK's unit tests.
    static func kotlinStartFixture() throws -> [String: String] {
        let text = try read(kotlinTestPath)
        let body = try #require(
            text.components(separatedBy: "private val start = mapOf(").dropFirst().first?.components(separatedBy: "\n    )").first,
            "\(kotlinTestPath) has no `private val start = mapOf(` fixture"
        )
        let pair = try NSRegularExpression(pattern: #""(liveline_\w+)" to (?:"""(.*?)"""|"([^"\\]*)")"#)
        var fixture: [String: String] = [:]
        for match in pair.matches(in: body, range: NSRange(body.startIndex..., in: body)) {
            let key = String(body[Range(match.range(at: 1), in: body)!])
            let value = Range(match.range(at: 2), in: body) ?? Range(match.range(at: 3), in: body)!
            fixture[key] = String(body[value])
        }
        return fixture
    }

    @Test("the Kotlin SDK's unit tests parse exactly what the encoder emits for the same start")
    func kotlinFixtureMatchesEncoder() throws {
        let fixture = try Self.kotlinStartFixture()
        try #require(!fixture.isEmpty, "no `\"liveline_…\" to …` pairs found in \(Self.kotlinTestPath)")
        #expect(fixture == (try Self.wireData(Self.start)))
    }

    @Test("values are what the Kotlin parser expects: decimal numbers, JSON objects, the alert's two halves")
    func valueShapes() throws {
        typealias Key = FCMLiveUpdateMessage.Key
        for message in [Self.start, Self.update, Self.end] {
            let data = try Self.wireData(message)
            for key in [Key.sequence, Key.timestamp, Key.staleDate, Key.dismissalDate] {
                if let text = data[key] { #expect(Int64(text) != nil, "\(key) = \(text) is not a decimal integer") }
            }
            for key in [Key.contentState, Key.attributes] {
                if let text = data[key] {
                    #expect(try JSONValue(parsing: Array(text.utf8)).objectValue != nil, "\(key) is not a JSON object")
                }
            }
            #expect((data[Key.alertTitle] ?? data[Key.alertTitleLocKey] == nil) == (data[Key.alertBody] ?? data[Key.alertBodyLocKey] == nil))
            #expect((data[Key.alertTitleLocKey] == nil) == (data[Key.alertTitleLocArgs] == nil))
            #expect((data[Key.alertBodyLocKey] == nil) == (data[Key.alertBodyLocArgs] == nil))
            for key in [Key.alertTitleLocArgs, Key.alertBodyLocArgs] {
                if let text = data[key] {
                    let arguments = try JSONValue(parsing: Array(text.utf8)).arrayValue
                    #expect(arguments?.allSatisfy { $0.stringValue != nil } == true, "\(key) is not a JSON array of strings")
                }
            }
        }
        #expect(try Self.wireData(Self.update)[Key.alertBodyLocArgs] == #"["Lions","1–0"]"#)
        #expect(try Self.wireData(Self.update)[Key.alertTitleLocArgs] == "[]")
        #expect(try Self.wireData(Self.end)[Key.dismissalDate] == "1763706000")
        #expect(try Self.wireData(Self.start)[Key.attributes] == #"{"away":"Tigers","home":"Lions"}"#)
    }
}
