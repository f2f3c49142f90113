//! Unstable hooks for test kits and harnesses (feature `testing`): what the
//! unpublished `abridge-testkit` (the demo, the chaos harness, bench seeding)
//! needs of the engine beyond its API. Not covered by semver; a host never
//! needs them.

pub mod seed;

use crate::error::Result;
use crate::ids::{SessionId, StepId};
use crate::store::{Connection, Key, Location, SessionCounts, SessionRow, StepRow, Transaction};

/// A write transaction on `conn`, taken as the engine takes its own (on
/// SQLite `BEGIN IMMEDIATE`; on PostgreSQL under the store's write lock).
pub fn write_tx(conn: &mut Connection) -> Result<Transaction<'_>> {
    crate::store::write_tx(conn)
}

/// An ordinary connection to the store at `location` beside its pool,
/// opened with `key` (an encrypted store's): an outside service's, or a
/// harness's lock holder's.
pub fn connect(location: impl Into<Location>, key: Option<&Key>) -> Result<Connection> {
    crate::store::connect(location.into(), key)
}

/// Steps of a session that waited for a summary, and their waits summed (ms).
pub fn summary_waits(conn: &Connection, session_id: SessionId) -> Result<(i64, i64)> {
    crate::store::summary_waits(conn, session_id)
}

/// (sessions, turns, turns failed, completed compactions) of the whole store.
pub fn run_totals(conn: &Connection) -> Result<(i64, i64, i64, i64)> {
    crate::store::run_totals(conn)
}

/// (completed compactions made in the background, steps that waited for a
/// summary).
pub fn background_totals(conn: &Connection) -> Result<(i64, i64)> {
    crate::store::background_totals(conn)
}

/// (turns whose lease was taken more than once, compactions claimed more
/// than once).
pub fn takeovers(conn: &Connection) -> Result<(i64, i64)> {
    crate::store::takeovers(conn)
}

/// A step by id (an error when there is none).
pub fn get_step(conn: &Connection, id: StepId) -> Result<StepRow> {
    crate::store::get_step(conn, id)
}

/// A session's counts: turns, steps, compactions by status, tool calls.
pub fn session_counts(conn: &Connection, session_id: SessionId) -> Result<SessionCounts> {
    crate::store::session_counts(conn, session_id)
}

/// The session with this external id, if any.
pub fn find_session(conn: &Connection, external_id: &str) -> Result<Option<SessionRow>> {
    crate::store::find_session(conn, external_id)
}

/// Drops the schema of the PostgreSQL store at `url` (its `?schema=`), with
/// every table in it: how a harness starts a server store afresh.
#[cfg(feature = "postgres")]
pub fn drop_postgres_store(url: &str) -> Result<()> {
    let target = crate::store::pg::parse(url)?;
    let c = Connection::from(target.connect()?);
    c.execute_batch(&format!("DROP SCHEMA IF EXISTS {} CASCADE", target.schema))
}
