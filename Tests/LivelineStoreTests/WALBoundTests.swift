import Testing

@testable import LivelineStore

@Suite("When the writer checkpoints the WAL itself")
struct WALBoundTests {
    @Test("due once the WAL reaches the limit, and again at the limit after it starts over")
    func dueAtTheLimit() {
        var bound = WALBound(limit: 100)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 60)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 99)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 100)
        #expect(bound.checkpointDue)
        bound.writerCheckpointed(.ran)
        #expect(!bound.checkpointDue, "done until the next commit says how it went")
        // The next transaction wrote the WAL from its beginning.
        bound.walGrew(to: 8)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 99)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 130)
        #expect(bound.checkpointDue, "the limit again, not the size it was checkpointed at plus the limit")
    }

    @Test("a checkpoint that found the checkpointer copying is tried again before the next transaction")
    func busyTriesAgain() {
        var bound = WALBound(limit: 100)
        bound.walGrew(to: 120)
        bound.writerCheckpointed(.busy)
        #expect(bound.checkpointDue)
        bound.walGrew(to: 140)
        #expect(bound.checkpointDue)
        bound.writerCheckpointed(.ran)
        #expect(!bound.checkpointDue)
    }

    @Test("a WAL that did not start over (a reader held it) is checkpointed again only after another limit's pages")
    func heldWALWaitsAnotherLimit() {
        var bound = WALBound(limit: 100)
        bound.walGrew(to: 120)
        bound.writerCheckpointed(.ran)
        bound.walGrew(to: 150)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 219)
        #expect(!bound.checkpointDue)
        bound.walGrew(to: 220)
        #expect(bound.checkpointDue)
    }

    @Test("the WAL's size on disk is cut to twice the limit when it starts over")
    func sizeLimit() {
        #expect(SQLiteWriter.walSizeLimit(pages: WALBound.defaultLimit) == 32_768_000)
        #expect(SQLiteWriter.walSizeLimit(pages: .max) == .max)
    }
}
