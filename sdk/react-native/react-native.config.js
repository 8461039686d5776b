// Autolinking: the Android package class; iOS is linked through the podspec.
module.exports = {
  dependency: {
    platforms: {
      android: {
        packageImportPath: 'import dev.liveline.reactnative.LivelinePackage;',
        packageInstance: 'new LivelinePackage()',
      },
    },
  },
};
