// The Liveline Android reference SDK as a standalone Gradle build: `./gradlew :liveline:assembleRelease`.
// An app can also include the module from its own settings (see README.md).
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}

dependencyResolutionManagement {
    repositories {
        google()
        mavenCentral()
    }
}

rootProject.name = "liveline-android"
include(":liveline")
