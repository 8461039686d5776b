// AN EXAMPLE — replace it with your own attributes type.
//
// ActivityKit needs the app's own `ActivityAttributes` type, known at compile time, and the same type (the same
// file) in the widget extension that draws the Live Activity. The bridge is generic over one such type, which the
// app registers once at launch:
//
//     LivelineReactNative.use(DeliveryAttributes.self)   // in AppDelegate, before React Native starts
//
// This type shows the shape: `LivelineActivityAttributes` (from LivelineKit) is an `ActivityAttributes` with
// `var liveline: LivelineActivityReference?`, which Liveline fills on a remote start ("which activity this is").
// JavaScript's `attributes` and `contentState` must decode into the type and its `ContentState` with a default
// `JSONDecoder` (so: numbers stay numbers, dates are seconds since 2001 unless you decode otherwise).
#if canImport(ActivityKit)
import ActivityKit
import Foundation
import LivelineKit

@available(iOS 16.2, *)
public struct ExampleDeliveryAttributes: LivelineActivityAttributes {
    public struct ContentState: Codable, Hashable {
        public var status: String
        public var minutesAway: Int
    }

    public var orderNumber: String
    public var liveline: LivelineActivityReference?
}
#endif
