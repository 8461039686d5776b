#ifndef C_SQLITE_SETTINGS_H
#define C_SQLITE_SETTINGS_H

/// Connection settings SQLite only offers through `sqlite3_db_config`, a C variadic function Swift cannot call.

/// Turns on the query planner stability guarantee (`SQLITE_DBCONFIG_ENABLE_QPSG`) on the connection `db` (an
/// `sqlite3 *`): a statement's plan no longer depends on the values bound to it. Without it SQLite compiles a
/// statement again whenever a new value is bound to a parameter its planner looked at, and SQLite 3.54 looks at the
/// parameters of every statement with an `ORDER BY` or a join against `VALUES`: the Store's hot statements were compiled
/// again at every run. Returns SQLite's result code (0 when the guarantee is on).
int liveline_sqlite_enable_query_planner_stability(void *db);

/// Sets, for the whole process, how large a statement journal SQLite keeps in memory before it writes it to a
/// temporary file (`SQLITE_CONFIG_STMTJRNL_SPILL`, a global setting of `sqlite3_config`, another variadic function).
/// SQLite writes a statement journal for each statement that changes several rows inside a larger transaction (so
/// that a failing statement can be undone alone); past the default 64 KB it opened a file in the temporary directory,
/// wrote to it and closed it, for each such statement. Must be called before SQLite is first used in the process, and
/// only once: afterwards SQLite refuses it (`SQLITE_MISUSE`, returned) and keeps its default. Returns SQLite's result
/// code.
int liveline_sqlite_set_statement_journal_spill(int bytes);

#endif
