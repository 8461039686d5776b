import LivelineCore
import LivelineStore

/// One directory over the push services: iOS instances go through APNs, Android instances through FCM.
public struct PlatformTransports: PushTransportDirectory {
    private let directories: [Platform: any PushTransportDirectory]

    /// Routes each platform to its own directory; a platform without one cannot be sent to.
    public init(ios: (any PushTransportDirectory)?, android: (any PushTransportDirectory)?) {
        var directories: [Platform: any PushTransportDirectory] = [:]
        directories[.ios] = ios
        directories[.android] = android
        self.directories = directories
    }

    public func transport(appID: String, platform: Platform) async throws -> (any PushTransport)? {
        try await directories[platform]?.transport(appID: appID, platform: platform)
    }

    public func transport(appID: String, platform: Platform, stored: [CredentialProvider: CredentialsVersion]?) async throws -> (any PushTransport)? {
        try await directories[platform]?.transport(appID: appID, platform: platform, stored: stored)
    }

    public func credentialsHealth(appID: String, platform: Platform, healthy: Bool, reason: String?) async {
        await directories[platform]?.credentialsHealth(appID: appID, platform: platform, healthy: healthy, reason: reason)
    }
}
