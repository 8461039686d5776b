/// The headers of an APNs request, sorted out once, with Apple's header checks.
struct RequestHeaders {
    var method: String?
    var path: String?
    var authorization: String?
    var authorizationCount = 0
    var pushType: String?
    var topic: String?
    var priority: String?
    var expiration: String?
    var apnsID: String?
    var collapseID: String?
    /// `apns-channel-id` (broadcasts and channel management).
    var channelID: String?
    /// `apns-request-id` (broadcasts and channel management).
    var requestID: String?
    var requestIDRepeated = false
    /// Whether some `apns-*` header came more than once.
    var hasDuplicateAPNsHeader = false
    var apnsIDRepeated = false
    /// The device token from `/3/device/<token>`, lowercased; `nil` when the path has another form.
    var deviceToken: String?

    static let devicePathPrefix = "/3/device/"

    init(_ headers: [ReceivedPush.Header]) {
        var otherAPNsNames: [String] = []
        for header in headers {
            switch header.name {
            case ":method": method = header.value
            case ":path": path = header.value
            case "authorization":
                authorizationCount += 1
                if authorization == nil { authorization = header.value }
            case "apns-push-type": Self.keep(header.value, in: &pushType, duplicate: &hasDuplicateAPNsHeader)
            case "apns-topic": Self.keep(header.value, in: &topic, duplicate: &hasDuplicateAPNsHeader)
            case "apns-priority": Self.keep(header.value, in: &priority, duplicate: &hasDuplicateAPNsHeader)
            case "apns-expiration": Self.keep(header.value, in: &expiration, duplicate: &hasDuplicateAPNsHeader)
            case "apns-id":
                if apnsID != nil { apnsIDRepeated = true }
                Self.keep(header.value, in: &apnsID, duplicate: &hasDuplicateAPNsHeader)
            case "apns-collapse-id": Self.keep(header.value, in: &collapseID, duplicate: &hasDuplicateAPNsHeader)
            case "apns-channel-id": Self.keep(header.value, in: &channelID, duplicate: &hasDuplicateAPNsHeader)
            case "apns-request-id":
                if requestID != nil { requestIDRepeated = true }
                Self.keep(header.value, in: &requestID, duplicate: &hasDuplicateAPNsHeader)
            default:
                if header.name.hasPrefix("apns-") {
                    if otherAPNsNames.contains(header.name) { hasDuplicateAPNsHeader = true }
                    otherAPNsNames.append(header.name)
                }
            }
        }
        if let path, path.hasPrefix(Self.devicePathPrefix) {
            let token = path.utf8.dropFirst(Self.devicePathPrefix.utf8.count)
            if !token.isEmpty, !token.contains(UInt8(ascii: "/")) {
                deviceToken = String(decoding: token, as: UTF8.self).lowercased()
            }
        }
    }

    private static func keep(_ value: String, in field: inout String?, duplicate: inout Bool) {
        if field == nil { field = value } else { duplicate = true }
    }

    /// The provider token of `authorization: bearer <token>` (scheme case-insensitive).
    var bearerToken: String? {
        guard let authorization, authorization.utf8.count > 7, authorization.prefix(7).lowercased() == "bearer " else {
            return nil
        }
        return String(authorization.dropFirst(7))
    }

    /// The request's `apns-id` when it is present once and a UUID, to echo back.
    var validAPNsID: String? {
        guard !apnsIDRepeated, let apnsID, Self.isUUID(apnsID) else { return nil }
        return apnsID
    }

    /// The request's `apns-request-id` when present once and a UUID, to echo back.
    var validRequestID: String? {
        guard !requestIDRepeated, let requestID, Self.isUUID(requestID) else { return nil }
        return requestID
    }

    /// The bundle id of a well-formed Live Activity topic (`<bundle id>.push-type.liveactivity`).
    var topicBundleID: String? {
        guard let topic, topic.hasSuffix(APNsEmulatorCore.topicSuffix), topic.utf8.count > APNsEmulatorCore.topicSuffix.utf8.count
        else { return nil }
        return String(topic.dropLast(APNsEmulatorCore.topicSuffix.count))
    }

    /// `:method` must be POST (405) and `:path` `/3/device/<token>` (404, or 400 without a token).
    func checkMethodAndPath() throws(APNsEmulatorCore.Rejection) {
        guard method == "POST" else { throw .init(405, "MethodNotAllowed") }
        guard let path else { throw .init(404, "BadPath") }
        if path == "/3/device" || path == Self.devicePathPrefix { throw .init(400, "MissingDeviceToken") }
        guard deviceToken != nil else { throw .init(404, "BadPath") }
    }

    /// The `apns-*` headers, in Apple's order; returns the topic's bundle id.
    func checkAPNsHeaders(isRegistered: Bool) throws(APNsEmulatorCore.Rejection) -> String {
        if hasDuplicateAPNsHeader { throw .init(400, "DuplicateHeaders") }
        guard let pushType else { throw .init(400, "MissingPushType") }
        guard pushType == "liveactivity" else { throw .init(400, "InvalidPushType") }
        guard topic != nil else { throw .init(400, "MissingTopic") }
        guard let bundleID = topicBundleID else { throw .init(400, "BadTopic") }
        guard isRegistered else { throw .init(400, "TopicDisallowed") }
        if let priority, priority != "5", priority != "10" { throw .init(400, "BadPriority") }
        if let expiration {
            guard !expiration.isEmpty, expiration.utf8.allSatisfy({ (0x30...0x39).contains($0) }), Int64(expiration) != nil
            else { throw .init(400, "BadExpirationDate") }
        }
        if let apnsID, !Self.isUUID(apnsID) { throw .init(400, "BadMessageId") }
        if let collapseID, collapseID.utf8.count > 64 { throw .init(400, "BadCollapseId") }
        return bundleID
    }

    /// Whether `text` is a UUID in its canonical 8-4-4-4-12 hex form (either case).
    static func isUUID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard bytes.count == 36 else { return false }
        for (index, byte) in bytes.enumerated() {
            if index == 8 || index == 13 || index == 18 || index == 23 {
                guard byte == UInt8(ascii: "-") else { return false }
            } else {
                guard (0x30...0x39).contains(byte) || (0x61...0x66).contains(byte) || (0x41...0x46).contains(byte) else {
                    return false
                }
            }
        }
        return true
    }
}

/// The last `capacity` received pushes, oldest overwritten first.
struct PushHistory: Sendable {
    let capacity: Int
    private var storage: [ReceivedPush] = []
    /// Where the oldest record sits once the buffer is full.
    private var oldest = 0

    init(capacity: Int) {
        self.capacity = max(0, capacity)
        storage.reserveCapacity(min(self.capacity, 1024))
    }

    var count: Int { storage.count }

    mutating func append(_ push: ReceivedPush) {
        guard capacity > 0 else { return }
        if storage.count < capacity {
            storage.append(push)
        } else {
            storage[oldest] = push
            oldest = (oldest + 1) % capacity
        }
    }

    /// Up to `limit` of the newest records that match, oldest of them first.
    func newest(limit: Int, where matches: (ReceivedPush) -> Bool) -> [ReceivedPush] {
        var found: [ReceivedPush] = []
        var offset = storage.count - 1
        while offset >= 0, found.count < limit {
            let push = storage[(oldest + offset) % storage.count]
            if matches(push) { found.append(push) }
            offset -= 1
        }
        return found.reversed()
    }
}
