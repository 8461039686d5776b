import Foundation
import LivelineCore
import Testing

@Suite("Content-state schemas")
struct ContentStateSchemaTests {
    static let schemaJSON: JSONValue = [
        "contentState": [
            "status": "string",
            "minutesAway": "integer",
            "progress": "number",
            "delayed": "boolean",
            "eta": "date",
            "note": "string?",
            "stops": ["type": "array", "items": "string"],
            "driver": ["type": "object", "fields": ["name": "string", "rating": "number?"]],
            "phase": ["type": "enum", "values": ["preparing", "onTheWay", "delivered"]],
            "window": ["type": "object", "fields": ["from": "date"], "optional": true],
        ],
        "attributes": ["orderNumber": "string"],
    ]

    static let valid: JSONValue = [
        "status": "On the way", "minutesAway": 12, "progress": 0.5, "delayed": false, "eta": "2026-11-21T10:00:00Z",
        "stops": ["A", "B"], "driver": ["name": "Ana"], "phase": "onTheWay",
    ]

    static func replacing(_ key: String, with value: JSONValue?) -> JSONValue {
        guard case .object(var members) = valid else { return valid }
        members[key] = value
        return .object(members)
    }

    @Test("a conforming state passes, and an ISO-8601 date becomes seconds since 2001 (JSONDecoder's default)")
    func conforming() throws {
        let schema = try AttributesTypeSchema(json: Self.schemaJSON)
        let out = try schema.conform(contentState: Self.valid)
        // 2026-11-21T10:00:00Z is 1,795,255,200 s after 1970 and 816,948,000 s after 2001-01-01.
        #expect(out.objectValue?["eta"] == .integer(816_948_000))
        #expect(out.objectValue?["minutesAway"] == .integer(12))
        #expect(out.objectValue?["status"] == "On the way")
    }

    @Test("the date decodes on the phone's side to the same instant")
    func dateRoundTripsThroughJSONDecoder() throws {
        struct State: Decodable { var eta: Date }
        let schema = try AttributesTypeSchema(json: Self.schemaJSON)
        let out = try schema.conform(contentState: Self.valid)
        let decoded = try JSONDecoder().decode(State.self, from: Data(out.encoded))
        #expect(decoded.eta == Date(timeIntervalSince1970: 1_795_255_200))
    }

    @Test("secondsSince1970 encodes dates as epoch seconds")
    func epochDates() throws {
        guard case .object(var members) = Self.schemaJSON else { return }
        members["dateEncoding"] = "secondsSince1970"
        let schema = try AttributesTypeSchema(json: .object(members))
        let out = try schema.conform(contentState: Self.valid)
        #expect(out.objectValue?["eta"] == .integer(1_795_255_200))
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        struct State: Decodable { var eta: Date }
        #expect(try decoder.decode(State.self, from: Data(out.encoded)).eta == Date(timeIntervalSince1970: 1_795_255_200))
    }

