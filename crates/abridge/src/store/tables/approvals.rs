//! Parked tool calls: the `approvals` row a call that needs a decision (or a
//! deferred tool's call) gets instead of running, the decision that moves it
//! from `pending` once, the "always allow" grants, and parking a turn.

use crate::error::{Error, Result};
use crate::ids::{CallId, SessionId, StepId, TurnId};
use crate::store::db::{Connection, OptionalExtension, Transaction};
use crate::store::leases::*;
use crate::store::rows::*;
use crate::store::write_tx;
use rusqlite::params;

/// A call to park.
#[derive(Debug, Clone)]
pub(crate) struct NewApproval<'a> {
    pub session_id: SessionId,
    pub turn_id: TurnId,
    pub step_id: StepId,
    pub position: i64,
    pub tool_call_id: &'a str,
    pub tool_name: &'a str,
    pub arguments: String,
    pub effect: &'a str,
    pub kind: ApprovalKind,
}

/// What a decision says. The first one taken for a call wins; it never changes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Decision {
    /// Run the call, with these arguments instead of the model's when given
    /// (recorded as edited); with `always`, every later call of the same
    /// tool in the session runs without asking (recorded with this decision).
    Approve {
        /// Edited arguments (a JSON object), or None for the model's.
        input: Option<serde_json::Value>,
        /// Always allow this tool in this session.
        always: bool,
    },
    /// Do not run it: the model sees `reason` as the tool's (error) result.
    Reject {
        /// What the model is told.
        reason: String,
    },
    /// A deferred tool's result, delivered: the model sees `result` as the
    /// tool's result (`ok: false`, an error result).
    Deliver {
        /// The result text.
        result: String,
        /// Whether it is a success.
        ok: bool,
    },
}

impl Decision {
    /// Approve as the model wrote the call.
    pub fn approve() -> Decision {
        Decision::Approve {
            input: None,
            always: false,
        }
    }

    /// Reject, telling the model `reason`.
    pub fn reject(reason: impl Into<String>) -> Decision {
        Decision::Reject {
            reason: reason.into(),
        }
    }

    /// Deliver a successful result.
    pub fn deliver(result: impl Into<String>) -> Decision {
        Decision::Deliver {
            result: result.into(),
            ok: true,
        }
    }
}

/// The parked-call row of a step's call, if it has one.
pub(crate) fn approval_for_call(
    conn: &Connection,
    step_id: StepId,
    tool_call_id: &str,
) -> Result<Option<ApprovalRow>> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM approvals WHERE step_id = ?1 AND tool_call_id = ?2",
        ApprovalRow::COLUMNS
    ))?
    .query_row(params![step_id, tool_call_id], ApprovalRow::from_row)
    .optional()
}

/// A parked call's row by id, over a connection (a read-only snapshot's
/// too).
pub fn get_approval(conn: &Connection, id: CallId) -> Result<ApprovalRow> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM approvals WHERE id = ?1",
        ApprovalRow::COLUMNS
    ))?
    .query_row([id], ApprovalRow::from_row)
    .optional()?
    .ok_or(Error::UnknownCall { call: id })
}

/// The decision that granted "always allow" for `tool` in the session, if one did.
pub(crate) fn granted(
    conn: &Connection,
    session_id: SessionId,
    tool: &str,
) -> Result<Option<CallId>> {
    conn.prepare_cached(
        "SELECT approval_id FROM approval_grants WHERE session_id = ?1 AND tool_name = ?2",
    )?
    .query_row(params![session_id, tool], |r| r.get(0))
    .optional()
}

/// Parks a call inside the step's fenced transaction: its row, `pending`
/// (or `approved` by the grant of the decision `granted`), unless it has
/// one already.
///
/// Claim semantics: UNIQUE(step_id, tool_call_id); the existing row is
/// returned as it is, with false.
pub(crate) fn park_call(
    tx: &Transaction<'_>,
    new: &NewApproval<'_>,
    granted: Option<CallId>,
) -> Result<(ApprovalRow, bool)> {
    let now = tx.now_ms();
    let (status, by, decided_at) = match granted {
        Some(by) => (
            "approved",
            Some(format!("always allowed (call {by})")),
            Some(now),
        ),
        None => ("pending", None, None),
    };
    let inserted = tx.execute(
        "INSERT INTO approvals (session_id, turn_id, step_id, position, tool_call_id, tool_name, \
         arguments, effect, kind, status, decided_by, created_at, decided_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
         ON CONFLICT (step_id, tool_call_id) DO NOTHING",
        params![
            new.session_id,
            new.turn_id,
            new.step_id,
            new.position,
            new.tool_call_id,
            new.tool_name,
            new.arguments,
            new.effect,
            new.kind.as_str(),
            status,
            by,
            now,
            decided_at
        ],
    )? == 1;
    let row = approval_for_call(tx, new.step_id, new.tool_call_id)?.ok_or(Error::NoRow)?;
    Ok((row, inserted))
}

