import ArgumentParser
import AsyncHTTPClient
import Foundation
import LivelineCore
import NIOCore
import NIOHTTP1

/// `liveline push start|update|end`: a quick test from the terminal, through the HTTP API of a running server, with
/// the app's secret key — the same requests a backend sends.
struct Push: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Start, update or end an activity through a running server's HTTP API (a quick test from the terminal).",
        subcommands: [Start.self, Update.self, End.self]
    )

    /// Where the server is and which key to use.
    struct Connection: ParsableArguments {
        @Option(help: "The server's base URL (default: $LIVELINE_URL, else http://127.0.0.1:8080).")
        var url: String?

        @Option(help: "The app's secret key, sk_… (default: $LIVELINE_SECRET_KEY).")
        var key: String?

        @Option(help: "The app id the key must belong to (checked with GET /v1/app before anything is sent).")
        var app: String?

        @Option(help: "The activity id.")
        var activity: String

        var baseURL: String {
            let base = url ?? ProcessInfo.processInfo.environment["LIVELINE_URL"] ?? "http://127.0.0.1:8080"
            return base.hasSuffix("/") ? String(base.dropLast()) : base
        }

        func validate() throws {
            // The id goes into the request's path: one with '/' or '?' would name another route (`x/end?` ended the
            // activity from `push update`).
            guard Identifier.isValid(activity) else {
                throw ValidationError(
                    "--activity must be 1 to \(Limits.maximumIdentifierLength) characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'; got '\(activity)'."
                )
            }
        }

        func secretKey() throws -> String {
            guard let key = key ?? ProcessInfo.processInfo.environment["LIVELINE_SECRET_KEY"], !key.isEmpty else {
                throw ValidationError("Give the app's secret key with --key or $LIVELINE_SECRET_KEY (serve --dev prints the demo app's).")
            }
            return key
        }
    }

    struct Start: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Start an activity remotely for devices, users, tags or every device (POST /v1/activities/{id}/start)."
        )

        @OptionGroup var connection: Connection

        @Option(name: .customLong("device"), help: "A device id to start it on (repeatable).")
        var devices: [String] = []

        @Option(name: .customLong("user"), help: "A user id whose devices to start it on (repeatable).")
        var users: [String] = []

        @Option(name: .customLong("tag"), help: "key:value a device must carry (repeatable; all must match).")
        var tags: [String] = []

        @Flag(help: "Start it on every device of the app.")
        var all = false

        @Option(help: "The Swift type name of the activity's attributes.")
        var attributesType: String

        @Option(help: "The static attributes, a JSON object.")
        var attributes: String = "{}"

        @Option(help: "The content state, a JSON object.")
        var contentState: String

        @Option(help: "The alert's title (a start needs an alert).")
        var alertTitle: String

        @Option(help: "The alert's body.")
        var alertBody: String

        func run() async throws {
            let body = try PushRequests.start(
                attributesType: attributesType, attributes: attributes, contentState: contentState, alertTitle: alertTitle,
                alertBody: alertBody, devices: devices, users: users, tags: tags, all: all
            )
            try await PushRequests.send(.POST, "/v1/activities/\(connection.activity)/start", body: body, connection)
        }
    }

    struct Update: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Post a new content state (POST /v1/activities/{id}/updates).")

        @OptionGroup var connection: Connection

        @Option(help: "The content state, a JSON object.")
        var contentState: String

        @Option(help: "An alert's title (optional).")
        var alertTitle: String?

        @Option(help: "The alert's body.")
        var alertBody: String?

        func run() async throws {
            var members: [String: JSONValue] = ["contentState": try PushRequests.object(contentState, "--content-state")]
            if let alert = try PushRequests.alert(title: alertTitle, body: alertBody) { members["alert"] = alert }
            try await PushRequests.send(.POST, "/v1/activities/\(connection.activity)/updates", body: .object(members), connection)
        }
    }

    struct End: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "End the activity (POST /v1/activities/{id}/end).")

        @OptionGroup var connection: Connection

        @Option(help: "The final content state, a JSON object (default: the current one).")
        var contentState: String?

        @Option(help: "Seconds from now until the ended activity leaves the screen (at most 14400).")
        var dismissIn: Int?

        func run() async throws {
            var members: [String: JSONValue] = [:]
            if let contentState { members["contentState"] = try PushRequests.object(contentState, "--content-state") }
            if let dismissIn {
                members["dismissalDate"] = .integer(Int64(Date().timeIntervalSince1970) + Int64(dismissIn))
            }
            try await PushRequests.send(.POST, "/v1/activities/\(connection.activity)/end", body: .object(members), connection)
        }
    }
}

