// Expo config plugin: `"plugins": [["@liveline/react-native", {serverUrl, publishableKey, smallIcon?, frequentUpdates?}]]`.
//
// Android: writes the Kotlin SDK's <meta-data> (so a push to a closed app is shown before any JavaScript runs).
// The messaging service, receiver and permissions come from the package's own AndroidManifest.xml.
// iOS: sets NSSupportsLiveActivities (and NSSupportsLiveActivitiesFrequentUpdates when asked). It does not create
// the widget extension that draws the Live Activity, nor register your attributes type: see README.md.
const { AndroidConfig, createRunOncePlugin, withAndroidManifest, withInfoPlist } = require('@expo/config-plugins');
const pkg = require('./package.json');

function withLiveline(config, props = {}) {
  const { serverUrl, publishableKey, smallIcon, frequentUpdates = false } = props;
  if (!serverUrl || !publishableKey) {
    throw new Error('@liveline/react-native: the plugin needs serverUrl and publishableKey');
  }
  if (!publishableKey.startsWith('pk_')) {
    throw new Error('@liveline/react-native: publishableKey must be a publishable key (pk_…), never a secret key');
  }

  config = withAndroidManifest(config, (config) => {
    const application = AndroidConfig.Manifest.getMainApplicationOrThrow(config.modResults);
    AndroidConfig.Manifest.addMetaDataItemToMainApplication(application, 'dev.liveline.server_url', serverUrl);
    AndroidConfig.Manifest.addMetaDataItemToMainApplication(application, 'dev.liveline.publishable_key', publishableKey);
    if (smallIcon) {
      // A drawable resource, e.g. "@drawable/notification_icon" (expo-notifications' icon lands there).
      AndroidConfig.Manifest.addMetaDataItemToMainApplication(application, 'dev.liveline.small_icon', smallIcon, 'resource');
    }
    return config;
  });

  config = withInfoPlist(config, (config) => {
    config.modResults.NSSupportsLiveActivities = true;
    if (frequentUpdates) config.modResults.NSSupportsLiveActivitiesFrequentUpdates = true;
    return config;
  });

  return config;
}

module.exports = createRunOncePlugin(withLiveline, pkg.name, pkg.version);