/// Parks the leased turn: its lease released (no process holds a parked
/// turn), inside the step's fenced transaction. The turn stays `running`.
pub(crate) fn park_turn(tx: &Transaction<'_>, lease: &Lease) -> Result<()> {
    tx.execute(
        "UPDATE turns SET lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = ?1 AND lease_epoch = ?2 AND status = 'running'",
        params![lease.turn_id, lease.epoch],
    )?;
    Ok(())
}

/// Takes a decision for a call, in one IMMEDIATE transaction.
///
/// Claim semantics: `UPDATE … WHERE status = 'pending'`: the first decision
/// wins. A call decided before is [`Error::AlreadyDecided`] naming that
/// decision; one that does not exist, [`Error::UnknownCall`]; a decision
/// that does not fit it, [`Error::WrongDecision`]. `always` also records
/// the session's grant for the tool, in the same transaction.
pub(crate) fn decide(
    conn: &mut Connection,
    id: CallId,
    decision: &Decision,
    by: Option<&str>,
) -> Result<ApprovalRow> {
    let tx = write_tx(conn)?;
    let row = get_approval(&tx, id)?;
    let wrong = |reason: &str| {
        Err(Error::WrongDecision {
            call: id,
            reason: reason.to_string(),
        })
    };
    if row.status != ApprovalStatus::Pending {
        return Err(Error::AlreadyDecided {
            call: id,
            status: row.status.to_string(),
            by: row.decided_by,
        });
    }
    let (status, input, note, ok, always) = match decision {
        Decision::Approve { input, always } => {
            if row.kind != ApprovalKind::Approval {
                return wrong(
                    "it waits for a delivered result, not an approval (deliver or reject it)",
                );
            }
            let input = match input {
                Some(v) if !v.is_object() => {
                    return wrong("edited arguments must be a JSON object")
                }
                Some(v) => Some(v.to_string()),
                None => None,
            };
            ("approved", input, None, None, *always)
        }
        Decision::Reject { reason } => ("rejected", None, Some(reason.clone()), None, false),
        Decision::Deliver { result, ok } => {
            if row.kind != ApprovalKind::Result {
                return wrong("it waits for an approval, not a result (approve or reject it)");
            }
            (
                "delivered",
                None,
                Some(result.clone()),
                Some(*ok as i64),
                false,
            )
        }
    };
    let now = tx.now_ms();
    let n = tx.execute(
        "UPDATE approvals SET status = ?1, input = ?2, note = ?3, ok = ?4, always = ?5, \
         decided_by = ?6, decided_at = ?7 WHERE id = ?8 AND status = 'pending'",
        params![status, input, note, ok, always as i64, by, now, id],
    )?;
    if n == 0 {
        // Decided by another in between (PostgreSQL: the row's lock waited).
        drop(tx);
        let first = get_approval(conn, id)?;
        return Err(Error::AlreadyDecided {
            call: id,
            status: first.status.to_string(),
            by: first.decided_by,
        });
    }
    if always {
        tx.execute(
            "INSERT INTO approval_grants (session_id, tool_name, approval_id, created_at) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (session_id, tool_name) DO NOTHING",
            params![row.session_id, row.tool_name, id, now],
        )?;
    }
    let decided = get_approval(&tx, id)?;
    tx.commit()?;
    Ok(decided)
}

/// Rejects a call that waited past the runner's deadline, inside the step's
/// fenced transaction: `UPDATE … WHERE status = 'pending'`, so a decision
/// taken first stands. Returns the row as it now reads.
pub(crate) fn expire_call(tx: &Transaction<'_>, id: CallId, reason: &str) -> Result<ApprovalRow> {
    tx.execute(
        "UPDATE approvals SET status = 'rejected', note = ?1, decided_by = 'deadline', \
         decided_at = ?2 WHERE id = ?3 AND status = 'pending'",
        params![reason, tx.now_ms(), id],
    )?;
    get_approval(tx, id)
}

