import FCM
import Foundation
import Testing

@Suite("FCM responses and error taxonomy")
struct ResponseTests {
    static func errorBody(code: Int, status: String, errorCode: String?, message: String = "m") -> [UInt8] {
        var details = ""
        if let errorCode {
            details = #","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"X"},{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"\#(errorCode)"}]"#
        }
        return Array(#"{"error":{"code":\#(code),"message":"\#(message)","status":"\#(status)"\#(details)}}"#.utf8)
    }

    @Test("a success exposes the message name and id")
    func success() {
        let response = FCMResponse(status: 200, body: Array(#"{"name": "projects/demo/messages/0:1500%31bd"}"#.utf8))
        #expect(response.isSuccess)
        #expect(response.messageName == "projects/demo/messages/0:1500%31bd")
        #expect(response.messageID == "0:1500%31bd")
        #expect(response.disposition == nil)
        #expect(response.errorCode == nil)
    }

    @Test("the errorCode detail wins over status and HTTP code")
    func detailErrorCode() {
        let response = FCMResponse(
            status: 404, body: Self.errorBody(code: 404, status: "NOT_FOUND", errorCode: "UNREGISTERED", message: "Requested entity was not found.")
        )
        #expect(response.errorCode == .unregistered)
        #expect(response.errorStatus == "NOT_FOUND")
        #expect(response.errorMessage == "Requested entity was not found.")
        #expect(response.disposition == .invalidToken)
        #expect(response.reason == "UNREGISTERED")

        let mismatch = FCMResponse(status: 403, body: Self.errorBody(code: 403, status: "PERMISSION_DENIED", errorCode: "SENDER_ID_MISMATCH"))
        #expect(mismatch.errorCode == .senderIDMismatch)
        #expect(mismatch.disposition == .terminal)

        let novel = FCMResponse(status: 400, body: Self.errorBody(code: 400, status: "INVALID_ARGUMENT", errorCode: "BRAND_NEW_CODE"))
        #expect(novel.errorCode == .unknown("BRAND_NEW_CODE"))
        #expect(novel.disposition == .terminal)
    }

    @Test(
        "without a detail the code comes from Google's status, else the HTTP status",
        arguments: [
            (400, "INVALID_ARGUMENT", FCMErrorCode.invalidArgument),
            (404, "NOT_FOUND", .unregistered),
            (429, "RESOURCE_EXHAUSTED", .quotaExceeded),
            (503, "UNAVAILABLE", .unavailable),
            (500, "INTERNAL", .internal),
            (401, "UNAUTHENTICATED", .unknown("UNAUTHENTICATED")),
            (403, "PERMISSION_DENIED", .unknown("PERMISSION_DENIED")),
        ]
    )
    func codeFromStatus(http: Int, status: String, expected: FCMErrorCode) {
        #expect(FCMResponse(status: http, body: Self.errorBody(code: http, status: status, errorCode: nil)).errorCode == expected)
    }

    @Test("a body that is not Google's JSON is classified by its HTTP status")
    func unreadableBody() {
        #expect(FCMResponse(status: 503, body: Array("<html>oops</html>".utf8)).errorCode == .unavailable)
        #expect(FCMResponse(status: 503, body: Array("<html>oops</html>".utf8)).disposition == .retryable)
        #expect(FCMResponse(status: 502, body: [UInt8]()).disposition == .retryable)
        #expect(FCMResponse(status: 502, body: [UInt8]()).reason == "HTTP 502")
        #expect(FCMResponse(status: 418, body: [UInt8]()).disposition == .terminal)
        #expect(FCMResponse(status: 401, body: [UInt8]()).disposition == .credentials)
        // A 404 that is not Google's (a wrong base URL, a proxy) blames the app's setup, never the device's token.
        let bare = FCMResponse(status: 404, body: Array("<html>Not Found</html>".utf8))
        #expect(bare.errorCode == nil)
        #expect(bare.disposition == .credentials)
        #expect(FCMResponse(status: 404, body: Self.errorBody(code: 404, status: "NOT_FOUND", errorCode: nil)).disposition == .invalidToken)
    }

    @Test(
        "every code is classified",
        arguments: [
            (FCMErrorCode.unregistered, 404, FCMErrorDisposition.invalidToken),
            (.invalidArgument, 400, .terminal),
            (.senderIDMismatch, 403, .terminal),
            // One token's refusal (an iOS or web token): not the service account's.
            (.thirdPartyAuthError, 401, .terminal),
            (.quotaExceeded, 429, .retryable),
            (.unavailable, 503, .retryable),
            (.internal, 500, .retryable),
            (.unspecifiedError, 400, .terminal),
            (.unspecifiedError, 500, .retryable),
            (.unknown("SOMETHING_NEW"), 404, .credentials),
            (.unknown("SOMETHING_NEW"), 409, .terminal),
            (.unknown("SOMETHING_NEW"), 403, .credentials),
            (.unknown("SOMETHING_NEW"), 401, .credentials),
            (.unknown("SOMETHING_NEW"), 429, .retryable),
            (.unknown("SOMETHING_NEW"), 504, .retryable),
        ]
    )
    func classification(code: FCMErrorCode, status: Int, expected: FCMErrorDisposition) {
        #expect(FCMErrorDisposition.disposition(status: status, code: code) == expected)
    }

    @Test("an INVALID_ARGUMENT that blames the token invalidates it; one about the message is terminal")
    func invalidArgumentBlame() {
        // Google's error page: a token that is not a valid registration token is answered with FCM's detail alone.
        let token = FCMResponse(
            status: 400,
            body: Array(
                #"{"error":{"code":400,"message":"The registration token is not a valid FCM registration token","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"INVALID_ARGUMENT"}]}}"#.utf8
            )
        )
        #expect(token.errorCode == .invalidArgument)
        #expect(token.fieldViolations == nil)
        #expect(token.blamesToken)
        #expect(token.disposition == .invalidToken)

        // … and a message it cannot accept with a BadRequest detail naming the field.
        let data = FCMResponse(
            status: 400,
            body: Array(
                #"{"error":{"code":400,"message":"Invalid value at 'message.data[0].value' (TYPE_STRING), 12","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.data[0].value","description":"Invalid value at 'message.data[0].value' (TYPE_STRING), 12"}]}]}}"#.utf8
            )
        )
        #expect(data.errorCode == .invalidArgument)
        #expect(data.fieldViolations == ["message.data[0].value"])
        #expect(!data.blamesToken)
        #expect(data.disposition == .terminal)

        // Both details (as the emulator answers): the field decides.
        func both(field: String) -> FCMResponse {
            FCMResponse(
                status: 400,
                body: Array(
                    #"{"error":{"code":400,"message":"m","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"INVALID_ARGUMENT"},{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"\#(field)","description":"m"}]}]}}"#.utf8
                )
            )
        }
        #expect(both(field: "message.token").disposition == .invalidToken)
        #expect(both(field: "message.android.ttl").disposition == .terminal)
        #expect(both(field: "message").disposition == .terminal)

        // Without any detail nothing blames the token: terminal.
        let bare = FCMResponse(status: 400, body: Self.errorBody(code: 400, status: "INVALID_ARGUMENT", errorCode: nil))
        #expect(bare.errorCode == .invalidArgument)
        #expect(!bare.blamesToken)
        #expect(bare.disposition == .terminal)
        // Another code with FCM's detail alone is not about the token either.
        #expect(FCMResponse(status: 404, body: Self.errorBody(code: 404, status: "NOT_FOUND", errorCode: "UNREGISTERED")).blamesToken == false)
    }

    @Test("the documented codes are the ones Google lists")
    func documentedCodes() {
        #expect(
            Set(FCMErrorCode.allDocumented.map(\.rawValue)) == [
                "UNSPECIFIED_ERROR", "INVALID_ARGUMENT", "UNREGISTERED", "SENDER_ID_MISMATCH", "QUOTA_EXCEEDED", "UNAVAILABLE",
                "INTERNAL", "THIRD_PARTY_AUTH_ERROR",
            ]
        )
        #expect(FCMErrorCode.unknown("UNREGISTERED") == .unregistered)
    }

    @Test("Retry-After is read as seconds or as an HTTP date")
    func retryAfter() {
        let now = Date(timeIntervalSince1970: 784_111_777)  // Sun, 06 Nov 1994 08:49:37 GMT
        #expect(FCMResponse.retryAfter("120", now: now) == .seconds(120))
        #expect(FCMResponse.retryAfter(" 0 ", now: now) == .seconds(0))
        #expect(FCMResponse.retryAfter("Sun, 06 Nov 1994 08:50:07 GMT", now: now) == .seconds(30))
        #expect(FCMResponse.retryAfter("Sunday, 06-Nov-94 08:50:37 GMT", now: now) == .seconds(60))
        #expect(FCMResponse.retryAfter("Sun Nov  6 08:49:47 1994", now: now) == .seconds(10))
        #expect(FCMResponse.retryAfter("Sun, 06 Nov 1994 08:00:00 GMT", now: now) == .zero)
        #expect(FCMResponse.retryAfter("-5", now: now) == nil)
        #expect(FCMResponse.retryAfter("soon", now: now) == nil)
        #expect(FCMResponse.retryAfter("", now: now) == nil)

        let response = FCMResponse(
            status: 429, body: Self.errorBody(code: 429, status: "RESOURCE_EXHAUSTED", errorCode: "QUOTA_EXCEEDED"), retryAfterHeader: "7"
        )
        #expect(response.retryAfter == .seconds(7))
        #expect(response.disposition == .retryable)
    }
}
