import Foundation
import LivelineCore
import LivelineDispatch
import LivelineStore

/// Creating apps and issuing their keys, shared by the `liveline` CLI and the admin API.
public struct AppAdministration: Sendable {
    let store: any Store
    let clock: WallClock
    let sealer: CredentialSealer
    /// Told an app's keys were revoked, so that nothing in this process keeps trusting them.
    let keysRevoked: @Sendable (_ appID: String) -> Void
    /// Deletes an app's broadcast channels at APNs before the app goes; `nil` where there is none (no app with a
    /// channel can then be deleted but by leaving its channels).
    let channels: (any BroadcastChannelManagement)?
    /// Told an app was deleted, so that nothing in this process keeps its connections or credentials.
    let appDeleted: @Sendable (_ appID: String) async -> Void

    /// Creates the administration over `store`; `sealer` seals provider secrets at rest; `keysRevoked` hears of each
    /// rotation and deletion (the server's cache of keys); `channels` deletes a deleted app's broadcast channels;
    /// `appDeleted` hears of each deletion (the push clients).
    public init(
        store: any Store, clock: WallClock = .system, sealer: CredentialSealer, channels: (any BroadcastChannelManagement)? = nil,
        keysRevoked: @escaping @Sendable (String) -> Void = { _ in }, appDeleted: @escaping @Sendable (String) async -> Void = { _ in }
    ) {
        self.store = store
        self.clock = clock
        self.sealer = sealer
        self.channels = channels
        self.keysRevoked = keysRevoked
        self.appDeleted = appDeleted
    }

    /// Stores (replacing) an app's APNs credentials, sealed; they start out healthy.
    public func setAPNsCredentials(appID: String, _ credentials: APNsCredentials) async throws -> StoredCredentials {
        try credentials.validate()
        return try await saveCredentials(appID: appID) { try credentials.stored(appID: appID, sealer: self.sealer, at: $0) }
    }

    /// Stores an app's FCM service account, sealed; replaces earlier FCM credentials and marks them healthy.
    public func setFCMCredentials(appID: String, _ credentials: FCMCredentials) async throws -> StoredCredentials {
        try credentials.validate()
        return try await saveCredentials(appID: appID) { try credentials.stored(appID: appID, sealer: self.sealer, at: $0) }
    }

    /// Seals (with `seal`, given the time) and stores validated credentials for an existing app.
    private func saveCredentials(appID: String, seal: (Date) throws -> StoredCredentials) async throws -> StoredCredentials {
        guard try await store.app(id: appID) != nil else { throw StoreError.appNotFound }
        let stored = try seal(clock.now())
        try await store.saveCredentials(stored)
        return stored
    }

    /// Sets (or clears, with `nil` parts) the app's own priority-10 budget; returns the app.
    public func setBudget(appID: String, _ budget: BudgetOverride) async throws -> AppRecord {
        try await store.setBudget(appID: appID, budget)
        guard let app = try await store.app(id: appID) else { throw StoreError.appNotFound }
        return app
    }

    /// Sets (or clears, with `nil` parts) the app's broadcast defaults; returns the app.
    public func setBroadcastDefaults(appID: String, _ defaults: BroadcastDefaults) async throws -> AppRecord {
        try await store.setBroadcastDefaults(appID: appID, defaults)
        guard let app = try await store.app(id: appID) else { throw StoreError.appNotFound }
        return app
    }

    /// Sets who may set the app's devices' `userId` and `tags` (``AudienceSource``); returns the app.
    public func setAudienceFrom(appID: String, _ source: AudienceSource) async throws -> AppRecord {
        try await store.setAudienceFrom(appID: appID, source)
        guard let app = try await store.app(id: appID) else { throw StoreError.appNotFound }
        return app
    }

    /// The app's credentials as shown to operators: settings and health, never the secret.
    public func credentials(appID: String) async throws -> [StoredCredentials] {
        guard try await store.app(id: appID) != nil else { throw StoreError.appNotFound }
        var found: [StoredCredentials] = []
        for provider in CredentialProvider.allCases {
            if let stored = try await store.credentials(appID: appID, provider: provider) { found.append(stored) }
        }
        return found
    }

    /// An app with the keys just issued for it. The keys are shown once and never again.
    public struct AppWithKeys: Sendable {
        public var app: AppRecord
        public var secretKey: String
        public var publishableKey: String
    }

