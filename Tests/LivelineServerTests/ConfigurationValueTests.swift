import Foundation
import LivelineTestSupport
import Testing

@testable import LivelineServer

@Suite("Configuration values that cannot be used are refused, never replaced by the default")
struct ConfigurationValueTests {
    private func configuration(_ environment: [String: String], file: String? = nil) async throws -> LivelineConfiguration {
        try LivelineConfiguration(reader: await LivelineConfiguration.reader(flags: [:], file: file, environment: environment))
    }

    private func writeFile(_ json: String) throws -> URL {
        let url = uniqueTemporaryURL(prefix: "liveline-config").appendingPathExtension("json")
        try Data(json.utf8).write(to: url)
        return url
    }

    @Test(
        "a value of the wrong type in the environment is an error naming the key and its variable",
        arguments: [
            ("LIVELINE_PORT", "abc", "liveline.port (LIVELINE_PORT) must be a whole number"),
            ("LIVELINE_PORT", "", "liveline.port (LIVELINE_PORT) must be a whole number"),
            ("LIVELINE_METRICS_ENABLED", "off", "liveline.metrics.enabled (LIVELINE_METRICS_ENABLED) must be true or false"),
            ("LIVELINE_BUDGET_HOURLY", "", "liveline.budget.hourly (LIVELINE_BUDGET_HOURLY) must be a whole number"),
            ("LIVELINE_EMULATOR", "maybe", "liveline.emulator (LIVELINE_EMULATOR) must be true or false"),
        ]
    )
    func wrongTypeInTheEnvironment(variable: String, value: String, message: String) async throws {
        await #expect {
            _ = try await configuration([variable: value])
        } throws: { error in
            (error as? ConfigurationError)?.description.hasPrefix(message) == true
        }
    }

    @Test("a value of the wrong type in the file is an error; a good one is read, and the environment still comes first")
    func wrongTypeInTheFile() async throws {
        let bad = try writeFile(#"{"liveline": {"metrics": {"enabled": "false"}}}"#)
        defer { try? FileManager.default.removeItem(at: bad) }
        await #expect(throws: ConfigurationError.self) { _ = try await configuration([:], file: bad.path) }

        let good = try writeFile(#"{"liveline": {"port": 48082, "metrics": {"enabled": false}, "staleness": {"first": 900}}}"#)
        defer { try? FileManager.default.removeItem(at: good) }
        let read = try await configuration([:], file: good.path)
        #expect(read.port == 48082)
        #expect(!read.metricsEnabled)
        #expect(read.staleness.first == 900)
        #expect(try await configuration(["LIVELINE_PORT": "48083"], file: good.path).port == 48083)
    }

    @Test("a string key given another type in the file is refused, named, never replaced by the default")
    func stringKeysOfAnotherType() async throws {
        for json in [#"{"liveline": {"host": 127001}}"#, #"{"liveline": {"dataDirectory": 5}}"#, #"{"liveline": {"logFormat": true}}"#] {
            let file = try writeFile(json)
            defer { try? FileManager.default.removeItem(at: file) }
            await #expect {
                _ = try await configuration([:], file: file.path)
            } throws: { error in
                (error as? ConfigurationError)?.description.contains("must be a string") == true
            }
        }
        let good = try writeFile(#"{"liveline": {"host": "0.0.0.0", "logFormat": "json"}}"#)
        defer { try? FileManager.default.removeItem(at: good) }
        let read = try await configuration([:], file: good.path)
        #expect(read.host == "0.0.0.0" && read.logFormat == .json)
    }

    @Test("a key the file's liveline object holds and Liveline does not know is refused, named")
    func unknownKeysInTheFile() async throws {
        let file = try writeFile(#"{"liveline": {"prot": 48080, "metrics": {"enabld": false}, "port": 1}, "other": {"tool": 1}}"#)
        defer { try? FileManager.default.removeItem(at: file) }
        await #expect {
            _ = try await configuration([:], file: file.path)
        } throws: { error in
            let text = (error as? ConfigurationError)?.description ?? ""
            return text.contains("liveline.metrics.enabld, liveline.prot") && !text.contains("other") && !text.contains("liveline.port")
        }
    }

    @Test("a first stale time outside the minimum and maximum is refused, not moved to the nearer bound")
    func firstStaleTimeWithinBounds() async throws {
        await #expect(throws: ConfigurationError.self) { _ = try await configuration(["LIVELINE_STALENESS_FIRST": "100"]) }
        #expect(try await configuration(["LIVELINE_STALENESS_FIRST": "600"]).staleness.first == 600)
    }
}

@Suite("Where the database setting points")
struct DatabaseLocationTests {
    private func location(_ database: String) throws -> LivelineConfiguration.DatabaseLocation {
        try LivelineConfiguration(dataDirectory: "/data", database: database).databaseLocation
    }

    @Test("a URL's scheme is read whatever its case: Postgres:// is PostgreSQL, never a file named after the URL")
    func schemeCase() throws {
        for url in ["Postgres://alice:S3cret@db.internal:5432/live", "POSTGRESQL://alice:S3cret@db.internal/live"] {
            guard case .postgres(let parsed) = try location(url) else {
                Issue.record("\(url) was not read as PostgreSQL")
                continue
            }
            #expect(parsed.host == "db.internal" && parsed.database == "live" && parsed.password == "S3cret")
            #expect(!parsed.description.contains("S3cret"))
        }
        #expect(try location("SQLITE:/var/lib/liveline.sqlite") == .sqlite(path: "/var/lib/liveline.sqlite"))
        #expect(try location("sqlite:///var/lib/liveline.sqlite") == .sqlite(path: "/var/lib/liveline.sqlite"))
        #expect(try location("data/liveline.sqlite") == .sqlite(path: "data/liveline.sqlite"))
    }

    @Test("another scheme is refused, naming the scheme and never the password")
    func otherSchemes() throws {
        for url in ["mysql://alice:S3cret@db/live", "postgress://alice:S3cret@db/live", "http://alice:S3cret@db/live"] {
            #expect {
                try location(url)
            } throws: { error in
                let message = "\(error)"
                return error is ConfigurationError && message.contains("is not a database Liveline uses") && !message.contains("S3cret")
            }
        }
    }
}
