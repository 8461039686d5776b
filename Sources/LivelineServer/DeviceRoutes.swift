import Foundation
import Hummingbird
import LivelineCore
import LivelineStore

/// The `/v1/devices` API: an app's installations register themselves (publishable or secret key) with their user,
/// tags and push-to-start or FCM tokens; the backend reads, lists and deletes them (secret key).
struct DeviceRoutes<Context: RequestContext>: Sendable {
    let store: any DeviceStore & AppStore
    let authenticator: Authenticator
    let clock: WallClock

    /// The most tags a device carries.
    static var maximumTags: Int { 64 }
    /// The longest tag key, in Unicode code points (as JSON Schema counts).
    static var maximumTagKeyLength: Int { 64 }
    /// The longest tag value, in Unicode code points.
    static var maximumTagValueLength: Int { 256 }
    /// The most push-to-start tokens one registration may give.
    static var maximumPushToStartTokens: Int { 64 }
    /// The most `tag` conditions one listing may give.
    static var maximumTagFilters: Int { 16 }
    /// The longest `osVersion` and `locale`.
    static var maximumShortStringLength: Int { 64 }

    func add(to router: Router<Context>) {
        let v1 = router.group("v1")
        v1.put("devices/:deviceId", use: putDevice)
        v1.get("devices/:deviceId", use: device)
        v1.get("devices", use: devices)
        v1.delete("devices/:deviceId", use: deleteDevice)
    }

    // MARK: Handlers

