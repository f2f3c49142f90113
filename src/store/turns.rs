//! Sessions, turns (with their leases), steps and tool invocations.

use super::rows::*;
use super::{now_ms, write_tx};
use crate::error::{Error, Result};
use crate::ids::{CompactionId, InvocationId, SessionId, StepId, TurnId};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

/// A held turn lease: the right to write one turn's steps while `epoch` is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The turn.
    pub turn_id: TurnId,
    /// Who holds it.
    pub owner: String,
    /// Fencing epoch; a takeover increments it.
    pub epoch: i64,
    /// How long each renewal extends it, ms.
    pub ttl_ms: i64,
    /// The owner name of the holder this lease was taken over from (None: the
    /// turn is new, or its lease was free).
    pub taken_from: Option<String>,
}

/// Checks the lease inside the caller's write transaction, and renews it when
/// less than half its time is left.
///
/// Transaction behaviour: must run inside an IMMEDIATE transaction, so the check
/// and the writes that follow are atomic; a taken-over lease matches no row and
/// the whole transaction is refused with [`Error::LeaseLost`]. A lease with
/// more than half its time left is only read: the heartbeat and the writes
/// that find it past half renew it, so it never runs out while its holder
/// works, and most steps leave the turn's row (and its page) untouched.
pub(crate) fn fence(tx: &Transaction<'_>, lease: &Lease) -> Result<()> {
    check_lease(tx, lease, lease.ttl_ms / 2)
}

/// Checks the lease; renews it when less than `renew_below` ms are left.
fn check_lease(tx: &Transaction<'_>, lease: &Lease, renew_below: i64) -> Result<()> {
    let expires: Option<Option<i64>> = tx
        .prepare_cached(
            "SELECT lease_expires_at FROM turns \
             WHERE id = ?1 AND lease_owner = ?2 AND lease_epoch = ?3 AND status = 'running'",
        )?
        .query_row(params![lease.turn_id, lease.owner, lease.epoch], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(expires) = expires else {
        return Err(Error::LeaseLost {
            turn_id: lease.turn_id,
            epoch: lease.epoch,
        });
    };
    let now = now_ms();
    if expires.is_none_or(|e| e - now < renew_below) {
        tx.prepare_cached("UPDATE turns SET lease_expires_at = ?1 WHERE id = ?2")?
            .execute(params![now + lease.ttl_ms, lease.turn_id])?;
    }
    Ok(())
}

pub(crate) fn get_session(conn: &Connection, id: SessionId) -> Result<SessionRow> {
    conn.prepare_cached(&format!(
        "SELECT {} FROM sessions WHERE id = ?1",
        SessionRow::COLUMNS
    ))?
    .query_row([id], SessionRow::from_row)
    .optional()?
    .ok_or_else(|| Error::UnknownSession(id.to_string()))
}

pub(crate) fn find_session(conn: &Connection, external_id: &str) -> Result<Option<SessionRow>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {} FROM sessions WHERE external_id = ?1",
            SessionRow::COLUMNS
        ))?
        .query_row([external_id], SessionRow::from_row)
        .optional()?)
}

