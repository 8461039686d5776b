/// Failures the APNs emulator injects so a sender's retry, backoff and reconnect paths can be
/// exercised. Faults apply only to requests whose provider token was accepted.
///
/// Each rate is a probability from 0 to 1 drawn independently per request, in this order:
/// dropped connection, 500, 503, 429.
public struct APNsFaults: Sendable, Codable, Hashable {
    /// The share of requests answered `500 InternalServerError`.
    public var internalErrorRate: Double
    /// The share of requests answered `503 ServiceUnavailable`.
    public var unavailableRate: Double
    /// The share of requests answered `429 TooManyRequests`.
    public var tooManyRequestsRate: Double
    /// When set, injected 429 and 503 answers carry a `retry-after` header with this many seconds.
    public var retryAfterSeconds: Int?
    /// Milliseconds to wait before answering each request.
    public var delayMilliseconds: Int
    /// When set, a connection is sent a `GOAWAY` frame (debug data `{"reason":"Shutdown"}`) after
    /// it has carried this many requests, and is closed once they are answered.
    public var goAwayAfterRequests: Int?
    /// The share of requests whose TCP connection is closed instead of answered.
    public var dropConnectionRate: Double
    /// Broadcasts arrive out of order, as APNs may reorder a channel's notifications: every other accepted
    /// broadcast is held back and applied to the subscribers right after the next one on its channel.
    public var reorderBroadcasts: Bool

    /// No faults: every request is answered on its merits, at once.
    public static let none = APNsFaults()

    /// Creates a set of faults; every parameter defaults to "no fault".
    public init(
        internalErrorRate: Double = 0,
        unavailableRate: Double = 0,
        tooManyRequestsRate: Double = 0,
        retryAfterSeconds: Int? = nil,
        delayMilliseconds: Int = 0,
        goAwayAfterRequests: Int? = nil,
        dropConnectionRate: Double = 0,
        reorderBroadcasts: Bool = false
    ) {
        self.reorderBroadcasts = reorderBroadcasts
        self.internalErrorRate = internalErrorRate
        self.unavailableRate = unavailableRate
        self.tooManyRequestsRate = tooManyRequestsRate
        self.retryAfterSeconds = retryAfterSeconds
        self.delayMilliseconds = delayMilliseconds
        self.goAwayAfterRequests = goAwayAfterRequests
        self.dropConnectionRate = dropConnectionRate
    }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case internalErrorRate, unavailableRate, tooManyRequestsRate, retryAfterSeconds, delayMilliseconds,
            goAwayAfterRequests, dropConnectionRate, reorderBroadcasts
    }

    /// Decodes faults; a missing member means "no fault" of that kind.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            internalErrorRate: try container.decodeIfPresent(Double.self, forKey: .internalErrorRate) ?? 0,
            unavailableRate: try container.decodeIfPresent(Double.self, forKey: .unavailableRate) ?? 0,
            tooManyRequestsRate: try container.decodeIfPresent(Double.self, forKey: .tooManyRequestsRate) ?? 0,
            retryAfterSeconds: try container.decodeIfPresent(Int.self, forKey: .retryAfterSeconds),
            delayMilliseconds: try container.decodeIfPresent(Int.self, forKey: .delayMilliseconds) ?? 0,
            goAwayAfterRequests: try container.decodeIfPresent(Int.self, forKey: .goAwayAfterRequests),
            dropConnectionRate: try container.decodeIfPresent(Double.self, forKey: .dropConnectionRate) ?? 0,
            reorderBroadcasts: try container.decodeIfPresent(Bool.self, forKey: .reorderBroadcasts) ?? false
        )
    }

    /// Encodes every member; unset optionals as `null`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(internalErrorRate, forKey: .internalErrorRate)
        try container.encode(unavailableRate, forKey: .unavailableRate)
        try container.encode(tooManyRequestsRate, forKey: .tooManyRequestsRate)
        try container.encode(retryAfterSeconds, forKey: .retryAfterSeconds)
        try container.encode(delayMilliseconds, forKey: .delayMilliseconds)
        try container.encode(goAwayAfterRequests, forKey: .goAwayAfterRequests)
        try container.encode(dropConnectionRate, forKey: .dropConnectionRate)
        try container.encode(reorderBroadcasts, forKey: .reorderBroadcasts)
    }

    /// The first member out of range, as `(field, message)`, or `nil` when all are valid.
    public var invalidMember: (field: String, message: String)? {
        let rates: [(String, Double)] = [
            ("internalErrorRate", internalErrorRate), ("unavailableRate", unavailableRate),
            ("tooManyRequestsRate", tooManyRequestsRate), ("dropConnectionRate", dropConnectionRate),
        ]
        for (field, rate) in rates where !(rate >= 0 && rate <= 1) {
            return (field, "\(field) must be a number from 0 to 1.")
        }
        if let retryAfterSeconds, retryAfterSeconds < 0 {
            return ("retryAfterSeconds", "retryAfterSeconds must not be negative.")
        }
        if delayMilliseconds < 0 || delayMilliseconds > 600_000 {
            return ("delayMilliseconds", "delayMilliseconds must be from 0 to 600000.")
        }
        if let goAwayAfterRequests, goAwayAfterRequests < 1 {
            return ("goAwayAfterRequests", "goAwayAfterRequests must be at least 1.")
        }
        return nil
    }
}
