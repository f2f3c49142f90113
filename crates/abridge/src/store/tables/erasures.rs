//! The erasures table: the id floor every new row is taken past, a deleted
//! session's record, what `verify` checks of deletions; the checkpoint that
//! makes freed bytes go. Deleting and pruning sessions is administration
//! (`crate::admin::erase`).

use crate::error::Result;
use crate::ids::SessionId;
use crate::store::db::Connection;

/// The SQL expression of the id a new row of `table` takes: past both its
/// highest id and the floor of the newest erasure (floors only grow: each
/// is taken past the one before), two index lookups.
macro_rules! next_id {
    ($table:literal) => {
        concat!(
            "(SELECT max(coalesce((SELECT max(id) FROM ",
            $table,
            "), 0), coalesce((SELECT ",
            $table,
            "_id_floor FROM erasures ORDER BY id DESC LIMIT 1), 0)) + 1)"
        )
    };
}
pub(crate) use next_id;
/// Copies the WAL into the database file and truncates it; false when a
/// reader of an older snapshot kept part of it.
///
/// On PostgreSQL, a plain `VACUUM` of the history tables instead: the old
/// row versions' space is freed for reuse (the server's own write-ahead log
/// and its retention are the server's to manage).
pub(crate) fn checkpoint(conn: &Connection) -> Result<bool> {
    if conn.kind() == crate::store::BackendKind::Postgres {
        conn.execute_batch(
            "VACUUM sessions, turns, steps, tool_invocations, compactions, pins, redacted_rows",
        )?;
        return Ok(true);
    }
    let (busy, log, done): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    Ok(busy == 0 && log == done)
}
/// Whether session `id` was deleted (an erasure records it).
pub(crate) fn was_deleted(conn: &Connection, id: SessionId) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM erasures WHERE session_id = ?1 AND kind = 'delete'")?
        .exists([id])
}
/// The sessions deleted (the one exception to append-only history), and a
/// line for each that left a row behind in a history table (a deletion is
/// whole or not at all).
pub(crate) fn deletions_left_behind(conn: &Connection) -> Result<(i64, Vec<String>)> {
    let deleted: i64 = conn.query_row(
        "SELECT count(*) FROM erasures WHERE kind = 'delete'",
        [],
        |r| r.get(0),
    )?;
    let mut q = conn.prepare(
        "SELECT e.session_id, \
           (SELECT count(*) FROM sessions WHERE id = e.session_id) \
         + (SELECT count(*) FROM turns WHERE session_id = e.session_id) \
         + (SELECT count(*) FROM compactions WHERE session_id = e.session_id) \
         + (SELECT count(*) FROM pins WHERE session_id = e.session_id) \
         + (SELECT count(*) FROM redactions WHERE session_id = e.session_id) \
         FROM erasures e WHERE e.kind = 'delete'",
    )?;
    let rows = q.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
    let mut left = Vec::new();
    for row in rows {
        let (sid, n) = row?;
        if n > 0 {
            left.push(format!("deleted session {sid} still has {n} rows"));
        }
    }
    Ok((deleted, left))
}
