plugins {
    id("com.android.library")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "dev.liveline"
    // Android 16 (API 36): Notification.ProgressStyle, setShortCriticalText, canPostPromotedNotifications.
    compileSdk = 36

    defaultConfig {
        minSdk = 26 // notification channels
        consumerProguardFiles("consumer-rules.pro")
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    testOptions {
        // android.util.Log in unit tests: a no-op instead of "not mocked".
        unitTests.isReturnDefaultValues = true
    }

    sourceSets["main"].java.srcDirs("src/main/kotlin")
    sourceSets["test"].java.srcDirs("src/test/kotlin")
}

kotlin {
    jvmToolchain(17)
}

dependencies {
    implementation("androidx.core:core-ktx:1.16.0")
    implementation("androidx.work:work-runtime-ktx:2.10.1")
    // The app brings its own Firebase setup (google-services.json, the BoM); the SDK compiles against messaging.
    api("com.google.firebase:firebase-messaging:24.1.1")

    testImplementation("junit:junit:4.13.2")
    // Android's org.json is a stub in local unit tests; this is the real implementation.
    testImplementation("org.json:json:20240303")
}
