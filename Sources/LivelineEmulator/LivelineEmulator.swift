/// Local stand-ins for APNs and FCM.
public enum LivelineEmulator {}
