//! The redactions table and what the read side asks of it: a step's or a
//! summary's redaction mark, a session's redactions, whether a row was
//! redacted. Making a redaction is administration (`crate::admin::redact`).

use crate::error::Result;
use crate::ids::SessionId;
use crate::message::sha256_hex;
use crate::store::db::{Connection, OptionalExtension};
use rusqlite::params;

/// What every redacted occurrence is replaced by.
pub const REDACTION_MARKER: &str = "[redacted]";

/// Rows a redaction changed, by table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RedactedRows {
    /// The session row (its system prompt): 0 or 1.
    pub sessions: i64,
    /// Turns (input, output, error).
    pub turns: i64,
    /// Steps (response, error).
    pub steps: i64,
    /// Tool invocations (arguments, result).
    pub tool_invocations: i64,
    /// Compactions (summary, focus, error).
    pub compactions: i64,
    /// Pinned facts (value, sentence).
    pub pins: i64,
    /// Parked tool calls (arguments, approved arguments, reason or result).
    #[serde(default)]
    pub approvals: i64,
}
/// A redaction an executed step's rebuilt messages are checked against.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RedactionMark {
    /// The redaction's id.
    pub redaction_id: i64,
    /// When it was made, ms since the epoch.
    pub at: i64,
    /// SHA-256 of what the row rebuilds to since (the step's messages; a
    /// compaction's summary).
    pub sha256: String,
}

/// A redaction as recorded (never the pattern: its SHA-256).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RedactionRecord {
    /// Its id.
    pub id: i64,
    /// `text` or `regex`.
    pub pattern_kind: String,
    /// SHA-256 of the pattern.
    pub pattern_sha256: String,
    /// Occurrences replaced.
    pub occurrences: i64,
    /// Rows changed, by table.
    pub rows: RedactedRows,
    /// Executed steps that rebuild with the marker since.
    pub steps_rebuilt: i64,
    /// Running turns fenced.
    pub turns_fenced: i64,
    /// When, ms since the epoch.
    pub at: i64,
}

/// A session's redactions, oldest first.
pub(crate) fn list_redactions(
    conn: &Connection,
    session_id: SessionId,
) -> Result<Vec<RedactionRecord>> {
    let mut st = conn.prepare_cached(
        "SELECT id, pattern_kind, pattern_sha256, occurrences, rows, steps_rebuilt, \
         turns_fenced, at FROM redactions WHERE session_id = ?1 ORDER BY id",
    )?;
    let rows = st.query_map([session_id], |r| {
        Ok((
            RedactionRecord {
                id: r.get(0)?,
                pattern_kind: r.get(1)?,
                pattern_sha256: r.get(2)?,
                occurrences: r.get(3)?,
                rows: RedactedRows::default(),
                steps_rebuilt: r.get(5)?,
                turns_fenced: r.get(6)?,
                at: r.get(7)?,
            },
            r.get::<_, String>(4)?,
        ))
    })?;
    rows.map(|row| {
        let (mut record, counts) = row?;
        record.rows = serde_json::from_str(&counts)?;
        Ok(record)
    })
    .collect()
}

/// The newest redaction of `row_id` in `tbl` that recorded a hash.
pub(crate) fn redaction_mark(
    conn: &Connection,
    tbl: &str,
    row_id: i64,
) -> Result<Option<RedactionMark>> {
    conn.prepare_cached(
        "SELECT r.id, r.at, x.sha256 FROM redacted_rows x JOIN redactions r \
             ON r.id = x.redaction_id WHERE x.tbl = ?1 AND x.row_id = ?2 AND x.sha256 IS NOT NULL \
             ORDER BY x.redaction_id DESC LIMIT 1",
    )?
    .query_row(params![tbl, row_id], |r| {
        Ok(RedactionMark {
            redaction_id: r.get(0)?,
            at: r.get(1)?,
            sha256: r.get(2)?,
        })
    })
    .optional()
}

/// True when a redaction changed row `row_id` of `tbl`.
pub(crate) fn row_redacted(conn: &Connection, tbl: &str, row_id: i64) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM redacted_rows WHERE tbl = ?1 AND row_id = ?2")?
        .exists(params![tbl, row_id])
}

/// The newest redaction of a session (its id), 0 when none: what a kept
/// context and a summary in flight were read under.
pub(crate) fn session_redaction(conn: &Connection, session_id: SessionId) -> Result<i64> {
    conn.prepare_cached(SESSION_REDACTION_SQL)?
        .query_row([session_id], |r| r.get(0))
}

const SESSION_REDACTION_SQL: &str =
    "SELECT coalesce(max(id), 0) FROM redactions WHERE session_id = ?1";

/// Queues [`session_redaction`]'s read (see [`Connection::prefetch`]).
pub(crate) fn prefetch_session_redaction(conn: &Connection, session_id: SessionId) -> Result<()> {
    conn.prefetch(SESSION_REDACTION_SQL, [session_id])
}

/// True when turn `turn_id`'s input read `input` before a redaction changed it.
pub(crate) fn input_before_redaction(conn: &Connection, turn_id: i64, input: &str) -> Result<bool> {
    conn.prepare_cached(
        "SELECT 1 FROM redacted_rows WHERE tbl = 'turns' AND row_id = ?1 AND sha256 = ?2",
    )?
    .exists(params![turn_id, sha256_hex(input.as_bytes())])
}
