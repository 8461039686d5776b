import Foundation
import Logging

/// How `liveline serve` writes its logs.
public enum LogFormat: String, Sendable, CaseIterable {
    /// swift-log's plain text lines (the default; ``TextLogHandler``).
    case text
    /// One JSON object per line (``JSONLogHandler``).
    case json
}

/// A swift-log `LogHandler` that writes one JSON object per line: `timestamp` (ISO 8601, UTC, milliseconds),
/// `level`, `label`, `message`, `source`, then every metadata value as a string, flattened: a nested dictionary's
/// keys are joined with dots (`error.code`), an array becomes its text. A metadata key that would overwrite one of
/// the five fields is written as `metadata.<key>`.
///
/// Keys appear in that order; the object is written in one `write` so that lines from several threads do not mix.
public struct JSONLogHandler: LogHandler {
    /// Where finished lines go (with their trailing newline).
    public typealias Sink = @Sendable (String) -> Void

    /// The handler's own metadata (added to every line).
    public var metadata: Logger.Metadata = [:]
    /// The least level written.
    public var logLevel: Logger.Level = .info
    /// Metadata from the task's context, if any.
    public var metadataProvider: Logger.MetadataProvider?

    private let label: String
    private let sink: Sink

    /// A handler for `label` that writes to `sink` (standard error by default).
    public init(label: String, metadataProvider: Logger.MetadataProvider? = nil, sink: @escaping Sink = JSONLogHandler.standardError) {
        self.label = label
        self.metadataProvider = metadataProvider
        self.sink = sink
    }

    /// Writes to the process's standard error.
    public static let standardError: Sink = { line in FileHandle.standardError.write(Data(line.utf8)) }

    /// One metadata value of the handler's own.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes `event` as one line: the handler's metadata, then the task's (its metadata provider's), then the
    /// event's own, later ones winning.
    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let explicit = event.metadata { merged.merge(explicit) { _, new in new } }
        if let error = event.error, merged["error"] == nil { merged["error"] = .string("\(error)") }
        sink(
            Self.line(
                timestamp: Date(), level: event.level, label: label, message: event.message.description, source: event.source, metadata: merged
            )
        )
    }

    static let fields: Set<String> = ["timestamp", "level", "label", "message", "source"]

    /// One log line: the JSON object and a newline.
    static func line(
        timestamp: Date, level: Logger.Level, label: String, message: String, source: String, metadata: Logger.Metadata
    ) -> String {
        var out = "{"
        append("timestamp", iso8601(timestamp), to: &out, first: true)
        append("level", level.rawValue, to: &out)
        append("label", label, to: &out)
        append("message", message, to: &out)
        append("source", source, to: &out)
        var flat: [(String, String)] = []
        flatten(metadata, prefix: "", into: &flat)
        for (key, value) in flat.sorted(by: { $0.0 < $1.0 }) {
            append(fields.contains(key) ? "metadata." + key : key, value, to: &out)
        }
        out += "}\n"
        return out
    }

    private static func flatten(_ metadata: Logger.Metadata, prefix: String, into flat: inout [(String, String)]) {
        for (key, value) in metadata {
            let name = prefix.isEmpty ? key : prefix + "." + key
            switch value {
            case .string(let string): flat.append((name, string))
            case .stringConvertible(let convertible): flat.append((name, convertible.description))
            case .dictionary(let nested): flatten(nested, prefix: name, into: &flat)
            case .array: flat.append((name, value.description))
            }
        }
    }

    private static func append(_ key: String, _ value: String, to out: inout String, first: Bool = false) {
        if !first { out += "," }
        escape(key, into: &out)
        out += ":"
        escape(value, into: &out)
    }

    /// `text` as a JSON string literal.
    static func escape(_ text: String, into out: inout String) {
        out += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    /// `2026-11-24T03:40:00.123Z`.
    static func iso8601(_ date: Date) -> String {
        let interval = date.timeIntervalSince1970
        let whole = interval.rounded(.down)
        var seconds = time_t(whole)
        let milliseconds = min(999, Int((interval - whole) * 1000))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ value: Int32, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(milliseconds), 3))Z"
    }
}

extension LogFormat {
    /// A swift-log handler factory for this format at `level` (for `LoggingSystem.bootstrap`).
    public func handlerFactory(level: Logger.Level) -> @Sendable (String) -> any LogHandler {
        switch self {
        case .text:
            return { label in
                var handler = TextLogHandler.standardError(label: label)
                handler.logLevel = level
                return handler
            }
        case .json:
            return { label in
                var handler = JSONLogHandler(label: label)
                handler.logLevel = level
                return handler
            }
        }
    }
}
