import Foundation
import LivelineCore
import SQLiteNIO

extension SQLStore {
    public func priority10Usage(appID: String, activityID: String) async throws -> [Priority10Usage] {
        try await reader.query(
            """
            SELECT priority10_tally, priority10_sent, frequent_pushes FROM instances
            WHERE app_id = ? AND activity_id = ? AND state = 'active' AND platform = 'ios'
            """,
            [.text(appID), .text(activityID)]
        ).map { row in
            Priority10Usage(
                tally: Self.priority10Tally(from: row),
                frequentPushes: row.column("frequent_pushes")?.integer.map { $0 != 0 }
            )
        }
    }
}
