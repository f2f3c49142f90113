//! Compaction rows: claim, lease, complete, fail (G1, G2).

use crate::error::{Error, Result};
use crate::ids::{CompactionId, SessionId};
use crate::store::db::{Connection, OptionalExtension};
use crate::store::rows::*;
use crate::store::write_tx;
use rusqlite::params;

/// What a claim on a boundary found. Not a bool: each case asks the caller for
/// something different.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// This caller inserted the row and holds its lease: summarise it.
    Claimed(CompactionRow),
    /// The row is already completed: read it.
    AlreadyCompleted(CompactionRow),
    /// The row was pending with an expired lease (a crash mid-summary) or a dead
    /// holder; this caller took the lease over: finish it, without re-deciding.
    TakenOver(CompactionRow),
    /// A live other holds the pending row: wait for it, do not summarise twice.
    HeldByLiveOther(CompactionRow),
    /// Every attempt failed earlier; the boundary stays failed until retried.
    Failed(CompactionRow),
}

impl ClaimOutcome {
    /// The row, whatever the outcome.
    pub fn row(&self) -> &CompactionRow {
        match self {
            ClaimOutcome::Claimed(r)
            | ClaimOutcome::AlreadyCompleted(r)
            | ClaimOutcome::TakenOver(r)
            | ClaimOutcome::HeldByLiveOther(r)
            | ClaimOutcome::Failed(r) => r,
        }
    }
}

/// What a completed summary records about itself.
#[derive(Debug, Clone, Default)]
pub struct CompactionStats {
    /// Summariser model.
    pub model: Option<String>,
    /// SHA-256 of the rules.
    pub prompt_sha256: String,
    /// Tokens of what the summary replaces.
    pub tokens_before: i64,
    /// Tokens of the summary.
    pub tokens_after: i64,
    /// Summariser input tokens, summed over calls.
    pub input_tokens: Option<i64>,
    /// Summariser output tokens, summed over calls.
    pub output_tokens: Option<i64>,
    /// Summariser calls.
    pub summary_calls: i64,
    /// Live pins checked by the guard (None: the guard was off).
    pub pins_live: Option<i64>,
    /// Pins the guard appended.
    pub pins_added: Option<i64>,
    /// How many of the newest facts mentioned in passing counted as live.
    pub pins_window: Option<i64>,
}

pub(crate) fn get_compaction(conn: &Connection, id: CompactionId) -> Result<CompactionRow> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM compactions WHERE id = ?1",
        CompactionRow::COLUMNS
    ))?
    .query_row([id], CompactionRow::from_row)
}

pub(crate) fn compaction_at(
    conn: &Connection,
    session_id: SessionId,
    boundary: i64,
) -> Result<Option<CompactionRow>> {
    conn.prepare_cached(compaction_at_sql())?
        .query_row(params![session_id, boundary], CompactionRow::from_row)
        .optional()
}

/// Made once: a step reads it (and says it will) on every call.
fn compaction_at_sql() -> &'static str {
    sql_once!(
        "SELECT {} FROM compactions WHERE session_id = ?1 AND up_to_turn_index = ?2",
        CompactionRow::COLUMNS
    )
}

/// Says that [`compaction_at`] follows (see [`Connection::prefetch`]).
pub(crate) fn prefetch_compaction_at(
    conn: &Connection,
    session_id: SessionId,
    boundary: i64,
) -> Result<()> {
    conn.prefetch(compaction_at_sql(), params![session_id, boundary])
}

/// The newest completed compaction whose boundary is before turn `turn_idx`:
/// what a step of that turn reads (G4: never a pending or failed row).
pub(crate) fn latest_completed(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
) -> Result<Option<CompactionRow>> {
    conn.prepare_cached(latest_completed_sql())?
        .query_row(params![session_id, turn_idx], CompactionRow::from_row)
        .optional()
}

/// [`latest_completed`]'s id alone: what a step that already holds the
/// row's text (a completed row never changes, G2) needs to know.
pub(crate) fn latest_completed_id(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
) -> Result<Option<CompactionId>> {
    conn.prepare_cached(latest_completed_id_sql())?
        .query_row(params![session_id, turn_idx], |r| r.get(0))
        .optional()
}

