//! Rebuilding an executed step's messages from the store (G3).

use crate::error::{Error, Result};
use crate::ids::{SessionId, StepId};
use crate::message::{sha256_hex, to_bytes, Message};
use crate::render::{build_messages, render_turn, RenderFormat, SummaryView};
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
    let at = (turn_idx, step_idx);
    build_in_slices(
        conn,
        session,
        at,
        compaction,
        elided_steps,
        format,
        BUILD_CHUNK_TURNS,
    )
}

/// [`build_for`], reading `chunk` turns at a time.
fn build_in_slices(
    conn: &Connection,
    session: &SessionRow,
    (turn_idx, step_idx): (i64, i64),
    compaction: Option<&CompactionRow>,
    elided_steps: i64,
    format: RenderFormat,
    chunk: i64,
) -> Result<Vec<Message>> {
    let view = compaction.map(|c| SummaryView {
        up_to_turn_index: c.up_to_turn_index,
        summary: c.summary.as_deref().unwrap_or(""),
    });
    let mut out = build_messages(&session.system_prompt, view, &[], format)?;
    // The rows are read and rendered a slice of turns at a time: what a
    // long uncompacted history holds in memory is its messages, not its
    // rows as well.
    let mut from = compaction.map_or(0, |c| c.up_to_turn_index + 1);
    while from <= turn_idx {
        let to = from.saturating_add(chunk - 1).min(turn_idx);
        let before = if to == turn_idx { step_idx } else { i64::MAX };
        let mut turns = store::load_range(conn, session.id, (from, 0), (to, before))?;
        if elided_steps > 0 {
            if let Some(turn) = turns.last_mut().filter(|t| t.idx == turn_idx) {
                crate::render::elide_results(turn, elided_steps);
            }
        }
        for turn in &turns {
            render_turn(turn, &mut out, format)?;
        }
        from = to + 1;
    }
    Ok(out)
}

/// Turns read at a time by [`build_for`].
const BUILD_CHUNK_TURNS: i64 = 256;

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

#[cfg(test)]
mod slice_tests {
    use super::*;
    use crate::store::Store;
    use crate::testing::seed::{seed_history, SeedShape};

    /// Reading the rows a slice of turns at a time builds the same messages
    /// as reading them at once: every slice size, with and without a
    /// summary, mid-turn, with results elided.
    #[test]
    fn a_history_read_in_slices_builds_the_same_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s.db")).unwrap();
        for compact_every in [None, Some(4)] {
            let session = store
                .with_conn(|c| {
                    let s =
                        store::create_session(c, &format!("s{compact_every:?}"), "m", "sys", "{}")?;
                    seed_history(
                        c,
                        s.id,
                        &SeedShape {
                            turns: 23,
                            tool_result_bytes: vec![10, 300],
                            compact_every,
                            tool_steps: 2,
                        },
                    )?;
                    Ok(s)
                })
                .unwrap();
            store
                .with_conn(|c| {
                    let latest = store::latest_completed(c, session.id, 22)?;
                    for (at, elided) in [((22, 0), 0), ((22, 2), 1), ((22, 3), 0), ((5, 1), 0)] {
                        let read = latest.as_ref().filter(|l| l.up_to_turn_index < at.0);
                        let whole = build_in_slices(
                            c,
                            &session,
                            at,
                            read,
                            elided,
                            RenderFormat::CURRENT,
                            i64::MAX,
                        )?;
                        assert!(whole.len() > 3);
                        for chunk in [1, 2, 5, 256] {
                            let sliced = build_in_slices(
                                c,
                                &session,
                                at,
                                read,
                                elided,
                                RenderFormat::CURRENT,
                                chunk,
                            )?;
                            assert_eq!(
                                to_bytes(&sliced),
                                to_bytes(&whole),
                                "{compact_every:?} {at:?} {chunk}"
                            );
                        }
                    }
                    Ok(())
                })
                .unwrap();
        }
    }
}
