import Foundation
import LivelineCore

/// A broadcast the `reorderBroadcasts` fault holds back until the next one on its channel.
struct HeldBroadcast: Sendable {
    var decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>
}

extension APNsEmulatorCore {
    // MARK: Channel management (the second HTTP/2 listener)

    /// What a channel management request asks of the registry, decided under one lock.
    private enum ManagementResult {
        case created(String)
        case read(BroadcastChannel)
        case deleted
        case listed([String])
        case refused(Rejection)
    }

    /// Answers one request on the channel management listener as Apple documents it, and changes the channels.
    /// Faults are not applied here: they belong to the push listener.
    func handleChannelManagement(_ request: APNsRequest, connection: inout ConnectionTokenState) -> APNsOutcome {
        let now = clock()
        let headers = RequestHeaders(request.headers)
        let requestID = headers.validRequestID ?? Self.newAPNsID()
        var responseHeaders = [ReceivedPush.Header(name: "apns-request-id", value: requestID)]
        var status = 200
        var body: [UInt8]?
        var changedChannels = false
        var reason: String?
        do throws(Rejection) {
            let route = try ChannelManagement.route(method: headers.method, path: headers.path)
            let cached = headers.bearerToken.flatMap { token in state.withLock { $0.tokenChecks[token] } }
            try authenticate(headers, cached: cached, now: now, connection: &connection)
            if headers.hasDuplicateAPNsHeader { throw Rejection(400, "DuplicateHeaders") }
            if let requestID = headers.requestID, !RequestHeaders.isUUID(requestID) { throw Rejection(400, "BadMessageId") }
            var policy = 0
            var channelID = ""
            switch route {
            case .create:
                policy = try ChannelManagement.storagePolicy(fromCreateBody: request.body, length: request.bodyLength)
            case .read, .delete:
                channelID = try ChannelManagement.checkChannelID(headers.channelID)
            case .list:
                break
            }
            let limit = maximumChannelsPerApp
            let result = state.withLock { state -> ManagementResult in
                let bundleID = route.bundleID
                guard state.bundles.contains(bundleID) else { return .refused(Rejection(400, "FeatureNotEnabled")) }
                switch route {
                case .create:
                    let live = state.channels.values.reduce(0) { $0 + ($1.bundleID == bundleID && !$1.deleted ? 1 : 0) }
                    guard live < limit else { return .refused(Rejection(400, "CannotCreateChannelConfig")) }
                    var id = ChannelManagement.newChannelID()
                    while state.channels[id] != nil { id = ChannelManagement.newChannelID() }
                    state.channels[id] = BroadcastChannel(
                        id: id, bundleID: bundleID, storagePolicy: policy, createdAt: now, order: state.nextChannelOrder
                    )
                    state.nextChannelOrder += 1
                    return .created(id)
                case .read, .delete:
                    guard let channel = state.channels[channelID], !channel.deleted, channel.bundleID == bundleID else {
                        return .refused(Rejection(400, "ChannelNotRegistered"))
                    }
                    if case .read = route { return .read(channel) }
                    state.channels[channelID]!.deleted = true
                    state.channels[channelID]!.deletedAt = now
                    state.heldBroadcasts[channelID] = nil
                    return .deleted
                case .list:
                    let ids = state.channels.values.filter { $0.bundleID == bundleID && !$0.deleted }.sorted { $0.order < $1.order }
                        .map(\.id)
                    return .listed(ids)
                }
            }
            switch result {
            case .refused(let rejection):
                throw rejection
            case .created(let id):
                status = 201
                responseHeaders.append(ReceivedPush.Header(name: "apns-channel-id", value: id))
                changedChannels = true
            case .read(let channel):
                body = JSONValue.object([
                    "message-storage-policy": .integer(Int64(channel.storagePolicy)),
                    "push-type": .string(ChannelManagement.pushType),
                ]).encoded
            case .deleted:
                status = 204
                changedChannels = true
                // The control API's subscribers of a deleted channel are dropped with it (they live in memory only).
                _ = audiences.withLock { $0.removeValue(forKey: channelID) }
            case .listed(let ids):
                body = JSONValue.object(["channels": .array(ids.map(JSONValue.string))]).encoded
            }
        } catch {
            status = error.status
            body = error.body
            reason = error.reason
        }
        state.withLock { state in
            state.statistics.channelManagementRequests += 1
            if let reason { state.statistics.channelManagementByReason[reason, default: 0] += 1 }
        }
        if changedChannels { changed() }
        return APNsOutcome(
            answer: .respond(status: status, headers: responseHeaders, body: body, retryAfter: nil), delayMilliseconds: 0,
            goAwayAfterRequests: nil
        )
    }

