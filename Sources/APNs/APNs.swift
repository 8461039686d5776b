/// APNs over HTTP/2 for Live Activities.
public enum APNs {}
