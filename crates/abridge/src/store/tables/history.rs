//! Loading the rows a message array is built from.
//!
//! Three range queries, whatever the history's length: the turns, their
//! completed steps, and those steps' finished tool invocations.

use crate::error::Result;
use crate::ids::{SessionId, StepId, TurnId};
use crate::store::db::Connection;
use rusqlite::params;

/// A completed step as the message builder sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryStep {
    /// Step index in its turn.
    pub idx: i64,
    /// The stored response JSON.
    pub response: String,
    /// Finished invocations: (tool_call_id, result, is_error), in position order.
    pub results: Vec<(String, String, bool)>,
}

/// A turn as the message builder sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryTurn {
    /// Turn index.
    pub idx: i64,
    /// The user's input.
    pub input: String,
    /// Completed steps, in order.
    pub steps: Vec<HistoryStep>,
}

/// Loads turns `after_idx < idx <= upto_idx` of a session with their completed
/// steps; for turn `upto_idx` only the steps before `before_step_idx`.
///
/// Every row read here is final (completed steps and finished invocations are
/// never updated), which is what makes a rebuild byte-identical (G3).
pub(crate) fn load_history(
    conn: &Connection,
    session_id: SessionId,
    after_idx: i64,
    upto_idx: i64,
    before_step_idx: i64,
) -> Result<Vec<HistoryTurn>> {
    load_range(
        conn,
        session_id,
        (after_idx + 1, 0),
        (upto_idx, before_step_idx),
    )
}

/// `branch` alone (the session's own turns: a migration's hook runs before
/// lineage exists, and a turn's own pins read its own rows), or
/// [`over_lineage`].
fn own_or_lineage(lineage: bool, branch: &str) -> String {
    if lineage {
        over_lineage(branch)
    } else {
        branch.to_string()
    }
}

/// A query over a session's turns, made to read a fork's too: `branch`
/// reads `FROM turns t ... WHERE t.session_id = ?1 ...`; the result is that
/// query (the session's own turns) and, joined by `UNION ALL`, the same query
/// over the turns its lineage names (a fork's ancestors', each up to the
/// turn the fork reads; nothing for a session that is not a fork). An
/// ORDER BY after it names result columns by position.
///
/// The ancestors' half is gated by whether the session has a lineage at
/// all, a condition on the parameters alone: PostgreSQL evaluates it once,
/// before the half runs (a one-time filter), and skips the half for a
/// session that is not a fork whatever plan it chose for it. A plan
/// prepared while a new store's tables were nearly empty, and kept by the
/// connection for every later run, would otherwise scan every step of the
/// store for a half that finds nothing (the step bench on PostgreSQL grew
/// 2-3.5x from H = 100 to H = 1,000 through the compactions' reads).
pub(crate) fn over_lineage(branch: &str) -> String {
    debug_assert!(branch.contains("FROM turns t") && branch.contains("t.session_id = ?1"));
    let ancestors = branch
        .replacen(
            "FROM turns t",
            "FROM session_lineage l JOIN turns t ON t.session_id = l.owner_id \
             AND t.idx > l.after_idx AND t.idx <= l.upto_idx",
            1,
        )
        .replacen(
            "t.session_id = ?1",
            "l.session_id = ?1 AND EXISTS (SELECT 1 FROM session_lineage g WHERE g.session_id = ?1)",
            1,
        );
    format!("{branch} UNION ALL {ancestors}")
}

/// The completed steps of a range (see [`load_range`]).
fn range_steps_sql(lineage: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(lineage)].get_or_init(|| {
        format!(
            "{} ORDER BY 5, 3",
            own_or_lineage(
                lineage,
                "SELECT s.id, s.turn_id, s.idx, s.response, t.idx FROM turns t \
                 JOIN steps s ON s.turn_id = t.id \
                 WHERE t.session_id = ?1 AND t.idx >= ?2 AND t.idx <= ?3 AND s.status = 'completed' \
                 AND (t.idx < ?3 OR s.idx < ?4) AND (t.idx > ?2 OR s.idx >= ?5)"
            )
        )
    })
}

/// The tool results of those steps.
fn range_results_sql(lineage: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(lineage)].get_or_init(|| {
        format!(
            "{} ORDER BY 5, 6, 7",
            own_or_lineage(
                lineage,
                "SELECT i.step_id, i.tool_call_id, i.status, i.result, t.idx, s.idx, i.position \
                 FROM turns t JOIN steps s ON s.turn_id = t.id JOIN tool_invocations i ON i.step_id = s.id \
                 WHERE t.session_id = ?1 AND t.idx >= ?2 AND t.idx <= ?3 AND s.status = 'completed' \
                 AND (t.idx < ?3 OR s.idx < ?4) AND (t.idx > ?2 OR s.idx >= ?5) \
                 AND i.status <> 'started'"
            )
        )
    })
}