    // MARK: Broadcasts (on the push listener)

    /// Answers `POST /4/broadcasts/apps/{bundleID}` as Apple documents it; an accepted broadcast is decoded once and
    /// applied to every Live Activity subscribed to the channel, then recorded.
    func handleBroadcast(
        _ request: APNsRequest, headers: RequestHeaders, bundleID: String, now: Date, connection: inout ConnectionTokenState
    ) -> APNsOutcome {
        let requestID = headers.validRequestID ?? Self.newAPNsID()
        let providerToken = headers.bearerToken
        let snapshot = state.withLock { state in
            (
                tokenCheck: providerToken.flatMap { state.tokenChecks[$0] }, faults: state.faults,
                bundleRegistered: state.bundles.contains(bundleID), channel: headers.channelID.flatMap { state.channels[$0] }
            )
        }
        var status: Int?
        var body: [UInt8]?
        var reason: String?
        var retryAfter: Int?
        var acceptedChannel: String?
        var faultsApplied = false
        do throws(Refusal) {
            do throws(Rejection) {
                guard headers.method == "POST" else { throw Rejection(405, "MethodNotAllowed") }
                try authenticate(headers, cached: snapshot.tokenCheck, now: now, connection: &connection)
            } catch {
                throw .reject(error)
            }
            let faults = snapshot.faults
            faultsApplied = true
            if Self.happens(faults.dropConnectionRate) { throw .drop }
            if Self.happens(faults.internalErrorRate) { throw .reject(Rejection(500, "InternalServerError")) }
            if Self.happens(faults.unavailableRate) { throw .reject(Rejection(503, "ServiceUnavailable")) }
            if Self.happens(faults.tooManyRequestsRate) { throw .reject(Rejection(429, "TooManyRequests")) }
            do throws(Rejection) {
                acceptedChannel = try BroadcastRules.check(
                    headers, bundleID: bundleID, bundleRegistered: snapshot.bundleRegistered, channel: snapshot.channel,
                    bodyLength: request.bodyLength
                )
            } catch {
                throw .reject(error)
            }
            status = 200
        } catch {
            switch error {
            case .drop:
                status = nil
            case .reject(let rejection):
                status = rejection.status
                body = rejection.body
                reason = rejection.reason
                if faultsApplied, Self.injectedReasons.contains(rejection.reason) { retryAfter = snapshot.faults.retryAfterSeconds }
            }
        }

        var record = ReceivedPush(
            receivedAt: now, token: "", headers: request.headers, payload: String(decoding: request.body, as: UTF8.self),
            status: status, reason: reason, apnsID: requestID, verdict: nil, kind: "broadcast", channelID: headers.channelID
        )
        var tally = BroadcastTally()
        if let channelID = acceptedChannel {
            tally = applyBroadcast(LiveActivityState.decode(request.body), channelID: channelID, now: now)
            record.verdict = tally.verdict
            record.subscribersApplied = tally.applied
            record.subscribersIgnored = tally.ignored
        }
        state.withLock { state in
            state.statistics.totalRequests += 1
            if let status {
                state.statistics.byStatus[status, default: 0] += 1
                if status == 200 {
                    state.statistics.accepted += 1
                    state.statistics.broadcasts += 1
                }
            } else {
                state.statistics.dropped += 1
            }
            if let reason = record.reason { state.statistics.byReason[reason, default: 0] += 1 }
            state.statistics.broadcastApplied += tally.applied
            state.statistics.broadcastIgnored += tally.ignored
            state.history.append(record)
        }
        if acceptedChannel != nil { changed() }
        let answer: APNsOutcome.Answer
        if let status {
            var responseHeaders = [ReceivedPush.Header(name: "apns-request-id", value: requestID)]
            if status == 200 { responseHeaders.append(ReceivedPush.Header(name: "apns-unique-id", value: Self.newAPNsID())) }
            answer = .respond(status: status, headers: responseHeaders, body: body, retryAfter: retryAfter)
        } else {
            answer = .drop
        }
        return APNsOutcome(
            answer: answer, delayMilliseconds: faultsApplied ? snapshot.faults.delayMilliseconds : 0,
            goAwayAfterRequests: faultsApplied ? snapshot.faults.goAwayAfterRequests : nil
        )
    }