/// The running turns parked on a call that has waited since before `before`
/// (ms since the epoch): those a deadline has passed for.
pub(crate) fn parked_since(conn: &Connection, before: i64) -> Result<Vec<TurnRow>> {
    let cols: Vec<String> = TurnRow::COLUMNS
        .split(',')
        .map(|c| format!("t.{}", c.trim()))
        .collect();
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM turns t WHERE t.status = 'running' AND EXISTS \
         (SELECT 1 FROM approvals a WHERE a.turn_id = t.id AND a.status = 'pending' \
          AND a.created_at <= ?1) ORDER BY t.id",
        cols.join(", ")
    ))?;
    let rows = st.query_map([before], TurnRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Parked calls that wait, oldest first: every session's, or one
/// session's; over a connection (a read-only snapshot's too).
pub fn pending_calls(conn: &Connection, session: Option<SessionId>) -> Result<Vec<ApprovalRow>> {
    let rows = match session {
        Some(sid) => {
            let mut st = conn.prepare(&format!(
                "SELECT {} FROM approvals WHERE status = 'pending' AND session_id = ?1 ORDER BY id",
                ApprovalRow::COLUMNS
            ))?;
            let rows = st.query_map([sid], ApprovalRow::from_row)?;
            rows.collect::<rusqlite::Result<_>>()?
        }
        None => {
            let mut st = conn.prepare(&format!(
                "SELECT {} FROM approvals WHERE status = 'pending' ORDER BY id",
                ApprovalRow::COLUMNS
            ))?;
            let rows = st.query_map([], ApprovalRow::from_row)?;
            rows.collect::<rusqlite::Result<_>>()?
        }
    };
    Ok(rows)
}

/// Every parked call a session ever had, oldest first; over a connection.
pub fn list_approvals(conn: &Connection, session: SessionId) -> Result<Vec<ApprovalRow>> {
    let mut st = conn.prepare(&format!(
        "SELECT {} FROM approvals WHERE session_id = ?1 ORDER BY id",
        ApprovalRow::COLUMNS
    ))?;
    let rows = st.query_map([session], ApprovalRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// How many calls of the turn still wait.
pub(crate) fn waiting_calls(conn: &Connection, turn_id: TurnId) -> Result<i64> {
    conn.prepare_cached("SELECT count(*) FROM approvals WHERE turn_id = ?1 AND status = 'pending'")?
        .query_row([turn_id], |r| r.get(0))
}

/// Marks a turn's waiting calls abandoned, inside the caller's fenced
/// transaction that fails the turn. Returns how many.
pub(crate) fn abandon_calls(tx: &Transaction<'_>, turn_id: TurnId, reason: &str) -> Result<i64> {
    let n = tx.execute(
        "UPDATE approvals SET status = 'abandoned', note = ?1, decided_at = ?2 \
         WHERE turn_id = ?3 AND status = 'pending'",
        params![reason, tx.now_ms(), turn_id],
    )?;
    Ok(n as i64)
}

impl crate::Store {
    /// Takes a decision for a parked call, from any process: the first one
    /// wins (see [`Decision`]). `by` names the decider in the record.
    ///
    /// Errors: [`Error::AlreadyDecided`] (naming the first decision),
    /// [`Error::UnknownCall`], [`Error::WrongDecision`]; all final. The
    /// turn goes on when it is resumed ([`crate::Runner::resume_turn`] or
    /// [`crate::Runner::run_turn_at`], from any process) once none of its
    /// calls waits; it is then among [`crate::Runner::recoverable_turns`].
    pub async fn decide(
        &self,
        call: CallId,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<ApprovalRow> {
        let by = by.map(str::to_string);
        self.call(move |c| decide(c, call, &decision, by.as_deref()))
            .await
    }

    /// The calls that wait for a decision or a result, oldest first: every
    /// session's, or one session's.
    pub async fn pending_calls(&self, session: Option<SessionId>) -> Result<Vec<ApprovalRow>> {
        self.call(move |c| pending_calls(c, session)).await
    }

    /// Every call a session parked, decided or not, oldest first.
    pub async fn approvals(&self, session: SessionId) -> Result<Vec<ApprovalRow>> {
        self.call(move |c| list_approvals(c, session)).await
    }
}