/// The bodies `liveline push` sends, built from its flags (pure, tested), and the one way it sends them.
enum PushRequests {
    static func object(_ text: String, _ flag: String) throws -> JSONValue {
        guard let value = try? JSONValue(parsing: text.utf8), value.objectValue != nil else {
            throw ValidationError("\(flag) must be a JSON object, such as '{\"minute\": 12}'.")
        }
        return value
    }

    static func alert(title: String?, body: String?) throws -> JSONValue? {
        switch (title, body) {
        case (nil, nil): nil
        case (let title?, let body?): .object(["title": .string(title), "body": .string(body)])
        default: throw ValidationError("--alert-title and --alert-body go together.")
        }
    }

    /// The start's body: exactly one audience from `--device`, `--user`, `--tag` or `--all`.
    static func start(
        attributesType: String, attributes: String, contentState: String, alertTitle: String, alertBody: String,
        devices: [String], users: [String], tags: [String], all: Bool
    ) throws -> JSONValue {
        let chosen = [!devices.isEmpty, !users.isEmpty, !tags.isEmpty, all].filter { $0 }.count
        guard chosen == 1 else { throw ValidationError("Choose the audience with one of --device, --user, --tag or --all.") }
        let audience: JSONValue
        if !devices.isEmpty {
            audience = .object(["deviceIds": .array(devices.map(JSONValue.string))])
        } else if !users.isEmpty {
            audience = .object(["userIds": .array(users.map(JSONValue.string))])
        } else if !tags.isEmpty {
            var required: [String: JSONValue] = [:]
            for tag in tags {
                guard let colon = tag.firstIndex(of: ":"), colon != tag.startIndex else {
                    throw ValidationError("--tag must be key:value; got '\(tag)'.")
                }
                required[String(tag[..<colon])] = .string(String(tag[tag.index(after: colon)...]))
            }
            audience = .object(["tags": .object(required)])
        } else {
            audience = .object(["all": .bool(true)])
        }
        return .object([
            "attributesType": .string(attributesType),
            "attributes": try object(attributes, "--attributes"),
            "contentState": try object(contentState, "--content-state"),
            "alert": .object(["title": .string(alertTitle), "body": .string(alertBody)]),
            "audience": audience,
        ])
    }

    /// Sends one request with the secret key and prints the answer; a refusal is printed and ends the command with
    /// exit code 1.
    static func send(_ method: HTTPMethod, _ path: String, body: JSONValue, _ connection: Push.Connection) async throws {
        let key = try connection.secretKey()
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            if let app = connection.app {
                let (status, answer) = try await request(client, .GET, connection.baseURL + "/v1/app", key: key, body: nil)
                guard status == 200 else { throw refusal(status, answer) }
                let owner = (try? JSONValue(parsing: answer.utf8))?.objectValue?["id"]?.stringValue
                guard owner == app else {
                    throw ValidationError("The key belongs to app \(owner ?? "?"), not \(app).")
                }
            }
            let (status, answer) = try await request(client, method, connection.baseURL + path, key: key, body: body)
            print(answer)
            try await client.shutdown()
            if status >= 300 { throw ExitCode(1) }
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    private static func request(
        _ client: HTTPClient, _ method: HTTPMethod, _ url: String, key: String, body: JSONValue?
    ) async throws -> (UInt, String) {
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: "authorization", value: "Bearer \(key)")
        if let body {
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body.encoded))
        }
        let response = try await client.execute(request, timeout: .seconds(30))
        let bytes = try await response.body.collect(upTo: 1 << 20)
        return (response.status.code, String(buffer: bytes))
    }

    private static func refusal(_ status: UInt, _ answer: String) -> any Error {
        ValidationError("The server answered \(status): \(answer)")
    }
}