    /// How one broadcast went over a channel's subscribers.
    struct BroadcastTally {
        var applied = 0
        var ignored = 0
        var lastIgnoredReason: String?

        var verdict: PhoneVerdict {
            if applied > 0 { return .applied }
            return .ignored(lastIgnoredReason ?? "no subscribers")
        }

        mutating func count(_ verdict: PhoneVerdict) {
            switch verdict {
            case .applied: applied += 1
            case .ignored(let why):
                ignored += 1
                lastIgnoredReason = why
            }
        }
    }

    /// What one subscribed Live Activity does with a broadcast: the same display rules as a token push, except that
    /// a broadcast never starts an activity.
    static func applyBroadcast(
        _ decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>, to activity: inout LiveActivityState,
        now: Date
    ) -> PhoneVerdict {
        if case .success(let push) = decoded, push.event == "start" {
            activity.ignoredCount += 1
            activity.lastIgnoredReason = "start sent on a channel"
            return .ignored("start sent on a channel")
        }
        return activity.apply(decoded, now: now)
    }

    /// Applies an accepted broadcast (decoded once) to the channel's subscribers: the iPhones' channel activities
    /// and the control API's anonymous ones. With the `reorderBroadcasts` fault, every other broadcast is held back
    /// and applied right after the next one, as APNs may reorder a channel's notifications.
    func applyBroadcast(
        _ decoded: Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>, channelID: String, now: Date
    ) -> BroadcastTally {
        var tally = BroadcastTally()
        let batch = state.withLock { state -> [Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>] in
            state.channels[channelID]?.broadcasts += 1
            var batch: [Result<LiveActivityState.DecodedPush, LiveActivityState.Unusable>]
            if state.faults.reorderBroadcasts {
                if let held = state.heldBroadcasts.removeValue(forKey: channelID) {
                    batch = [decoded, held.decoded]
                } else {
                    state.heldBroadcasts[channelID] = HeldBroadcast(decoded: decoded)
                    batch = []
                }
            } else {
                batch = [decoded]
                if let held = state.heldBroadcasts.removeValue(forKey: channelID) { batch.append(held.decoded) }
            }
            guard !batch.isEmpty else { return batch }
            let keys = state.devices.compactMap { $0.value.channelID == channelID ? $0.key : nil }
            for key in keys {
                for item in batch {
                    let verdict = Self.applyBroadcast(item, to: &state.devices[key]!.activity, now: now)
                    tally.count(verdict)
                }
            }
            return batch
        }
        guard !batch.isEmpty else {
            tally.lastIgnoredReason = "held back (reorderBroadcasts fault)"
            return tally
        }
        audiences.withLock { audiences in
            guard var subscribers = audiences.removeValue(forKey: channelID) else { return }
            for index in subscribers.indices {
                for item in batch {
                    tally.count(Self.applyBroadcast(item, to: &subscribers[index], now: now))
                }
            }
            audiences[channelID] = subscribers
        }
        return tally
    }

    // MARK: Channels for the control API

    /// Creates a channel directly (as `POST /1/apps/{bundleID}/channels` would, without the checks) and registers the
    /// bundle id; returns its id.
    func createChannel(bundleID: String, storagePolicy: Int) -> String {
        let now = clock()
        let id = state.withLock { state in
            state.bundles.insert(bundleID)
            var id = ChannelManagement.newChannelID()
            while state.channels[id] != nil { id = ChannelManagement.newChannelID() }
            state.channels[id] = BroadcastChannel(
                id: id, bundleID: bundleID, storagePolicy: storagePolicy, createdAt: now, order: state.nextChannelOrder
            )
            state.nextChannelOrder += 1
            return id
        }
        changed()
        return id
    }

