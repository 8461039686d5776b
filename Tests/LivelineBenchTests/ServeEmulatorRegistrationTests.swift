import Foundation
import LivelineEmulator
import LivelineServer
import Testing

@testable import liveline

/// Where `serve`'s built-in emulators' simulated phones register with Liveline.
@Suite("serve: emulator registration")
struct ServeEmulatorRegistrationTests {
    private func directory() -> String {
        (NSTemporaryDirectory() as NSString).appendingPathComponent("liveline-register-\(UUID().uuidString)")
    }

    @Test("--dev registers with this server using the demo key it created, and keeps the key for later starts")
    func devDefault() throws {
        let directory = directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = LivelineConfiguration(host: "0.0.0.0", port: 9090, dev: true)
        let first = BuiltInEmulators.registrationTarget(configuration, createdDemoKey: "pk_demo", directory: directory)
        #expect(first == .target(LivelineRegistrationTarget(url: "http://127.0.0.1:9090", publishableKey: "pk_demo")))
        let later = BuiltInEmulators.registrationTarget(configuration, createdDemoKey: nil, directory: directory)
        #expect(later == first)
    }

    @Test("Without a key, with 'none', or outside dev mode without a URL, phones do not register")
    func off() {
        let directory = directory()
        var configuration = LivelineConfiguration(dev: true)
        #expect(BuiltInEmulators.registrationTarget(configuration, createdDemoKey: nil, directory: directory).resolved == nil)
        configuration.emulatorRegisterWith = "none"
        #expect(BuiltInEmulators.registrationTarget(configuration, createdDemoKey: "pk_demo", directory: directory).resolved == nil)
        try? FileManager.default.removeItem(atPath: directory)
        let plain = LivelineConfiguration()
        #expect(BuiltInEmulators.registrationTarget(plain, createdDemoKey: nil, directory: directory).resolved == nil)
    }

    @Test("An explicit URL and key win")
    func explicit() {
        var configuration = LivelineConfiguration()
        configuration.emulatorRegisterWith = "http://liveline.test:8080"
        configuration.emulatorPublishableKey = "pk_given"
        #expect(
            BuiltInEmulators.registrationTarget(configuration, createdDemoKey: nil, directory: directory()).resolved
                == LivelineRegistrationTarget(url: "http://liveline.test:8080", publishableKey: "pk_given")
        )
    }

    @Test("liveline emulator: --register-with and --publishable-key come together, with an http(s) URL")
    func standaloneFlags() throws {
        try validateRegistration(registerWith: nil, publishableKey: nil)
        try validateRegistration(registerWith: "http://127.0.0.1:8080", publishableKey: "pk_x")
        #expect(throws: (any Error).self) { try validateRegistration(registerWith: "http://127.0.0.1:8080", publishableKey: nil) }
        #expect(throws: (any Error).self) { try validateRegistration(registerWith: nil, publishableKey: "pk_x") }
        #expect(throws: (any Error).self) { try validateRegistration(registerWith: "127.0.0.1:8080", publishableKey: "pk_x") }
        #expect(
            registrationTarget(registerWith: "http://127.0.0.1:8080", publishableKey: "pk_x")
                == LivelineRegistrationTarget(url: "http://127.0.0.1:8080", publishableKey: "pk_x")
        )
    }
}
