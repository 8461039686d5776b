import LivelineCore

/// What one instance's pushes in a pass came to, as far as the pass is concerned.
public enum FanOutInstanceOutcome: Sendable, Hashable {
    /// Done for this sequence: delivered, invalidated or refused for good.
    case done
    /// Still failing after the retries: the activity is tried again after the pass-retry delay.
    case retryLater
    /// The push service refused the app's credentials: the platform's pass stops.
    case credentialsRefused
}

/// A result the fan-out can classify; the engine's per-instance results conform.
public protocol FanOutResult: Sendable {
    /// What the result means for the pass.
    var fanOutOutcome: FanOutInstanceOutcome { get }
}

/// The sequence being sent and everything the engine needs to send it (its rendered payload, the transport), as the
/// engine prepares it. The state machine only reads the sequence.
public protocol FanOutRendition: Sendable {
    /// The activity's sequence the pushes carry.
    var sequence: Int64 { get }
}

/// How the machine is tuned: ``DispatcherConfiguration``'s numbers, without the clock.
public struct FanOutLimits: Sendable, Hashable {
    /// Instances per page read from the Store.
    public var pageSize: Int
    /// Pushes handed to the transport in one call.
    public var pushesPerCall: Int
    /// Pushes in flight at once.
    public var pushesInFlight: Int
    /// Results per progress batch.
    public var progressBatchSize: Int
    /// Progress batches that may wait to be written before no new pushes go out.
    public var progressBatchesBehind: Int

    /// Creates limits; each is at least 1.
    public init(pageSize: Int, pushesPerCall: Int, pushesInFlight: Int, progressBatchSize: Int, progressBatchesBehind: Int) {
        self.pageSize = max(1, pageSize)
        self.pushesPerCall = max(1, pushesPerCall)
        self.pushesInFlight = max(1, pushesInFlight)
        self.progressBatchSize = max(1, progressBatchSize)
        self.progressBatchesBehind = max(1, progressBatchesBehind)
    }
}

/// One pass of the delivery engine over one claimed activity, as a pure state machine: what to do next, given what
/// has happened. It performs no I/O and reads no clock; ``Dispatcher`` performs its actions and feeds their outcomes
/// back as events, so every decision of a fan-out is tested without a socket or a database
/// (`FanOutStateMachineTests`).
///
/// A pass goes through the engine's platforms in order. For each one it reads the first page of instances that are
/// behind the activity's sequence; an empty page means nothing to do there (and a first page may say that later
/// platforms have nothing either: they are skipped). Otherwise the engine finds the platform's transport and renders
/// the sequence (both arrive with that first page as its ``FanOutRendition``), and the machine
///
/// - sends the page in chunks of ``FanOutLimits/pushesPerCall``, never more than ``FanOutLimits/pushesInFlight`` at
///   once, while the next page is read ahead;
/// - coalesces: a page read after a newer sequence was accepted comes with that sequence's rendition, and from then on
///   every push carries the newest state (instances already sent the older one are behind again and are read once more
///   by a later pass);
/// - records results in batches of ``FanOutLimits/progressBatchSize``, one write at a time and in order, and holds new
///   sends back while more than ``FanOutLimits/progressBatchesBehind`` batches wait to be written;
/// - stops early when the claim is lost, the Store fails, the app's credentials are refused, or the server shuts
///   down (or a renewal of its lease finds it gone), and then only lets what is in flight finish and be recorded.
///
/// When every platform is done it releases the claim, saying when the activity should be looked at again.
///
/// Drive it by calling ``nextAction()`` until it answers ``Action/wait`` (then feed the next event with
/// ``receive(_:)``) or ``Action/release(_:)`` (the pass is over).
public struct FanOutStateMachine<Instance: Sendable, Rendition: FanOutRendition, Result: FanOutResult>: Sendable {
    /// Something that happened, fed to ``receive(_:)``.
    public enum Event: Sendable {
        /// The page asked for by ``Action/readPage(platform:below:after:)`` was read: the instances behind (ordered by
        /// `cursor`), the cursor after the last one, and — for a platform's first page, or when a newer sequence was
        /// accepted since — the sequence to send from now on.
        ///
        /// A platform's first page may also say which of the platforms after it have nothing behind (`nothingBehind`:
        /// the engine read them with it, all of them in one page): the pass skips them, without reading their first
        /// pages. An activity of one phone is then one read, not one per platform.
        case pageRead(instances: [Instance], cursor: String?, rendition: Rendition?, nothingBehind: [Platform] = [])
        /// The platform's first page has instances, but the engine has no way to send this app's pushes on it
        /// (no credentials and no emulator): its instances wait.
        case transportUnavailable
        /// The activity has no state to send: the pass ends.
        case nothingToSend
        /// Another engine holds the activity now (the answer to a page read): the pass stops and leaves it to that engine.
        case claimLost
        /// Renewing the claim's lease, which the engine does on a timer while the pass runs, found it held by another
        /// engine (or run out): nothing new goes out; what is in flight finishes and is recorded.
        case leaseLost
        /// The Store failed while reading a page: the platform's pass stops and the activity is tried again soon.
        case storeFailed
        /// One ``Action/send(_:rendition:)`` came back with a result per instance.
        case resultsReceived([Result])
        /// The oldest ``Action/recordProgress(_:)`` was written (or failed: its instances are simply sent again).
        case progressRecorded
        /// The server is shutting down: nothing new goes out.
        case shutdown
    }

