import Foundation
import LivelineCore
import NIOCore
import SQLiteNIO

/// Idempotency keys: the accepted requests remembered per app (table `idempotency_keys`, migration 13).
extension SQLStore {
    public func idempotencyRecord(appID: String, key: String) async throws -> IdempotencyRecord? {
        try await reader.query(Self.selectIdempotencyRecord, [.text(appID), .text(key)]).first.map { row in
            try Self.idempotencyRecord(from: row, appID: appID, key: key)
        }
    }

    public func pruneIdempotencyKeys(olderThan cutoff: Date) async throws -> Int {
        try await transaction(durability: .bookkeeping) { db in
            try db.query(
                "DELETE FROM idempotency_keys WHERE created_at < ? RETURNING key", [.integer(Self.millis(cutoff))]
            ).count
        }
    }

    /// Runs `write` under `claim`, on the writer, inside the transaction that `write` changes the database in: the one
    /// piece every keyed write of the Store goes through (a new keyed write wraps its body in it).
    ///
    /// Without a claim, `write` runs. With one, the record under `(appID, claim.key)` decides
    /// (``IdempotencyDecision``): the same request accepted within ``IdempotencyKey/retention`` is answered with its
    /// stored response and `write` does not run; another request under the key throws
    /// ``StoreError/idempotencyKeyReused``; otherwise `write` runs and, if it returns, its response (``IdempotencyClaim/respond``)
    /// is inserted in the same transaction, so the write and its record commit together. A write that throws leaves no
    /// record: only accepted requests are remembered. The writer runs one transaction at a time, so the check and the
    /// insert cannot interleave with another request's; the table's primary key `(app_id, key)` refuses a second
    /// record all the same.
    static func idempotently<Result: Sendable>(
        _ claim: IdempotencyClaim<Result>?, appID: String, at now: Date, on db: any SQLConnection, _ write: () throws -> Result
    ) throws -> IdempotentOutcome<Result> {
        guard let claim else { return .performed(try write()) }
        let remembered = try db.query(selectIdempotencyRecord, [.text(appID), .text(claim.key)]).first.map { row in
            try idempotencyRecord(from: row, appID: appID, key: claim.key)
        }
        if let remembered {
            switch remembered.decision(for: claim.fingerprint, now: now) {
            case .replay:
                return .replayed(remembered.response)
            case .refuseReuse:
                throw StoreError.idempotencyKeyReused
            case .perform:
                // A record past its retention that the sweeper has not pruned yet: the key is free again.
                try db.query("DELETE FROM idempotency_keys WHERE app_id = ? AND key = ?", [.text(appID), .text(claim.key)])
            }
        }
        let result = try write()
        let response = claim.respond(result)
        try db.execute(
            "INSERT INTO idempotency_keys (app_id, key, request_hash, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            [.text(appID), .text(claim.key), .blob(ByteBuffer(bytes: claim.fingerprint)), .integer(response.status),
             .blob(ByteBuffer(bytes: response.body)), .integer(millis(now))]
        )
        return .performed(result)
    }

    static let selectIdempotencyRecord =
        "SELECT request_hash, status, body, created_at FROM idempotency_keys WHERE app_id = ? AND key = ?"

    static func idempotencyRecord(from row: StoreRow, appID: String, key: String) throws -> IdempotencyRecord {
        guard let hash = row.column("request_hash")?.blob else { throw CorruptRow(column: "request_hash") }
        guard let status = row.column("status")?.integer else { throw CorruptRow(column: "status") }
        guard let body = row.column("body")?.blob else { throw CorruptRow(column: "body") }
        return IdempotencyRecord(
            appID: appID, key: key, fingerprint: Array(buffer: hash), response: StoredResponse(status: status, body: Array(buffer: body)),
            acceptedAt: try row.date("created_at")
        )
    }
}