/// Made once, as [`compaction_at_sql`]. Reads ids and boundaries only (the
/// rows' first pages, never the summary's text).
fn latest_completed_id_sql() -> &'static str {
    // A fork reads its base (its parent's, at or before the fork point)
    // until it completes one of its own, whose boundaries are all above the
    // base's. Of the two (`o`: the session's own newest, `b`: its base, each
    // a lookup of at most one row) the one of the later boundary, compared
    // only when both exist; no row when neither does, so the id is never
    // NULL. (A `UNION ALL` of the two under an `ORDER BY` built a temporary
    // b-tree at every run.)
    "SELECT CASE WHEN ids.b IS NULL THEN ids.o WHEN ids.o IS NULL THEN ids.b \
     WHEN (SELECT up_to_turn_index FROM compactions WHERE id = ids.b) \
     > (SELECT up_to_turn_index FROM compactions WHERE id = ids.o) THEN ids.b \
     ELSE ids.o END FROM (SELECT \
     (SELECT id FROM compactions WHERE session_id = ?1 AND status = 'completed' \
     AND up_to_turn_index < ?2 ORDER BY up_to_turn_index DESC LIMIT 1) AS o, \
     (SELECT id FROM compactions WHERE id = (SELECT base_compaction_id FROM sessions \
     WHERE id = ?1) AND up_to_turn_index < ?2) AS b) ids \
     WHERE ids.o IS NOT NULL OR ids.b IS NOT NULL"
}

/// Made once, as [`compaction_at_sql`]. The row is chosen by id and read
/// once: a merge of whole rows would copy the summary's text into a sorter.
fn latest_completed_sql() -> &'static str {
    sql_once!(
        "SELECT {} FROM compactions WHERE id = ({})",
        CompactionRow::COLUMNS,
        latest_completed_id_sql()
    )
}

/// Says that [`latest_completed_id`] follows (see [`Connection::prefetch`]).
pub(crate) fn prefetch_latest_completed_id(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
) -> Result<()> {
    conn.prefetch(latest_completed_id_sql(), params![session_id, turn_idx])
}

pub(crate) fn list_compactions(
    conn: &Connection,
    session_id: SessionId,
) -> Result<Vec<CompactionRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM compactions WHERE session_id = ?1 ORDER BY up_to_turn_index",
        CompactionRow::COLUMNS
    ))?;
    let rows = st.query_map([session_id], CompactionRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A claim request.
#[derive(Debug, Clone)]
pub(crate) struct Claim<'a> {
    pub session_id: SessionId,
    pub boundary: i64,
    pub owner: &'a str,
    pub ttl_ms: i64,
    pub trigger: &'a str,
    pub focus: Option<&'a str>,
    pub trigger_tokens: Option<i64>,
    /// Claimed at the soft threshold, to be summarised in the background.
    pub background: bool,
    /// The thresholds in force (hard, soft), recorded on a new row.
    pub thresholds: Thresholds,
}

/// The thresholds in force when a row is claimed or queued, in tokens:
/// the hard one (None: off) and the soft one (None: no background).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Thresholds {
    pub hard: Option<i64>,
    pub soft: Option<i64>,
}

/// Claims the compaction row for (session, boundary).
///
/// Claim semantics: `INSERT … ON CONFLICT DO NOTHING` under the UNIQUE
/// (session_id, up_to_turn_index) index, inside `BEGIN IMMEDIATE`: at most one
/// row per boundary, ever (G1). A pending row whose lease expired, or whose
/// holder `owner_is_dead` says is dead, is taken over (attempts + 1).
/// Whether a pending row is held by someone else whose lease is live (see
/// [`crate::store::lease_held_by_live_other`]): such a row is waited for, any other
/// pending row may be taken over.
pub(crate) fn held_by_live_other(
    row: &CompactionRow,
    owner: &str,
    now: i64,
    owner_is_dead: &dyn Fn(&str) -> bool,
) -> bool {
    crate::store::lease_held_by_live_other(
        row.lease_owner.as_deref(),
        row.lease_expires_at,
        owner,
        now,
        owner_is_dead,
    )
}

/// The completed compaction a new row at boundary `?2` of session `?1`
/// folds in: the session's newest below it, or a fork's base.
const PREVIOUS: &str = "coalesce((SELECT id FROM compactions WHERE session_id = ?1 \
     AND status = 'completed' AND up_to_turn_index < ?2 ORDER BY up_to_turn_index DESC LIMIT 1), \
     (SELECT c.id FROM sessions s JOIN compactions c ON c.id = s.base_compaction_id \
     WHERE s.id = ?1 AND c.up_to_turn_index < ?2))";

/// The id of turn `?2` of session `?1` as one row (NULL: no such turn): the
/// session's own, or a fork's ancestor's at or before its fork point.
const BOUNDARY_TURN: &str =
    "(SELECT coalesce((SELECT id FROM turns WHERE session_id = ?1 AND idx = ?2), \
     (SELECT t.id FROM session_lineage l JOIN turns t ON t.session_id = l.owner_id AND t.idx = ?2 \
     WHERE l.session_id = ?1 AND l.after_idx < ?2 AND l.upto_idx >= ?2)) AS turn_id)";

