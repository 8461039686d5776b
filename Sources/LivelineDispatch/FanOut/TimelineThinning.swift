/// Which of one pass's attempts are written to the delivery timeline, and when, as a pure decision: the timeline keeps
/// an activity's newest ``keep`` attempts (``DispatcherConfiguration/deliveriesPerActivity``), and a pass that sends to
/// many more instances than that wrote every attempt only to delete all but the last ``keep`` at its end: a fan-out of
/// 100,000 wrote 100,000 attempts and pruned 90,000 of them. Holding them back, four fan-outs of 100,000 on SQLite
/// wrote 224 MB to disk instead of 339 (`/proc/PID/io`); pushes per second did not change beyond the machine's noise,
/// and the server's peak memory rose from 83 to 97 MB.
///
/// A batch's attempts are held back instead of written while at least ``keep`` instances of the pass are still to be
/// recorded after it (``counted(pending:)``, the Store's count of the pass's pending instances, less the batches
/// recorded since): each of those makes an attempt, written after the batch's, so the batch's would be pruned. The
/// newest ``keep`` held attempts stay in memory; they are written, before the batch, with the first batch that is
/// written (fewer than ``keep`` are left to come), or at the end of the pass (``passEnded()``) if none is. So whatever
/// ends the pass (its last instance, a lost claim, a shutdown, instances deleted meanwhile, a count that was too
/// high), every attempt that is dropped has at least ``keep`` newer ones written after it, and the timeline holds the
/// same newest ``keep`` attempts as if every one had been written: only the attempts a crash catches held are lost
/// (at most ``keep``, of a pass that had sent to more than ``keep`` more instances).
///
/// Until a count is given, every batch is written, as before: a pass is counted (beside its sends) only when a first
/// page is full, so a small activity's pass costs no count and holds nothing.
///
/// `Batch` is what the engine holds of a batch (its attempts); the machine only counts their instances and
/// attempts, and hands batches back in the order they came.
struct TimelineThinning<Batch> {
    /// The attempts the timeline keeps per activity.
    let keep: Int
    /// Instances of the pass still to be recorded, at least; nil until counted.
    private(set) var toCome: Int?
    /// The newest batches held back, oldest first, with their attempts.
    private var held: [(batch: Batch, attempts: Int)] = []
    /// Their attempts.
    private(set) var heldAttempts = 0

    /// What to do with a batch's attempts.
    enum Decision {
        /// Hold them back: nothing is written for the timeline now.
        case hold
        /// Write, in this order, the attempts of `earlier` (batches held back before, oldest first) and then the
        /// batch's own.
        case write(earlier: [Batch])
    }

    init(keep: Int) {
        self.keep = max(1, keep)
    }

    /// The count a pass gives ``counted(pending:)`` without asking the Store for it, when it has one: a slice of a
    /// shared fan-out (`slice`) was cut to `sliceSize` pending instances by its plan (the last to fewer), and any count
    /// is safe here, one too high included (the held batches are written when the pass ends). A pass over a whole
    /// activity has none (nil): the Store counts its pending instances.
    ///
    /// Counted, each slice's pass cost PostgreSQL a walk of its range (`COUNT(*)` over up to 10,000 instances, 20 – 30
    /// ms each, `pg_stat_statements`): a fan-out of 100,000 on one node ran ten counts a round, 0.2 – 0.3 s of
    /// PostgreSQL's 1.2 – 1.6 s of CPU for the round, on the connection of the engine's reads by key.
    static func countWithoutReading(slice: Bool, sliceSize: Int?) -> Int? {
        guard slice, let sliceSize, sliceSize > 0 else { return nil }
        return sliceSize
    }

    /// The pass's instances still to be recorded, as the Store counted them (a first page that was full): from now
    /// on, each batch recorded is taken from it. A second count is ignored.
    mutating func counted(pending: Int) {
        if toCome == nil { toCome = max(0, pending) }
    }

    /// Decides for the next batch, recorded with `instances` results and `attempts` attempts.
    mutating func record(_ batch: Batch, instances: Int, attempts: Int) -> Decision {
        if let left = toCome { toCome = max(0, left - instances) }
        guard let left = toCome, left >= keep else {
            let earlier = held.map(\.batch)
            held.removeAll()
            heldAttempts = 0
            return .write(earlier: earlier)
        }
        held.append((batch, attempts))
        heldAttempts += attempts
        // The oldest held batch goes once the newer ones hold `keep` attempts without it.
        var dropped = 0
        while dropped < held.count - 1, heldAttempts - held[dropped].attempts >= keep {
            heldAttempts -= held[dropped].attempts
            dropped += 1
        }
        held.removeFirst(dropped)
        return .hold
    }

    /// The batches still held when the pass ends, oldest first: their attempts are written now.
    mutating func passEnded() -> [Batch] {
        defer {
            held.removeAll()
            heldAttempts = 0
        }
        return held.map(\.batch)
    }
}
