import Logging

/// swift-log's plain text lines, exactly as `StreamLogHandler` writes them, with the logger's metadata kept as it is
/// set and turned into text only when a line is written.
///
/// `StreamLogHandler` renders its metadata into text (sorted, joined) at every change of it. The HTTP server changes a
/// request's logger metadata twice for every request (Hummingbird's request id and ours, `request.id`), whether or not
/// anything is logged: setting it took 7.1 % of the server's CPU for `GET /healthz` in a profile on a 2-core machine
/// (about 7 µs a request), and 2.3 % with this handler. Here setting metadata is a dictionary write; a line is
/// rendered by a `StreamLogHandler` (no metadata of its own) given the merged metadata in the order it uses: the
/// logger's, then the metadata provider's, then the line's own, later ones winning, and the error's `error.message`
/// and `error.type` last.
public struct TextLogHandler: LogHandler {
    /// The logger's metadata (added to every line).
    public var metadata: Logger.Metadata = [:]
    /// Metadata from the task's context, if any.
    public var metadataProvider: Logger.MetadataProvider?
    /// Writes the lines; holds no metadata and no provider of its own.
    private var lines: StreamLogHandler

    /// The least level written.
    public var logLevel: Logger.Level {
        get { lines.logLevel }
        set { lines.logLevel = newValue }
    }

    /// A handler for `label` writing to `stream`.
    public init(label: String, stream: any TextOutputStream & Sendable, metadataProvider: Logger.MetadataProvider?) {
        self.init(lines: StreamLogHandler(label: label, stream: stream, metadataProvider: nil), metadataProvider: metadataProvider)
    }

    private init(lines: StreamLogHandler, metadataProvider: Logger.MetadataProvider?) {
        self.lines = lines
        self.metadataProvider = metadataProvider
    }

    /// A handler for `label` writing to standard error (as `StreamLogHandler.standardError` does), with swift-log's
    /// global metadata provider.
    public static func standardError(label: String) -> TextLogHandler {
        TextLogHandler(lines: StreamLogHandler.standardError(label: label, metadataProvider: nil), metadataProvider: LoggingSystem.metadataProvider)
    }

    /// One metadata value of the logger's.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes `event` as one line, with the logger's and the provider's metadata merged into the line's.
    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty { merged.merge(provided) { _, new in new } }
        if merged.isEmpty {
            lines.log(event: event)
            return
        }
        if let explicit = event.metadata, !explicit.isEmpty { merged.merge(explicit) { _, new in new } }
        var event = event
        event.metadata = merged
        lines.log(event: event)
    }
}
