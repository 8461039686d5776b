/// The headers of an APNs request, sorted out once, with Apple's header checks.
struct RequestHeaders {
    var method: String?
    var path: String?
    var authorization: [String] = []
    /// Every `apns-*` header's values, in arrival order.
    var apns: [String: [String]] = [:]

    static let devicePathPrefix = "/3/device/"

    init(_ headers: [ReceivedPush.Header]) {
        for header in headers {
            switch header.name {
            case ":method": method = header.value
            case ":path": path = header.value
            case "authorization": authorization.append(header.value)
            default:
                if header.name.hasPrefix("apns-") { apns[header.name, default: []].append(header.value) }
            }
        }
    }

    func value(_ name: String) -> String? { apns[name]?.first }

    /// The device token from `/3/device/<token>`, lowercased; `nil` when the path has another form.
    var deviceToken: String? {
        guard let path, path.hasPrefix(Self.devicePathPrefix) else { return nil }
        let token = path.dropFirst(Self.devicePathPrefix.count)
        guard !token.isEmpty, !token.contains("/") else { return nil }
        return token.lowercased()
    }

    var priority: String? { value("apns-priority") }

    /// The request's `apns-id` when it is present once and a UUID, to echo back.
    var validAPNsID: String? {
        guard let values = apns["apns-id"], values.count == 1, Self.isUUID(values[0]) else { return nil }
        return values[0]
    }

    /// `:method` must be POST (405) and `:path` `/3/device/<token>` (404, or 400 without a token).
    func checkMethodAndPath() throws(EmulatorCore.Rejection) {
        guard method == "POST" else { throw .init(405, "MethodNotAllowed") }
        guard let path else { throw .init(404, "BadPath") }
        if path == "/3/device" || path == Self.devicePathPrefix { throw .init(400, "MissingDeviceToken") }
        guard deviceToken != nil else { throw .init(404, "BadPath") }
    }

    /// The `apns-*` headers, in Apple's order; returns the topic's bundle id.
    func checkAPNsHeaders(isRegistered: (String) -> Bool) throws(EmulatorCore.Rejection) -> String {
        if apns.values.contains(where: { $0.count > 1 }) { throw .init(400, "DuplicateHeaders") }
        guard value("apns-push-type") == "liveactivity" else { throw .init(400, "InvalidPushType") }
        guard let topic = value("apns-topic") else { throw .init(400, "MissingTopic") }
        guard topic.hasSuffix(EmulatorCore.topicSuffix), topic.count > EmulatorCore.topicSuffix.count else {
            throw .init(400, "BadTopic")
        }
        let bundleID = String(topic.dropLast(EmulatorCore.topicSuffix.count))
        guard isRegistered(bundleID) else { throw .init(400, "TopicDisallowed") }
        if let priority, priority != "5", priority != "10" { throw .init(400, "BadPriority") }
        if let expiration = value("apns-expiration") {
            guard !expiration.isEmpty, expiration.utf8.allSatisfy({ (0x30...0x39).contains($0) }), Int64(expiration) != nil
            else { throw .init(400, "BadExpirationDate") }
        }
        if let id = value("apns-id"), !Self.isUUID(id) { throw .init(400, "BadMessageId") }
        if let collapseID = value("apns-collapse-id"), collapseID.utf8.count > 64 { throw .init(400, "BadCollapseId") }
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