    /// Creates an app and issues its first secret and publishable keys.
    public func createApp(name: String, bundleID: String, androidPackage: String?) async throws -> AppWithKeys {
        let name = try Self.validateName(name)
        let bundleID = try Self.validateBundleID(bundleID)
        let androidPackage = try androidPackage.map(Self.validateAndroidPackage)
        let now = clock.now()
        let app = AppRecord(
            id: "app_" + APIKeys.randomString(length: 20), name: name, bundleID: bundleID,
            androidPackage: androidPackage, createdAt: now
        )
        let secret = APIKeys.issue(appID: app.id, scope: .secret, at: now)
        let publishable = APIKeys.issue(appID: app.id, scope: .publishable, at: now)
        try await store.createApp(app, keys: [secret.record, publishable.record])
        return AppWithKeys(app: app, secretKey: secret.key, publishableKey: publishable.key)
    }

    /// Every app, oldest first.
    public func listApps() async throws -> [AppRecord] { try await store.apps() }

    /// Revokes the app's keys and issues a new pair.
    public func rotateKeys(appID: String) async throws -> AppWithKeys {
        guard let app = try await store.app(id: appID) else { throw StoreError.appNotFound }
        let now = clock.now()
        let secret = APIKeys.issue(appID: app.id, scope: .secret, at: now)
        let publishable = APIKeys.issue(appID: app.id, scope: .publishable, at: now)
        try await store.replaceKeys(appID: app.id, with: [secret.record, publishable.record])
        keysRevoked(app.id)
        return AppWithKeys(app: app, secretKey: secret.key, publishableKey: publishable.key)
    }

    /// What deleting an app did.
    public struct DeletedApp: Sendable {
        /// What the Store removed, and the channels left at APNs.
        public var deletion: AppDeletion
        /// The app's broadcast channels deleted at APNs first.
        public var channelsDeleted: Int
    }

    /// Some of an app's broadcast channels could not be deleted at APNs, so the app was kept.
    public struct ChannelsNotDeleted: Error, Sendable, CustomStringConvertible {
        /// The channels the app held.
        public var held: Int
        /// How many of them APNs did not delete.
        public var failed: Int
        /// Why the first of those failed.
        public var reason: String
        /// Whether the app's keys were already revoked (channels made while it was being deleted could not be).
        public var keysRevoked: Bool

        /// What happened and what to do, with `leaving` the way to delete the app leaving the channels.
        public func message(leaving: String) -> String {
            let deleted = held - failed
            var text = "\(failed) of the app's \(held) broadcast channel\(held == 1 ? "" : "s") could not be deleted at APNs (\(reason)). "
            text += keysRevoked ? "The app was kept, with its keys revoked" : "The app was kept"
            if deleted > 0 { text += "; the \(deleted) deleted at APNs are gone from its activities, which no longer broadcast" }
            return text + ". Try again, or pass \(leaving) to delete the app and leave those channels at APNs, where they count against the bundle id's channels until deleted there."
        }

        public var description: String { message(leaving: "--leave-channels") }
    }

    /// How many channel deletions run at once.
    static let channelDeletionsAtOnce = 8

    /// Deletes the app with all its data (``AppStore/deleteApp(id:leavingChannels:)``), revokes its keys and closes its
    /// push connections.
    ///
    /// Its broadcast channels are deleted at APNs first (one APNs no longer knows counts as deleted), since nothing could
    /// delete them afterwards. When one cannot be, the app is kept (``ChannelsNotDeleted``), unless `leavingChannels`:
    /// then the app goes and those channels stay at APNs. The channels of an app without APNs credentials were made by
    /// the built-in emulator, not at Apple: they are left. Then its keys are revoked, in a write of their own, so that
    /// its own requests stop competing with the deletion, and the rest goes in one transaction. Live Activities on
    /// phones are not ended: the app's updates and ends stop, and each Live Activity ends when iOS (or Android) ends it.
    public func deleteApp(appID: String, leavingChannels: Bool) async throws -> DeletedApp {
        guard try await store.app(id: appID) != nil else { throw StoreError.appNotFound }
        let first = try await deleteChannels(appID: appID)
        if let refusal = first.refusal(leavingChannels: leavingChannels, keysRevoked: false) { throw refusal }
        try await store.replaceKeys(appID: appID, with: [])
        keysRevoked(appID)
        // Requests already under way when the keys went may have made channels since the first look; those tried then
        // are not tried again.
        let late = try await deleteChannels(appID: appID, skipping: first.tried)
        if let refusal = late.refusal(leavingChannels: leavingChannels, keysRevoked: true) { throw refusal }
        let leaving = leavingChannels || first.failures.count + late.failures.count > 0
        guard let deletion = try await store.deleteApp(id: appID, leavingChannels: leaving) else { throw StoreError.appNotFound }
        await appDeleted(appID)
        return DeletedApp(deletion: deletion, channelsDeleted: first.deleted + late.deleted)
    }

