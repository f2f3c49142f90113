//! Turns: begun (with their lease and step 0), listed, completed or failed.

use crate::error::{Error, Result};
use crate::ids::{CompactionId, SessionId, StepId, TurnId};
use crate::store::db::{Connection, OptionalExtension, Transaction};
use crate::store::leases::*;
use crate::store::rows::*;
use crate::store::sessions::*;
use crate::store::write_tx;
use rusqlite::params;

pub(crate) fn get_turn(conn: &Connection, id: TurnId) -> Result<TurnRow> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM turns WHERE id = ?1",
        TurnRow::COLUMNS
    ))?
    .query_row([id], TurnRow::from_row)
    .optional()?
    .ok_or(Error::UnknownTurn(id))
}

pub(crate) fn list_turns(conn: &Connection, session_id: SessionId) -> Result<Vec<TurnRow>> {
    list_turns_after(conn, session_id, -1)
}

/// A session's turns after turn `after_idx`, in order.
pub(crate) fn list_turns_after(
    conn: &Connection,
    session_id: SessionId,
    after_idx: i64,
) -> Result<Vec<TurnRow>> {
    // A fork's turns are its ancestors' up to its fork point, then its own.
    let columns = TurnRow::COLUMNS
        .split(", ")
        .map(|c| format!("t.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut st = conn.prepare(&format!(
        "{} ORDER BY 3",
        crate::store::history::over_lineage(&format!(
            "SELECT {columns} FROM turns t WHERE t.session_id = ?1 AND t.idx > ?2"
        ))
    ))?;
    let rows = st.query_map(params![session_id, after_idx], TurnRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every running turn but the parked ones (a call of theirs waits for a
/// decision); the runner keeps those a host may resume (lease expired or
/// owner dead). A parked turn whose calls are all decided is among them.
pub(crate) fn running_turns(conn: &mut Connection) -> Result<Vec<TurnRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM turns t WHERE status = 'running' AND NOT EXISTS \
         (SELECT 1 FROM approvals a WHERE a.turn_id = t.id AND a.status = 'pending') ORDER BY id",
        TurnRow::COLUMNS
    ))?;
    let rows = st.query_map([], TurnRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The next turn's index: after the session's last, or, for a fork without
/// a turn of its own yet, after its fork point.
const NEXT_TURN_SQL: &str = "SELECT coalesce(max(idx) + 1, (SELECT parent_turn + 1 FROM sessions \
     WHERE id = ?1 AND parent_kind = 'fork'), 0) FROM turns WHERE session_id = ?1";
const RUNNING_TURN_SQL: &str = "SELECT idx FROM turns WHERE session_id = ?1 AND status = 'running'";

/// Starts turn `idx` of a session (the next index when `idx` is None) and takes
/// its lease, in one IMMEDIATE transaction, then runs `then` on the connection
/// with the turn, its lease (None: the turn had finished) and its session; on
/// PostgreSQL a new turn's `COMMIT` goes with `then`'s first request.
///
/// Claim semantics: idempotent on (session, idx, input): a turn that exists with
/// the same input is returned as it is (the host re-running its script after a
/// crash) and its lease is acquired as [`acquire_lease`] would. A different input
/// or a gap in the indices is [`Error::TurnConflict`]; another running turn is
/// [`Error::TurnRunning`] ([`Error::TurnParked`] when it waits for a decision).
#[allow(clippy::too_many_arguments)]
pub(crate) fn begin_turn<R>(
    conn: &mut Connection,
    session_id: SessionId,
    idx: Option<i64>,
    input: &str,
    owner: &str,
    ttl_ms: i64,
    owner_is_dead: &dyn Fn(&str) -> bool,
    then: impl FnOnce(&mut Connection, TurnRow, Option<Lease>, SessionRow) -> Result<R>,
) -> Result<R> {
    let tx = conn.write_tx_of(crate::store::db::Owner::Session(session_id))?;
    // Read together (one round trip on PostgreSQL): none depends on another.
    tx.prefetch(NEXT_TURN_SQL, [session_id])?;
    tx.prefetch(RUNNING_TURN_SQL, [session_id])?;
    let session = get_session(&tx, session_id)?;
    let next: i64 = tx
        .prepare_cached(NEXT_TURN_SQL)?
        .query_row([session_id], |r| r.get(0))?;
    let idx = idx.unwrap_or(next);
    if idx < session.first_own_turn() {
        return Err(Error::TurnConflict {
            session_id,
            idx,
            reason: format!(
                "the session is a fork: turns up to {} are its parent's, and its own start at {}",
                session.first_own_turn() - 1,
                session.first_own_turn()
            ),
        });
    }
    if idx < next {
        let existing: TurnRow = tx.query_row(
            &format!(
                "SELECT {} FROM turns WHERE session_id = ?1 AND idx = ?2",
                TurnRow::COLUMNS
            ),
            params![session_id, idx],
            TurnRow::from_row,
        )?;
        // A redacted input is recognised by the hash of what it was.
        if existing.input != input
            && !crate::store::input_before_redaction(&tx, existing.id.0, input)?
        {
            return Err(Error::TurnConflict {
                session_id,
                idx,
                reason: "exists with a different input".into(),
            });
        }
        if existing.status != TurnStatus::Running {
            tx.commit()?;
            return then(conn, existing, None, session);
        }
        // Its fenced writers may be at work (on PostgreSQL this transaction
        // holds the session's lock, not the turn's): the turn's lock first,
        // then its row as it is now.
        tx.lock_turn(existing.id);
        let existing = get_turn(&tx, existing.id)?;
        if existing.status != TurnStatus::Running {
            tx.commit()?;
            return then(conn, existing, None, session);
        }
        let lease = take_lease(&tx, &existing, owner, ttl_ms, owner_is_dead)?;
        let row = get_turn(&tx, existing.id)?;
        tx.commit()?;
        return then(conn, row, Some(lease), session);
    }
    if idx > next {
        return Err(Error::TurnConflict {
            session_id,
            idx,
            reason: format!("the next turn index is {next}"),
        });
    }
    if let Some(running) = tx
        .prepare_cached(RUNNING_TURN_SQL)?
        .query_row([session_id], |r| r.get::<_, i64>(0))
        .optional()?
    {
        let turn: TurnId = tx
            .prepare_cached("SELECT id FROM turns WHERE session_id = ?1 AND idx = ?2")?
            .query_row(params![session_id, running], |r| r.get(0))?;
        let calls = crate::store::waiting_calls(&tx, turn)?;
        if calls > 0 {
            return Err(Error::TurnParked {
                session_id,
                parked_idx: running,
                calls,
            });
        }
        return Err(Error::TurnRunning {
            session_id,
            running_idx: running,
        });
    }
    let now = tx.now_ms();
    let id = tx.insert_returning_id(
        concat!(
            "INSERT INTO turns (id, session_id, idx, input, status, lease_owner, lease_epoch, \
             lease_expires_at, created_at) VALUES (",
            crate::store::next_id!("turns"),
            ", ?1, ?2, ?3, 'running', ?4, 1, ?5, ?6)"
        ),
        params![session_id, idx, input, owner, now + ttl_ms, now],
    )?;
    let id = TurnId(id.ok_or(crate::error::Error::NoRow)?);
    // Step 0 is claimed with its turn: the first step needs no write of its own.
    insert_step(&tx, id, 0, now)?;
    // The row as inserted, without reading it back.
    let row = TurnRow {
        id,
        session_id,
        idx,
        input: input.to_string(),
        status: TurnStatus::Running,
        output: None,
        error: None,
        lease_owner: Some(owner.to_string()),
        lease_epoch: 1,
        lease_expires_at: Some(now + ttl_ms),
        created_at: now,
        finished_at: None,
    };
    let lease = Lease {
        turn_id: id,
        owner: owner.into(),
        epoch: 1,
        ttl_ms,
        taken_from: None,
    };
    // What `then` reads goes with this COMMIT (on PostgreSQL).
    tx.commit_then(|c| then(c, row, Some(lease), session))?
}

/// Completes the leased turn with `output` and releases its lease, inside the
/// caller's fenced transaction; returns the finished row.
pub(crate) fn complete_turn(
    tx: &Transaction<'_>,
    lease: &Lease,
    turn: &TurnRow,
    output: &str,
    now: i64,
) -> Result<TurnRow> {
    tx.execute_later(
        "UPDATE turns SET status = 'completed', output = ?1, finished_at = ?2, \
         lease_expires_at = NULL WHERE id = ?3",
        params![output, now, lease.turn_id],
    )?;
    // The row as it now reads (the fence held: no one else changed it),
    // without reading it back.
    Ok(TurnRow {
        status: TurnStatus::Completed,
        output: Some(output.to_string()),
        lease_owner: Some(lease.owner.clone()),
        lease_epoch: lease.epoch,
        lease_expires_at: None,
        finished_at: Some(now),
        ..turn.clone()
    })
}

/// Fails the turn (and the step, if given) with `error`, fenced; the facts of
/// its completed steps are pinned in the same transaction.
pub(crate) fn fail_turn(
    conn: &mut Connection,
    lease: &Lease,
    step_id: Option<StepId>,
    error: &str,
    pins: Option<&dyn crate::pins::PinExtractor>,
) -> Result<()> {
    let failed = (|| {
        let tx = write_tx(conn)?;
        fence(&tx, lease)?;
        let now = tx.now_ms();
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
        if let Some(extractor) = pins {
            let turn = get_turn(&tx, lease.turn_id)?;
            crate::store::pins::pin_turn(&tx, turn.session_id, turn.idx, extractor, None)?;
        }
        tx.commit()
    })();
    failed.map_err(|e| explain_lost(conn, e))
}

/// Abandons the leased (parked) turn: its waiting calls marked abandoned,
/// then the turn and its responded step failed with `error`, in one fenced
/// transaction.
pub(crate) fn abandon_turn(
    conn: &mut Connection,
    lease: &Lease,
    error: &str,
    pins: Option<&dyn crate::pins::PinExtractor>,
) -> Result<()> {
    let done = (|| {
        let tx = write_tx(conn)?;
        fence(&tx, lease)?;
        crate::store::abandon_calls(&tx, lease.turn_id, error)?;
        let now = tx.now_ms();
        tx.execute(
            "UPDATE steps SET status = 'failed', error = ?1, completed_at = ?2 \
             WHERE turn_id = ?3 AND status IN ('running', 'responded')",
            params![error, now, lease.turn_id],
        )?;
        tx.execute(
            "UPDATE turns SET status = 'failed', error = ?1, finished_at = ?2, \
             lease_expires_at = NULL WHERE id = ?3",
            params![error, now, lease.turn_id],
        )?;
        if let Some(extractor) = pins {
            let turn = get_turn(&tx, lease.turn_id)?;
            crate::store::pins::pin_turn(&tx, turn.session_id, turn.idx, extractor, None)?;
        }
        tx.commit()
    })();
    done.map_err(|e| explain_lost(conn, e))
}

/// The context measure of the newest executed step of the session (before turn
/// `before_turn_idx`'s step `before_step_idx`, both inclusive bounds excluded).
///
/// Looked for first in this turn and the one before, where it nearly always
/// is, with the turn range in the index condition: a planner whose
/// statistics are older than the session (PostgreSQL's, before autovacuum
/// has analysed a table that grew fast) otherwise sorts every step of it.
/// A fork's measure may be its parent's (its first step's newest executed
/// step is the parent's at the fork point): a look that reaches below the
/// session's first own turn (`lineage`) reads its ancestors' half too, and
/// sorts the two halves' rows. One that does not, every look of a session
/// that is no fork, reads its newest row in the indexes' order, without
/// the sort (a temporary b-tree at every run).
fn latest_measure_sql(lineage: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    const BRANCH: &str = "SELECT s.context_tokens, s.compaction_id, t.idx, s.idx FROM turns t \
         JOIN steps s ON s.turn_id = t.id \
         WHERE t.session_id = ?1 AND t.idx >= ?4 AND t.idx <= ?2 \
         AND s.context_tokens IS NOT NULL AND (t.idx < ?2 OR s.idx < ?3)";
    SQL[usize::from(lineage)].get_or_init(|| {
        if lineage {
            format!(
                "{} ORDER BY 3 DESC, 4 DESC LIMIT 1",
                crate::store::history::over_lineage(BRANCH)
            )
        } else {
            format!("{BRANCH} ORDER BY t.idx DESC, s.idx DESC LIMIT 1")
        }
    })
}

/// Where [`latest_context_tokens`] looks first: this turn and the one
/// before; whether that reaches below `own_from` (the session's first own
/// turn, `SessionRow::first_own_turn`).
fn first_look(turn_idx: i64, own_from: i64) -> (i64, bool) {
    let from = (turn_idx - 1).max(0);
    (from, from < own_from)
}

/// Queues [`latest_context_tokens`]'s first read (see
/// [`Connection::prefetch`]).
pub(crate) fn prefetch_latest_context_tokens(
    conn: &Connection,
    session_id: SessionId,
    own_from: i64,
    turn_idx: i64,
    step_idx: i64,
) -> Result<()> {
    let (from, lineage) = first_look(turn_idx, own_from);
    conn.prefetch(
        latest_measure_sql(lineage),
        params![session_id, turn_idx, step_idx, from],
    )
}

/// The newest executed step's context measure (and the compaction it read)
/// before turn `turn_idx`'s step `step_idx`; `own_from` is the session's
/// first own turn (0 unless it is a fork).
pub(crate) fn latest_context_tokens(
    conn: &Connection,
    session_id: SessionId,
    own_from: i64,
    turn_idx: i64,
    step_idx: i64,
) -> Result<Option<(i64, Option<CompactionId>)>> {
    let newest = |from: i64, lineage: bool| -> Result<Option<(i64, Option<CompactionId>)>> {
        conn.prepare_cached(latest_measure_sql(lineage))?
            .query_row(params![session_id, turn_idx, step_idx, from], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
    };
    let (from, lineage) = first_look(turn_idx, own_from);
    match newest(from, lineage)? {
        Some(found) => Ok(Some(found)),
        None if turn_idx >= 2 => newest(0, 0 < own_from),
        None => Ok(None),
    }
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

/// Claims step `idx` of a turn as `running` inside the caller's transaction; a
/// row already there is left as it is.
pub(crate) fn insert_step(tx: &Transaction<'_>, turn_id: TurnId, idx: i64, now: i64) -> Result<()> {
    tx.execute_later(
        "INSERT INTO steps (turn_id, idx, status, created_at) VALUES (?1, ?2, 'running', ?3) \
         ON CONFLICT (turn_id, idx) DO NOTHING",
        params![turn_id, idx, now],
    )
}

/// The sizes of turns `after_idx + 1 ..= before_idx - 1`, newest first:
/// what [`recent_window_boundary`] walks back through.
fn recent_window_sql() -> &'static str {
    sql_once!(
        "{} ORDER BY 1 DESC",
        crate::store::history::over_lineage(
            "SELECT t.idx, length(t.input) \
               + coalesce((SELECT sum(length(s.response)) FROM steps s WHERE s.turn_id = t.id), 0) \
               + coalesce((SELECT sum(length(i.result)) FROM steps s2 \
                   JOIN tool_invocations i ON i.step_id = s2.id WHERE s2.turn_id = t.id), 0) \
             FROM turns t WHERE t.session_id = ?1 AND t.idx < ?2 AND t.idx > ?3"
        )
    )
}

/// Queues [`recent_window_boundary`]'s read (see [`Connection::prefetch`]).
pub(crate) fn prefetch_recent_window(
    conn: &Connection,
    session_id: SessionId,
    before_idx: i64,
    after_idx: i64,
) -> Result<()> {
    conn.prefetch(
        recent_window_sql(),
        params![session_id, before_idx, after_idx],
    )
}

/// The boundary that keeps, beside the turns after `boundary`, the most
/// recent turns whose stored text (input, responses, tool results; chars / 4,
/// rounded up) adds up to at most `keep_tokens`, counting back from turn
/// `before_idx - 1` and no further back than turn `after_idx + 1`. Reads only
/// the turns it walks past. Finished turns never change, so every step of a
/// turn (and its re-run after a crash) gets the same answer.
///
/// The compactor walks the same turns with [`walk_turn_sizes`], keeping the
/// sizes it read for the session's next turns; this is the reference its
/// tests hold that walk to, and the preview's.
pub(crate) fn recent_window_boundary(
    conn: &Connection,
    session_id: SessionId,
    before_idx: i64,
    after_idx: i64,
    boundary: i64,
    keep_tokens: u64,
) -> Result<i64> {
    let mut tail = Tail::new(boundary, keep_tokens);
    walk_turn_sizes(conn, session_id, before_idx, after_idx, |idx, chars| {
        tail.take(idx, chars)
    })?;
    Ok(tail.boundary())
}

/// Calls `each` with the index and stored text's size (chars: input,
/// responses, tool results) of the session's turns `after_idx + 1 ..=
/// before_idx - 1`, newest first, while it returns true. Reads only the
/// turns it walks past.
pub(crate) fn walk_turn_sizes(
    conn: &Connection,
    session_id: SessionId,
    before_idx: i64,
    after_idx: i64,
    mut each: impl FnMut(i64, i64) -> bool,
) -> Result<()> {
    let mut st = conn.prepare_cached(recent_window_sql())?;
    let mut rows = st.query(params![session_id, before_idx, after_idx])?;
    while let Some(r) = rows.next()? {
        if !each(r.get(0)?, r.get(1)?) {
            break;
        }
    }
    Ok(())
}

/// What [`walk_turn_sizes`] reads for a finished turn (its input's, its
/// steps' responses' and their tool results' characters, SQL's `length()`),
/// counted from the very strings its rows were written with, so that the
/// turn's size needs no read. None when one of them holds a NUL: SQLite's
/// `length()` of a text stops at the first.
pub(crate) fn turn_text_chars(turn: &crate::store::HistoryTurn) -> Option<i64> {
    let texts = std::iter::once(turn.input.as_str()).chain(turn.steps.iter().flat_map(|s| {
        std::iter::once(s.response.as_str()).chain(s.results.iter().map(|r| r.1.as_str()))
    }));
    let mut chars = 0usize;
    for text in texts {
        if text.as_bytes().contains(&0) {
            return None;
        }
        chars += text.chars().count();
    }
    i64::try_from(chars).ok()
}

/// The verbatim tail as [`recent_window_boundary`] walks back through a
/// session's turns, newest first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tail {
    keep_tokens: u64,
    kept: u64,
    boundary: i64,
}

impl Tail {
    /// A tail of at most `keep_tokens` before `boundary`, nothing in it yet.
    pub(crate) fn new(boundary: i64, keep_tokens: u64) -> Tail {
        Tail {
            keep_tokens,
            kept: 0,
            boundary,
        }
    }

    /// Takes turn `idx` of `chars` into the tail: false when it does not
    /// fit, which ends the walk (no older turn is kept either).
    pub(crate) fn take(&mut self, idx: i64, chars: i64) -> bool {
        self.kept += (chars.max(0) as u64).div_ceil(4);
        if self.kept > self.keep_tokens {
            return false;
        }
        self.boundary = self.boundary.min(idx - 1);
        true
    }

    /// The boundary that keeps the turns taken.
    pub(crate) fn boundary(&self) -> i64 {
        self.boundary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The newest measure is found past turns with no measured step (a turn
    /// that failed before its model answered), not only in the turn before.
    #[test]
    fn latest_measure_is_found_past_turns_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path().join("m.db")).unwrap();
        store
            .with_conn(|c| {
                c.execute_batch(
                    "INSERT INTO sessions (id, external_id, model, system_prompt, created_at) \
                     VALUES (1, 's', 'm', 'p', 0);
                     INSERT INTO turns (id, session_id, idx, input, status, created_at) VALUES
                       (10, 1, 0, 'a', 'completed', 0), (11, 1, 1, 'b', 'failed', 0),
                       (12, 1, 2, 'c', 'failed', 0), (13, 1, 3, 'd', 'running', 0);
                     INSERT INTO steps (turn_id, idx, status, context_tokens, created_at) VALUES
                       (10, 0, 'completed', 500, 0), (10, 1, 'completed', 700, 0),
                       (11, 0, 'failed', NULL, 0), (13, 0, 'completed', 900, 0),
                       (13, 1, 'running', NULL, 0);",
                )?;
                let sid = SessionId(1);
                // Two turns back, past two turns without a measure.
                assert_eq!(latest_context_tokens(c, sid, 0, 3, 0)?, Some((700, None)));
                // In the turn itself, before the step.
                assert_eq!(latest_context_tokens(c, sid, 0, 3, 1)?, Some((900, None)));
                assert_eq!(latest_context_tokens(c, sid, 0, 1, 0)?, Some((700, None)));
                assert_eq!(latest_context_tokens(c, sid, 0, 0, 1)?, Some((500, None)));
                assert_eq!(latest_context_tokens(c, sid, 0, 0, 0)?, None);
                Ok(())
            })
            .unwrap();
    }
}

/// A session's pace before turn `turn_idx`, for the adaptive soft threshold
/// (`compaction::Background::adaptive`): how much its context grew in one
/// turn at most among its last [`PACE_TURNS`] turns (the largest measure of
/// a turn's steps against the previous measured turn's; a compaction's fall
/// is no growth), its newest background summary's time from claim to
/// completion (see [`background_summary_ms`]), and its recent turns' mean
/// time. Each None when there is nothing to say. Finished rows only: every
/// step of a turn reads the same answer unless a summary completes between
/// them.
///
/// The compactor reads the turns' part a turn at a time ([`turn_paces`],
/// kept for the next turns) and combines it with [`Pace::of`]; this
/// statement over all the window's turns is the reference its tests hold
/// that combination to (the summary's time is [`background_summary_ms`] in
/// both).
#[cfg(test)]
pub(crate) fn session_pace(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
) -> Result<Pace> {
    const SQL: &str = "SELECT \
        (SELECT max(m - prev) FROM (SELECT m, lag(m) OVER (ORDER BY idx) AS prev FROM \
            (SELECT t.idx AS idx, max(s.context_tokens) AS m FROM turns t \
             JOIN steps s ON s.turn_id = t.id \
             WHERE t.session_id = ?1 AND t.idx < ?2 AND t.idx >= ?2 - ?3 \
             AND s.context_tokens IS NOT NULL GROUP BY t.idx) per_turn) growth), \
        (SELECT CAST(avg(t.finished_at - t.created_at) AS BIGINT) FROM turns t \
         WHERE t.session_id = ?1 AND t.idx < ?2 AND t.idx >= ?2 - ?3 \
         AND t.status = 'completed')";
    let (growth, turn_ms) = conn
        .prepare_cached(SQL)?
        .query_row(params![session_id, turn_idx, PACE_TURNS], |r| {
            Ok((r.get::<_, Option<i64>>(0)?, r.get(1)?))
        })?;
    Ok(Pace {
        growth: growth.filter(|g| *g > 0),
        summary_ms: background_summary_ms(conn, session_id)?,
        turn_ms,
    })
}

/// What the pace reads of one turn: its largest measured context (None: no
/// step of it was measured) and, once completed, its time. A finished
/// turn's never changes (the session's redaction aside, which the
/// compactor's memo is keyed on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TurnPace {
    pub(crate) idx: i64,
    pub(crate) max_context: Option<i64>,
    pub(crate) ms: Option<i64>,
}

/// The session's turns `from..=to` as the pace reads them, in order (a turn
/// that does not exist has no entry).
pub(crate) fn turn_paces(
    conn: &Connection,
    session_id: SessionId,
    from: i64,
    to: i64,
) -> Result<Vec<TurnPace>> {
    const SQL: &str = "SELECT t.idx, \
        (SELECT max(s.context_tokens) FROM steps s WHERE s.turn_id = t.id), \
        CASE WHEN t.status = 'completed' THEN t.finished_at - t.created_at END \
        FROM turns t WHERE t.session_id = ?1 AND t.idx >= ?2 AND t.idx <= ?3 ORDER BY t.idx";
    let mut st = conn.prepare_cached(SQL)?;
    let rows = st.query_map(params![session_id, from, to], |r| {
        Ok(TurnPace {
            idx: r.get(0)?,
            max_context: r.get(1)?,
            ms: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The session's newest background summary's time from claim to
/// completion, ms: among its [`PACE_TURNS`] newest compaction rows (the
/// read visits a fixed number of rows however many compactions the session
/// has had), the newest completed in the background.
pub(crate) fn background_summary_ms(
    conn: &Connection,
    session_id: SessionId,
) -> Result<Option<i64>> {
    const SQL: &str = "SELECT done - claimed FROM \
        (SELECT c.up_to_turn_index AS upto, c.status AS st, c.background AS bg, \
                c.completed_at AS done, c.created_at AS claimed \
         FROM compactions c WHERE c.session_id = ?1 \
         ORDER BY c.up_to_turn_index DESC LIMIT ?2) recent \
        WHERE st = 'completed' AND bg = 1 ORDER BY upto DESC LIMIT 1";
    Ok(conn
        .prepare_cached(SQL)?
        .query_row(params![session_id, PACE_TURNS], |r| {
            r.get::<_, Option<i64>>(0)
        })
        .optional()?
        .flatten())
}

/// How many of a session's latest turns its pace looks at.
pub(crate) const PACE_TURNS: i64 = 8;

/// A session's pace (see [`Pace::of`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pace {
    /// The largest growth of the context in one turn, tokens.
    pub(crate) growth: Option<i64>,
    /// The newest background summary's time, claim to completion, ms.
    pub(crate) summary_ms: Option<i64>,
    /// The recent turns' mean time, ms.
    pub(crate) turn_ms: Option<i64>,
}

impl Pace {
    /// The pace from the session's last [`PACE_TURNS`] turns (in order; as
    /// [`turn_paces`] reads them) and its newest background summary's time:
    /// the largest rise of one measured turn's context over the measured
    /// turn before it (a fall is no growth), and the completed turns' mean
    /// time, truncated to whole milliseconds (as SQLite's `CAST` of the
    /// mean does).
    pub(crate) fn of(turns: &[TurnPace], summary_ms: Option<i64>) -> Pace {
        let measured = || turns.iter().filter_map(|t| t.max_context);
        let growth = measured()
            .zip(measured().skip(1))
            .map(|(prev, m)| m.saturating_sub(prev))
            .max()
            .filter(|g| *g > 0);
        let times: Vec<i64> = turns.iter().filter_map(|t| t.ms).collect();
        let turn_ms = (!times.is_empty()).then(|| {
            let sum: i128 = times.iter().map(|&m| i128::from(m)).sum();
            (sum as f64 / times.len() as f64) as i64
        });
        Pace {
            growth,
            summary_ms,
            turn_ms,
        }
    }
}
