import Foundation
import LivelineCore
import SQLiteNIO

extension SQLStore {
    public func saveSchema(appID: String, attributesType: String, schema: JSONValue, at now: Date) async throws -> StoredSchema {
        try await transaction { db in
            let exists = try db.query("SELECT 1 FROM apps WHERE id = ?", [.text(appID)])
            if exists.isEmpty { throw StoreError.appNotFound }
            let nowMillis = Self.millis(now)
            let rows = try db.query(
                """
                INSERT INTO attributes_type_schemas (app_id, attributes_type, schema, created_at, updated_at) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (app_id, attributes_type) DO UPDATE SET schema = excluded.schema, updated_at = excluded.updated_at
                RETURNING created_at
                """,
                [.text(appID), .text(attributesType), Self.json(schema), .integer(nowMillis), .integer(nowMillis)]
            )
            let created = try rows.first?.date("created_at") ?? Self.date(nowMillis)
            return StoredSchema(appID: appID, attributesType: attributesType, schema: schema, createdAt: created, updatedAt: Self.date(nowMillis))
        }
    }

    public func schema(appID: String, attributesType: String) async throws -> StoredSchema? {
        guard let row = try await reader.query(
            "SELECT * FROM attributes_type_schemas WHERE app_id = ? AND attributes_type = ?", [.text(appID), .text(attributesType)]
        ).first else { return nil }
        return StoredSchema(
            appID: try row.string("app_id"), attributesType: try row.string("attributes_type"),
            schema: try row.json("schema") ?? .object([:]), createdAt: try row.date("created_at"), updatedAt: try row.date("updated_at")
        )
    }
}
