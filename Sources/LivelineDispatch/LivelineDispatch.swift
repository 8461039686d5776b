/// The delivery engine.
public enum LivelineDispatch {}