    /// Adds `count` anonymous iOS 18 Live Activities that started locally with `pushType: .channel(channelID)`.
    /// Returns `(created, total subscribers)`, or `nil` when there is no such live channel.
    func addSubscribers(channelID: String, count: Int, attributesType: String?) -> (created: Int, total: Int)? {
        let now = clock()
        guard let phoneSubscribers = state.withLock({ state -> Int? in
            guard let channel = state.channels[channelID], !channel.deleted else { return nil }
            return state.devices.values.reduce(0) { $0 + ($1.channelID == channelID ? 1 : 0) }
        }) else { return nil }
        var template = LiveActivityState()
        template.attributesType = attributesType
        template.startedAt = now
        let total = audiences.withLock { audiences -> Int in
            audiences[channelID, default: []].append(contentsOf: repeatElement(template, count: count))
            return audiences[channelID]!.count
        }
        return (count, total + phoneSubscribers)
    }

    /// Every live channel with its counts, in creation order.
    func channelSummaries() -> [BroadcastChannelSummary] {
        let (channels, phoneCounts) = state.withLock { state in
            var counts: [String: Int] = [:]
            for device in state.devices.values { if let id = device.channelID { counts[id, default: 0] += 1 } }
            return (state.channels.values.filter { !$0.deleted }.sorted { $0.order < $1.order }, counts)
        }
        let anonymous = audiences.withLock { audiences in channels.map { audiences[$0.id]?.count ?? 0 } }
        return zip(channels, anonymous).map { channel, count in
            Self.summary(channel, subscribers: count + (phoneCounts[channel.id] ?? 0))
        }
    }

    static func summary(_ channel: BroadcastChannel, subscribers: Int) -> BroadcastChannelSummary {
        BroadcastChannelSummary(
            channelID: channel.id, bundleID: channel.bundleID, storagePolicy: channel.storagePolicy, createdAt: channel.createdAt,
            subscribers: subscribers, broadcasts: channel.broadcasts
        )
    }

    /// One live channel with its subscribers grouped by the timestamp they show, or `nil`.
    func channelDetail(id: String) -> BroadcastChannelDetail? {
        let now = clock()
        guard
            let found = state.withLock({ state -> (BroadcastChannel, [LiveActivityState])? in
                guard let channel = state.channels[id], !channel.deleted else { return nil }
                return (channel, state.devices.values.filter { $0.channelID == id }.map(\.activity))
            })
        else { return nil }
        let (channel, phoneStates) = found
        var byTimestamp: [Double?: Int] = [:]
        var ended = 0
        var stale = 0
        var total = 0
        func count(_ activity: LiveActivityState) {
            total += 1
            byTimestamp[activity.timestamp, default: 0] += 1
            if activity.isStale(at: now) { stale += 1 }
            if activity.ended || (activity.startedAt.map { now >= $0 + LiveActivityState.maximumActiveDuration } ?? false) { ended += 1 }
        }
        for activity in phoneStates { count(activity) }
        audiences.withLock { audiences in
            for activity in audiences[id] ?? [] { count(activity) }
        }
        var grouped: [String: Int] = [:]
        for (timestamp, number) in byTimestamp { grouped[BroadcastChannelDetail.key(timestamp), default: 0] += number }
        return BroadcastChannelDetail(
            summary: Self.summary(channel, subscribers: total), subscribersByTimestamp: grouped, ended: ended, stale: stale
        )
    }

    /// The first `limit` subscribers' displays: the iPhones' channel activities (by their key), then the anonymous
    /// ones (`subscriber-<n>`). `nil` when there is no such live channel.
    func channelSubscribers(id: String, limit: Int) -> [DisplayedActivity]? {
        let now = clock()
        guard
            let found = state.withLock({ state -> (BroadcastChannel, [(String, Device)])? in
                guard let channel = state.channels[id], !channel.deleted else { return nil }
                let devices = state.devices.filter { $0.value.channelID == id }.sorted { $0.value.sequence < $1.value.sequence }
                return (channel, devices.map { ($0.key, $0.value) })
            })
        else { return nil }
        let (channel, phoneDevices) = found
        var displays = phoneDevices.prefix(limit).map { Self.display(token: $0.0, device: $0.1, now: now) }
        let room = limit - displays.count
        if room > 0 {
            let anonymous = audiences.withLock { Array(($0[id] ?? []).prefix(room)) }
            for (index, activity) in anonymous.enumerated() {
                var device = Device(bundleID: channel.bundleID, sequence: index)
                device.activity = activity
                displays.append(Self.display(token: "subscriber-\(index)", device: device, now: now))
            }
        }
        return displays
    }
}