    /// What the engine should do next.
    public enum Action: Sendable {
        /// Read the next page of `platform`'s instances behind `sequence` (on a platform's first page: the claim's),
        /// after `cursor` (nil: from the start). Answer with ``Event/pageRead(instances:cursor:rendition:)``,
        /// ``Event/claimLost``, ``Event/storeFailed``, and on a first page also ``Event/transportUnavailable`` or
        /// ``Event/nothingToSend``.
        case readPage(platform: Platform, below: Int64?, after: String?)
        /// Push `rendition` to these instances in one transport call. The engine retries each push that may succeed
        /// later (429, 5xx, a transport failure) with backoff and jitter (``RetryPolicy``, honouring `Retry-After`),
        /// then answers with ``Event/resultsReceived(_:)``: one result per instance, with every attempt for the
        /// delivery timeline. Whatever still fails comes back as ``FanOutInstanceOutcome/retryLater``.
        ///
        /// The instances are a slice of the page read (its indices are the page's): handed on without copying each one.
        case send(ArraySlice<Instance>, rendition: Rendition)
        /// Record these results. Answer with ``Event/progressRecorded``. Only one is in flight at a time.
        case recordProgress([Result])
        /// Mark the platform's credentials unhealthy (the push service refused them). No answer.
        case reportCredentialsRefused(Platform)
        /// Nothing to do until the next event.
        case wait
        /// The pass is over: hand the claim back.
        case release(ReleaseTiming)
    }

    /// When the released activity should be looked at again.
    public enum ReleaseTiming: Sendable, Hashable {
        /// At once (it may have become pending again meanwhile).
        case now
        /// After the pass-retry delay: something failed that may succeed later.
        case afterPassRetryDelay
        /// After a short pause: the Store failed.
        case afterStoreRetryDelay
        /// Not by this engine: it was stopped (shutdown or claim lost); whoever holds or claims it next decides.
        case unscheduled
    }

    private enum PageRead: Sendable {
        case instances([Instance], cursor: String?, rendition: Rendition?)
        case claimLost
        case storeFailed
    }

    private let platforms: [Platform]
    private let limits: FanOutLimits

    /// Index into `platforms` of the platform being worked on.
    private var platformIndex = 0
    /// Platforms a first page said have nothing behind: their passes are skipped.
    private var skipped: Set<Platform> = []
    /// The platform's first page is being read (no rendition yet).
    private var readingFirstPage = false
    /// What is sent now; nil until the platform's first page with instances (the pass has not started sending).
    private var rendition: Rendition?
    /// The page being sent and how far.
    private var page: [Instance] = []
    private var pageIndex = 0
    private var cursor: String?
    /// No page follows the last one read.
    private var lastPageRead = false
    /// A read-ahead page is being read.
    private var pageReadPending = false
    /// A page read ahead, waiting for the current one to be sent.
    private var readAhead: PageRead?

    private var pushesInFlight = 0
    /// Results not yet in a batch.
    private var unbatched: [Result] = []
    /// Batches waiting to be written, oldest first, and whether one is being written.
    private var batches: [[Result]] = []
    private var writing = false