pub(crate) fn list_sessions(conn: &Connection) -> Result<Vec<SessionRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM sessions ORDER BY id",
        SessionRow::COLUMNS
    ))?;
    let rows = st.query_map([], SessionRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Creates the session, or returns the existing one with the same external id.
///
/// Claim semantics: UNIQUE(external_id); a second creator gets the first row.
/// A different model or system prompt is [`Error::SessionConflict`].
pub(crate) fn create_session(
    conn: &mut Connection,
    external_id: &str,
    model: &str,
    system_prompt: &str,
    config: &str,
) -> Result<SessionRow> {
    if external_id.trim().is_empty() {
        return Err(Error::Config(
            "a session's external id must not be blank".into(),
        ));
    }
    let tx = write_tx(conn)?;
    tx.execute(
        "INSERT INTO sessions (external_id, model, system_prompt, config, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (external_id) DO NOTHING",
        params![external_id, model, system_prompt, config, now_ms()],
    )?;
    let row = find_session(&tx, external_id)?.expect("row exists after insert");
    tx.commit()?;
    if row.model != model {
        return Err(Error::SessionConflict {
            external_id: external_id.into(),
            field: "model",
        });
    }
    if row.system_prompt != system_prompt {
        return Err(Error::SessionConflict {
            external_id: external_id.into(),
            field: "system_prompt",
        });
    }
    Ok(row)
}

pub(crate) fn get_turn(conn: &Connection, id: TurnId) -> Result<TurnRow> {
    conn.prepare_cached(&format!(
        "SELECT {} FROM turns WHERE id = ?1",
        TurnRow::COLUMNS
    ))?
    .query_row([id], TurnRow::from_row)
    .optional()?
    .ok_or(Error::UnknownTurn(id))
}

pub(crate) fn list_turns(conn: &Connection, session_id: SessionId) -> Result<Vec<TurnRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM turns WHERE session_id = ?1 ORDER BY idx",
        TurnRow::COLUMNS
    ))?;
    let rows = st.query_map([session_id], TurnRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every running turn; the runner keeps those a host may resume (lease expired
/// or owner dead).
pub(crate) fn running_turns(conn: &mut Connection) -> Result<Vec<TurnRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM turns WHERE status = 'running' ORDER BY id",
        TurnRow::COLUMNS
    ))?;
    let rows = st.query_map([], TurnRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Starts turn `idx` of a session (the next index when `idx` is None) and takes
/// its lease, in one IMMEDIATE transaction.
///
/// Claim semantics: idempotent on (session, idx, input): a turn that exists with
/// the same input is returned as it is (the host re-running its script after a
/// crash) and its lease is acquired as [`acquire_lease`] would. A different input
/// or a gap in the indices is [`Error::TurnConflict`]; another running turn is
/// [`Error::TurnRunning`].
pub(crate) fn begin_turn(
    conn: &mut Connection,
    session_id: SessionId,
    idx: Option<i64>,
    input: &str,
    owner: &str,
    ttl_ms: i64,
    owner_is_dead: &dyn Fn(&str) -> bool,
) -> Result<(TurnRow, Option<Lease>)> {
    let tx = write_tx(conn)?;
    get_session(&tx, session_id)?;
    let next: i64 = tx
        .prepare_cached("SELECT coalesce(max(idx) + 1, 0) FROM turns WHERE session_id = ?1")?
        .query_row([session_id], |r| r.get(0))?;
    let idx = idx.unwrap_or(next);
    if idx < next {
        let existing: TurnRow = tx.query_row(
            &format!(
                "SELECT {} FROM turns WHERE session_id = ?1 AND idx = ?2",
                TurnRow::COLUMNS
            ),
            params![session_id, idx],
            TurnRow::from_row,
        )?;
        if existing.input != input {
            return Err(Error::TurnConflict {
                session_id,
                idx,
                reason: "exists with a different input".into(),
            });
        }
        if existing.status != TurnStatus::Running {
            tx.commit()?;
            return Ok((existing, None));
        }
        let lease = take_lease(&tx, &existing, owner, ttl_ms, owner_is_dead)?;
        let row = get_turn(&tx, existing.id)?;
        tx.commit()?;
        return Ok((row, Some(lease)));
    }
    if idx > next {
        return Err(Error::TurnConflict {
            session_id,
            idx,
            reason: format!("the next turn index is {next}"),
        });
    }
    if let Some(running) = tx
        .prepare_cached("SELECT idx FROM turns WHERE session_id = ?1 AND status = 'running'")?
        .query_row([session_id], |r| r.get::<_, i64>(0))
        .optional()?
    {
        return Err(Error::TurnRunning {
            session_id,
            running_idx: running,
        });
    }
    let now = now_ms();
    tx.prepare_cached(
        "INSERT INTO turns (session_id, idx, input, status, lease_owner, lease_epoch, \
         lease_expires_at, created_at) VALUES (?1, ?2, ?3, 'running', ?4, 1, ?5, ?6)",
    )?
    .execute(params![session_id, idx, input, owner, now + ttl_ms, now])?;
    let id = TurnId(tx.last_insert_rowid());
    // Step 0 is claimed with its turn: the first step needs no write of its own.
    insert_step(&tx, id, 0, now)?;
    let row = get_turn(&tx, id)?;
    tx.commit()?;
    let lease = Lease {
        turn_id: id,
        owner: owner.into(),
        epoch: 1,
        ttl_ms,
        taken_from: None,
    };
    Ok((row, Some(lease)))
}

fn take_lease(
    tx: &Transaction<'_>,
    turn: &TurnRow,
    owner: &str,
    ttl_ms: i64,
    owner_is_dead: &dyn Fn(&str) -> bool,
) -> Result<Lease> {
    let now = now_ms();
    let (holder, expires_at) = (turn.lease_owner.as_deref(), turn.lease_expires_at);
    if super::lease_held_by_live_other(holder, expires_at, owner, now, owner_is_dead) {
        return Err(Error::LeaseHeld {
            turn_id: turn.id,
            owner: crate::owner::owner_name(holder.unwrap_or_default()).to_string(),
            expires_at: expires_at.unwrap_or_default(),
        });
    }
    let epoch = turn.lease_epoch + 1;
    tx.execute(
        "UPDATE turns SET lease_owner = ?1, lease_epoch = ?2, lease_expires_at = ?3 \
         WHERE id = ?4 AND status = 'running' AND lease_epoch = ?5",
        params![owner, epoch, now + ttl_ms, turn.id, turn.lease_epoch],
    )?;
    Ok(Lease {
        turn_id: turn.id,
        owner: owner.into(),
        epoch,
        ttl_ms,
        taken_from: holder.map(|h| crate::owner::owner_name(h).to_string()),
    })
}

/// Takes the lease of a running turn: free, expired, held by a dead owner, or
/// held by `owner` itself (a restarted host with a stable identity).
///
/// Claim semantics: the epoch increments, fencing every earlier holder.
pub(crate) fn acquire_lease(
    conn: &mut Connection,
    turn_id: TurnId,
    owner: &str,
    ttl_ms: i64,
    owner_is_dead: &dyn Fn(&str) -> bool,
) -> Result<(TurnRow, Lease)> {
    let tx = write_tx(conn)?;
    let turn = get_turn(&tx, turn_id)?;
    if turn.status != TurnStatus::Running {
        return Err(Error::TurnFinished {
            turn_id,
            status: turn.status.to_string(),
        });
    }
    let lease = take_lease(&tx, &turn, owner, ttl_ms, owner_is_dead)?;
    let turn = get_turn(&tx, turn_id)?;
    tx.commit()?;
    Ok((turn, lease))
}

/// Renews the lease to its full time (heartbeat). Returns false when it was lost.
pub(crate) fn renew_lease(conn: &mut Connection, lease: &Lease) -> Result<bool> {
    let tx = write_tx(conn)?;
    let ok = match check_lease(&tx, lease, i64::MAX) {
        Ok(()) => true,
        Err(Error::LeaseLost { .. }) => false,
        Err(e) => return Err(e),
    };
    tx.commit()?;
    Ok(ok)
}

pub(crate) fn get_step(conn: &Connection, id: StepId) -> Result<StepRow> {
    conn.prepare_cached(&format!(
        "SELECT {} FROM steps WHERE id = ?1",
        StepRow::COLUMNS
    ))?
    .query_row([id], StepRow::from_row)
    .optional()?
    .ok_or(Error::UnknownStep(id))
}

pub(crate) fn list_steps(conn: &Connection, turn_id: TurnId) -> Result<Vec<StepRow>> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT {} FROM steps WHERE turn_id = ?1 ORDER BY idx",
        StepRow::COLUMNS
    ))?;
    let rows = st.query_map([turn_id], StepRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The turn's newest step row, if any. A read: no transaction, no fence.
pub(crate) fn last_step(conn: &Connection, turn_id: TurnId) -> Result<Option<StepRow>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {} FROM steps WHERE turn_id = ?1 ORDER BY idx DESC LIMIT 1",
            StepRow::COLUMNS
        ))?
        .query_row([turn_id], StepRow::from_row)
        .optional()?)
}

