// The React Native bridge for iOS: JavaScript asks to start and end Live Activities and hears about tokens and
// states; this module calls ActivityKit and the Swift SDK LivelineKit, which registers every token with Liveline and
// reports `ended` / `dismissed` (also when no JavaScript runs).
//
// ActivityKit needs the app's own attributes type, so the bridge is generic over one type the app registers:
//
//     import LivelineReactNative
//     LivelineReactNative.use(DeliveryAttributes.self)   // AppDelegate, application(_:didFinishLaunchingWithOptions:)
//
// ExampleDeliveryAttributes.swift shows such a type; replace it with yours.
import Foundation
import LivelineKit
import React
#if canImport(ActivityKit)
import ActivityKit
#endif

/// The one place the app tells the bridge its attributes type.
public enum LivelineReactNative {
    #if canImport(ActivityKit)
    /// Registers the app's attributes type `A`: JavaScript's `startActivity` starts `Activity<A>`; once `configure`
    /// ran, LivelineKit registers `A`'s push-to-start tokens (iOS 17.2+) and follows every `Activity<A>`.
    @available(iOS 16.2, *)
    public static func use<A: LivelineActivityAttributes>(_ type: A.Type) {
        LivelineModule.driver.set(ActivityDriver<A>())
    }
    #endif
}

/// What the module needs from the registered type, without knowing it.
protocol LivelineActivityDriving: Sendable {
    var attributesType: String { get }
    /// Starts an `Activity` whose attributes carry `liveline.activityId`.
    func start(activityID: String, attributes: Data, contentState: Data, staleDate: Date?) async throws
    /// Ends the activity Liveline knows as `activityID`; false when there is none.
    func end(activityID: String, contentState: Data?, dismissImmediately: Bool) async throws -> Bool
    /// Has LivelineKit follow every activity of the type and forwards their states to `emit`.
    func observe(emit: @escaping @Sendable (String, [String: String]) -> Void)
}

/// Process-wide state: the registered driver, whether LivelineKit already follows every activity of its type, whether
/// tokens and states are being forwarded, and the module instance JavaScript listens to now (a reload makes a new one).
final class DriverBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: (any LivelineActivityDriving)?
    private var followsAll = false
    private var forwarding = false
    private weak var module: LivelineModule?
    func set(_ driver: any LivelineActivityDriving) { lock.withLock { value = driver } }
    func get() -> (any LivelineActivityDriving)? { lock.withLock { value } }
    var followsEveryActivity: Bool {
        get { lock.withLock { followsAll } }
        set { lock.withLock { followsAll = newValue } }
    }
    /// True the first time only: forwarding is started once per process.
    func beginForwarding() -> Bool {
        lock.withLock {
            defer { forwarding = true }
            return !forwarding
        }
    }
    var currentModule: LivelineModule? {
        get { lock.withLock { module } }
        set { lock.withLock { module = newValue } }
    }
    /// Sends an event to the module JavaScript listens to now, if any.
    func emit(_ name: String, _ body: [String: Any]) { currentModule?.emit(name, body) }
}

@objc(LivelineModule)
final class LivelineModule: RCTEventEmitter {
    static let driver = DriverBox()
    private let lock = NSLock()
    private var hasListeners = false

    override static func requiresMainQueueSetup() -> Bool { false }

    override func supportedEvents() -> [String]! { ["updateToken", "pushToStartToken", "activityState"] }

    override func startObserving() { lock.withLock { hasListeners = true } }
    override func stopObserving() { lock.withLock { hasListeners = false } }

    fileprivate func emit(_ name: String, _ body: [String: Any]) {
        if lock.withLock({ hasListeners }) { sendEvent(withName: name, body: body) }
    }

