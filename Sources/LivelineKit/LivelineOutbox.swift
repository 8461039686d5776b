import Foundation

/// The calls waiting to reach Liveline, and the rules by which they coalesce and go out. Pure: no clock, no I/O
/// (``LivelineClient`` persists it and sends what it picks).
///
/// - Coalescing: one device registration (fields merge, push-to-start tokens merge per attributes type, newest wins);
///   one instance registration per activity (the newest token wins: a rotation replaces the waiting token); one
///   event per activity and type (the same event again changes nothing; a `frequentPushes` with the other value
///   replaces it, with a new idempotency key).
/// - In flight: a send carries the operation's revision. Completing or rejecting it removes the operation only if no
///   newer call was merged meanwhile; otherwise the newer content stays and is sent afterwards.
/// - Order: the device registration, then instance registrations, then events, each oldest first; an event waits
///   while its activity's registration is pending (the instance must exist before the server takes its events).
struct LivelineOutbox: Sendable, Hashable, Codable {
    /// One send of one revision of an operation.
    struct Attempt: Sendable, Hashable {
        var key: LivelineOperation.Key
        var revision: Int
    }

    /// The file format's version.
    var version = 1
    /// The waiting operations, oldest first.
    private(set) var operations: [LivelineOperation] = []
    /// The sequence number the next new operation gets.
    private(set) var nextSequence = 0

    init() {}

    /// Records a call: merges it into the waiting operation with the same key, or appends it. Returns the operation as
    /// it now waits. A merge that changes the content raises the revision and clears the wait, so the newest content is
    /// tried at once (the attempt count, and so the next backoff, is kept).
    @discardableResult
    mutating func record(_ kind: LivelineOperation.Kind) -> LivelineOperation {
        let incoming = LivelineOperation(kind: kind, sequence: nextSequence, revision: 0, attempts: 0, notBefore: nil, lastError: nil)
        guard let index = operations.firstIndex(where: { $0.key == incoming.key }) else {
            nextSequence += 1
            operations.append(incoming)
            return incoming
        }
        var operation = operations[index]
        let merged = Self.merge(operation.kind, with: kind)
        guard merged != operation.kind else { return operation }
        operation.kind = merged
        operation.revision += 1
        operation.notBefore = nil
        operations[index] = operation
        return operation
    }

    /// The waiting kind with a newer call of the same key laid over it.
    static func merge(_ waiting: LivelineOperation.Kind, with newer: LivelineOperation.Kind) -> LivelineOperation.Kind {
        switch (waiting, newer) {
        case (.registerDevice(let old), .registerDevice(let new)):
            return .registerDevice(old.merging(new))
        case (.registerActivity(let activityID, let oldType, _), .registerActivity(_, let newType, let token)):
            return .registerActivity(activityID: activityID, attributesType: newType ?? oldType, pushToken: token)
        case (.subscribeActivity(let activityID, let oldType, _), .subscribeActivity(_, let newType, let channelID)):
            return .subscribeActivity(activityID: activityID, attributesType: newType ?? oldType, channelID: channelID)
        case (.report(_, let oldEvent, _), .report(_, let newEvent, _)) where oldEvent == newEvent:
            // The same event again: the one recorded first keeps its idempotency key.
            return waiting
        default:
            return newer
        }
    }

    /// The operation to send next at `now`, or `nil`: the first by rank (device, instances, events) and age that is
    /// due (or any, when `ignoringBackoff`), not yet attempted in this pass (`excluding`), and not an event whose
    /// activity's registration still waits.
    func next(at now: Date, ignoringBackoff: Bool = false, excluding attempted: Set<Attempt> = []) -> LivelineOperation? {
        sendable(excluding: attempted)
            .filter { ignoringBackoff || ($0.notBefore ?? now) <= now }
            .min { ($0.rank, $0.sequence) < ($1.rank, $1.sequence) }
    }

    /// When the next operation falls due (`nil` when nothing can be sent): the earliest wait among operations not
    /// held back behind another.
    func nextDue(at now: Date) -> Date? {
        sendable(excluding: []).map { $0.notBefore ?? now }.min()
    }

    /// Operations not attempted in this pass and not held back by their activity's pending registration.
    private func sendable(excluding attempted: Set<Attempt>) -> [LivelineOperation] {
        let registering = Set(operations.compactMap { operation -> String? in
            switch operation.kind {
            case .registerActivity(let activityID, _, _), .subscribeActivity(let activityID, _, _): return activityID
            case .registerDevice, .report: return nil
            }
        })
        return operations.filter { operation in
            if attempted.contains(Attempt(key: operation.key, revision: operation.revision)) { return false }
            if case .report(let activityID, _, _) = operation.kind, registering.contains(activityID) { return false }
            return true
        }
    }

    /// The send of `attempt` succeeded: the operation is removed unless a newer call was merged meanwhile. Returns
    /// whether it was removed.
    @discardableResult
    mutating func complete(_ attempt: Attempt) -> Bool {
        guard let index = operations.firstIndex(where: { $0.key == attempt.key }), operations[index].revision == attempt.revision else {
            return false
        }
        operations.remove(at: index)
        return true
    }

    /// The server refused `attempt` for good: the same as ``complete(_:)`` — a newer call merged meanwhile still gets
    /// its own try.
    @discardableResult
    mutating func reject(_ attempt: Attempt) -> Bool {
        complete(attempt)
    }

    /// The send of `attempt` failed and may succeed later: the operation counts one more attempt and waits until
    /// `retryAt` (whatever its revision: the server is not answering). Returns the operation as it now waits.
    @discardableResult
    mutating func fail(_ attempt: Attempt, retryAt: Date, reason: String) -> LivelineOperation? {
        guard let index = operations.firstIndex(where: { $0.key == attempt.key }) else { return nil }
        operations[index].attempts += 1
        operations[index].notBefore = retryAt
        operations[index].lastError = reason
        return operations[index]
    }

    /// Every operation is due now (their attempt counts are kept): what a new client does with the outbox it loads,
    /// since a relaunched app may well be online again.
    mutating func clearWaits() {
        for index in operations.indices { operations[index].notBefore = nil }
    }

    /// The waiting operation with `key`.
    func operation(_ key: LivelineOperation.Key) -> LivelineOperation? {
        operations.first { $0.key == key }
    }
}