/// Claims step `idx` of a turn as `running` inside the caller's transaction; a
/// row already there is left as it is.
fn insert_step(tx: &Transaction<'_>, turn_id: TurnId, idx: i64, now: i64) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO steps (turn_id, idx, status, created_at) VALUES (?1, ?2, 'running', ?3) \
         ON CONFLICT (turn_id, idx) DO NOTHING",
    )?
    .execute(params![turn_id, idx, now])?;
    Ok(())
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
    let tx = write_tx(conn)?;
    fence(&tx, lease)?;
    let row = match last_step(&tx, lease.turn_id)? {
        Some(s) if s.status != StepStatus::Completed => s,
        other => {
            let idx = other.map_or(0, |s| s.idx + 1);
            insert_step(&tx, lease.turn_id, idx, now_ms())?;
            last_step(&tx, lease.turn_id)?.expect("row exists after insert")
        }
    };
    tx.commit()?;
    Ok(row)
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
}

/// Opens a fenced IMMEDIATE transaction: every write of a leased turn runs in
/// one. The caller commits it.
pub(crate) fn fenced_tx<'c>(conn: &'c mut Connection, lease: &Lease) -> Result<Transaction<'c>> {
    let tx = write_tx(conn)?;
    fence(&tx, lease)?;
    Ok(tx)
}

