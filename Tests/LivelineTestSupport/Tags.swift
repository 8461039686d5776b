import Foundation
import Testing

extension Tag {
    /// A test that takes several seconds or more: a real process killed and restarted, fan-outs to thousands of
    /// phones, throughput runs. Give such a test (or its suite) both `.tags(.slow)` and `.unlessSkippingSlowTests`.
    @Tag public static var slow: Self
}

extension Trait where Self == ConditionTrait {
    /// Leaves the test out when the environment variable `LIVELINE_SKIP_SLOW_TESTS` is `1`, so a developer can run
    /// everything else quickly (`LIVELINE_SKIP_SLOW_TESTS=1 swift test`); CI leaves it unset and runs all.
    ///
    /// `swift test` cannot filter by tag (its `--filter` and `--skip` match test names), so the tag marks the slow
    /// tests for readers and IDEs and this trait is what skips them; the two go together.
    public static var unlessSkippingSlowTests: Self {
        .disabled(
            if: ProcessInfo.processInfo.environment["LIVELINE_SKIP_SLOW_TESTS"] == "1",
            "a slow test, left out because LIVELINE_SKIP_SLOW_TESTS=1"
        )
    }
}