    /// The platform's pass takes no new work (its pages are done, or it was stopped).
    private var platformClosed = false
    private var credentialsRefused = false
    private var stopped = false
    private var finished = false
    private var retry: ReleaseTiming?

    /// A pass over `platforms`, in order.
    public init(platforms: [Platform], limits: FanOutLimits) {
        self.platforms = platforms
        self.limits = limits
    }

    /// What one read of `platform`'s first page together with the `later` platforms' (`read`: their instances behind,
    /// by device id, at most `pageSize`) says of `platform`'s first page: `nil` when it cannot say, and the page must be
    /// read alone.
    ///
    /// - Fewer than `pageSize`: the read holds every instance behind on all of them, so `platform`'s are its whole
    ///   first page, and the later platforms with none have nothing behind (the `nothingBehind` of
    ///   ``Event/pageRead(instances:cursor:rendition:nothingBehind:)``).
    /// - A full page, all of `platform`: its first page too (its instances come in the same order), and nothing is
    ///   known of the later ones.
    /// - A full page of several platforms: `platform`'s part of it may be short of a page, which would end its pass
    ///   early: `nil`.
    public static func firstPage(
        of platform: Platform, in read: [Instance], readWith later: [Platform], pageSize: Int, platformOf: (Instance) -> Platform
    ) -> (instances: [Instance], nothingBehind: [Platform])? {
        guard read.count < pageSize else { return read.allSatisfy { platformOf($0) == platform } ? (read, []) : nil }
        let found = Set(read.map(platformOf))
        return (read.filter { platformOf($0) == platform }, later.filter { !found.contains($0) })
    }

    /// Whether a pass asks the Store to plan slices of its activity (a shared fan-out, ``DispatcherConfiguration/sliceSize``)
    /// once it has read its first page: when slices are left by a holder that stopped (`slicesLeft`: they are adopted),
    /// when the read did not hold every instance the pass has to send (`pending` nil), or when they are more than one
    /// slice holds. A read that holds them all, `sliceSize` at most, says what the planning's own look would: the pass
    /// sends them alone. Most activities are so, and on PostgreSQL that look was one statement of the seven or so an
    /// activity of one phone cost the engine.
    public static func asksForSlices(slicesLeft: Bool, pending: Int?, sliceSize: Int) -> Bool {
        guard !slicesLeft, let pending else { return true }
        return pending > sliceSize
    }

    /// Takes in what happened.
    public mutating func receive(_ event: Event) {
        switch event {
        case .pageRead(let instances, let cursor, let rendition, let nothingBehind):
            if readingFirstPage { skipped.formUnion(nothingBehind) }
            pageArrived(.instances(instances, cursor: cursor, rendition: rendition))
        case .claimLost:
            pageArrived(.claimLost)
        case .storeFailed:
            pageArrived(.storeFailed)
        case .transportUnavailable:
            precondition(readingFirstPage, "transportUnavailable answers a platform's first page")
            readingFirstPage = false
            retryAfter(.afterPassRetryDelay)
            nextPlatform()
        case .nothingToSend:
            precondition(readingFirstPage, "nothingToSend answers a platform's first page")
            readingFirstPage = false
            finished = true
        case .resultsReceived(let results):
            pushesInFlight -= results.count
            for result in results {
                switch result.fanOutOutcome {
                case .done: break
                case .retryLater: retryAfter(.afterPassRetryDelay)
                case .credentialsRefused: credentialsRefused = true
                }
            }
            unbatched.append(contentsOf: results)
            while unbatched.count >= limits.progressBatchSize {
                batches.append(Array(unbatched.prefix(limits.progressBatchSize)))
                unbatched.removeFirst(limits.progressBatchSize)
            }
        case .progressRecorded:
            precondition(writing, "progressRecorded answers a recordProgress")
            writing = false
        case .shutdown, .leaseLost:
            stopped = true
        }
    }