pub(crate) fn claim_compaction(
    conn: &mut Connection,
    c: &Claim<'_>,
    owner_is_dead: &dyn Fn(&str) -> bool,
) -> Result<ClaimOutcome> {
    let tx = write_tx(conn)?;
    let now = tx.now_ms();
    // The new row comes back with the insert (one request); a row already
    // there is read.
    let sql = sql_once!(
        "INSERT INTO compactions (id, session_id, up_to_turn_index, up_to_turn_id, \
             previous_id, status, trigger, focus, attempts, lease_owner, lease_expires_at, \
             trigger_tokens, created_at, background, threshold_tokens, soft_threshold_tokens) \
             SELECT {}, ?1, ?2, b.turn_id, {PREVIOUS}, \
               'pending', ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9, ?10, ?11 \
             FROM {BOUNDARY_TURN} b WHERE b.turn_id IS NOT NULL \
             ON CONFLICT (session_id, up_to_turn_index) DO NOTHING RETURNING {}",
        crate::store::next_id!("compactions"),
        CompactionRow::COLUMNS
    );
    let new = tx
        .prepare_cached(sql)?
        .query_row(
            params![
                c.session_id,
                c.boundary,
                c.trigger,
                c.focus,
                c.owner,
                now + c.ttl_ms,
                c.trigger_tokens,
                now,
                c.background,
                c.thresholds.hard,
                c.thresholds.soft
            ],
            CompactionRow::from_row,
        )
        .optional()?;
    let inserted = new.is_some();
    let row = match new {
        Some(row) => row,
        None => {
            compaction_at(&tx, c.session_id, c.boundary)?.ok_or_else(|| Error::TurnConflict {
                session_id: c.session_id,
                idx: c.boundary,
                reason: "no such turn to compact up to".into(),
            })?
        }
    };
    let outcome = if inserted {
        ClaimOutcome::Claimed(row)
    } else {
        match row.status {
            CompactionStatus::Completed => ClaimOutcome::AlreadyCompleted(row),
            CompactionStatus::Failed => ClaimOutcome::Failed(row),
            CompactionStatus::Pending => {
                if !held_by_live_other(&row, c.owner, now, owner_is_dead) {
                    tx.prepare_cached(
                        "UPDATE compactions SET lease_owner = ?1, lease_expires_at = ?2, \
                         attempts = attempts + 1 WHERE id = ?3 AND status = 'pending'",
                    )?
                    .execute(params![c.owner, now + c.ttl_ms, row.id])?;
                    ClaimOutcome::TakenOver(get_compaction(&tx, row.id)?)
                } else {
                    ClaimOutcome::HeldByLiveOther(row)
                }
            }
        }
    };
    tx.commit()?;
    Ok(outcome)
}

/// Records a pending row at (session, boundary) for another process to
/// summarise (background compaction served elsewhere): unleased, so the
/// first server (or a step at the hard threshold) claims it. Under the same
/// UNIQUE index as a claim: a row already there is left as it is. Returns
/// whether this call inserted it.
pub(crate) fn enqueue_compaction(
    conn: &mut Connection,
    session_id: SessionId,
    boundary: i64,
    trigger_tokens: Option<i64>,
    thresholds: Thresholds,
) -> Result<bool> {
    let tx = write_tx(conn)?;
    let sql = sql_once!(
        "INSERT INTO compactions (id, session_id, up_to_turn_index, up_to_turn_id, previous_id, \
             status, trigger, attempts, trigger_tokens, created_at, background, threshold_tokens, \
             soft_threshold_tokens) \
             SELECT {}, ?1, ?2, b.turn_id, {PREVIOUS}, \
               'pending', 'auto', 0, ?3, ?4, 1, ?5, ?6 \
             FROM {BOUNDARY_TURN} b WHERE b.turn_id IS NOT NULL \
             ON CONFLICT (session_id, up_to_turn_index) DO NOTHING",
        crate::store::next_id!("compactions")
    );
    let n = tx.prepare_cached(sql)?.execute(params![
        session_id,
        boundary,
        trigger_tokens,
        tx.now_ms(),
        thresholds.hard,
        thresholds.soft
    ])?;
    tx.commit()?;
    Ok(n == 1)
}

/// The session's pending row at the highest boundary, if any.
pub(crate) fn newest_pending(
    conn: &Connection,
    session_id: SessionId,
) -> Result<Option<CompactionRow>> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM compactions WHERE session_id = ?1 AND status = 'pending' \
             ORDER BY up_to_turn_index DESC LIMIT 1",
        CompactionRow::COLUMNS
    ))?
    .query_row(params![session_id], CompactionRow::from_row)
    .optional()
}

