import ArgumentParser
import Foundation
import HTTPTypes
import Hummingbird
import LivelineCore
import LivelineDispatch
import Logging

/// `liveline webhooks …`: tools for the webhooks an app's backend receives.
struct WebhooksCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "webhooks", abstract: "Tools for Liveline's webhooks.", subcommands: [Listen.self]
    )

    /// `liveline webhooks listen`: a local endpoint that verifies each delivery's signature and prints the event, for
    /// development (like `stripe listen`).
    struct Listen: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Receive webhooks locally: verify each signature (Standard Webhooks) and print the event.",
            discussion: """
                Create the webhook with this URL (the server must allow private networks, as `serve --dev` does):
                  curl -s -X POST $LIVELINE_URL/v1/webhooks -H "Authorization: Bearer $LIVELINE_SECRET_KEY" \\
                    -H 'Content-Type: application/json' -d '{"url": "http://127.0.0.1:9000/"}'
                then run `liveline webhooks listen --secret whsec_…` with the secret it answered.
                """
        )

        @Option(help: "The port to listen on (127.0.0.1).") var port = 9000
        @Option(help: "The webhook's signing secret (whsec_…), as POST /v1/webhooks answered it (env LIVELINE_WEBHOOK_SECRET).")
        var secret: String?

        func validate() throws {
            guard (1...65535).contains(port) else { throw ValidationError("--port must be between 1 and 65535; got \(port).") }
        }

        func run() async throws {
            guard let secret = secret ?? ProcessInfo.processInfo.environment["LIVELINE_WEBHOOK_SECRET"],
                let key = StandardWebhooks.key(of: secret)
            else { throw ValidationError("Give the webhook's secret (whsec_…) with --secret or LIVELINE_WEBHOOK_SECRET.") }
            let router = Router()
            // Any path: the root and everything below it.
            for path in ["/", "**"] {
                router.post(RouterPath(path)) { request, _ -> Response in
                    let body = Array(buffer: try await request.body.collect(upTo: 1 << 20))
                    let line = Self.describe(key: key, headers: request.headers, body: body, now: Date())
                    FileHandle.standardOutput.write(Data((line.text + "\n").utf8))
                    return Response(status: line.verified ? .noContent : .badRequest)
                }
            }
            var logger = Logger(label: "liveline.webhooks.listen")
            logger.logLevel = .warning
            let port = port
            let app = Application(
                router: router, configuration: .init(address: .hostname("127.0.0.1", port: port)),
                // Said once the port is bound, not before: a port in use fails first.
                onServerRunning: { _ in
                    FileHandle.standardOutput.write(Data("Listening on http://127.0.0.1:\(port)/ for Liveline webhooks; Ctrl-C to stop.\n".utf8))
                },
                logger: logger
            )
            try await app.runService()
        }

        /// One line for a delivery: verified (the event's type, id, activity, device and data) or why not. Pure.
        static func describe(key: [UInt8], headers: HTTPFields, body: [UInt8], now: Date) -> (verified: Bool, text: String) {
            guard let id = headers[HTTPField.Name("webhook-id")!], let timestampText = headers[HTTPField.Name("webhook-timestamp")!],
                let timestamp = Int64(timestampText), let signature = headers[HTTPField.Name("webhook-signature")!]
            else { return (false, "✘ not a Liveline webhook: the webhook-id, webhook-timestamp or webhook-signature header is missing") }
            guard StandardWebhooks.verify(key: key, id: id, timestamp: timestamp, body: body, header: signature, now: now) else {
                return (false, "✘ \(id): the signature does not verify with this secret (or the timestamp is over 5 minutes off)")
            }
            let event = (try? JSONValue(parsing: body))?.objectValue ?? [:]
            var text = "✔ \(event["type"]?.stringValue ?? "?")  \(id)"
            if let activity = event["activityId"]?.stringValue { text += "  activity=\(activity)" }
            if let device = event["deviceId"]?.stringValue { text += "  device=\(device)" }
            text += "  " + (event["data"] ?? .object([:])).encodedString
            return (true, text)
        }
    }
}