    @objc(configure:resolve:reject:)
    func configure(_ options: NSDictionary, resolve: @escaping RCTPromiseResolveBlock, reject: @escaping RCTPromiseRejectBlock) {
        guard let url = (options["serverUrl"] as? String).flatMap(URL.init(string:)),
              let key = options["publishableKey"] as? String, key.hasPrefix("pk_")
        else {
            reject("liveline_configure", "serverUrl and a publishable key (pk_…) are required.", nil)
            return
        }
        let deviceID = (options["deviceId"] as? String) ?? Self.storedDeviceID()
        let userID = options["userId"] as? String
        let tags = options["tags"] as? [String: String]
        let storage = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask)[0]
            .appendingPathComponent("Liveline", isDirectory: true)
        let version = ProcessInfo.processInfo.operatingSystemVersion
        let osVersion = "\(version.majorVersion).\(version.minorVersion).\(version.patchVersion)"
        do {
            // Calling it again with the same configuration does nothing; another one is refused.
            try Liveline.configure(
                LivelineConfiguration(serverURL: url, publishableKey: key, deviceID: deviceID, storageDirectory: storage)
            )
        } catch {
            reject("liveline_configure", String(describing: error), error)
            return
        }
        let client = Liveline.client
        let shared = Self.driver
        shared.currentModule = self
        if shared.beginForwarding() {
            Self.forwardTokens(from: client)
            shared.get()?.observe { name, body in shared.emit(name, body) }
        }
        Task {
            await client.registerDevice(
                userID: userID, tags: tags, osVersion: osVersion, locale: Locale.current.identifier(.bcp47)
            )
            resolve(deviceID)
        }
    }

    @objc(startActivity:resolve:reject:)
    func startActivity(_ options: NSDictionary, resolve: @escaping RCTPromiseResolveBlock, reject: @escaping RCTPromiseRejectBlock) {
        guard Liveline.isConfigured else {
            reject("liveline_start", "Call configure before startActivity.", nil)
            return
        }
        guard let driver = Self.driver.get() else {
            reject("liveline_start", "No attributes type registered: call LivelineReactNative.use(YourAttributes.self) at launch.", nil)
            return
        }
        guard let activityID = options["activityId"] as? String,
              let attributes = options["attributes"] as? NSDictionary,
              let contentState = options["contentState"] as? NSDictionary
        else {
            reject("liveline_start", "activityId, attributes and contentState are required.", nil)
            return
        }
        let staleDate = (options["staleDate"] as? NSNumber).map { Date(timeIntervalSince1970: $0.doubleValue) }
        let attributesJSON: Data
        let stateJSON: Data
        do {
            // Liveline's reference to the activity, as a remote start carries it: attributes.liveline.activityId.
            let withReference = NSMutableDictionary(dictionary: attributes)
            withReference["liveline"] = ["activityId": activityID]
            attributesJSON = try JSONSerialization.data(withJSONObject: withReference)
            stateJSON = try JSONSerialization.data(withJSONObject: contentState)
        } catch {
            reject("liveline_start", error.localizedDescription, error)
            return
        }
        Task {
            do {
                try await driver.start(activityID: activityID, attributes: attributesJSON, contentState: stateJSON, staleDate: staleDate)
                resolve(true)
            } catch {
                reject("liveline_start", String(describing: error), error)
            }
        }
    }

    @objc(endActivity:options:resolve:reject:)
    func endActivity(
        _ activityID: String, options: NSDictionary, resolve: @escaping RCTPromiseResolveBlock, reject: @escaping RCTPromiseRejectBlock
    ) {
        guard let driver = Self.driver.get() else {
            reject("liveline_end", "No attributes type registered: call LivelineReactNative.use(YourAttributes.self) at launch.", nil)
            return
        }
        let state: Data?
        do {
            state = try (options["contentState"] as? NSDictionary).map { try JSONSerialization.data(withJSONObject: $0) }
        } catch {
            reject("liveline_end", error.localizedDescription, error)
            return
        }
        let immediately = (options["dismissImmediately"] as? Bool) ?? false
        Task {
            do {
                // LivelineKit follows the activity and reports `ended` to Liveline when ActivityKit says it ended.
                if try await driver.end(activityID: activityID, contentState: state, dismissImmediately: immediately) {
                    resolve(nil)
                } else {
                    reject("liveline_end", "No Live Activity \(activityID) on this phone.", nil)
                }
            } catch {
                reject("liveline_end", String(describing: error), error)
            }
        }
    }

    /// Forwards each token LivelineKit has sent (or is retrying) to JavaScript, once per new token.
    private static func forwardTokens(from client: LivelineClient) {
        let shared = driver
        Task {
            var seen: [String: String] = [:]
            for await event in await client.events() {
                let operation: LivelineOperation
                switch event {
                case .sent(let sent, _): operation = sent
                case .willRetry(let pending, _, _): operation = pending
                case .rejected, .storageFailed: continue
                }
                switch operation.kind {
                case .registerActivity(let activityID, _, let token):
                    if seen["activity:" + activityID] != token {
                        seen["activity:" + activityID] = token
                        shared.emit("updateToken", ["activityId": activityID, "token": token])
                    }
                case .registerDevice(let registration):
                    for (type, token) in registration.pushToStartTokens where seen["start:" + type] != token {
                        seen["start:" + type] = token
                        shared.emit("pushToStartToken", ["attributesType": type, "token": token])
                    }
                case .subscribeActivity, .report:
                    continue
                }
            }
        }
    }

    /// A device id made once and kept, when JavaScript gives none.
    private static func storedDeviceID() -> String {
        let key = "dev.liveline.deviceId"
        if let id = UserDefaults.standard.string(forKey: key) { return id }
        let id = UUID().uuidString.lowercased()
        UserDefaults.standard.set(id, forKey: key)
        return id
    }
}