    static let mismatches: [(String, JSONValue?, String)] = [
        ("minutesAway", "128", #"contentState.minutesAway: expected integer, got string "128"."#),
        ("minutesAway", 12.5, "contentState.minutesAway: expected integer, got number 12.5."),
        ("minutesAway", nil, "contentState.minutesAway: expected integer, but it is missing."),
        ("minutesAway", .null, "contentState.minutesAway: expected integer, got null."),
        ("status", 7, "contentState.status: expected string, got integer 7."),
        ("progress", "half", #"contentState.progress: expected number, got string "half"."#),
        ("delayed", "no", #"contentState.delayed: expected boolean, got string "no"."#),
        ("eta", "tomorrow", #"contentState.eta: expected date (ISO-8601 or a number), got string "tomorrow"."#),
        ("eta", true, "contentState.eta: expected date, got boolean true."),
        ("note", 3, "contentState.note: expected string, got integer 3."),
        ("stops", "A", #"contentState.stops: expected array of string, got string "A"."#),
        ("stops", ["A", 2], "contentState.stops[1]: expected string, got integer 2."),
        ("driver", ["rating": 4.5], "contentState.driver.name: expected string, but it is missing."),
        ("driver", ["name": "Ana", "rating": "good"], #"contentState.driver.rating: expected number, got string "good"."#),
        ("phase", "lost", #"contentState.phase: expected one of "preparing", "onTheWay", "delivered", got string "lost"."#),
    ]

    @Test("a non-conforming state is refused with the field and the expectation", arguments: 0..<mismatches.count)
    func mismatch(index: Int) throws {
        let (key, value, message) = Self.mismatches[index]
        let schema = try AttributesTypeSchema(json: Self.schemaJSON)
        let error = #expect(throws: ValidationError.self) { try schema.conform(contentState: Self.replacing(key, with: value)) }
        #expect(error?.code == "schema_mismatch")
        #expect(error?.message == message)
        #expect(error?.field == message.split(separator: ":").first.map(String.init))
    }

    @Test("optional fields may be missing or null; fields the schema does not name pass through")
    func optionalsAndExtras() throws {
        let schema = try AttributesTypeSchema(json: Self.schemaJSON)
        _ = try schema.conform(contentState: Self.replacing("note", with: .null))
        _ = try schema.conform(contentState: Self.replacing("window", with: ["from": 1]))
        let out = try schema.conform(contentState: Self.replacing("extra", with: "kept"))
        #expect(out.objectValue?["extra"] == "kept")
        // An integral number where an integer is declared is sent as an integer.
        #expect(try schema.conform(contentState: Self.replacing("minutesAway", with: 12.0)).objectValue?["minutesAway"] == .integer(12))
    }

    @Test("attributes are checked when the schema declares them")
    func attributes() throws {
        let schema = try AttributesTypeSchema(json: Self.schemaJSON)
        _ = try schema.conform(attributes: ["orderNumber": "1234"])
        let error = #expect(throws: ValidationError.self) { try schema.conform(attributes: ["orderNumber": 1234]) }
        #expect(error?.message == "attributes.orderNumber: expected string, got integer 1234.")
    }

    static let badSchemaCases: [(JSONValue, String)] = [
        (JSONValue.array([]), "A schema must be a JSON object."),
        (["attributes": [:]], "The schema needs 'contentState': the fields of the ContentState."),
        (["contentState": ["a": "int"]], "contentState.a: unknown type 'int'; use string, integer, number, boolean, date (with ? for optional) or an object with 'type'."),
        (["contentState": ["a": ["type": "array"]]], "contentState.a: an array needs 'items'."),
        (["contentState": ["a": ["type": "enum", "values": [1]]]], "contentState.a: enum values must be strings."),
        (["contentState": [:], "dateEncoding": "iso"], "dateEncoding must be 'secondsSince2001' or 'secondsSince1970'."),
        (["contentState": [:], "extra": 1], "Unknown member 'extra' in the schema."),
    ]

    @Test("bad schemas are refused with the place of the problem", arguments: 0..<badSchemaCases.count)
    func badSchemas(index: Int) {
        let (json, message) = Self.badSchemaCases[index]
        let error = #expect(throws: ValidationError.self) { try AttributesTypeSchema(json: json) }
        #expect(error?.message == message)
    }

    @Test("a schema survives its JSON form")
    func roundTrip() throws {
        let schema = try AttributesTypeSchema(json: Self.schemaJSON)
        #expect(try AttributesTypeSchema(json: schema.json) == schema)
    }

    @Test("without a schema, later fields whose kind changed are reported")
    func shapeChanges() {
        let first = JSONShape(of: ["minutesAway": 12, "progress": 0.5, "driver": ["name": "Ana"], "note": .null])
        let later = JSONShape(of: ["minutesAway": "12", "progress": 1, "driver": ["name": 7], "note": "hi", "new": true])
        #expect(first.changes(to: later) == [
            JSONShape.Change(field: "contentState.driver.name", was: "string", now: "integer"),
            JSONShape.Change(field: "contentState.minutesAway", was: "integer", now: "string"),
        ])
        let merged = first.adding(later)
        #expect(merged.kinds["contentState.note"] == "string")
        #expect(merged.kinds["contentState.minutesAway"] == "integer")
    }
}

@Suite("Default stale dates")
struct StalenessPolicyTests {
    let now = Date(timeIntervalSince1970: 1_795_255_200)

    @Test("a first state gets an hour; later ones twice the interval, bounded")
    func defaults() {
        let policy = StalenessPolicy()
        #expect(policy.staleDate(now: now, previous: nil) == 1_795_255_200 + 3600)
        #expect(policy.staleDate(now: now, previous: now - 600) == 1_795_255_200 + 1200)
        #expect(policy.staleDate(now: now, previous: now - 1) == 1_795_255_200 + 120)
        #expect(policy.staleDate(now: now, previous: now - 86_400) == 1_795_255_200 + 14_400)
        // A clock that went backwards is treated like a first state.
        #expect(policy.staleDate(now: now, previous: now + 60) == 1_795_255_200 + 3600)
    }

    @Test("bounds are configurable")
    func configured() {
        let policy = StalenessPolicy(first: 60, minimum: 30, maximum: 90, factor: 3)
        #expect(policy.staleDate(now: now, previous: nil) == 1_795_255_200 + 60)
        #expect(policy.staleDate(now: now, previous: now - 20) == 1_795_255_200 + 60)
        #expect(policy.staleDate(now: now, previous: now - 5) == 1_795_255_200 + 30)
        #expect(policy.staleDate(now: now, previous: now - 100) == 1_795_255_200 + 90)
    }
}

@Suite("Priority budget")
struct PriorityBudgetTests {
    let budget = PriorityBudget()

    @Test("updates go at 10 within the budget and at 5 beyond it; alerts, ends and explicit priorities are honoured")
    func decisions() {
        #expect(budget.priority(event: .update, hasAlert: false, requested: nil, used: 9, frequentPushes: nil) == 10)
        #expect(budget.priority(event: .update, hasAlert: false, requested: nil, used: 10, frequentPushes: nil) == 5)
        #expect(budget.priority(event: .update, hasAlert: false, requested: nil, used: 10, frequentPushes: true) == 10)
        #expect(budget.priority(event: .update, hasAlert: false, requested: nil, used: 40, frequentPushes: true) == 5)
        #expect(budget.priority(event: .update, hasAlert: true, requested: nil, used: 99, frequentPushes: nil) == 10)
        #expect(budget.priority(event: .end, hasAlert: false, requested: nil, used: 99, frequentPushes: nil) == 10)
        #expect(budget.priority(event: .update, hasAlert: false, requested: 10, used: 99, frequentPushes: nil) == 10)
        #expect(budget.priority(event: .update, hasAlert: false, requested: 5, used: 0, frequentPushes: nil) == 5)
    }

    @Test("warnings start at the warning share")
    func warnings() {
        #expect(budget.warns(used: 8, frequentPushes: nil))
        #expect(!budget.warns(used: 7, frequentPushes: nil))
        #expect(!PriorityBudget(hourly: 0, hourlyWithFrequentPushes: 0).warns(used: 5, frequentPushes: nil))
    }
}
