//! Rebuilding an executed step's messages from the store (G3).

use crate::error::{Error, Result};
use crate::ids::{SessionId, StepId};
use crate::message::{sha256_hex, to_bytes, Message};
use crate::render::{build_messages, RenderFormat, SummaryView};
use crate::store::Connection;
use crate::store::{self, CompactionRow, CompactionStatus, SessionRow};

/// A step's messages rebuilt from the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Rebuilt {
    /// The step.
    pub step_id: StepId,
    /// The rebuilt message array.
    pub messages: Vec<Message>,
    /// Its serialised bytes: what the step hashed.
    pub bytes: Vec<u8>,
    /// SHA-256 of `bytes`.
    pub sha256: String,
    /// The hash the step recorded when it ran.
    pub recorded: String,
    /// The newest redaction that changed what the step rebuilds to, and
    /// the hash its messages rebuilt to right after it (None: never
    /// redacted). The recorded hash is of the bytes before.
    pub redaction: Option<crate::store::RedactionMark>,
}

impl Rebuilt {
    /// True when the rebuild reproduces the recorded bytes.
    pub fn matches(&self) -> bool {
        self.sha256 == self.recorded
    }

    /// True when the rebuild reproduces, marker for marker, the bytes a
    /// redaction left (the step's recorded bytes held the redacted text).
    pub fn matches_redacted(&self) -> bool {
        self.redaction
            .as_ref()
            .is_some_and(|m| m.sha256 == self.sha256)
    }

    /// True when the rebuild is what the store says it must be: the
    /// recorded bytes, or, after a redaction, the redacted ones.
    pub fn holds(&self) -> bool {
        self.matches_redacted() || (self.redaction.is_none() && self.matches())
    }
}

/// Builds the messages of step `step_idx` of turn `turn_idx`, reading
/// `compaction`, with the tool results of that turn's first `elided_steps`
/// steps as placeholders (see [`crate::render::elide_results`]).
pub(crate) fn build_for(
    conn: &Connection,
    session: &SessionRow,
    (turn_idx, step_idx): (i64, i64),
    compaction: Option<&CompactionRow>,
    elided_steps: i64,
    format: RenderFormat,
) -> Result<Vec<Message>> {
    let after = compaction.map_or(-1, |c| c.up_to_turn_index);
    let mut history = store::load_history(conn, session.id, after, turn_idx, step_idx)?;
    if elided_steps > 0 {
        if let Some(turn) = history.last_mut().filter(|t| t.idx == turn_idx) {
            crate::render::elide_results(turn, elided_steps);
        }
    }
    let view = compaction.map(|c| SummaryView {
        up_to_turn_index: c.up_to_turn_index,
        summary: c.summary.as_deref().unwrap_or(""),
    });
    build_messages(&session.system_prompt, view, &history, format)
}

/// Rebuilds an executed step's messages, their bytes and hash, next to the hash
/// it recorded. Errors with [`Error::StepNotExecuted`] for a step that never got
/// a response.
pub fn rebuild_step(conn: &Connection, step_id: StepId) -> Result<Rebuilt> {
    let step = store::get_step(conn, step_id)?;
    let recorded = step
        .messages_sha256
        .clone()
        .ok_or(Error::StepNotExecuted(step_id))?;
    let turn = store::get_turn(conn, step.turn_id)?;
    let session = store::get_session(conn, turn.session_id)?;
    let compaction = match step.compaction_id {
        Some(id) => {
            let c = store::get_compaction(conn, id)?;
            if c.status != CompactionStatus::Completed {
                return Err(Error::ReadNonCompleted {
                    step_id,
                    compaction_id: id,
                });
            }
            Some(c)
        }
        None => None,
    };
    let format = RenderFormat::from_i64(step.render_format)?;
    let messages = build_for(
        conn,
        &session,
        (turn.idx, step.idx),
        compaction.as_ref(),
        step.elided_steps,
        format,
    )?;
    let bytes = to_bytes(&messages);
    let sha256 = sha256_hex(&bytes);
    let redaction = store::redaction_mark(conn, "step_messages", step_id.0)?;
    Ok(Rebuilt {
        step_id,
        messages,
        bytes,
        sha256,
        recorded,
        redaction,
    })
}

/// Builds the messages the next step of turn `turn_idx` (its step `step_idx`)
/// would send now, reading the newest completed compaction before that turn.
/// For previews and benchmarks; a running step uses what `ensure()` returned.
pub fn build_at(
    conn: &Connection,
    session_id: SessionId,
    turn_idx: i64,
    step_idx: i64,
) -> Result<Vec<Message>> {
    let session = store::get_session(conn, session_id)?;
    let compaction = store::latest_completed(conn, session_id, turn_idx)?;
    build_for(
        conn,
        &session,
        (turn_idx, step_idx),
        compaction.as_ref(),
        0,
        RenderFormat::CURRENT,
    )
}