#if canImport(ActivityKit)
/// The bridge's work for the app's attributes type `A`.
@available(iOS 16.2, *)
struct ActivityDriver<A: LivelineActivityAttributes>: LivelineActivityDriving {
    var attributesType: String { String(describing: A.self) }

    func start(activityID: String, attributes: Data, contentState: Data, staleDate: Date?) async throws {
        let decoder = JSONDecoder()
        let attributes = try decoder.decode(A.self, from: attributes)
        let state = try decoder.decode(A.ContentState.self, from: contentState)
        let activity = try Activity<A>.request(
            attributes: attributes, content: ActivityContent(state: state, staleDate: staleDate), pushType: .token
        )
        // LivelineKit registers the activity's push token under activityID, on every rotation, and reports its end.
        // Once observe() runs on iOS 17.2+, LivelineKit follows every new activity of the type by itself.
        if !LivelineModule.driver.followsEveryActivity {
            Liveline.track(activity, activityID: activityID)
        }
    }

    func end(activityID: String, contentState: Data?, dismissImmediately: Bool) async throws -> Bool {
        guard let activity = Activity<A>.activities.first(where: { $0.attributes.liveline?.activityId == activityID }) else {
            return false
        }
        let state = try contentState.map { try JSONDecoder().decode(A.ContentState.self, from: $0) } ?? activity.content.state
        await activity.end(ActivityContent(state: state, staleDate: nil), dismissalPolicy: dismissImmediately ? .immediate : .default)
        return true
    }

    func observe(emit: @escaping @Sendable (String, [String: String]) -> Void) {
        if #available(iOS 17.2, *) {
            // Push-to-start tokens, and every activity of the type: running, started here, started remotely.
            Liveline.observePushToStart(for: A.self)
            LivelineModule.driver.followsEveryActivity = true
        } else {
            // No remote starts before iOS 17.2: follow the activities still running from an earlier launch.
            for activity in Activity<A>.activities { Liveline.track(activity) }
        }
        // Their states, for JavaScript.
        Task {
            for activity in Activity<A>.activities { Self.forwardStates(activity, emit: emit) }
            for await activity in Activity<A>.activityUpdates { Self.forwardStates(activity, emit: emit) }
        }
    }

    private static func forwardStates(_ activity: Activity<A>, emit: @escaping @Sendable (String, [String: String]) -> Void) {
        guard let id = activity.attributes.liveline?.activityId else { return }
        Task {
            for await state in activity.activityStateUpdates {
                emit("activityState", ["activityId": id, "state": name(of: state)])
            }
        }
    }

    private static func name(of state: ActivityState) -> String {
        switch state {
        case .active: "active"
        case .ended: "ended"
        case .dismissed: "dismissed"
        case .stale: "stale"
        @unknown default: "pending"
        }
    }
}
#endif
