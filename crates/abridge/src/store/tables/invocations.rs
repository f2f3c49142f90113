//! Tool invocations: claimed before an outside call, run inside the step's
//! transaction for a transactional tool, finished with the result the model sees.

use crate::error::{Error, Result};
use crate::ids::{InvocationId, StepId};
use crate::store::db::{Connection, OptionalExtension, Transaction};
use crate::store::leases::*;
use crate::store::rows::*;
use rusqlite::params;

/// A tool call to record.
#[derive(Debug, Clone)]
pub(crate) struct NewInvocation<'a> {
    pub step_id: StepId,
    pub position: i64,
    pub tool_call_id: &'a str,
    pub tool_name: &'a str,
    pub arguments: String,
    pub effect: Effect,
    pub idempotency_key: &'a str,
}

pub(crate) fn insert_or_get_invocation(
    tx: &Transaction<'_>,
    inv: &NewInvocation<'_>,
) -> Result<(InvocationRow, bool)> {
    let inserted = write_invocation(
        tx,
        inv,
        "started",
        None,
        " ON CONFLICT (step_id, tool_call_id) DO NOTHING",
        true,
    )?
    .is_some();
    let row = tx
        .prepare_cached(sql_once!(
            "SELECT {} FROM tool_invocations WHERE step_id = ?1 AND tool_call_id = ?2",
            InvocationRow::COLUMNS
        ))?
        .query_row(
            params![inv.step_id, inv.tool_call_id],
            InvocationRow::from_row,
        )?;
    Ok((row, inserted))
}

/// Whether a step's call has an invocation row (it ran, or started to).
pub(crate) fn invocation_exists(
    conn: &Connection,
    step_id: StepId,
    tool_call_id: &str,
) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM tool_invocations WHERE step_id = ?1 AND tool_call_id = ?2")?
        .exists(params![step_id, tool_call_id])
}

/// Inserts an invocation row (`tail`: what follows its values); with
/// `want_id`, returns the id of the row it made, else queues the insert
/// ([`Transaction::execute_later`]) and returns None.
fn write_invocation(
    tx: &Transaction<'_>,
    inv: &NewInvocation<'_>,
    status: &str,
    result: Option<&str>,
    tail: &str,
    want_id: bool,
) -> Result<Option<i64>> {
    let now = tx.now_ms();
    let finished_at = result.map(|_| now);
    let sql = format!(
        "INSERT INTO tool_invocations (step_id, position, tool_call_id, tool_name, arguments, \
         effect, idempotency_key, status, result, created_at, completed_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11){tail}"
    );
    let values = params![
        inv.step_id,
        inv.position,
        inv.tool_call_id,
        inv.tool_name,
        inv.arguments,
        inv.effect.as_str(),
        inv.idempotency_key,
        status,
        result,
        now,
        finished_at
    ];
    if want_id {
        return tx.insert_returning_id(&sql, values);
    }
    tx.execute_later(&sql, values)?;
    Ok(None)
}

/// Records that a tool call is about to run (or returns its row if it exists),
/// inside the caller's fenced transaction.
///
/// Claim semantics: UNIQUE(step_id, tool_call_id). Returns the row and whether
/// this call inserted it. An existing `started` row gets `attempts + 1`.
pub(crate) fn start_invocation(
    tx: &Transaction<'_>,
    inv: &NewInvocation<'_>,
) -> Result<(InvocationRow, bool)> {
    let (mut row, inserted) = insert_or_get_invocation(tx, inv)?;
    if !inserted && row.status == InvocationStatus::Started {
        tx.prepare_cached("UPDATE tool_invocations SET attempts = attempts + 1 WHERE id = ?1")?
            .execute([row.id])?;
        row.attempts += 1;
    }
    Ok((row, inserted))
}