    /// The next thing to do: call until it answers ``Action/wait`` or ``Action/release(_:)``.
    public mutating func nextAction() -> Action {
        if finished { return .release(releaseTiming) }
        if rendition == nil {
            if readingFirstPage { return .wait }
            if stopped || platformIndex == platforms.count {
                finished = true
                return .release(releaseTiming)
            }
            readingFirstPage = true
            return .readPage(platform: platforms[platformIndex], below: nil, after: nil)
        }
        if (stopped || credentialsRefused) && !platformClosed { platformClosed = true }

        // Progress first: it is what lets sends go on.
        if !writing, !batches.isEmpty {
            writing = true
            return .recordProgress(batches.removeFirst())
        }
        if !platformClosed {
            if let action = sendOrRead() { return action }
        }
        // Closed, or waiting for a page: once nothing is in flight the platform's pass ends.
        if platformClosed, pushesInFlight == 0, !pageReadPending {
            if !unbatched.isEmpty {
                batchUnbatched()
                if !writing {
                    writing = true
                    return .recordProgress(batches.removeFirst())
                }
            }
            if !writing, batches.isEmpty {
                let refused = credentialsRefused
                let platform = platforms[platformIndex]
                if refused { retryAfter(.afterPassRetryDelay) }
                nextPlatform()
                if refused { return .reportCredentialsRefused(platform) }
                return nextAction()
            }
        }
        return .wait
    }

    // MARK: Inside a platform's pass

    private mutating func sendOrRead() -> Action? {
        // Read ahead: the next page is read while this one is sent.
        if !pageReadPending, readAhead == nil, !lastPageRead {
            pageReadPending = true
            return .readPage(platform: platforms[platformIndex], below: rendition?.sequence, after: cursor)
        }
        if pageIndex == page.count {
            guard let next = readAhead else {
                if lastPageRead { platformClosed = true }
                return nil
            }
            readAhead = nil
            switch next {
            case .instances(let instances, let cursor, let newer):
                take(instances, cursor: cursor, rendition: newer)
                if instances.isEmpty { platformClosed = true; return nil }
                return sendOrRead()
            case .claimLost:
                stopped = true
                platformClosed = true
                return nil
            case .storeFailed:
                retryAfter(.afterStoreRetryDelay)
                platformClosed = true
                return nil
            }
        }
        guard pushesInFlight < limits.pushesInFlight, batches.count + (writing ? 1 : 0) <= limits.progressBatchesBehind,
            let rendition
        else { return nil }
        let count = min(limits.pushesPerCall, page.count - pageIndex, limits.pushesInFlight - pushesInFlight)
        let chunk = page[pageIndex..<(pageIndex + count)]
        pageIndex += count
        pushesInFlight += count
        return .send(chunk, rendition: rendition)
    }

    private mutating func pageArrived(_ read: PageRead) {
        if readingFirstPage {
            readingFirstPage = false
            switch read {
            case .instances(let instances, let cursor, let rendition):
                guard !instances.isEmpty else { nextPlatform(); return }
                precondition(rendition != nil, "a platform's first page with instances comes with its rendition")
                take(instances, cursor: cursor, rendition: rendition)
            case .claimLost:
                stopped = true
            case .storeFailed:
                retryAfter(.afterStoreRetryDelay)
                nextPlatform()
            }
            return
        }
        precondition(pageReadPending, "a page arrived that was not asked for")
        pageReadPending = false
        readAhead = read
    }

    private mutating func take(_ instances: [Instance], cursor: String?, rendition newer: Rendition?) {
        page = instances
        pageIndex = 0
        if let cursor { self.cursor = cursor }
        if let newer { rendition = newer }
        if instances.count < limits.pageSize { lastPageRead = true }
    }

    private mutating func batchUnbatched() {
        batches.append(unbatched)
        unbatched.removeAll(keepingCapacity: true)
    }

    private mutating func nextPlatform() {
        platformIndex += 1
        while platformIndex < platforms.count, skipped.contains(platforms[platformIndex]) { platformIndex += 1 }
        rendition = nil
        page = []
        pageIndex = 0
        cursor = nil
        lastPageRead = false
        pageReadPending = false
        readAhead = nil
        platformClosed = false
        credentialsRefused = false
    }

    private mutating func retryAfter(_ timing: ReleaseTiming) {
        // The longer wait wins.
        if retry == nil || (retry == .afterStoreRetryDelay && timing == .afterPassRetryDelay) { retry = timing }
    }

    private var releaseTiming: ReleaseTiming {
        retry ?? (stopped ? .unscheduled : .now)
    }
}
