//! Steps: claimed, given their model response, completed (claiming the next).

use crate::error::{Error, Result};
use crate::ids::{CompactionId, StepId, TurnId};
use crate::store::db::{Connection, OptionalExtension, Transaction};
use crate::store::leases::*;
use crate::store::rows::*;
use crate::store::turns::*;
use rusqlite::params;

/// What step `idx` of `turn_id` read: the compaction (None: none, or no such
/// step) and how many of the turn's steps had their results elided.
pub(crate) fn step_read(
    conn: &Connection,
    turn_id: TurnId,
    idx: i64,
) -> Result<(Option<CompactionId>, i64)> {
    Ok(conn
        .prepare_cached(
            "SELECT compaction_id, elided_steps FROM steps WHERE turn_id = ?1 AND idx = ?2",
        )?
        .query_row(params![turn_id, idx], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((None, 0)))
}

pub(crate) fn get_step(conn: &Connection, id: StepId) -> Result<StepRow> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM steps WHERE id = ?1",
        StepRow::COLUMNS
    ))?
    .query_row([id], StepRow::from_row)
    .optional()?
    .ok_or(Error::UnknownStep(id))
}

pub(crate) fn list_steps(conn: &Connection, turn_id: TurnId) -> Result<Vec<StepRow>> {
    let mut st = conn.prepare_cached(sql_once!(
        "SELECT {} FROM steps WHERE turn_id = ?1 ORDER BY idx",
        StepRow::COLUMNS
    ))?;
    let rows = st.query_map([turn_id], StepRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The turn's newest step row, if any. A read: no transaction, no fence.
pub(crate) fn last_step(conn: &Connection, turn_id: TurnId) -> Result<Option<StepRow>> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM steps WHERE turn_id = ?1 ORDER BY idx DESC LIMIT 1",
        StepRow::COLUMNS
    ))?
    .query_row([turn_id], StepRow::from_row)
    .optional()
}

/// The step to run next: the turn's unfinished step if there is one (a resume,
/// or the step claimed by the transaction that completed the previous one),
/// otherwise a new row after the last completed step.
///
/// Claim semantics: the common case is a read; only a turn whose newest step is
/// completed (a layout where completing a step did not claim the next) takes a
/// fenced IMMEDIATE transaction to claim one under UNIQUE(turn_id, idx).
pub(crate) fn claim_step(conn: &mut Connection, lease: &Lease) -> Result<StepRow> {
    if let Some(s) = last_step(conn, lease.turn_id)? {
        if s.status != StepStatus::Completed {
            return Ok(s);
        }
    }
    let claimed = (|| {
        let tx = conn.write_tx_of(crate::store::db::Owner::Turn(lease.turn_id))?;
        fence(&tx, lease)?;
        let row = match last_step(&tx, lease.turn_id)? {
            Some(s) if s.status != StepStatus::Completed => s,
            other => {
                let idx = other.map_or(0, |s| s.idx + 1);
                insert_step(&tx, lease.turn_id, idx, tx.now_ms())?;
                last_step(&tx, lease.turn_id)?.expect("row exists after insert")
            }
        };
        tx.commit()?;
        Ok(row)
    })();
    claimed.map_err(|e| explain_lost(conn, e))
}

/// What a step persists with its response, in one transaction.
#[derive(Debug, Clone)]
pub(crate) struct Responded {
    pub step_id: StepId,
    pub compaction_id: Option<CompactionId>,
    pub messages_sha256: String,
    pub response_json: String,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub context_tokens: i64,
    pub estimated: bool,
    /// Milliseconds waited for a summary before the model call (None: none).
    pub summary_wait_ms: Option<i64>,
    pub cache_read_tokens: Option<i64>,
    pub cache_write_tokens: Option<i64>,
    /// This turn's first steps whose tool results were sent as placeholders.
    pub elided_steps: i64,
}

/// How a step's response is written: the step left `responded` for its tool
/// calls, or (a final answer, no call) `completed` by the same statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseThen {
    /// `running` → `responded`; [`complete_step`] marks it completed later.
    Responded,
    /// `running` → `completed` at once, `responded_at` and `completed_at`
    /// the same instant: the transaction that writes the response also
    /// completes the step (nothing runs between), so the row is rewritten
    /// once, not twice. [`complete_step`] is told so.
    Completed,
}

/// Writes a step's response, usage, hash, compaction read and context measure
/// inside the caller's fenced transaction: `running` → `responded` (or
/// `completed`, see [`ResponseThen`]). A step that is no longer running means
/// the lease was lost.
pub(crate) fn write_response(
    tx: &Transaction<'_>,
    lease: &Lease,
    r: &Responded,
    then: ResponseThen,
) -> Result<()> {
    let now = tx.now_ms();
    let (status, completed_at) = match then {
        ResponseThen::Responded => ("responded", None),
        ResponseThen::Completed => ("completed", Some(now)),
    };
    tx.execute_later_or(
        "UPDATE steps SET status = ?15, compaction_id = ?1, messages_sha256 = ?2, \
             response = ?3, input_tokens = ?4, output_tokens = ?5, context_tokens = ?6, \
             estimated = ?7, responded_at = ?8, render_format = ?10, summary_wait_ms = ?11, \
             cache_read_tokens = ?12, cache_write_tokens = ?13, elided_steps = ?14, \
             completed_at = ?16 \
             WHERE id = ?9 AND status = 'running'",
        params![
            r.compaction_id,
            r.messages_sha256,
            r.response_json,
            r.input_tokens,
            r.output_tokens,
            r.context_tokens,
            r.estimated,
            now,
            r.step_id,
            crate::render_format::RenderFormat::CURRENT.as_i64(),
            r.summary_wait_ms,
            r.cache_read_tokens,
            r.cache_write_tokens,
            r.elided_steps,
            status,
            completed_at
        ],
        lease.lost(),
    )
}

/// Marks a responded step completed inside the caller's fenced transaction
/// (unless `marked`: its response was written as completed in this
/// transaction, [`ResponseThen::Completed`]); with `final_output` also
/// completes the turn (releasing its lease) and returns it, otherwise claims
/// the next step (`running`), so that the next step starts with a read, not a
/// write.
pub(crate) fn complete_step(
    tx: &Transaction<'_>,
    lease: &Lease,
    turn: &TurnRow,
    step_id: StepId,
    step_idx: i64,
    final_output: Option<&str>,
    marked: bool,
) -> Result<Option<TurnRow>> {
    let now = tx.now_ms();
    if !marked {
        tx.execute_later(
            "UPDATE steps SET status = 'completed', completed_at = ?1 \
             WHERE id = ?2 AND status = 'responded'",
            params![now, step_id],
        )?;
    }
    match final_output {
        Some(out) => Ok(Some(complete_turn(tx, lease, turn, out, now)?)),
        None => {
            insert_step(tx, lease.turn_id, step_idx + 1, now)?;
            Ok(None)
        }
    }
}
