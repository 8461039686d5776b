/// A change to an app that every node sharing a PostgreSQL database must act on at once, rather than when its caches
/// next read the database: the Store sends it (``wire``) on the `liveline_apps` channel inside the transaction that
/// makes the change, so that it is heard exactly when the change is committed, and by no one when it is not — from a
/// server node or from a one-shot command (`liveline keys rotate`, `liveline apps delete`) alike. Nodes hear it through
/// ``NodeWakeChannel/run(onWake:onAppNotice:)``.
public enum AppNotice: Sendable, Hashable {
    /// The app's keys were revoked (rotated): no node may go on accepting them from a cache.
    case keysRevoked(appID: String)
    /// The app was deleted: its keys are gone, and its push connections and credentials should leave memory.
    case appDeleted(appID: String)
    /// Notices may have been missed: the node was not listening for a while (its connection was lost). What it keeps
    /// of any app should be read again.
    case mayHaveMissed

    /// The `LISTEN` / `NOTIFY` channel.
    static let channel = "liveline_apps"

    /// The notice as sent, `keys-revoked <app id>` or `deleted <app id>`; `nil` for ``mayHaveMissed``, which is never
    /// sent.
    var wire: String? {
        switch self {
        case .keysRevoked(let appID): "keys-revoked \(appID)"
        case .appDeleted(let appID): "deleted \(appID)"
        case .mayHaveMissed: nil
        }
    }

    /// The notice a payload heard on the channel carries; `nil` for one this version does not know (a newer node's),
    /// which is ignored.
    init?(wire: String) {
        guard let space = wire.firstIndex(of: " ") else { return nil }
        let appID = String(wire[wire.index(after: space)...])
        guard !appID.isEmpty else { return nil }
        switch wire[..<space] {
        case "keys-revoked": self = .keysRevoked(appID: appID)
        case "deleted": self = .appDeleted(appID: appID)
        default: return nil
        }
    }
}