/// Records a tool's result inside the caller's fenced transaction:
/// `started` → `completed`/`failed`.
pub(crate) fn finish_invocation(
    tx: &Transaction<'_>,
    lease: &Lease,
    id: InvocationId,
    ok: bool,
    result: &str,
    rerun: bool,
) -> Result<()> {
    let status = if ok { "completed" } else { "failed" };
    // `rerun`: Sabotage::rerun_completed_effects (deliberately wrong): a
    // finished row is finished again.
    let sql = if rerun {
        "UPDATE tool_invocations SET status = ?1, result = ?2, completed_at = ?3 WHERE id = ?4"
    } else {
        "UPDATE tool_invocations SET status = ?1, result = ?2, completed_at = ?3 \
         WHERE id = ?4 AND status = 'started'"
    };
    let n = tx
        .prepare_cached(sql)?
        .execute(params![status, result, tx.now_ms(), id])?;
    if n == 0 {
        // Completed by someone else under our feet: only possible if our lease was lost.
        return Err(Error::LeaseLost {
            turn_id: lease.turn_id,
            epoch: lease.epoch,
        });
    }
    Ok(())
}

/// What a transactional tool body returns: Ok(result) commits with its writes.
pub(crate) type TxBody<'f> =
    dyn FnOnce(&Transaction<'_>) -> Result<std::result::Result<String, String>> + 'f;

/// Runs a transactional tool inside the caller's fenced transaction and
/// records it with its result, so the tool's writes and its record commit
/// together or not at all. The invocation row is written once, finished
/// (nothing can see it in between: the transaction holds the write lock).
///
/// An already-finished invocation does not run `body`. A body that returns
/// `Ok(Err(msg))` (the tool refused) has its writes rolled back to a savepoint
/// and the error result is recorded instead. A body returning `Err` aborts the
/// caller's transaction (a crash: nothing recorded). A `started` row (written
/// by an older build, which claimed the row before running the tool) is
/// finished in place.
///
/// `fresh`: this transaction writes the step's response, so no invocation
/// of the step can exist (they are written with the response or after it):
/// the lookup is skipped, one round trip fewer on PostgreSQL.
pub(crate) fn run_transactional(
    tx: &Transaction<'_>,
    lease: &Lease,
    inv: &NewInvocation<'_>,
    body: Box<TxBody<'_>>,
    want_id: bool,
    fresh: bool,
    rerun: bool,
) -> Result<Option<(Option<InvocationId>, bool, String)>> {
    let existing = match fresh {
        true => None,
        false => get_invocation_by_call(tx, inv.step_id, inv.tool_call_id)?,
    };
    if existing
        .as_ref()
        .is_some_and(|row| row.status != InvocationStatus::Started)
        && !rerun
    {
        return Ok(None);
    }
    tx.execute_later("SAVEPOINT tool_body", [])?;
    let (ok, result) = match body(tx)? {
        Ok(result) => {
            tx.execute_later("RELEASE tool_body", [])?;
            (true, result)
        }
        Err(msg) => {
            tx.prepare_cached("ROLLBACK TO tool_body")?.execute([])?;
            tx.prepare_cached("RELEASE tool_body")?.execute([])?;
            (false, msg)
        }
    };
    let id = match existing {
        Some(row) => {
            finish_invocation(tx, lease, row.id, ok, &result, rerun)?;
            Some(row.id)
        }
        // Written once, finished. Without `want_id` no one asks for its
        // id: on PostgreSQL it goes with the next request (an insert that
        // fails fails the transaction).
        None => {
            let status = if ok { "completed" } else { "failed" };
            write_invocation(tx, inv, status, Some(&result), "", want_id)?.map(InvocationId)
        }
    };
    Ok(Some((id, ok, result)))
}

/// The invocation of a step's call, if recorded.
fn get_invocation_by_call(
    tx: &Transaction<'_>,
    step_id: StepId,
    tool_call_id: &str,
) -> Result<Option<InvocationRow>> {
    tx.prepare_cached(sql_once!(
        "SELECT {} FROM tool_invocations WHERE step_id = ?1 AND tool_call_id = ?2",
        InvocationRow::COLUMNS
    ))?
    .query_row(params![step_id, tool_call_id], InvocationRow::from_row)
    .optional()
}

pub(crate) fn list_invocations(conn: &Connection, step_id: StepId) -> Result<Vec<InvocationRow>> {
    let mut st = conn.prepare_cached(sql_once!(
        "SELECT {} FROM tool_invocations WHERE step_id = ?1 ORDER BY position",
        InvocationRow::COLUMNS
    ))?;
    let rows = st.query_map([step_id], InvocationRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
