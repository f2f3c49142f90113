//! Sessions: created once per external id, read by id or external id.

use crate::error::{Error, Result};
use crate::ids::SessionId;
use crate::store::db::{Connection, OptionalExtension};
use crate::store::rows::*;
use crate::store::write_tx;
use crate::store::ParentKind;
use rusqlite::params;

pub(crate) fn get_session(conn: &Connection, id: SessionId) -> Result<SessionRow> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM sessions WHERE id = ?1",
        SessionRow::COLUMNS
    ))?
    .query_row([id], SessionRow::from_row)
    .optional()?
    .map_or_else(
        || {
            Err(if crate::store::was_deleted(conn, id)? {
                Error::SessionDeleted { session_id: id }
            } else {
                Error::UnknownSession(id.to_string())
            })
        },
        Ok,
    )
}

pub(crate) fn find_session(conn: &Connection, external_id: &str) -> Result<Option<SessionRow>> {
    conn.prepare_cached(sql_once!(
        "SELECT {} FROM sessions WHERE external_id = ?1",
        SessionRow::COLUMNS
    ))?
    .query_row([external_id], SessionRow::from_row)
    .optional()
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
        concat!(
            "INSERT INTO sessions (id, external_id, model, system_prompt, config, created_at) \
             VALUES (",
            crate::store::next_id!("sessions"),
            ", ?1, ?2, ?3, ?4, ?5) ON CONFLICT (external_id) DO NOTHING"
        ),
        params![external_id, model, system_prompt, config, tx.now_ms()],
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

/// Makes `external_id` a fork of `parent` at turn `at_turn`: a session
/// whose history is the parent's turns up to and including `at_turn`, read
/// where they are, then its own.
///
/// Claim semantics: one IMMEDIATE transaction. It writes the session row,
/// one `session_lineage` row per ancestor whose turns it reads (bounded by
/// the depth of forks, never by the length of the history), and a copy of
/// each pin live at the fork point (within `window` for the facts mentioned
/// in passing: the pins a later compaction carries, which the fork then
/// supersedes in its own rows, leaving the parent's untouched). Nothing of
/// the parent changes. The fork reads the compaction the parent had
/// completed at or before the fork point. Idempotent on (external id,
/// parent, fork point): the same call again returns the fork; another
/// session of that name is [`Error::SessionConflict`]. The fork point must
/// be a completed turn ([`Error::NotAForkPoint`]).
pub(crate) fn fork_session(
    conn: &mut Connection,
    parent_id: SessionId,
    at_turn: i64,
    external_id: &str,
    window: usize,
) -> Result<SessionRow> {
    if external_id.trim().is_empty() {
        return Err(Error::Config(
            "a session's external id must not be blank".into(),
        ));
    }
    let tx = write_tx(conn)?;
    let parent = get_session(&tx, parent_id)?;
    if let Some(existing) = find_session(&tx, external_id)? {
        let same = existing.parent.as_ref().is_some_and(|p| {
            p.kind == ParentKind::Fork && p.session_id == parent_id && p.turn == at_turn
        });
        if !same {
            return Err(Error::SessionConflict {
                external_id: external_id.into(),
                field: "parent",
            });
        }
        tx.commit()?;
        return Ok(existing);
    }
    let refuse = |reason: String| Error::NotAForkPoint {
        session_id: parent_id,
        turn: at_turn,
        reason,
    };
    let status: Option<String> = tx
        .prepare_cached(&crate::store::history::over_lineage(
            "SELECT t.status FROM turns t WHERE t.session_id = ?1 AND t.idx = ?2",
        ))?
        .query_row(params![parent_id, at_turn], |r| r.get(0))
        .optional()?;
    match status.as_deref() {
        None => return Err(refuse("the session has no such turn".into())),
        Some("completed") => {}
        Some(other) => return Err(refuse(format!("the turn is {other}, not completed"))),
    }
    let base = crate::store::latest_completed(&tx, parent_id, at_turn + 1)?.map(|c| c.id);
    tx.execute(
        concat!(
            "INSERT INTO sessions (id, external_id, model, system_prompt, config, created_at, \
             parent_id, parent_kind, parent_turn, base_compaction_id) VALUES (",
            crate::store::next_id!("sessions"),
            ", ?1, ?2, ?3, ?4, ?5, ?6, 'fork', ?7, ?8)"
        ),
        params![
            external_id,
            parent.model,
            parent.system_prompt,
            parent.config,
            tx.now_ms(),
            parent_id,
            at_turn,
            base
        ],
    )?;
    let fork = find_session(&tx, external_id)?.expect("row exists after insert");
    // The ancestors' turns it reads: each of the parent's lineage, cut at the
    // fork point, and the parent's own turns up to it.
    let mut owners: Vec<(SessionId, i64, i64)> = Vec::new();
    {
        let mut st = tx.prepare_cached(
            "SELECT owner_id, after_idx, upto_idx FROM session_lineage WHERE session_id = ?1",
        )?;
        let mut rows = st.query([parent_id])?;
        while let Some(r) = rows.next()? {
            let (owner, after, upto): (SessionId, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            if after < at_turn {
                owners.push((owner, after, upto.min(at_turn)));
            }
        }
    }
    let parent_from = parent.first_own_turn() - 1;
    if at_turn > parent_from {
        owners.push((parent_id, parent_from, at_turn));
    }
    for (owner, after, upto) in owners {
        tx.execute(
            "INSERT INTO session_lineage (session_id, owner_id, after_idx, upto_idx) \
             VALUES (?1, ?2, ?3, ?4)",
            params![fork.id, owner, after, upto],
        )?;
    }
    let now = tx.now_ms();
    for pin in crate::store::live_pins(&tx, parent_id, at_turn, window)? {
        tx.execute(
            "INSERT INTO pins (session_id, turn_index, kind, slot, value, sentence, source, \
             supersedes, windowed, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                fork.id,
                pin.turn_index,
                pin.kind.as_str(),
                pin.slot,
                pin.value,
                pin.sentence,
                pin.source.as_str(),
                pin.supersedes,
                i64::from(pin.window),
                now
            ],
        )?;
    }
    tx.commit()?;
    Ok(fork)
}

/// The sessions that hang off `session_id` (forks and delegated children),
/// oldest first.
pub(crate) fn children(conn: &Connection, session_id: SessionId) -> Result<Vec<SessionRow>> {
    let mut st = conn.prepare_cached(sql_once!(
        "SELECT {} FROM sessions WHERE parent_id = ?1 ORDER BY id",
        SessionRow::COLUMNS
    ))?;
    let rows = st.query_map([session_id], SessionRow::from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The forks that read `session_id`'s rows: those whose lineage reads its
/// turns (its forks, theirs, and so on), and its own forks, whose base
/// compaction may be its own even when they fork inside an ancestor's turns.
pub(crate) fn forks_reading(conn: &Connection, session_id: SessionId) -> Result<Vec<String>> {
    let mut st = conn.prepare_cached(
        "SELECT s.external_id FROM sessions s WHERE s.id IN \
         (SELECT l.session_id FROM session_lineage l WHERE l.owner_id = ?1) \
         OR (s.parent_id = ?1 AND s.parent_kind = 'fork') ORDER BY s.id",
    )?;
    let rows = st.query_map([session_id], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The child session that runs tool call `call_id` of `parent`'s turn
/// `turn_idx`, created on the first call.
///
/// Claim semantics: one IMMEDIATE transaction; UNIQUE (parent, turn, call)
/// among delegated children: every later call (a resumed parent after a
/// crash) gets the same row, never a second child. Named
/// `{parent}/{turn}/{call id}`; a session of that name that is not this
/// call's child is [`Error::SessionConflict`].
pub(crate) fn delegate_child(
    conn: &mut Connection,
    parent: &SessionRow,
    turn_idx: i64,
    call_id: &str,
    model: &str,
    system_prompt: &str,
) -> Result<(SessionRow, bool)> {
    let external_id = format!("{}/{turn_idx}/{call_id}", parent.external_id);
    let tx = write_tx(conn)?;
    let n = tx.execute(
        concat!(
            "INSERT INTO sessions (id, external_id, model, system_prompt, config, created_at, \
             parent_id, parent_kind, parent_turn, parent_call) VALUES (",
            crate::store::next_id!("sessions"),
            ", ?1, ?2, ?3, '{}', ?4, ?5, 'delegate', ?6, ?7) ON CONFLICT DO NOTHING"
        ),
        params![
            external_id,
            model,
            system_prompt,
            tx.now_ms(),
            parent.id,
            turn_idx,
            call_id
        ],
    )?;
    let child = tx
        .prepare_cached(sql_once!(
            "SELECT {} FROM sessions WHERE parent_id = ?1 AND parent_kind = 'delegate' \
             AND parent_turn = ?2 AND parent_call = ?3",
            SessionRow::COLUMNS
        ))?
        .query_row(params![parent.id, turn_idx, call_id], SessionRow::from_row)
        .optional()?
        .ok_or_else(|| Error::SessionConflict {
            external_id: external_id.clone(),
            field: "parent",
        })?;
    tx.commit()?;
    Ok((child, n == 1))
}

/// The running turns of the children delegated by `session_id`'s turn
/// `turn_idx` (what abandoning that turn abandons too).
pub(crate) fn running_child_turns(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
) -> Result<Vec<crate::ids::TurnId>> {
    let mut st = conn.prepare_cached(
        "SELECT t.id FROM sessions s JOIN turns t ON t.session_id = s.id \
         WHERE s.parent_id = ?1 AND s.parent_kind = 'delegate' AND s.parent_turn = ?2 \
         AND t.status = 'running' ORDER BY t.id",
    )?;
    let rows = st.query_map(params![session_id, turn_idx], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