/// Writes a step's response, usage, hash, compaction read and context measure
/// inside the caller's fenced transaction: `running` → `responded`. A step that
/// is no longer running means the lease was lost.
pub(crate) fn write_response(tx: &Transaction<'_>, lease: &Lease, r: &Responded) -> Result<()> {
    let n = tx
        .prepare_cached(
            "UPDATE steps SET status = 'responded', compaction_id = ?1, messages_sha256 = ?2, \
             response = ?3, input_tokens = ?4, output_tokens = ?5, context_tokens = ?6, \
             estimated = ?7, responded_at = ?8, render_format = ?10 \
             WHERE id = ?9 AND status = 'running'",
        )?
        .execute(params![
            r.compaction_id,
            r.messages_sha256,
            r.response_json,
            r.input_tokens,
            r.output_tokens,
            r.context_tokens,
            r.estimated,
            now_ms(),
            r.step_id,
            crate::builder::RenderFormat::CURRENT.as_i64()
        ])?;
    if n == 0 {
        return Err(Error::LeaseLost {
            turn_id: lease.turn_id,
            epoch: lease.epoch,
        });
    }
    Ok(())
}

/// Completes the leased turn with `output` and releases its lease, inside the
/// caller's fenced transaction; returns the finished row.
fn complete_turn(tx: &Transaction<'_>, lease: &Lease, output: &str, now: i64) -> Result<TurnRow> {
    tx.prepare_cached(
        "UPDATE turns SET status = 'completed', output = ?1, finished_at = ?2, \
         lease_expires_at = NULL WHERE id = ?3",
    )?
    .execute(params![output, now, lease.turn_id])?;
    get_turn(tx, lease.turn_id)
}

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

fn insert_or_get_invocation(
    tx: &Transaction<'_>,
    inv: &NewInvocation<'_>,
) -> Result<(InvocationRow, bool)> {
    let inserted =
        tx.prepare_cached(
            "INSERT INTO tool_invocations (step_id, position, tool_call_id, tool_name, arguments, \
             effect, idempotency_key, status, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'started', ?8) \
             ON CONFLICT (step_id, tool_call_id) DO NOTHING",
        )?
        .execute(params![
            inv.step_id,
            inv.position,
            inv.tool_call_id,
            inv.tool_name,
            inv.arguments,
            inv.effect.as_str(),
            inv.idempotency_key,
            now_ms()
        ])? == 1;
    let row = tx
        .prepare_cached(&format!(
            "SELECT {} FROM tool_invocations WHERE step_id = ?1 AND tool_call_id = ?2",
            InvocationRow::COLUMNS
        ))?
        .query_row(
            params![inv.step_id, inv.tool_call_id],
            InvocationRow::from_row,
        )?;
    Ok((row, inserted))
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
) -> Result<()> {
    let status = if ok { "completed" } else { "failed" };
    let sql = if cfg!(feature = "broken-idempotency") {
        "UPDATE tool_invocations SET status = ?1, result = ?2, completed_at = ?3 WHERE id = ?4"
    } else {
        "UPDATE tool_invocations SET status = ?1, result = ?2, completed_at = ?3 \
         WHERE id = ?4 AND status = 'started'"
    };
    let n = tx
        .prepare_cached(sql)?
        .execute(params![status, result, now_ms(), id])?;
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
pub(crate) type TxBody<'f> = dyn FnOnce(&Transaction<'_>, &InvocationRow) -> Result<std::result::Result<String, String>>
    + 'f;