/// The turns of a range.
fn range_turns_sql(lineage: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[usize::from(lineage)].get_or_init(|| {
        format!(
            "{} ORDER BY 2",
            own_or_lineage(
                lineage,
                "SELECT t.id, t.idx, t.input FROM turns t \
                 WHERE t.session_id = ?1 AND t.idx >= ?2 AND t.idx <= ?3"
            )
        )
    })
}

/// Queues [`load_range_from`]'s three reads (see [`Connection::prefetch`]):
/// a caller that knows the range before its read transaction's first
/// request sends them with it. `own_from` as there.
pub(crate) fn prefetch_range(
    conn: &Connection,
    session_id: SessionId,
    from: (i64, i64),
    to: (i64, i64),
    own_from: i64,
) -> Result<()> {
    let lineage = from.0 < own_from;
    let bounds = params![session_id, from.0, to.0, to.1, from.1];
    conn.prefetch(range_steps_sql(lineage), bounds)?;
    conn.prefetch(range_results_sql(lineage), bounds)?;
    conn.prefetch(range_turns_sql(lineage), params![session_id, from.0, to.0])
}

/// [`load_range`] for a caller that knows the session's first own turn
/// (`SessionRow::first_own_turn`: 0 unless it is a fork): a range that
/// starts there or later holds only the session's own turns, and is read
/// without the query's half over a fork's ancestors. That half costs a
/// lookup that finds nothing, and a server that plans it from the
/// statistics of a new store's empty tables reads every step of the store
/// for it.
pub(crate) fn load_range_from(
    conn: &Connection,
    session_id: SessionId,
    from: (i64, i64),
    to: (i64, i64),
    own_from: i64,
) -> Result<Vec<HistoryTurn>> {
    load_range_of(conn, session_id, from, to, from.0 < own_from)
}

/// Loads the rows between two positions `(turn idx, step idx)` of a session:
/// turns `from.0 ..= to.0` with their completed steps, in turn `from.0` only
/// the steps from `from.1` on, in turn `to.0` only those before `to.1`. The
/// first turn's input is loaded too; a caller continuing a message array
/// inside that turn skips it.
///
/// A fork's range reads its ancestors' turns up to its fork point where
/// they are (see [`over_lineage`]).
pub(crate) fn load_range(
    conn: &Connection,
    session_id: SessionId,
    from: (i64, i64),
    to: (i64, i64),
) -> Result<Vec<HistoryTurn>> {
    load_range_of(conn, session_id, from, to, true)
}

/// One turn of the session's own (never an ancestor's), with its completed
/// steps: what a finished turn's facts are pinned from, also inside a
/// migration that runs before forks exist.
pub(crate) fn load_own_turn(
    conn: &Connection,
    session_id: SessionId,
    turn_index: i64,
) -> Result<Vec<HistoryTurn>> {
    load_range_of(
        conn,
        session_id,
        (turn_index, 0),
        (turn_index, i64::MAX),
        false,
    )
}

