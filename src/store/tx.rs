//! Transactions: every write is IMMEDIATE; a step's reads share one read
//! transaction.

use crate::error::Result;
use rusqlite::{Connection, TransactionBehavior};

/// Runs `f`'s reads in one read transaction: one snapshot for all of them, and
/// SQLite takes its file and WAL-index locks once instead of once per statement
/// (a pair of `fcntl` calls or more each). Inside a transaction already, just
/// runs `f`.
pub(crate) fn in_read_tx<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<R>,
) -> Result<R> {
    if !conn.is_autocommit() {
        return f(conn);
    }
    conn.prepare_cached("BEGIN")?.execute([])?;
    let out = f(conn);
    // A read transaction has nothing to keep: COMMIT and ROLLBACK end it alike.
    let end = conn
        .prepare_cached("COMMIT")
        .and_then(|mut st| st.execute([]));
    if end.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let v = out?;
    end?;
    Ok(v)
}

/// Starts an IMMEDIATE transaction: every write in abridge goes through here.
pub(crate) fn write_tx(conn: &mut Connection) -> Result<rusqlite::Transaction<'_>> {
    Ok(conn.transaction_with_behavior(TransactionBehavior::Immediate)?)
}
