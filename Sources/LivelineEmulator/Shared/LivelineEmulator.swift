/// Local stand-ins for the push services Liveline talks to, written from Apple's (and later
/// Google's) documents rather than from Liveline's sending code.
///
/// ``APNsEmulator`` is the APNs stand-in: HTTP/2 over TLS with Apple's answers, simulated phones
/// behind it, and a JSON control API.
public enum LivelineEmulator {}
