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
        if let schemaReads { return try await schemaReads.value(for: SchemaKey(appID: appID, attributesType: attributesType)) }
        return try await reader.query(
            "SELECT * FROM attributes_type_schemas WHERE app_id = ? AND attributes_type = ?", [.text(appID), .text(attributesType)]
        ).first.map(Self.schema(from:))
    }

    /// The reads of schemas by key, on PostgreSQL (``schemas(_:on:)``).
    static let schemasByKey = """
        SELECT s.* FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS k(app_id, attributes_type)
        JOIN attributes_type_schemas s ON s.app_id = k.app_id AND s.attributes_type = k.attributes_type
        """

    /// The schemas of `keys` that exist, read in one statement on PostgreSQL, under ``keyedReadSettings`` (one plan
    /// kept, the lookup by primary key), as the activities' reads by key are (``activities(_:on:)``).
    ///
    /// Read alone, each update's read of its schema was planned for its values: over 5,000 updates to activities a
    /// phone had registered (`pg_stat_statements`), 128 ms of planning and 14 ms of running, beside a round trip each.
    static func schemas(_ keys: [SchemaKey], on reader: any StoreReader) async throws -> [SchemaKey: StoredSchema] {
        try await readByKeys(
            schemasByKey, [PostgresArray.text(keys.map(\.appID)), PostgresArray.text(keys.map(\.attributesType))], on: reader
        ) { row in
            let schema = try schema(from: row)
            return (SchemaKey(appID: schema.appID, attributesType: schema.attributesType), schema)
        }
    }

    static func schema(from row: StoreRow) throws -> StoredSchema {
        StoredSchema(
            appID: try row.string("app_id"), attributesType: try row.string("attributes_type"),
            schema: try row.json("schema") ?? .object([:]), createdAt: try row.date("created_at"), updatedAt: try row.date("updated_at")
        )
    }
}

/// An attributes type's schema's key: its app and the type's name.
struct SchemaKey: Sendable, Hashable {
    var appID: String
    var attributesType: String
}
