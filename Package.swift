// swift-tools-version:6.2
import PackageDescription

let package = Package(
    name: "liveline",
    platforms: [.macOS(.v15), .iOS(.v16)],
    products: [
        .executable(name: "liveline", targets: ["liveline"]),
        .library(name: "LivelineCore", targets: ["LivelineCore"]),
        .library(name: "LivelineStore", targets: ["LivelineStore"]),
        .library(name: "LivelineServer", targets: ["LivelineServer"]),
        .library(name: "LivelineKit", targets: ["LivelineKit"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/vapor/sqlite-nio.git", from: "1.13.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-configuration.git", from: "1.4.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
    ],
    targets: [
        // Domain values and pure rules. No I/O, no server or database imports.
        .target(name: "LivelineCore"),
        // SQLite settings Swift cannot reach (a C variadic function), for the Store's connections.
        .target(name: "CSQLiteSettings", dependencies: [.product(name: "SQLiteNIO", package: "sqlite-nio")]),
        // The Store protocol and its implementations.
        .target(
            name: "LivelineStore",
            dependencies: [
                "LivelineCore",
                "CSQLiteSettings",
                .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ]
        ),
        // APNs over HTTP/2: provider tokens, requests, responses, the error taxonomy.
        .target(
            name: "APNs",
            dependencies: [
                "LivelineCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // FCM HTTP v1: service-account OAuth, messages:send, the error taxonomy.
        .target(
            name: "FCM",
            dependencies: [
                "LivelineCore",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The delivery engine: claims work from the Store and pushes through APNs and FCM.
        .target(
            name: "LivelineDispatch",
            dependencies: [
                "LivelineCore",
                "LivelineStore",
                "APNs",
                "FCM",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ]
        ),
        // Local stand-ins for APNs and FCM, written from Apple's and Google's documents.
        // Imports none of the sending code (APNs, FCM, Dispatch).
        .target(
            name: "LivelineEmulator",
            dependencies: [
                "LivelineCore",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdHTTP2", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The HTTP API.
        .target(
            name: "LivelineServer",
            dependencies: [
                "LivelineCore",
                "LivelineStore",
                "LivelineDispatch",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            // The OpenAPI document, served at /openapi.json and printed by `liveline openapi`.
            resources: [.embedInCode("Resources/openapi.json")]
        ),
        // The client SDK for apps: a platform-neutral core (outbox, registration, rotation, retry) over Foundation only,
        // and a thin ActivityKit adapter (`#if canImport(ActivityKit)`).
        .target(name: "LivelineKit"),
        // The `liveline` command.
        .executableTarget(
            name: "liveline",
            dependencies: [
                "LivelineCore",
                "LivelineStore",
                "LivelineServer",
                "LivelineEmulator",
                "LivelineDispatch",
                "APNs",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ]
        ),
        // What the test targets share: a clock moved by hand, temporary directories and stores, the run's RSA keys
        // and service-account files, base64url for reading JWTs, the `slow` tag. Only what more than one test target
        // uses.
        .target(
            name: "LivelineTestSupport",
            dependencies: [
                "LivelineStore",
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ],
            path: "Tests/LivelineTestSupport"
        ),
        .testTarget(name: "LivelineCoreTests", dependencies: ["LivelineCore"]),
        // The client SDK's outbox, retry schedule and persistence; end to end against a real `liveline serve --dev`.
        .testTarget(
            name: "LivelineKitTests",
            dependencies: [
                "LivelineKit",
                "LivelineCore",
                "LivelineTestSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        // `liveline bench`: request building, percentiles, h2load's output, the round's figures; the load generator against a small server.
        // Also the executable's other pure decisions (where `serve`'s simulated phones register).
        .testTarget(
            name: "LivelineBenchTests",
            dependencies: [
                "liveline",
                "APNs",
                "LivelineCore",
                "LivelineServer",
                "LivelineStore",
                "LivelineTestSupport",
                "LivelineDispatch",
                "LivelineEmulator",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ]
        ),
        .testTarget(
            name: "LivelineStoreTests",
            dependencies: [
                "LivelineStore", "LivelineCore", "LivelineTestSupport", .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"), .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"), .product(name: "MetricsTestKit", package: "swift-metrics"),
            ]
        ),
        .testTarget(
            name: "APNsTests",
            dependencies: [
                "APNs",
                "LivelineCore",
                "LivelineTestSupport",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "FCMTests",
            dependencies: [
                "FCM",
                "LivelineEmulator",
                "LivelineCore",
                "LivelineTestSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "LivelineEmulatorTests",
            dependencies: [
                "LivelineEmulator",
                .product(name: "Hummingbird", package: "hummingbird"),
                "LivelineCore",
                "LivelineTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ]
        ),
        .testTarget(
            name: "LivelineDispatchTests",
            dependencies: [
                "LivelineDispatch", "LivelineStore", "LivelineCore", "APNs", "FCM", "LivelineEmulator", "LivelineTestSupport",
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "LivelineServerTests",
            dependencies: [
                "LivelineServer",
                "LivelineStore",
                "LivelineCore",
                "LivelineDispatch",
                "LivelineTestSupport",
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ]
        ),
    ]
)
