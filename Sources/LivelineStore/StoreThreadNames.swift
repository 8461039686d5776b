/// The names of the Store's threads, as Linux shows them (`top -H`, `ps -L`, `/proc/PID/task/*/comm`; at most 15
/// bytes): the prefix each of its NIO thread pools and event loop groups is started with. NIO adds the thread's number
/// (a pool's `ll-writer-#0`; a group's `ll-pgio-5-#0`, with the group's number before the thread's).
public enum StoreThreadNames {
    /// SQLite's writer: every write, one transaction after another (``SQLiteWriter``).
    public static let sqliteWriter = "ll-writer-#"
    /// SQLite's checkpointer: copies the WAL back into the database file (``SQLiteCheckpointer``).
    public static let sqliteCheckpointer = "ll-checkpt-#"
    /// SQLite's readers, a connection each (``SQLiteReaders``).
    public static let sqliteReaders = "ll-reader-#"
    /// The thread that syncs SQLite's WAL to disk for the writer's commits (``WALSyncer``).
    public static let walSyncer = "ll-walsync-#"
    /// The threads that run the Store's statements on its PostgreSQL connections, every pool's.
    public static let postgresConnections = "ll-pg-#"
    /// The event loops of the Store's PostgreSQL connections (PostgresNIO's I/O).
    public static let postgresEventLoops = "ll-pgio-"
}
