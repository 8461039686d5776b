require "json"

package = JSON.parse(File.read(File.join(__dir__, "package.json")))

# Where LivelineKit (the Swift package of the Liveline repository) is fetched from: your checkout's remote or a fork,
# e.g. LIVELINE_KIT_URL=https://github.com/you/liveline.git pod install
liveline_url = ENV["LIVELINE_KIT_URL"] or raise "liveline-react-native: set LIVELINE_KIT_URL to the git URL of the Liveline repository (README.md)"
liveline_version = ENV.fetch("LIVELINE_KIT_VERSION", package["version"])

Pod::Spec.new do |s|
  s.name          = "liveline-react-native"
  s.module_name   = "LivelineReactNative"
  s.version       = package["version"]
  s.summary       = package["description"]
  s.homepage      = liveline_url.sub(/\.git\z/, "")
  s.license       = package["license"]
  s.authors       = "Liveline contributors"
  s.platforms     = { :ios => "16.2" }
  s.source        = { :git => liveline_url, :tag => "v#{s.version}" }
  s.source_files  = "ios/**/*.{h,m,swift}"
  s.swift_version = "5.9"

  s.dependency "React-Core"

  # React Native 0.75+ links a Swift package from a podspec.
  if defined?(ReactNativePodsUtils) && ReactNativePodsUtils.respond_to?(:spm_dependency)
    ReactNativePodsUtils.spm_dependency(s,
      url: liveline_url,
      requirement: { kind: "upToNextMajorVersion", minimumVersion: liveline_version },
      products: ["LivelineKit"]
    )
  else
    raise "liveline-react-native needs React Native 0.75 or later (ReactNativePodsUtils.spm_dependency) to link LivelineKit"
  end
end
