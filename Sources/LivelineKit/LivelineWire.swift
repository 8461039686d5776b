import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One HTTP request to Liveline, before any I/O.
struct LivelineHTTPRequest: Sendable, Hashable {
    var method: String
    /// The path below the server URL, percent-encoded (`/v1/devices/install-1`).
    var path: String
    /// Header names as sent; `Authorization` and `Content-Type` included.
    var headers: [String: String]
    var body: Data
}

/// Liveline's answer.
struct LivelineHTTPResponse: Sendable, Hashable {
    var status: Int
    /// Header names lowercased.
    var headers: [String: String]
    var body: Data
}

/// What a call's answer means for the outbox.
enum LivelineOutcome: Sendable, Hashable {
    /// 2xx: done.
    case sent(status: Int)
    /// A transport error, 408, 429 or 5xx: try again, not before `retryAfter` seconds when the server said so.
    case retry(reason: String, retryAfter: TimeInterval?)
    /// Another status: the server will not take it. `code` is its `error.code` (or `http_<status>`).
    case rejected(status: Int, code: String, message: String?, field: String? = nil)
}

/// The pure rules of the wire: how an operation becomes a request, and what an answer means.
enum LivelineWire {
    /// The request that sends `operation` for `configuration`'s device.
    static func request(for operation: LivelineOperation, configuration: LivelineConfiguration) -> LivelineHTTPRequest {
        var headers = ["Authorization": "Bearer \(configuration.publishableKey)", "Content-Type": "application/json"]
        let device = pathSegment(configuration.deviceID)
        let platform = configuration.platform.rawValue
        switch operation.kind {
        case .registerDevice(let registration):
            var body: [String: Any] = ["platform": platform]
            if let userID = registration.userID { body["userId"] = userID }
            if let tags = registration.tags { body["tags"] = tags }
            if let osVersion = registration.osVersion { body["osVersion"] = osVersion }
            if let locale = registration.locale { body["locale"] = locale }
            if !registration.pushToStartTokens.isEmpty { body["pushToStartTokens"] = registration.pushToStartTokens }
            return LivelineHTTPRequest(method: "PUT", path: "/v1/devices/\(device)", headers: headers, body: json(body))
        case .registerActivity(let activityID, let attributesType, let pushToken):
            var body: [String: Any] = ["platform": platform, "pushToken": pushToken]
            if let attributesType { body["attributesType"] = attributesType }
            return LivelineHTTPRequest(
                method: "PUT", path: "/v1/activities/\(pathSegment(activityID))/instances/\(device)", headers: headers, body: json(body)
            )
        case .subscribeActivity(let activityID, let attributesType, let channelID):
            var body: [String: Any] = ["platform": platform, "channelId": channelID]
            if let attributesType { body["attributesType"] = attributesType }
            return LivelineHTTPRequest(
                method: "PUT", path: "/v1/activities/\(pathSegment(activityID))/instances/\(device)", headers: headers, body: json(body)
            )
        case .report(let activityID, let event, let idempotencyKey):
            var body: [String: Any] = ["type": event.type]
            if case .frequentPushes(let enabled) = event { body["enabled"] = enabled }
            headers["Idempotency-Key"] = idempotencyKey
            return LivelineHTTPRequest(
                method: "POST", path: "/v1/activities/\(pathSegment(activityID))/instances/\(device)/events", headers: headers,
                body: json(body)
            )
        }
    }

    /// What `response` means: 2xx sent; 408, 429 and 5xx retried (honouring `Retry-After`); any other status rejected
    /// with the server's `error.code`.
    static func outcome(of response: LivelineHTTPResponse, now: Date) -> LivelineOutcome {
        let status = response.status
        if (200..<300).contains(status) { return .sent(status: status) }
        let error = errorBody(response.body)
        if status == 408 || status == 429 || (500..<600).contains(status) {
            let reason = "HTTP \(status)" + (error.code.map { " \($0)" } ?? "")
            return .retry(reason: reason, retryAfter: response.headers["retry-after"].flatMap { retryAfter($0, now: now) })
        }
        return .rejected(status: status, code: error.code ?? "http_\(status)", message: error.message, field: error.field)
    }

    /// `{"error": {"code", "message", "field"}}`, when the body is that.
    static func errorBody(_ body: Data) -> (code: String?, message: String?, field: String?) {
        guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
            let error = object["error"] as? [String: Any]
        else { return (nil, nil, nil) }
        return (error["code"] as? String, error["message"] as? String, error["field"] as? String)
    }

    /// A `Retry-After` value in seconds from `now`: delta-seconds (`120`) or an HTTP date. `nil` when unreadable.
    static func retryAfter(_ value: String, now: Date) -> TimeInterval? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        if let seconds = Int(trimmed), seconds >= 0 { return TimeInterval(seconds) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE',' dd MMM yyyy HH':'mm':'ss 'GMT'"
        guard let date = formatter.date(from: trimmed) else { return nil }
        return max(0, date.timeIntervalSince(now))
    }

    /// An id as one path segment: everything but unreserved characters percent-encoded.
    static func pathSegment(_ id: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return id.addingPercentEncoding(withAllowedCharacters: allowed) ?? id
    }

    /// Lowercase hexadecimal, as Liveline and APNs take tokens.
    static func hex(_ data: Data) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(data.count * 2)
        for byte in data {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    private static func json(_ object: [String: Any]) -> Data {
        // Only strings, booleans and string dictionaries go in: serialization cannot fail.
        (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
    }
}

/// Sends one request to Liveline. The real one is ``URLSessionTransport``; tests stand in.
protocol LivelineTransport: Sendable {
    /// Sends `request` to `serverURL` + its path; throws on a transport error (no answer).
    func send(_ request: LivelineHTTPRequest, to serverURL: URL) async throws -> LivelineHTTPResponse
}

/// The transport over `URLSession` (FoundationNetworking on Linux).
struct URLSessionTransport: LivelineTransport {
    /// Seconds before a request without an answer counts as a transport error.
    var timeout: TimeInterval = 30

    func send(_ request: LivelineHTTPRequest, to serverURL: URL) async throws -> LivelineHTTPResponse {
        let base = serverURL.absoluteString.hasSuffix("/") ? String(serverURL.absoluteString.dropLast()) : serverURL.absoluteString
        guard let url = URL(string: base + request.path) else { throw URLError(.badURL) }
        var urlRequest = URLRequest(url: url, timeoutInterval: timeout)
        urlRequest.httpMethod = request.method
        for (name, value) in request.headers { urlRequest.setValue(value, forHTTPHeaderField: name) }
        urlRequest.httpBody = request.body
        let session = URLSession.shared
        return try await withCheckedThrowingContinuation { continuation in
            let task = session.dataTask(with: urlRequest) { data, response, error in
                if let error {
                    continuation.resume(throwing: error)
                    return
                }
                guard let http = response as? HTTPURLResponse else {
                    continuation.resume(throwing: URLError(.badServerResponse))
                    return
                }
                var headers: [String: String] = [:]
                for (name, value) in http.allHeaderFields {
                    if let name = name as? String, let value = value as? String { headers[name.lowercased()] = value }
                }
                continuation.resume(returning: LivelineHTTPResponse(status: http.statusCode, headers: headers, body: data ?? Data()))
            }
            task.resume()
        }
    }
}
