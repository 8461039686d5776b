import Foundation
import LivelineCore

/// One activity's ongoing notification on a simulated Android phone, and the rules by which an app that follows
/// Liveline's data contract applies a data message to it. Written from the contract (docs), not from Liveline's
/// message builder: a message FCM accepts (200) but the app cannot use is dropped silently, as a real app would.
///
/// The contract, as an app reads it: every value is a string; `liveline_activity_id` keys the notification;
/// `liveline_event` is `start`, `update` or `end`; `liveline_sequence` and `liveline_timestamp` are decimal integers;
/// `liveline_content_state` (and on `start`, `liveline_attributes`) JSON objects as text; `liveline_stale_date` and
/// `liveline_dismissal_date` (`end` only) decimal seconds since 1970; `liveline_alert_title` / `liveline_alert_body`
/// an optional alert, or for a localized one `liveline_alert_title_loc_key` / `liveline_alert_body_loc_key` with
/// `…_loc_args`, a JSON array of strings (the phone shows the app's string resource; the emulator records its key).
struct AndroidNotificationState: Sendable, Codable {
    let activityID: String
    var contentState: JSONValue?
    var sequence: Int64?
    var timestamp: Int64?
    var staleDate: Date?
    var attributesType: String?
    var attributes: JSONValue?
    var postedAt: Date?
    var updatedAt: Date?
    var ended = false
    var endedAt: Date?
    var dismissalDate: Date?
    var dismissedByUser = false
    var alertCount = 0
    var lastAlertTitle: String?
    var lastAlertBody: String?
    var appliedCount = 0
    var ignoredCount = 0
    var lastEvent: String?
    var lastIgnoredReason: String?
    var lastRegistration: RegistrationResult?

    init(activityID: String) { self.activityID = activityID }

    /// Whether the notification is on screen at `now`.
    func isVisible(at now: Date) -> Bool {
        guard postedAt != nil, !dismissedByUser else { return false }
        if ended, let dismissalDate, now >= dismissalDate { return false }
        return true
    }

    /// Applies a readable live update and says what happened.
    mutating func apply(_ update: LiveUpdate, now: Date) -> PhoneVerdict {
        let verdict: PhoneVerdict
        if dismissedByUser {
            verdict = .ignored("dismissed")
        } else if ended {
            verdict = .ignored("ended")
        } else if let sequence, update.sequence <= sequence {
            verdict = .ignored("stale sequence")
        } else {
            contentState = update.contentState
            sequence = update.sequence
            timestamp = update.timestamp
            staleDate = update.staleDate
            lastEvent = update.event
            if postedAt == nil { postedAt = now }
            updatedAt = now
            if update.alertTitle != nil || update.alertBody != nil {
                alertCount += 1
                lastAlertTitle = update.alertTitle
                lastAlertBody = update.alertBody
            }
            if update.event == "start" {
                attributesType = update.attributesType
                attributes = update.attributes
            }
            if update.event == "end" {
                ended = true
                endedAt = now
                dismissalDate = update.dismissalDate
            }
            verdict = .applied
        }
        if case .ignored(let why) = verdict {
            ignoredCount += 1
            lastIgnoredReason = why
        } else {
            appliedCount += 1
        }
        return verdict
    }

    func display(now: Date) -> AndroidLiveNotification {
        AndroidLiveNotification(
            activityID: activityID, visible: isVisible(at: now), contentState: contentState, sequence: sequence,
            timestamp: timestamp, staleDate: staleDate, isStale: staleDate.map { now > $0 } ?? false,
            attributesType: attributesType, attributes: attributes, postedAt: postedAt, updatedAt: updatedAt, ended: ended,
            endedAt: endedAt, dismissalDate: dismissalDate, dismissedByUser: dismissedByUser, alertCount: alertCount,
            lastAlertTitle: lastAlertTitle, lastAlertBody: lastAlertBody, appliedCount: appliedCount,
            ignoredCount: ignoredCount, lastEvent: lastEvent, lastIgnoredReason: lastIgnoredReason,
            lastRegistration: lastRegistration
        )
    }

