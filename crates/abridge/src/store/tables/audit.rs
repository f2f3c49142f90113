//! Counts and checks over whole tables, for `inspect` and `verify`.

use crate::error::Result;
use crate::ids::{CompactionId, InvocationId, SessionId, StepId};
use crate::store::db::Connection;
use crate::store::rows::*;
use rusqlite::params;

/// Counts for one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionCounts {
    /// Turns.
    pub turns: i64,
    /// Turns completed.
    pub turns_completed: i64,
    /// Turns failed.
    pub turns_failed: i64,
    /// Steps.
    pub steps: i64,
    /// Tool invocations.
    pub tool_calls: i64,
    /// Completed compactions.
    pub compactions_completed: i64,
    /// Failed compactions.
    pub compactions_failed: i64,
    /// Context tokens of the newest executed step.
    pub context_tokens: Option<i64>,
    /// Input tokens of the steps whose provider reported its prompt cache
    /// (None: no step did).
    pub cache_input_tokens: Option<i64>,
    /// Of those, read from the provider's prompt cache.
    pub cache_read_tokens: Option<i64>,
    /// Of those, written to the provider's prompt cache.
    pub cache_write_tokens: Option<i64>,
}

impl SessionCounts {
    /// The share of input tokens served from the provider's prompt cache,
    /// over the steps that reported it (None: none did).
    pub fn cached_input_share(&self) -> Option<f64> {
        match (self.cache_read_tokens, self.cache_input_tokens) {
            (Some(read), Some(input)) if input > 0 => Some(read as f64 / input as f64),
            _ => None,
        }
    }
}