    /// The app's channels as they went at APNs.
    struct ChannelDeletions {
        var held = 0
        var deleted = 0
        var failures: [ChannelManagementError] = []
        /// The channels asked to be deleted, whatever the answer.
        var tried: Set<String> = []

        /// The refusal to delete the app, if a channel could not be deleted at Apple and the caller does not leave it.
        /// Pure.
        func refusal(leavingChannels: Bool, keysRevoked: Bool) -> ChannelsNotDeleted? {
            // Without credentials the channels were the built-in emulator's: nothing at Apple holds them.
            let blocking = failures.filter { $0.kind != .noCredentials }
            guard !leavingChannels, let first = blocking.first else { return nil }
            return ChannelsNotDeleted(held: held, failed: blocking.count, reason: first.reason, keysRevoked: keysRevoked)
        }
    }

    /// Deletes at APNs every channel the app holds but those `skipping`, a few at a time, and writes down each one
    /// deleted.
    private func deleteChannels(appID: String, skipping: Set<String> = []) async throws -> ChannelDeletions {
        let held = try await store.heldChannels(appID: appID).filter { !skipping.contains($0.channelID) }
        var result = ChannelDeletions(held: held.count, tried: Set(held.map(\.channelID)))
        for start in stride(from: 0, to: held.count, by: Self.channelDeletionsAtOnce) {
            let some = held[start..<min(start + Self.channelDeletionsAtOnce, held.count)]
            let outcomes = await withTaskGroup(of: (ChannelToDelete, ChannelManagementError?).self) { group in
                for channel in some {
                    group.addTask {
                        guard let channels = self.channels else {
                            return (channel, ChannelManagementError(.unavailable, "this process has no way to reach APNs' channel management"))
                        }
                        do throws(ChannelManagementError) {
                            try await channels.deleteChannel(appID: channel.appID, channelID: channel.channelID)
                            return (channel, nil)
                        } catch {
                            return (channel, error)
                        }
                    }
                }
                var outcomes: [(ChannelToDelete, ChannelManagementError?)] = []
                for await outcome in group { outcomes.append(outcome) }
                return outcomes
            }
            for (channel, failure) in outcomes {
                if let failure {
                    result.failures.append(failure)
                } else {
                    try await store.markChannelDeleted(
                        appID: channel.appID, activityID: channel.activityID, channelID: channel.channelID, at: clock.now()
                    )
                    result.deleted += 1
                }
            }
        }
        return result
    }

    static func validateName(_ name: String) throws(ValidationError) -> String {
        let trimmed = name.trimmingCharacters(in: .whitespacesAndNewlines)
        // Counted in Unicode code points as sent, as the OpenAPI document's `maxLength` counts them (a Swift `count`
        // of grapheme clusters let 200 emoji with skin tones, 400 code points, through).
        guard !trimmed.isEmpty, name.unicodeScalars.count <= 200, !trimmed.unicodeScalars.contains(where: { $0.value < 0x20 }) else {
            throw ValidationError(code: "invalid_name", message: "name must be 1 to 200 printable characters.", field: "name")
        }
        return trimmed
    }

    /// A reverse-DNS bundle id: letters, digits, '-' and '.', at least two parts.
    static func validateBundleID(_ bundleID: String) throws(ValidationError) -> String {
        let parts = bundleID.split(separator: ".", omittingEmptySubsequences: false)
        let valid = bundleID.utf8.count <= 155 && parts.count >= 2 && parts.allSatisfy { part in
            !part.isEmpty && part.utf8.allSatisfy { byte in
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "-")
            }
        }
        guard valid else {
            throw ValidationError(
                code: "invalid_bundle_id", message: "bundleId must be a reverse-DNS iOS bundle id such as com.example.app.", field: "bundleId"
            )
        }
        return bundleID
    }

    /// An Android application id: at least two dot-separated parts, each starting with a letter.
    static func validateAndroidPackage(_ package: String) throws(ValidationError) -> String {
        let parts = package.split(separator: ".", omittingEmptySubsequences: false)
        let valid = package.utf8.count <= 255 && parts.count >= 2 && parts.allSatisfy { part in
            guard let first = part.utf8.first,
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(first) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(first)
            else { return false }
            return part.utf8.allSatisfy { byte in
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "_")
            }
        }
        guard valid else {
            throw ValidationError(
                code: "invalid_android_package", message: "androidPackage must be an application id such as com.example.app.",
                field: "androidPackage"
            )
        }
        return package
    }
}
