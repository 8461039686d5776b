/// The OpenAPI 3.1 description of Liveline's HTTP API, served at `/openapi.json` and printed by
/// `liveline openapi`. The document is `Resources/openapi.json`, embedded in the binary by SwiftPM.
enum OpenAPIDocument {
    /// The document's text, without the file's final newline.
    static let json: String = {
        var text = String(decoding: PackageResources.openapi_json, as: UTF8.self)
        while text.last?.isNewline == true { text.removeLast() }
        return text
    }()
}