/// Every pending row of the store, oldest first: what a background server
/// looks at (it claims only those no live other holds).
pub(crate) fn pending_compactions(conn: &Connection) -> Result<Vec<CompactionRow>> {
    let mut st = conn.prepare_cached(sql_once!(
        "SELECT {} FROM compactions WHERE status = 'pending' ORDER BY created_at, id",
        CompactionRow::COLUMNS
    ))?;
    let rows = st.query_map([], CompactionRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Extends a pending row's lease while its holder is still summarising.
/// Returns false when the row is no longer pending or held by someone else.
pub(crate) fn renew_compaction_lease(
    conn: &mut Connection,
    id: CompactionId,
    owner: &str,
    ttl_ms: i64,
) -> Result<bool> {
    let tx = write_tx(conn)?;
    let n = tx.execute(
        "UPDATE compactions SET lease_expires_at = ?1 \
         WHERE id = ?2 AND status = 'pending' AND lease_owner = ?3",
        params![tx.now_ms() + ttl_ms, id, owner],
    )?;
    tx.commit()?;
    Ok(n == 1)
}

/// Completes a pending row. First completion wins (G2): the UPDATE only matches a
/// `pending` row, so a late or stale completer changes nothing, discards its
/// draft and gets the winner's row back. Returns (row, won).
pub(crate) fn complete_compaction(
    conn: &mut Connection,
    id: CompactionId,
    summary: &str,
    stats: &CompactionStats,
    redaction: i64,
) -> Result<(CompactionRow, bool)> {
    let tx = write_tx(conn)?;
    // The completed row comes back with the update (one request), or is
    // read when another completion won.
    let sql = sql_once!(
        "UPDATE compactions SET status = 'completed', summary = ?1, summary_sha256 = ?11, \
             model = ?2, prompt_sha256 = ?3, tokens_before = ?4, tokens_after = ?5, \
             input_tokens = ?6, output_tokens = ?7, summary_calls = ?8, completed_at = ?9, \
             lease_expires_at = NULL, error = NULL, pins_live = ?12, pins_added = ?13, \
             pins_window = ?14 \
             WHERE id = ?10 AND status = 'pending' AND ?15 = \
               (SELECT coalesce(max(r.id), 0) FROM redactions r \
                WHERE r.session_id = compactions.session_id) \
             RETURNING {}",
        CompactionRow::COLUMNS
    );
    let won = tx
        .prepare_cached(sql)?
        .query_row(
            params![
                summary,
                stats.model,
                stats.prompt_sha256,
                stats.tokens_before,
                stats.tokens_after,
                stats.input_tokens,
                stats.output_tokens,
                stats.summary_calls,
                tx.now_ms(),
                id,
                crate::message::sha256_hex(summary.as_bytes()),
                stats.pins_live,
                stats.pins_added,
                stats.pins_window,
                redaction
            ],
            CompactionRow::from_row,
        )
        .optional()?;
    let (row, completed) = match won {
        Some(row) => (row, true),
        None => (get_compaction(&tx, id)?, false),
    };
    tx.commit()?;
    Ok((row, completed))
}

/// Marks a pending row failed with `error`, if `owner` still holds it.
pub(crate) fn fail_compaction(
    conn: &mut Connection,
    id: CompactionId,
    owner: &str,
    error: &str,
) -> Result<CompactionRow> {
    let tx = write_tx(conn)?;
    tx.execute(
        "UPDATE compactions SET status = 'failed', error = ?1, lease_expires_at = NULL \
         WHERE id = ?2 AND status = 'pending' AND lease_owner = ?3",
        params![error, id, owner],
    )?;
    let row = get_compaction(&tx, id)?;
    tx.commit()?;
    Ok(row)
}

/// Records the last error of an attempt on a pending row (without failing it).
pub(crate) fn note_compaction_error(
    conn: &mut Connection,
    id: CompactionId,
    error: &str,
) -> Result<()> {
    let tx = write_tx(conn)?;
    tx.execute(
        "UPDATE compactions SET error = ?1 WHERE id = ?2 AND status = 'pending'",
        params![error, id],
    )?;
    tx.commit()?;
    Ok(())
}

/// Re-arms a failed boundary so the next ensure() or compact_now() claims it.
/// Returns false when the row was not failed.
pub(crate) fn retry_compaction(
    conn: &mut Connection,
    session_id: SessionId,
    boundary: i64,
) -> Result<bool> {
    let tx = write_tx(conn)?;
    let n = tx.execute(
        "UPDATE compactions SET status = 'pending', lease_owner = NULL, lease_expires_at = 0 \
         WHERE session_id = ?1 AND up_to_turn_index = ?2 AND status = 'failed'",
        params![session_id, boundary],
    )?;
    tx.commit()?;
    Ok(n == 1)
}
