/// Failures the FCM emulator injects so a sender's retry and backoff paths can be exercised. Faults apply only to
/// `messages:send` requests whose access token was accepted.
///
/// Each rate is a probability from 0 to 1 drawn independently per request, in this order: 500 `INTERNAL`,
/// 503 `UNAVAILABLE`, 429 `QUOTA_EXCEEDED`.
public struct FCMFaults: Sendable, Codable, Hashable {
    /// The share of requests answered `500 INTERNAL`.
    public var internalErrorRate: Double
    /// The share of requests answered `503 UNAVAILABLE`.
    public var unavailableRate: Double
    /// The share of requests answered `429 QUOTA_EXCEEDED`.
    public var quotaExceededRate: Double
    /// When set, injected 429 and 503 answers carry a `Retry-After` header with this many seconds.
    public var retryAfterSeconds: Int?
    /// Milliseconds to wait before answering each request.
    public var delayMilliseconds: Int

    /// No faults: every request is answered on its merits, at once.
    public static let none = FCMFaults()

    /// Creates a set of faults; every parameter defaults to "no fault".
    public init(
        internalErrorRate: Double = 0, unavailableRate: Double = 0, quotaExceededRate: Double = 0, retryAfterSeconds: Int? = nil,
        delayMilliseconds: Int = 0
    ) {
        self.internalErrorRate = internalErrorRate
        self.unavailableRate = unavailableRate
        self.quotaExceededRate = quotaExceededRate
        self.retryAfterSeconds = retryAfterSeconds
        self.delayMilliseconds = delayMilliseconds
    }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case internalErrorRate, unavailableRate, quotaExceededRate, retryAfterSeconds, delayMilliseconds
    }

    /// Decodes faults; a missing member means "no fault" of that kind.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            internalErrorRate: try container.decodeIfPresent(Double.self, forKey: .internalErrorRate) ?? 0,
            unavailableRate: try container.decodeIfPresent(Double.self, forKey: .unavailableRate) ?? 0,
            quotaExceededRate: try container.decodeIfPresent(Double.self, forKey: .quotaExceededRate) ?? 0,
            retryAfterSeconds: try container.decodeIfPresent(Int.self, forKey: .retryAfterSeconds),
            delayMilliseconds: try container.decodeIfPresent(Int.self, forKey: .delayMilliseconds) ?? 0
        )
    }

    /// Encodes every member; an unset `retryAfterSeconds` as `null`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(internalErrorRate, forKey: .internalErrorRate)
        try container.encode(unavailableRate, forKey: .unavailableRate)
        try container.encode(quotaExceededRate, forKey: .quotaExceededRate)
        try container.encode(retryAfterSeconds, forKey: .retryAfterSeconds)
        try container.encode(delayMilliseconds, forKey: .delayMilliseconds)
    }

    /// The first member out of range, as `(field, message)`, or `nil` when all are valid.
    public var invalidMember: (field: String, message: String)? {
        let rates: [(String, Double)] = [
            ("internalErrorRate", internalErrorRate), ("unavailableRate", unavailableRate), ("quotaExceededRate", quotaExceededRate),
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
        return nil
    }
}