/// Steps of a session that waited for a summary, and their waits summed (ms).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn summary_waits(conn: &Connection, session_id: SessionId) -> Result<(i64, i64)> {
    conn.query_row(
        "SELECT count(s.summary_wait_ms), coalesce(sum(s.summary_wait_ms), 0) \
         FROM steps s JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?1",
        [session_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

pub(crate) fn session_counts(conn: &Connection, session_id: SessionId) -> Result<SessionCounts> {
    conn.query_row(
        "SELECT
           (SELECT count(*) FROM turns WHERE session_id = ?1),
           (SELECT count(*) FROM turns WHERE session_id = ?1 AND status = 'completed'),
           (SELECT count(*) FROM turns WHERE session_id = ?1 AND status = 'failed'),
           (SELECT count(*) FROM steps s JOIN turns t ON s.turn_id = t.id WHERE t.session_id = ?1),
           (SELECT count(*) FROM tool_invocations i JOIN steps s ON i.step_id = s.id
              JOIN turns t ON s.turn_id = t.id WHERE t.session_id = ?1),
           (SELECT count(*) FROM compactions WHERE session_id = ?1 AND status = 'completed'),
           (SELECT count(*) FROM compactions WHERE session_id = ?1 AND status = 'failed'),
           (SELECT s.context_tokens FROM steps s JOIN turns t ON s.turn_id = t.id
              WHERE t.session_id = ?1 AND s.context_tokens IS NOT NULL
              ORDER BY t.idx DESC, s.idx DESC LIMIT 1),
           c.input, c.read, c.write
         FROM (SELECT sum(s.input_tokens) AS input, sum(coalesce(s.cache_read_tokens, 0)) AS read,
                      sum(coalesce(s.cache_write_tokens, 0)) AS write
                 FROM steps s JOIN turns t ON s.turn_id = t.id
                WHERE t.session_id = ?1
                  AND (s.cache_read_tokens IS NOT NULL OR s.cache_write_tokens IS NOT NULL)) c",
        [session_id],
        |r| {
            Ok(SessionCounts {
                turns: r.get(0)?,
                turns_completed: r.get(1)?,
                turns_failed: r.get(2)?,
                steps: r.get(3)?,
                tool_calls: r.get(4)?,
                compactions_completed: r.get(5)?,
                compactions_failed: r.get(6)?,
                context_tokens: r.get(7)?,
                cache_input_tokens: r.get(8)?,
                cache_read_tokens: r.get::<_, Option<i64>>(8)?.and(r.get(9)?),
                cache_write_tokens: r.get::<_, Option<i64>>(8)?.and(r.get(10)?),
            })
        },
    )
}

/// Ids of every executed step (one with a recorded hash), optionally of one session.
pub(crate) fn executed_step_ids(
    conn: &Connection,
    session_id: Option<SessionId>,
) -> Result<Vec<StepId>> {
    let mut st = conn.prepare(
        "SELECT s.id FROM steps s JOIN turns t ON s.turn_id = t.id \
         WHERE s.messages_sha256 IS NOT NULL AND (CAST(?1 AS BIGINT) IS NULL OR t.session_id = ?1) ORDER BY s.id",
    )?;
    let rows = st.query_map(params![session_id], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every compaction row.
pub(crate) fn all_compactions(conn: &Connection) -> Result<Vec<CompactionRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM compactions ORDER BY session_id, up_to_turn_index",
        CompactionRow::COLUMNS
    ))?;
    let rows = st.query_map([], CompactionRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// (session_id, up_to_turn_index, count) groups with more than one row: only
/// possible if the unique index was dropped.
pub(crate) fn duplicate_boundaries(conn: &Connection) -> Result<Vec<DuplicateBoundary>> {
    let mut st = conn.prepare(
        "SELECT session_id, up_to_turn_index, count(*) FROM compactions \
         GROUP BY session_id, up_to_turn_index HAVING count(*) > 1",
    )?;
    let rows = st.query_map([], |r| {
        Ok(DuplicateBoundary {
            session_id: r.get(0)?,
            boundary: r.get(1)?,
            rows: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A boundary with more than one compaction row (a G1 violation).
pub(crate) struct DuplicateBoundary {
    pub session_id: SessionId,
    pub boundary: i64,
    pub rows: i64,
}

/// A step that recorded a compaction which is not completed (a G4 violation).
pub(crate) struct DraftRead {
    pub step_id: StepId,
    pub compaction_id: CompactionId,
    pub status: String,
}

/// Steps that recorded a compaction which is not completed.
pub(crate) fn steps_reading_non_completed(conn: &Connection) -> Result<Vec<DraftRead>> {
    let mut st = conn.prepare(
        "SELECT s.id, c.id, c.status FROM steps s JOIN compactions c ON s.compaction_id = c.id \
         WHERE c.status <> 'completed'",
    )?;
    let rows = st.query_map([], |r| {
        Ok(DraftRead {
            step_id: r.get(0)?,
            compaction_id: r.get(1)?,
            status: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Invocation rows that break G5.
#[derive(Debug, Default)]
pub(crate) struct InvocationAnomalies {
    /// Invocations of completed steps that never finished.
    pub unfinished: Vec<InvocationId>,
    /// (step, call id) recorded more than once.
    pub duplicated: Vec<(StepId, String)>,
}

/// Tool invocations of completed steps that never finished (a completed step
/// must have every invocation recorded), and duplicated (step, call id) rows.
pub(crate) fn invocation_anomalies(conn: &Connection) -> Result<InvocationAnomalies> {
    let mut st = conn.prepare(
        "SELECT i.id FROM tool_invocations i JOIN steps s ON i.step_id = s.id \
         WHERE s.status = 'completed' AND i.status = 'started'",
    )?;
    let unfinished = st
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut st = conn.prepare(
        "SELECT step_id, tool_call_id FROM tool_invocations GROUP BY step_id, tool_call_id HAVING count(*) > 1",
    )?;
    let duplicated = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(InvocationAnomalies {
        unfinished,
        duplicated,
    })
}

/// Counts: (steps executed, tool invocations).
pub(crate) fn invocation_count(conn: &Connection) -> Result<i64> {
    conn.query_row("SELECT count(*) FROM tool_invocations", [], |r| r.get(0))
}

/// `PRAGMA integrity_check`: the lines it reports ("ok" when sound).
pub(crate) fn integrity_check(conn: &Connection) -> Result<Vec<String>> {
    #[cfg(feature = "postgres")]
    if conn.kind() == crate::store::BackendKind::Postgres {
        return crate::store::pg::rules_in_place(conn);
    }
    let mut st = conn.prepare("PRAGMA integrity_check")?;
    let rows = st.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// (sessions, turns, turns failed, completed compactions) of the whole store.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn run_totals(conn: &Connection) -> Result<(i64, i64, i64, i64)> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM turns), \
                (SELECT count(*) FROM turns WHERE status = 'failed'), \
                (SELECT count(*) FROM compactions WHERE status = 'completed')",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}

/// (completed compactions made in the background, steps that waited for a summary).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn background_totals(conn: &Connection) -> Result<(i64, i64)> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM compactions WHERE status = 'completed' AND background = 1), \
                (SELECT count(*) FROM steps WHERE summary_wait_ms IS NOT NULL)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// (turns whose lease was taken more than once, compactions claimed more than once).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn takeovers(conn: &Connection) -> Result<(i64, i64)> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM turns WHERE lease_epoch > 1), \
                (SELECT count(*) FROM compactions WHERE attempts > 1)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Finished (completed or failed) turns of the session with this external id,
/// 0 when it does not exist yet.
pub fn finished_turns(conn: &Connection, external_id: &str) -> Result<i64> {
    conn.prepare_cached(
        "SELECT count(*) FROM turns t JOIN sessions s ON t.session_id = s.id \
             WHERE s.external_id = ?1 AND t.status <> 'running'",
    )?
    .query_row([external_id], |r| r.get(0))
}