fn load_range_of(
    conn: &Connection,
    session_id: SessionId,
    from: (i64, i64),
    to: (i64, i64),
    lineage: bool,
) -> Result<Vec<HistoryTurn>> {
    let (from_idx, from_step) = from;
    let (upto_idx, before_step_idx) = to;
    let mut turns: Vec<(TurnId, HistoryTurn)> = Vec::new();
    // The same range bounds for the steps and their invocations.
    let bounds = params![session_id, from_idx, upto_idx, before_step_idx, from_step];
    // The three reads depend on nothing read before them: on PostgreSQL
    // they share one round trip.
    conn.prefetch(range_steps_sql(lineage), bounds)?;
    conn.prefetch(range_results_sql(lineage), bounds)?;
    {
        let mut st = conn.prepare_cached(range_turns_sql(lineage))?;
        let mut rows = st.query(params![session_id, from_idx, upto_idx])?;
        while let Some(r) = rows.next()? {
            turns.push((
                r.get(0)?,
                HistoryTurn {
                    idx: r.get(1)?,
                    input: r.get(2)?,
                    steps: Vec::new(),
                },
            ));
        }
    }
    if turns.is_empty() {
        return Ok(Vec::new());
    }
    // turn id -> position in `turns`
    let first_turn = turns[0].0;
    let pos_of = |turn_id: TurnId, turns: &[(TurnId, HistoryTurn)]| -> Option<usize> {
        // Turn ids grow with idx inside a session, but other sessions interleave,
        // so search rather than offset.
        let guess = (turn_id.0 - first_turn.0) as usize;
        if guess < turns.len() && turns[guess].0 == turn_id {
            return Some(guess);
        }
        turns.binary_search_by_key(&turn_id, |t| t.0).ok()
    };
    // (step id, turn position, step position in its turn), in query order.
    let mut step_ids: Vec<(StepId, usize, usize)> = Vec::new();
    {
        let mut st = conn.prepare_cached(range_steps_sql(lineage))?;
        let mut rows = st.query(bounds)?;
        while let Some(r) = rows.next()? {
            let turn_id: TurnId = r.get(1)?;
            if let Some(p) = pos_of(turn_id, &turns) {
                step_ids.push((r.get(0)?, p, turns[p].1.steps.len()));
                turns[p].1.steps.push(HistoryStep {
                    idx: r.get(2)?,
                    response: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                    results: Vec::new(),
                });
            }
        }
    }
    if !step_ids.is_empty() {
        let mut st = conn.prepare_cached(range_results_sql(lineage))?;
        let mut rows = st.query(bounds)?;
        // Steps come in the same order as `step_ids`; walk both together.
        let mut cursor = 0usize;
        while let Some(r) = rows.next()? {
            let step_id: StepId = r.get(0)?;
            while cursor < step_ids.len() && step_ids[cursor].0 != step_id {
                cursor += 1;
            }
            let Some(&(_, p, q)) = step_ids.get(cursor) else {
                break;
            };
            let status: String = r.get(2)?;
            turns[p].1.steps[q].results.push((
                r.get(1)?,
                r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                status == "failed",
            ));
        }
    }
    Ok(turns.into_iter().map(|(_, t)| t).collect())
}

/// The plans a PostgreSQL connection keeps, on the server
/// `ABRIDGE_TEST_POSTGRES` names (skipped without it).
#[cfg(all(test, feature = "postgres"))]
mod pg_plan_tests {
    use super::*;

    /// A plan made for a read over a session's turns while the store was
    /// empty, then kept by the connection (a generic plan, as PostgreSQL
    /// settles on after a few runs), does not read the store's steps for
    /// the half over a fork's ancestors when the session is not a fork: it
    /// scanned every step of the store at every run before the half was
    /// gated, and a step's compactions and rebuilds grew with the history.
    #[test]
    fn a_kept_plan_reads_no_ancestors_for_a_session_that_is_not_a_fork() {
        let Some((store, _)) = crate::store::pg::pipeline_tests::fresh_store("kept_plan") else {
            return;
        };
        let sid = SessionId(1);
        // Steps read by sequential scans in this transaction, so far.
        let seq_read = |c: &Connection| -> Result<i64> {
            c.query_row(
                "SELECT pg_stat_get_xact_tuples_returned('steps'::regclass)",
                [],
                |r| r.get(0),
            )
        };
        store
            .with_conn(|c| {
                // Every plan generic, made at a statement's first run: here,
                // on empty tables.
                c.execute_batch(
                    "SET plan_cache_mode = force_generic_plan;
                     INSERT INTO sessions (id, external_id, model, system_prompt, created_at)
                       VALUES (1, 's', 'm', 'p', 0), (2, 'other', 'm', 'p', 0);
                     INSERT INTO turns (id, session_id, idx, input, status, created_at)
                       VALUES (1, 1, 0, 'a', 'completed', 0);
                     INSERT INTO steps (turn_id, idx, status, response, created_at)
                       VALUES (1, 0, 'completed', 'r', 0);",
                )?;
                let turns = c.in_read_tx(|c| load_range(c, sid, (0, 0), (0, i64::MAX)))?;
                assert_eq!(turns.len(), 1);
                // The store grows: another session's 3,000 steps.
                c.execute_batch(
                    "INSERT INTO turns (id, session_id, idx, input, status, created_at)
                       SELECT 1 + g, 2, g, 'b', 'completed', 0 FROM generate_series(1, 1000) g;
                     INSERT INTO steps (turn_id, idx, status, response, created_at)
                       SELECT 1 + g, k, 'completed', 'r', 0
                       FROM generate_series(1, 1000) g, generate_series(0, 2) k;",
                )?;
                c.in_read_tx(|c| {
                    let before = seq_read(c)?;
                    let turns = load_range(c, sid, (0, 0), (0, i64::MAX))?;
                    assert_eq!(turns.len(), 1);
                    assert_eq!(turns[0].steps.len(), 1);
                    let read = seq_read(c)? - before;
                    assert_eq!(read, 0, "{read} steps read by sequential scans");
                    Ok(())
                })
            })
            .unwrap();
    }
}