    /// A data message read the way the app reads it.
    struct LiveUpdate: Sendable {
        var activityID: String
        var event: String
        var sequence: Int64
        var timestamp: Int64
        var contentState: JSONValue
        var staleDate: Date?
        var dismissalDate: Date?
        var attributesType: String?
        var attributes: JSONValue?
        var alertTitle: String?
        var alertBody: String?
    }

    /// Why the app could not use a message; with the activity id when it could read that far.
    struct Unusable: Error {
        var activityID: String?
        var message: String
    }

    /// Reads a message's `data` map as the app does; any failure means the app drops the message.
    static func decode(_ data: [String: String]) -> Result<LiveUpdate, Unusable> {
        guard let activityID = data["liveline_activity_id"], !activityID.isEmpty else {
            return .failure(Unusable(activityID: nil, message: "not a Liveline live update (no liveline_activity_id)"))
        }
        func fail(_ message: String) -> Result<LiveUpdate, Unusable> { .failure(Unusable(activityID: activityID, message: message)) }
        guard let event = data["liveline_event"], ["start", "update", "end"].contains(event) else {
            return fail("liveline_event is not start, update or end")
        }
        guard let sequence = data["liveline_sequence"].flatMap(decimal) else {
            return fail("liveline_sequence is missing or not a decimal integer")
        }
        guard let timestamp = data["liveline_timestamp"].flatMap(decimal) else {
            return fail("liveline_timestamp is missing or not a decimal integer")
        }
        guard let stateText = data["liveline_content_state"], let contentState = try? JSONValue(parsing: Array(stateText.utf8)),
            contentState.objectValue != nil
        else { return fail("liveline_content_state is missing or not a JSON object") }
        var update = LiveUpdate(
            activityID: activityID, event: event, sequence: sequence, timestamp: timestamp, contentState: contentState
        )
        if let text = data["liveline_stale_date"] {
            guard let seconds = decimal(text) else { return fail("liveline_stale_date is not a decimal integer") }
            update.staleDate = Date(timeIntervalSince1970: Double(seconds))
        }
        if let text = data["liveline_dismissal_date"] {
            guard event == "end" else { return fail("liveline_dismissal_date on a \(event) event") }
            guard let seconds = decimal(text) else { return fail("liveline_dismissal_date is not a decimal integer") }
            update.dismissalDate = Date(timeIntervalSince1970: Double(seconds))
        }
        if event == "start" {
            guard let type = data["liveline_attributes_type"], !type.isEmpty else {
                return fail("start without liveline_attributes_type")
            }
            guard let text = data["liveline_attributes"], let attributes = try? JSONValue(parsing: Array(text.utf8)),
                attributes.objectValue != nil
            else { return fail("start without a liveline_attributes JSON object") }
            update.attributesType = type
            update.attributes = attributes
        }
        for (part, text) in [("title", \LiveUpdate.alertTitle), ("body", \LiveUpdate.alertBody)] {
            // Text shown as it is, or the key of one of the app's string resources with its arguments: the phone shows
            // the resource (recorded here by its key).
            if let shown = data["liveline_alert_\(part)"] {
                update[keyPath: text] = shown
            } else if let key = data["liveline_alert_\(part)_loc_key"] {
                guard !key.isEmpty else { return fail("liveline_alert_\(part)_loc_key is empty") }
                guard let argumentsText = data["liveline_alert_\(part)_loc_args"],
                    let arguments = try? JSONValue(parsing: Array(argumentsText.utf8)).arrayValue,
                    arguments.allSatisfy({ $0.stringValue != nil })
                else { return fail("liveline_alert_\(part)_loc_args is missing or not a JSON array of strings") }
                update[keyPath: text] = key
            }
        }
        return .success(update)
    }

    /// A decimal integer as text: an optional `-` and digits only.
    private static func decimal(_ text: String) -> Int64? {
        let digits = text.hasPrefix("-") ? text.dropFirst() : Substring(text)
        guard !digits.isEmpty, digits.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int64(text)
    }
}
