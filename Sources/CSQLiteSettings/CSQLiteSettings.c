#include "CSQLiteSettings.h"
#include "sqlite_nio_sqlite3.h"

int liveline_sqlite_enable_query_planner_stability(void *db) {
    int enabled = 0;
    int code = sqlite_nio_sqlite3_db_config((sqlite3 *)db, SQLITE_DBCONFIG_ENABLE_QPSG, 1, &enabled);
    if (code != SQLITE_OK) return code;
    return enabled == 1 ? SQLITE_OK : SQLITE_ERROR;
}

int liveline_sqlite_set_statement_journal_spill(int bytes) {
    return sqlite_nio_sqlite3_config(SQLITE_CONFIG_STMTJRNL_SPILL, bytes);
}