    @Sendable func putDevice(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .publishableOrSecret)
        let deviceID = try LifecycleRoutes<Context>.pathID("deviceId", context)
        let body = try await RequestBody.read(request)
        let registration = try Self.registration(body, appID: caller.appID, deviceID: deviceID)
        if caller.scope == .publishable, let field = Self.audienceField(body), try await store.app(id: caller.appID)?.audienceFrom == .backend {
            throw APIError(
                .forbidden, code: "secret_key_required",
                message: "This app sets its devices' userId and tags from its backend (audienceFrom: backend): register the device's tokens without them, and set them with the secret key.",
                field: field
            )
        }
        let (device, created) = try await store.putDevice(registration, at: clock.now())
        return Response.json(Representation.device(device, for: caller.scope), status: created ? .created : .ok)
    }

    @Sendable func device(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let deviceID = try LifecycleRoutes<Context>.pathID("deviceId", context)
        guard let device = try await store.device(appID: caller.appID, deviceID: deviceID) else {
            throw APIError.deviceNotFound(deviceID)
        }
        return Response.json(Representation.device(device))
    }

    @Sendable func devices(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        try QueryParameters.refuseUnknown(in: request, allowed: ["userId", "tag", "limit", "cursor"])
        let filter = try Self.filter(request)
        let page = try await store.devices(
            appID: caller.appID, filter: filter, cursor: try PageCursor.query(request, .identifier),
            limit: try LifecycleRoutes<Context>.limit(request)
        )
        return Response.json(Representation.page(page, Representation.device))
    }

    @Sendable func deleteDevice(_ request: Request, context: Context) async throws -> Response {
        let caller = try await authenticator.authenticate(request, access: .secret)
        let deviceID = try LifecycleRoutes<Context>.pathID("deviceId", context)
        guard try await store.deleteDevice(appID: caller.appID, deviceID: deviceID, at: clock.now()) else { throw APIError.deviceNotFound(deviceID) }
        return Response(status: .noContent)
    }

    // MARK: Input rules

    /// The first audience field (``AudienceSource``) the body names, `null` included, if any.
    static func audienceField(_ body: RequestBody) -> String? {
        ["userId", "tags"].first { body.members[$0] != nil }
    }

    /// The registration a `PUT /v1/devices/{deviceId}` body asks for: a field left out keeps what is stored, `null`
    /// clears it (for `tags` and `pushToStartTokens`, `null` is the same as `{}`).
    static func registration(_ body: RequestBody, appID: String, deviceID: String) throws -> DeviceRegistration {
        try body.allowOnly(["platform", "userId", "tags", "pushToStartTokens", "fcmToken", "osVersion", "locale"])
        let platformName = try body.requiredString("platform")
        guard let platform = Platform(rawValue: platformName) else {
            throw ValidationError(code: "invalid_platform", message: "platform must be 'ios' or 'android'.", field: "platform")
        }
        if platform == .android, body.members["pushToStartTokens"] != nil {
            throw ValidationError(
                code: "not_for_platform",
                message: "pushToStartTokens are iOS push-to-start tokens; an Android device registers its fcmToken.",
                field: "pushToStartTokens"
            )
        }
        if platform == .ios, body.members["fcmToken"] != nil {
            throw ValidationError(
                code: "not_for_platform", message: "fcmToken is an Android device's token; an iOS device registers pushToStartTokens.",
                field: "fcmToken"
            )
        }
        return DeviceRegistration(
            appID: appID, deviceID: deviceID, platform: platform,
            userID: try fieldUpdate(body, "userId") { userID throws(ValidationError) in try Identifier.validate(userID, field: "userId") },
            tags: try tags(body),
            pushToStartTokens: try pushToStartTokens(body),
            fcmToken: try fieldUpdate(body, "fcmToken") { token throws(ValidationError) in
                try PushToken.validate(token, platform: .android, field: "fcmToken")
            },
            osVersion: try fieldUpdate(body, "osVersion") { value throws(ValidationError) in try shortString(value, field: "osVersion") },
            locale: try fieldUpdate(body, "locale") { value throws(ValidationError) in try shortString(value, field: "locale") }
        )
    }

    /// An optional string member: absent keeps, `null` clears, a string (checked by `validate`) replaces.
    static func fieldUpdate(
        _ body: RequestBody, _ key: String, validate: (String) throws(ValidationError) -> String
    ) throws -> FieldUpdate<String> {
        switch body.members[key] {
        case nil: return .keep
        case .null?: return .clear
        case .string(let value)?: return .set(try validate(value))
        case let value?: throw APIError.invalidType(body.path(key), expected: "a string or null", got: value)
        }
    }

    /// `osVersion` and `locale`: 1 to 64 printable ASCII characters without spaces (`17.2.1`, `en-US`).
    static func shortString(_ value: String, field: String) throws(ValidationError) -> String {
        let bytes = value.utf8
        guard !bytes.isEmpty, bytes.count <= maximumShortStringLength, bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw ValidationError(
                code: "invalid_\(field == "osVersion" ? "os_version" : field)",
                message: "\(field) must be 1 to \(maximumShortStringLength) printable ASCII characters without spaces.", field: field
            )
        }
        return value
    }

    /// `tags`: an object of at most 64 string tags; `nil` when absent (the stored tags stay).
    static func tags(_ body: RequestBody) throws -> [String: String]? {
        guard let value = body.members["tags"] else { return nil }
        guard case .object(let members) = value else {
            if value == .null { return [:] }
            throw APIError.invalidType("tags", expected: "an object of strings", got: value)
        }
        guard members.count <= maximumTags else {
            throw ValidationError(code: "too_many_tags", message: "A device carries at most \(maximumTags) tags.", field: "tags")
        }
        var tags: [String: String] = [:]
        for (key, value) in members.sorted(by: { $0.key < $1.key }) {
            guard case .string(let string) = value else {
                throw APIError.invalidType("tags.\(key)", expected: "a string", got: value)
            }
            try validateTag(key: key, value: string, field: "tags")
            tags[key] = string
        }
        return tags
    }

    /// A tag's key is 1 to 64 code points without ':' (the `tag=key:value` filter splits there); its value at most 256.
    static func validateTag(key: String, value: String, field: String) throws(ValidationError) {
        // Counted and searched by code point, as JSON Schema does: ':' followed by a combining mark is one Character.
        guard !key.isEmpty, key.unicodeScalars.count <= maximumTagKeyLength, !key.unicodeScalars.contains(":") else {
            throw ValidationError(
                code: "invalid_tag", message: "A tag key must be 1 to \(maximumTagKeyLength) characters without ':'.", field: field
            )
        }
        guard value.unicodeScalars.count <= maximumTagValueLength else {
            throw ValidationError(
                code: "invalid_tag", message: "A tag value must be at most \(maximumTagValueLength) characters.", field: field
            )
        }
    }

    /// `pushToStartTokens`: attributes type → hexadecimal token, or `null` to remove that type's token.
    static func pushToStartTokens(_ body: RequestBody) throws -> [String: String?] {
        guard let value = body.members["pushToStartTokens"], value != .null else { return [:] }
        guard case .object(let members) = value else {
            throw APIError.invalidType("pushToStartTokens", expected: "an object", got: value)
        }
        guard members.count <= maximumPushToStartTokens else {
            throw ValidationError(
                code: "too_many_push_to_start_tokens",
                message: "One registration gives at most \(maximumPushToStartTokens) push-to-start tokens.", field: "pushToStartTokens"
            )
        }
        var tokens: [String: String?] = [:]
        for (attributesType, token) in members.sorted(by: { $0.key < $1.key }) {
            do {
                try LifecycleRoutes<Context>.validateAttributesType(attributesType)
            } catch {
                throw ValidationError(
                    code: error.code,
                    message: "Each key of pushToStartTokens must be the Swift type name of the ActivityAttributes (letters, digits, '_', '.').",
                    field: "pushToStartTokens"
                )
            }
            let field = "pushToStartTokens.\(attributesType)"
            switch token {
            case .null: tokens[attributesType] = .some(nil)
            case .string(let string): tokens[attributesType] = try PushToken.validate(string, platform: .ios, field: field)
            default: throw APIError.invalidType(field, expected: "a string or null", got: token)
            }
        }
        return tokens
    }

    /// The values of `name` in a query string, decoded as HTML forms and the usual clients (`URLSearchParams`, Python's
    /// `urlencode`) encode them: `+` is a space, `%2B` a plus. (A tag such as `city:New York` arrives as `New+York`.)
    /// A value that is not valid percent-encoding is 422 `invalid_tag`, as any other malformed tag condition.
    static func formValues(_ name: String, in query: String) throws -> [String] {
        let decode = { (text: Substring) in String(text).replacingOccurrences(of: "+", with: " ").removingPercentEncoding }
        return try query.split(separator: "&", omittingEmptySubsequences: true).compactMap { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard decode(parts[0]) == name else { return nil }
            guard parts.count > 1 else { return "" }
            guard let value = decode(parts[1]) else {
                throw ValidationError(code: "invalid_tag", message: "\(name) is not valid percent-encoding.", field: name)
            }
            return value
        }
    }

    /// The listing's filter: `userId` and any number (up to 16) of `tag=key:value`, all of which must hold.
    static func filter(_ request: Request) throws -> DeviceFilter {
        let query = request.uri.queryParameters
        var filter = DeviceFilter()
        if let userID = query["userId"].map(String.init) {
            filter.userID = try Identifier.validate(userID, field: "userId")
        }
        let tags = try formValues("tag", in: request.uri.query ?? "")
        guard tags.count <= maximumTagFilters else {
            throw ValidationError(code: "too_many_tags", message: "At most \(maximumTagFilters) tag conditions.", field: "tag")
        }
        for tag in tags {
            let scalars = tag.unicodeScalars
            guard let colon = scalars.firstIndex(of: ":") else {
                throw ValidationError(code: "invalid_tag", message: "tag must be 'key:value'.", field: "tag")
            }
            let key = String(Substring(scalars[..<colon]))
            let value = String(Substring(scalars[scalars.index(after: colon)...]))
            try validateTag(key: key, value: value, field: "tag")
            filter.tags.append(DeviceTag(key: key, value: value))
        }
        return filter
    }
}
