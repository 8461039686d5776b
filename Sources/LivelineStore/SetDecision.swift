/// What a set's planner (``RegistrationSet``, ``UpdateSet``) decides for one member: pure, and comparable in tests.
enum SetDecision<Result: Sendable>: Sendable {
    /// Written by the set: the member's result (a new instance, an accepted sequence).
    case written(Result)
    /// Refused by the member's own rules; nothing of it is written.
    case refused(StoreError)
    /// Left to the member's body, which runs after the set in the same transaction.
    case alone

    /// The decision as the pool takes it (``SetWriteOutcome``), the result made the body's own type by `outcome`.
    func outcome<Outcome>(_ outcome: (Result) -> Outcome) -> SetWriteOutcome<Outcome> {
        switch self {
        case .written(let result): .done(outcome(result))
        case .refused(let error): .refused(error)
        case .alone: .alone
        }
    }
}

extension SetDecision: Equatable where Result: Equatable {}
extension SetDecision: Hashable where Result: Hashable {}
