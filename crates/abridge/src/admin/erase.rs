//! Deleting a session whole, and pruning idle ones: the one exception to
//! append-only history.

use crate::error::Result;
use crate::ids::SessionId;
use crate::store::{checkpoint, next_id, Connection, SessionRow};
use rusqlite::params;

/// What deleting a session removed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Deleted {
    /// The session's row id.
    pub session_id: SessionId,
    /// Its external id.
    pub external_id: String,
    /// Rows removed, by table.
    pub turns: i64,
    /// Steps removed.
    pub steps: i64,
    /// Tool invocations removed.
    pub tool_invocations: i64,
    /// Compactions removed.
    pub compactions: i64,
    /// Pinned facts removed.
    pub pins: i64,
    /// The delegated children deleted with it (external ids): the sessions
    /// its tool calls ran, each recorded as an erasure of its own. A session
    /// that forks read is never deleted ([`crate::Error::HasForks`]).
    pub children: Vec<String>,
    /// The write-ahead log was checkpointed into the file and truncated after
    /// the delete, so the session's text is in neither. False while another
    /// connection still reads an older snapshot: the next checkpoint (any
    /// later write, or [`crate::Store::checkpoint`]) finishes it.
    pub checkpointed: bool,
}

/// Deletes every row of `session` in one IMMEDIATE transaction, with the
/// freed space overwritten (`secure_delete`), records the deletion in
/// `erasures`, then checkpoints the WAL (TRUNCATE).
/// With `idle_before`, only if the session is still idle then (checked
/// inside the transaction); None when it is not.
pub(crate) fn delete_session(
    conn: &mut Connection,
    session: &SessionRow,
    idle_before: Option<i64>,
) -> Result<Option<Deleted>> {
    // (Every pooled connection has it on; said again for this delete.)
    conn.secure_delete()?;
    let sid = session.id;
    let tx = conn.write_tx()?;
    // Checked again inside the write lock: a racing delete already did it.
    crate::store::get_session(&tx, sid)?;
    if let Some(before) = idle_before {
        if last_activity(&tx, session)? >= before {
            return Ok(None);
        }
    }
    // Past every id there is and every floor recorded before, so the
    // newest erasure's floors are the highest (what `next_id!` reads).
    let floors: (i64, i64, i64) = tx.query_row(
        concat!(
            "SELECT ",
            next_id!("sessions"),
            " - 1, ",
            next_id!("turns"),
            " - 1, ",
            next_id!("compactions"),
            " - 1"
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    // Forks read its turns where they are: it goes only after them. Its
    // delegated children (the sessions its tool calls ran, whose answers
    // its tool results already hold) go with it, first.
    let mut doomed = vec![session.clone()];
    let mut i = 0;
    while i < doomed.len() {
        let forks = crate::store::forks_reading(&tx, doomed[i].id)?;
        if !forks.is_empty() {
            return Err(crate::Error::HasForks {
                session_id: doomed[i].id,
                forks,
            });
        }
        for child in crate::store::children(&tx, doomed[i].id)? {
            if child.parent.as_ref().map(|p| p.kind) == Some(crate::store::ParentKind::Delegate) {
                doomed.push(child);
            }
        }
        i += 1;
    }
    let mut children = Vec::new();
    let mut counts = Counts::default();
    for s in doomed.iter().rev() {
        let c = erase_rows(&tx, s, floors)?;
        if s.id == sid {
            counts = c;
        } else {
            children.push(s.external_id.clone());
        }
    }
    let Counts {
        turns,
        steps,
        tool_invocations,
        compactions,
        pins,
    } = counts;
    tx.execute("DELETE FROM erasing", [])?;
    tx.commit()?;
    let checkpointed = checkpoint(conn)?;
    Ok(Some(Deleted {
        session_id: sid,
        external_id: session.external_id.clone(),
        turns,
        steps,
        tool_invocations,
        compactions,
        pins,
        children,
        checkpointed,
    }))
}
/// Rows removed from one session, by table.
#[derive(Default)]
struct Counts {
    turns: i64,
    steps: i64,
    tool_invocations: i64,
    compactions: i64,
    pins: i64,
}

/// Deletes every row of one session inside the caller's transaction (its
/// `erasing` gate open) and records the erasure.
fn erase_rows(
    tx: &crate::store::Transaction<'_>,
    session: &SessionRow,
    floors: (i64, i64, i64),
) -> Result<Counts> {
    let sid = session.id;
    tx.execute("INSERT INTO erasing (session_id) VALUES (?1)", [sid])?;
    // A fork's lineage goes with it.
    if tx.has_table("session_lineage")? {
        tx.execute("DELETE FROM session_lineage WHERE session_id = ?1", [sid])?;
    }
    // Its parked calls and grants (a store older than version 9 has none).
    if tx.has_table("approvals")? {
        tx.execute("DELETE FROM approval_grants WHERE session_id = ?1", [sid])?;
        tx.execute("DELETE FROM approvals WHERE session_id = ?1", [sid])?;
    }
    let tool_invocations = tx.execute(
        "DELETE FROM tool_invocations WHERE step_id IN \
         (SELECT s.id FROM steps s JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?1)",
        [sid],
    )? as i64;
    let steps = tx.execute(
        "DELETE FROM steps WHERE turn_id IN (SELECT id FROM turns WHERE session_id = ?1)",
        [sid],
    )? as i64;
    let pins = tx.execute("DELETE FROM pins WHERE session_id = ?1", [sid])? as i64;
    // Its redaction records go with it (they hold hashes, and ids of rows
    // that are no more).
    tx.execute(
        "DELETE FROM redacted_rows WHERE redaction_id IN \
         (SELECT id FROM redactions WHERE session_id = ?1)",
        [sid],
    )?;
    tx.execute("DELETE FROM redactions WHERE session_id = ?1", [sid])?;
    let compactions = tx.execute("DELETE FROM compactions WHERE session_id = ?1", [sid])? as i64;
    let turns = tx.execute("DELETE FROM turns WHERE session_id = ?1", [sid])? as i64;
    tx.execute("DELETE FROM sessions WHERE id = ?1", [sid])?;
    let rows = serde_json::json!({
        "turns": turns, "steps": steps, "tool_invocations": tool_invocations,
        "compactions": compactions, "pins": pins,
    });
    tx.execute(
        "INSERT INTO erasures (kind, session_id, external_id_sha256, rows, at, \
         sessions_id_floor, turns_id_floor, compactions_id_floor) \
         VALUES ('delete', ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            sid,
            crate::message::sha256_hex(session.external_id.as_bytes()),
            rows.to_string(),
            tx.now_ms(),
            floors.0,
            floors.1,
            floors.2
        ],
    )?;
    Ok(Counts {
        turns,
        steps,
        tool_invocations,
        compactions,
        pins,
    })
}

/// When `session`'s newest turn began, or it was created, with no turn.
fn last_activity(conn: &Connection, session: &SessionRow) -> Result<i64> {
    conn.query_row(
        "SELECT coalesce(max(created_at), ?2) FROM turns WHERE session_id = ?1",
        params![session.id, session.created_at],
        |r| r.get(0),
    )
}
/// Sessions whose newest turn (or, with none, the session itself) was
/// created before `before_ms`, oldest first, with that time.
pub(crate) fn idle_sessions(conn: &Connection, before_ms: i64) -> Result<Vec<(SessionRow, i64)>> {
    let mut q = conn.prepare(&format!(
        "SELECT {}, last FROM (SELECT s.*, coalesce((SELECT max(t.created_at) FROM turns t \
           WHERE t.session_id = s.id), s.created_at) AS last FROM sessions s) AS sessions \
         WHERE last < ?1 ORDER BY last, id",
        SessionRow::COLUMNS
    ))?;
    let rows = q.query_map([before_ms], |r| {
        Ok((SessionRow::from_row(r)?, r.get(SessionRow::WIDTH)?))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A session `prune` deletes (or, in a dry run, would).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IdleSession {
    /// The session.
    pub session_id: SessionId,
    /// Its external id.
    pub external_id: String,
    /// When its newest turn began (or it was created, with no turn), ms.
    pub last_activity: i64,
}

impl crate::Store {
    /// Deletes a session whole: every row of it (turns, steps, tool
    /// invocations, compactions, pinned facts) in one transaction, the freed
    /// space overwritten (`secure_delete`), the write-ahead log checkpointed,
    /// so its text is no longer in the file's bytes (see
    /// [`Deleted::checkpointed`]). The effects a host's transactional tools
    /// wrote are the host's. Recorded in `erasures` (row id, a hash of the
    /// external id, row counts). A runner working on the session (any
    /// process) gets [`crate::Error::TurnDeleted`] or
    /// [`crate::Error::SessionDeleted`] at its next write; the session is
    /// never seen half-deleted. `VACUUM` ([`crate::Store::vacuum`]) returns
    /// the space to the file system.
    ///
    /// A session that forks read is not deleted ([`crate::Error::HasForks`],
    /// naming them): their history is its turns. Delete the forks first.
    /// Its delegated children (the sessions its tool calls ran) are deleted
    /// with it, in the same transaction ([`Deleted::children`]).
    pub async fn delete_session(
        &self,
        key: impl Into<crate::inspect::SessionKey>,
    ) -> Result<Deleted> {
        let key = key.into();
        self.call(move |c| {
            let session = crate::inspect::session(c, &key)?;
            // Without an idle condition a delete always happens.
            delete_session(c, &session, None)?
                .ok_or_else(|| crate::Error::UnknownSession(session.external_id.clone()))
        })
        .await
    }

    /// The sessions with no turn begun within `idle_for` (nor created within
    /// it), oldest first: what [`crate::Store::prune`] deletes now.
    pub async fn idle_sessions(&self, idle_for: std::time::Duration) -> Result<Vec<IdleSession>> {
        let before = self
            .now_ms()
            .saturating_sub(idle_for.as_millis().min(i64::MAX as u128) as i64);
        self.call(move |c| idle(c, before)).await
    }

    /// Deletes every session idle for `idle_for` (see
    /// [`crate::Store::idle_sessions`], the dry run), each as
    /// [`crate::Store::delete_session`] does; a session that became active
    /// meanwhile is left. Returns what it deleted.
    pub async fn prune(&self, idle_for: std::time::Duration) -> Result<Vec<Deleted>> {
        let before = self
            .now_ms()
            .saturating_sub(idle_for.as_millis().min(i64::MAX as u128) as i64);
        self.call(move |c| {
            let mut out = Vec::new();
            // Newest first: a fork goes before the session it reads (one
            // still read by a fork that is not idle stays), and a delegated
            // child already deleted with its parent is passed over.
            for (session, _) in idle_sessions(c, before)?.into_iter().rev() {
                // Only if still idle inside its delete (a turn may have begun).
                match delete_session(c, &session, Some(before)) {
                    Ok(deleted) => out.extend(deleted),
                    Err(
                        crate::Error::HasForks { .. }
                        | crate::Error::SessionDeleted { .. }
                        | crate::Error::UnknownSession(_),
                    ) => {}
                    Err(e) => return Err(e),
                }
            }
            out.reverse();
            Ok(out)
        })
        .await
    }

    /// `VACUUM`: rewrites the file without its free pages, returning the
    /// space deleted sessions left to the file system, then checkpoints.
    pub async fn vacuum(&self) -> Result<()> {
        self.call(|c| {
            c.execute_batch("VACUUM")?;
            checkpoint(c)?;
            Ok(())
        })
        .await
    }

    /// Checkpoints the write-ahead log into the file and truncates it; false
    /// when a reader of an older snapshot kept part of it.
    pub async fn checkpoint(&self) -> Result<bool> {
        self.call(|c| checkpoint(c)).await
    }
}

fn idle(c: &Connection, before: i64) -> Result<Vec<IdleSession>> {
    Ok(idle_sessions(c, before)?
        .into_iter()
        .map(|(s, last)| IdleSession {
            session_id: s.id,
            external_id: s.external_id,
            last_activity: last,
        })
        .collect())
}
