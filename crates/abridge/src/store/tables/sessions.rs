//! Sessions: created once per external id, read by id or external id.

use crate::error::{Error, Result};
use crate::ids::SessionId;
use crate::store::db::{Connection, OptionalExtension};
use crate::store::rows::*;
use crate::store::write_tx;
use rusqlite::params;

pub(crate) fn get_session(conn: &Connection, id: SessionId) -> Result<SessionRow> {
    conn.prepare_cached(&format!(
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
    conn.prepare_cached(&format!(
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