/// Runs a transactional tool inside the caller's fenced transaction: claims the
/// invocation, runs `body` and records the result, so the tool's writes and its
/// record commit together or not at all.
///
/// An already-finished invocation does not run `body`. A body that returns
/// `Ok(Err(msg))` (the tool refused) has its writes rolled back to a savepoint
/// and the error result is recorded instead. A body returning `Err` aborts the
/// caller's transaction (a crash: nothing recorded).
pub(crate) fn run_transactional(
    tx: &Transaction<'_>,
    lease: &Lease,
    inv: &NewInvocation<'_>,
    body: Box<TxBody<'_>>,
) -> Result<Option<(InvocationId, bool)>> {
    let (row, _) = insert_or_get_invocation(tx, inv)?;
    if row.status != InvocationStatus::Started && !cfg!(feature = "broken-idempotency") {
        return Ok(None);
    }
    tx.prepare_cached("SAVEPOINT tool_body")?.execute([])?;
    let ok = match body(tx, &row)? {
        Ok(result) => {
            tx.prepare_cached("RELEASE tool_body")?.execute([])?;
            finish_invocation(tx, lease, row.id, true, &result)?;
            true
        }
        Err(msg) => {
            tx.prepare_cached("ROLLBACK TO tool_body")?.execute([])?;
            tx.prepare_cached("RELEASE tool_body")?.execute([])?;
            finish_invocation(tx, lease, row.id, false, &msg)?;
            false
        }
    };
    Ok(Some((row.id, ok)))
}

pub(crate) fn list_invocations(conn: &Connection, step_id: StepId) -> Result<Vec<InvocationRow>> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT {} FROM tool_invocations WHERE step_id = ?1 ORDER BY position",
        InvocationRow::COLUMNS
    ))?;
    let rows = st.query_map([step_id], InvocationRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Marks a responded step completed inside the caller's fenced transaction;
/// with `final_output` also completes the turn (releasing its lease) and
/// returns it, otherwise claims the next step (`running`), so that the next
/// step starts with a read, not a write.
pub(crate) fn complete_step(
    tx: &Transaction<'_>,
    lease: &Lease,
    step_id: StepId,
    step_idx: i64,
    final_output: Option<&str>,
) -> Result<Option<TurnRow>> {
    let now = now_ms();
    tx.prepare_cached(
        "UPDATE steps SET status = 'completed', completed_at = ?1 \
         WHERE id = ?2 AND status = 'responded'",
    )?
    .execute(params![now, step_id])?;
    match final_output {
        Some(out) => Ok(Some(complete_turn(tx, lease, out, now)?)),
        None => {
            insert_step(tx, lease.turn_id, step_idx + 1, now)?;
            Ok(None)
        }
    }
}

/// Fails the turn (and the step, if given) with `error`, fenced.
pub(crate) fn fail_turn(
    conn: &mut Connection,
    lease: &Lease,
    step_id: Option<StepId>,
    error: &str,
) -> Result<()> {
    let tx = write_tx(conn)?;
    fence(&tx, lease)?;
    let now = now_ms();
    if let Some(step_id) = step_id {
        tx.execute(
            "UPDATE steps SET status = 'failed', error = ?1, completed_at = ?2 \
             WHERE id = ?3 AND status IN ('running', 'responded')",
            params![error, now, step_id],
        )?;
    }
    tx.execute(
        "UPDATE turns SET status = 'failed', error = ?1, finished_at = ?2, lease_expires_at = NULL \
         WHERE id = ?3",
        params![error, now, lease.turn_id],
    )?;
    tx.commit()?;
    Ok(())
}

/// The context measure of the newest executed step of the session (before turn
/// `before_turn_idx`'s step `before_step_idx`, both inclusive bounds excluded).
pub(crate) fn latest_context_tokens(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
    step_idx: i64,
) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT s.context_tokens FROM turns t JOIN steps s ON s.turn_id = t.id \
             WHERE t.session_id = ?1 AND s.context_tokens IS NOT NULL \
             AND (t.idx < ?2 OR (t.idx = ?2 AND s.idx < ?3)) \
             ORDER BY t.idx DESC, s.idx DESC LIMIT 1",
        )?
        .query_row(params![session_id, turn_idx, step_idx], |r| r.get(0))
        .optional()?)
}
