//! Transactions: every write is IMMEDIATE; a step's reads share one read
//! transaction.

use crate::error::Result;
use crate::store::db::{Connection, Transaction};

/// Runs `f`'s reads in one read transaction: one snapshot for all of them, and
/// SQLite takes its file and WAL-index locks once instead of once per statement
/// (a pair of `fcntl` calls or more each). Inside a transaction already, just
/// runs `f`.
pub(crate) fn in_read_tx<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<R>,
) -> Result<R> {
    conn.in_read_tx(f)
}

/// [`in_read_tx`] for a step's reads (short; no write, no wait): on the
/// group commit's idle writer when the turns' writes run in its batches.
pub(crate) fn in_step_read_tx<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<R>,
) -> Result<R> {
    conn.in_step_read_tx(f)
}

/// Starts an IMMEDIATE transaction: every write in abridge goes through here.
pub(crate) fn write_tx(conn: &mut Connection) -> Result<Transaction<'_>> {
    conn.write_tx()
}
