//! The read API: typed, read-only views of a store, so a host never writes SQL
//! against it. Sessions (by id or external id), their turns, each turn's steps,
//! each step's tool invocations, the session's compactions, and the full,
//! uncompacted transcript (nothing is ever lost: compaction changes what the
//! model sees, never what the store holds).
//!
//! Two ways in, the same reads:
//! - async methods on [`Store`] ([`Store::session`], [`Store::turns`],
//!   [`Store::steps`], [`Store::invocations`], [`Store::compactions`],
//!   [`Store::export`], …), for a host holding a store;
//! - functions over a read-only [`Connection`] ([`session`], [`turns`], …),
//!   for a snapshot such as [`crate::store::read_only`] gives (what the
//!   `abridge` command uses).
//!
//! ```no_run
//! # async fn run(store: abridge::Store) -> abridge::Result<()> {
//! let session = store.session("user-42").await?;
//! for turn in store.turns(session.id).await? {
//!     for step in store.steps(turn.id).await? {
//!         let tools = store.invocations(step.id).await?;
//!         println!("turn {} step {}: {:?}, {} tool calls", turn.idx, step.idx, step.status, tools.len());
//!     }
//! }
//! for c in store.compactions(session.id).await? {
//!     println!("up to turn {}: {:?} {:?} -> {:?}", c.up_to_turn_index, c.status, c.tokens_before, c.tokens_after);
//! }
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::ids::{SessionId, StepId, TurnId};
use crate::message::{ModelResponse, ResponseBlock};
use crate::store::Connection;
use crate::store::{
    self, CompactionRow, InvocationRow, SessionCounts, SessionRow, StepRow, Store, TurnRow,
};
use serde::Serialize;
use serde_json::json;

/// A session with its counts.
#[derive(Debug, Clone, Serialize)]
pub struct SessionSummary {
    /// The row.
    pub session: SessionRow,
    /// Its counts.
    pub counts: SessionCounts,
}

/// A turn with its steps.
#[derive(Debug, Clone, Serialize)]
pub struct TurnSummary {
    /// The row.
    pub turn: TurnRow,
    /// Steps.
    pub steps: i64,
    /// The steps' ids, in order (what `abridge replay --step` takes).
    pub step_ids: Vec<StepId>,
}

/// One session in detail.
#[derive(Debug, Clone, Serialize)]
pub struct SessionDetail {
    /// Session and counts.
    pub summary: SessionSummary,
    /// Its turns.
    pub turns: Vec<TurnSummary>,
    /// Its compactions.
    pub compactions: Vec<CompactionRow>,
    /// Its live pinned facts (the newest value of each slot, every fact
    /// without one).
    pub live_pins: Vec<crate::pins::Pin>,
    /// Its redactions, oldest first.
    pub redactions: Vec<crate::store::RedactionRecord>,
    /// Its tool calls that waited (or wait) for a decision or a result,
    /// oldest first: a turn with one `pending` is parked.
    pub approvals: Vec<crate::store::ApprovalRow>,
    /// The parent's external id, for a fork or a delegated child (its link
    /// is [`SessionRow::parent`] in `summary.session`).
    pub parent_external_id: Option<String>,
    /// The sessions that hang off it: its forks and delegated children,
    /// oldest first.
    pub children: Vec<SessionRow>,
}

/// A session as a host names it: its row id or its external id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionKey {
    /// The row id.
    Id(SessionId),
    /// The host's own id, exactly as given to `create_session`.
    External(String),
}

impl From<SessionId> for SessionKey {
    fn from(id: SessionId) -> Self {
        SessionKey::Id(id)
    }
}

impl From<&str> for SessionKey {
    fn from(s: &str) -> Self {
        SessionKey::External(s.to_string())
    }
}

impl From<String> for SessionKey {
    fn from(s: String) -> Self {
        SessionKey::External(s)
    }
}

impl From<&String> for SessionKey {
    fn from(s: &String) -> Self {
        SessionKey::External(s.clone())
    }
}

/// One session, by id or external id. Errors: [`Error::UnknownSession`].
pub fn session(conn: &Connection, key: &SessionKey) -> Result<SessionRow> {
    match key {
        SessionKey::Id(id) => store::get_session(conn, *id),
        SessionKey::External(ext) => {
            store::find_session(conn, ext)?.ok_or_else(|| Error::UnknownSession(ext.clone()))
        }
    }
}

/// One turn by id.
pub fn turn(conn: &Connection, id: TurnId) -> Result<TurnRow> {
    store::get_turn(conn, id)
}

/// Every tool call of a session that waited (or waits) for a decision or a
/// delivered result, oldest first; none in a store older than version 9.
pub fn approvals(conn: &Connection, session: SessionId) -> Result<Vec<crate::store::ApprovalRow>> {
    if !conn.has_table("approvals")? {
        return Ok(Vec::new());
    }
    store::list_approvals(conn, session)
}

/// A session's turns, in order.
pub fn turns(conn: &Connection, session: SessionId) -> Result<Vec<TurnRow>> {
    store::list_turns(conn, session)
}

/// What a session's next turn reads: the newest completed compaction, the
/// message that stands for it (as every step that reads it sends it), and
/// the turns after it, in order. A host that builds its own requests (a
/// framework that keeps its own message list) reads its compacted history
/// here; the full history stays in [`turns`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionView {
    /// The newest completed compaction, if any.
    pub compaction: Option<crate::store::CompactionRow>,
    /// Its summary as the message text steps send
    /// ([`crate::render::summary_text`]).
    pub summary_message: Option<String>,
    /// The turns after its boundary (all of them without one).
    pub turns: Vec<TurnRow>,
}

/// A session's [`SessionView`].
pub fn view(conn: &Connection, session: SessionId) -> Result<SessionView> {
    let compaction = store::latest_completed(conn, session, i64::MAX)?;
    let after = compaction.as_ref().map_or(-1, |c| c.up_to_turn_index);
    let summary_message = compaction.as_ref().map(|c| {
        crate::render::summary_text(crate::render::SummaryView {
            up_to_turn_index: c.up_to_turn_index,
            summary: c.summary.as_deref().unwrap_or(""),
        })
    });
    Ok(SessionView {
        turns: store::list_turns_after(conn, session, after)?,
        compaction,
        summary_message,
    })
}

/// A turn's steps, in order: status, the compaction each read, context
/// tokens (and whether estimated), usage, the hash of the bytes sent.
pub fn steps(conn: &Connection, turn: TurnId) -> Result<Vec<StepRow>> {
    store::list_steps(conn, turn)
}

/// A step's tool invocations, in the order of the calls: effect mode,
/// status, attempts, idempotency key, result.
pub fn invocations(conn: &Connection, step: StepId) -> Result<Vec<InvocationRow>> {
    store::list_invocations(conn, step)
}

/// A session's compactions, oldest first: boundary, trigger and its tokens,
/// tokens before and after, summariser model, attempts, error.
pub fn compactions(conn: &Connection, session: SessionId) -> Result<Vec<CompactionRow>> {
    store::list_compactions(conn, session)
}

/// A session's pinned facts, oldest first, superseded ones included (each
/// names the pin it superseded).
pub fn pins(conn: &Connection, session: SessionId) -> Result<Vec<crate::pins::Pin>> {
    store::list_pins(conn, session)
}

/// The pins live at turn `boundary`: the newest value of each slot stated
/// at or before it, every other fact not mentioned in passing, and the
/// `window` newest of those that are ([`crate::pins::Fact::in_passing`]; the
/// compactor uses [`crate::CompactionConfig::pins_window`], default
/// [`crate::pins::DEFAULT_PINS_WINDOW`]); what a compaction at that boundary
/// carries (G8).
pub fn live_pins(
    conn: &Connection,
    session: SessionId,
    boundary: i64,
    window: usize,
) -> Result<Vec<crate::pins::Pin>> {
    store::live_pins(conn, session, boundary, window)
}

/// The full, uncompacted transcript of a session, with compaction points marked.
pub fn export_session(conn: &Connection, key: &SessionKey, format: ExportFormat) -> Result<String> {
    let session = session(conn, key)?;
    render_export(conn, &session, format)
}

/// The async read API on a store: each call is one read on a pooled connection
/// (see the [module docs](crate::inspect)).
impl Store {
    /// One session, by id or external id.
    pub async fn session(&self, key: impl Into<SessionKey>) -> Result<SessionRow> {
        let key = key.into();
        self.call(move |c| session(c, &key)).await
    }

    /// Every session with its counts.
    pub async fn sessions(&self) -> Result<Vec<SessionSummary>> {
        self.call(|c| sessions(c)).await
    }

    /// A session's turns, in order.
    pub async fn turns(&self, session: SessionId) -> Result<Vec<TurnRow>> {
        self.call(move |c| turns(c, session)).await
    }

    /// What the session's next turn reads (see [`SessionView`]).
    pub async fn view(&self, session: SessionId) -> Result<SessionView> {
        self.call(move |c| view(c, session)).await
    }

    /// A turn's steps, in order.
    pub async fn steps(&self, turn: TurnId) -> Result<Vec<StepRow>> {
        self.call(move |c| steps(c, turn)).await
    }

    /// A step's tool invocations, in the order of the calls.
    pub async fn invocations(&self, step: StepId) -> Result<Vec<InvocationRow>> {
        self.call(move |c| invocations(c, step)).await
    }

    /// A session's compactions, oldest first.
    pub async fn compactions(&self, session: SessionId) -> Result<Vec<CompactionRow>> {
        self.call(move |c| compactions(c, session)).await
    }

    /// A session's pinned facts, oldest first.
    pub async fn pins(&self, session: SessionId) -> Result<Vec<crate::pins::Pin>> {
        self.call(move |c| pins(c, session)).await
    }

    /// A session's full, uncompacted transcript.
    pub async fn export(&self, key: impl Into<SessionKey>, format: ExportFormat) -> Result<String> {
        let key = key.into();
        self.call(move |c| export_session(c, &key, format)).await
    }

    /// Rebuilds an executed step's messages and compares them with the hash
    /// recorded when it ran (G3).
    pub async fn rebuild_step(&self, step: StepId) -> Result<crate::replay::Rebuilt> {
        self.call(move |c| crate::replay::rebuild_step(c, step))
            .await
    }

    /// Checks the guarantees on the whole store, with the host's effect checks.
    pub async fn verify(
        &self,
        effect_checks: Vec<Box<dyn crate::verify::EffectCheck + Send>>,
    ) -> Result<crate::verify::Report> {
        self.call(move |c| {
            let checks: Vec<&dyn crate::verify::EffectCheck> =
                effect_checks.iter().map(|b| b.as_ref() as _).collect();
            crate::verify::verify_with(c, &checks)
        })
        .await
    }
}

/// Finds a session from what a user typed: `id:N` is the numeric id,
/// `ext:TEXT` the external id, and anything else the external id or the
/// numeric id. When a bare key is both (an external id "1" and session id 1)
/// and they name different sessions, [`Error::AmbiguousSession`]: one never
/// shadows the other.
pub fn resolve_session(conn: &Connection, key: &str) -> Result<SessionRow> {
    let unknown = || Error::UnknownSession(key.into());
    let by_id = |text: &str| -> Result<Option<SessionRow>> {
        match text.trim().parse::<i64>() {
            Ok(id) => match store::get_session(conn, SessionId(id)) {
                Ok(row) => Ok(Some(row)),
                Err(Error::UnknownSession(_)) => Ok(None),
                Err(e) => Err(e),
            },
            Err(_) => Ok(None),
        }
    };
    if let Some(id) = key.strip_prefix("id:") {
        return by_id(id)?.ok_or_else(unknown);
    }
    if let Some(ext) = key.strip_prefix("ext:") {
        return store::find_session(conn, ext)?.ok_or_else(unknown);
    }
    match (store::find_session(conn, key)?, by_id(key)?) {
        (Some(a), Some(b)) if a.id != b.id => Err(Error::AmbiguousSession {
            key: key.into(),
            external_of: a.id,
        }),
        (Some(row), _) | (None, Some(row)) => Ok(row),
        (None, None) => Err(unknown()),
    }
}

/// Every session with its counts.
pub fn sessions(conn: &Connection) -> Result<Vec<SessionSummary>> {
    store::list_sessions(conn)?
        .into_iter()
        .map(|s| {
            Ok(SessionSummary {
                counts: store::session_counts(conn, s.id)?,
                session: s,
            })
        })
        .collect()
}

/// One session: its turns and compactions.
pub fn session_detail(conn: &Connection, key: &str) -> Result<SessionDetail> {
    let s = resolve_session(conn, key)?;
    let turns = store::list_turns(conn, s.id)?
        .into_iter()
        .map(|t| {
            let step_ids: Vec<StepId> = store::list_steps(conn, t.id)?
                .iter()
                .map(|s| s.id)
                .collect();
            Ok(TurnSummary {
                steps: step_ids.len() as i64,
                step_ids,
                turn: t,
            })
        })
        .collect::<Result<_>>()?;
    let parent_external_id = match &s.parent {
        Some(p) => Some(store::get_session(conn, p.session_id)?.external_id),
        None => None,
    };
    Ok(SessionDetail {
        parent_external_id,
        children: store::children(conn, s.id)?,
        compactions: store::list_compactions(conn, s.id)?,
        live_pins: store::live_pins(conn, s.id, i64::MAX, crate::pins::DEFAULT_PINS_WINDOW)?,
        redactions: store::list_redactions(conn, s.id)?,
        approvals: approvals(conn, s.id)?,
        summary: SessionSummary {
            counts: store::session_counts(conn, s.id)?,
            session: s,
        },
        turns,
    })
}

/// Ids of every executed step (with a recorded hash).
pub fn executed_step_ids(conn: &Connection) -> Result<Vec<StepId>> {
    store::executed_step_ids(conn, None)
}

/// Ids of one session's executed steps.
pub fn session_step_ids(conn: &Connection, session_id: SessionId) -> Result<Vec<StepId>> {
    store::executed_step_ids(conn, Some(session_id))
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// Human-readable.
    Markdown,
    /// One JSON object per line.
    Jsonl,
}

/// One transcript record, in order.
fn records(conn: &Connection, session: &SessionRow) -> Result<Vec<serde_json::Value>> {
    let compactions = store::list_compactions(conn, session.id)?;
    let mut out = Vec::new();
    // A fork: its parent and fork point first; the shared turns follow as
    // the fork reads them, then its own.
    if let Some(p) = &session.parent {
        let parent = store::get_session(conn, p.session_id)?.external_id;
        out.push(match p.kind {
            store::ParentKind::Fork => {
                json!({"kind": "forked_from", "parent": parent, "at_turn": p.turn})
            }
            _ => json!({"kind": "delegated_by", "parent": parent, "parent_turn": p.turn, "call": p.call}),
        });
    }
    for turn in store::list_turns(conn, session.id)? {
        out.push(json!({"kind": "user", "turn": turn.idx, "text": turn.input}));
        for step in store::list_steps(conn, turn.id)? {
            if let Some(resp) = &step.response {
                let resp: ModelResponse = serde_json::from_str(resp)?;
                for b in &resp.blocks {
                    let v = match b {
                        ResponseBlock::Text { text } => json!({"kind": "assistant", "text": text}),
                        ResponseBlock::ToolUse {
                            id, name, input, ..
                        } => {
                            json!({"kind": "tool_call", "id": id, "name": name, "input": input})
                        }
                        ResponseBlock::Thinking {
                            thinking,
                            signature,
                        } => {
                            json!({"kind": "thinking", "text": thinking, "signature": signature})
                        }
                        ResponseBlock::RedactedThinking { data } => {
                            json!({"kind": "redacted_thinking", "data": data})
                        }
                        ResponseBlock::Data { value } => json!({"kind": "data", "value": value}),
                        ResponseBlock::Other { kind, value } => {
                            json!({"kind": "other", "type": kind, "value": value})
                        }
                    };
                    let mut v = v;
                    v["turn"] = json!(turn.idx);
                    v["step"] = json!(step.idx);
                    out.push(v);
                }
            }
            for inv in store::list_invocations(conn, step.id)? {
                out.push(json!({
                    "kind": "tool_result", "turn": turn.idx, "step": step.idx,
                    "id": inv.tool_call_id, "name": inv.tool_name, "status": inv.status,
                    "result": inv.result,
                }));
            }
            if step.status == store::StepStatus::Failed {
                out.push(json!({"kind": "step_failed", "turn": turn.idx, "step": step.idx, "error": step.error}));
            }
        }
        if turn.status == store::TurnStatus::Failed {
            out.push(json!({"kind": "turn_failed", "turn": turn.idx, "error": turn.error}));
        }
        for c in compactions
            .iter()
            .filter(|c| c.up_to_turn_index == turn.idx)
        {
            out.push(json!({
                "kind": "compaction", "up_to_turn": c.up_to_turn_index, "status": c.status,
                "trigger": c.trigger, "tokens_before": c.tokens_before, "tokens_after": c.tokens_after,
                "summary": c.summary,
            }));
        }
    }
    // The sessions that hang off it, last: forks and delegated children.
    for child in store::children(conn, session.id)? {
        if let Some(p) = &child.parent {
            out.push(json!({
                "kind": "child", "relation": p.kind, "session": child.external_id,
                "parent_turn": p.turn, "call": p.call,
            }));
        }
    }
    Ok(out)
}

/// The full, uncompacted transcript of the session a user typed (see
/// [`resolve_session`]), with compaction points marked.
pub fn export(conn: &Connection, key: &str, format: ExportFormat) -> Result<String> {
    let session = resolve_session(conn, key)?;
    render_export(conn, &session, format)
}

fn render_export(conn: &Connection, session: &SessionRow, format: ExportFormat) -> Result<String> {
    let session = session.clone();
    let recs = records(conn, &session)?;
    let mut out = String::new();
    match format {
        ExportFormat::Jsonl => {
            for r in recs {
                out.push_str(&r.to_string());
                out.push('\n');
            }
        }
        ExportFormat::Markdown => {
            out.push_str(&format!(
                "# Session {} ({})\n\nModel: {}\n\n> {}\n",
                session.external_id, session.id, session.model, session.system_prompt
            ));
            let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or("").to_string();
            for r in recs {
                match r["kind"].as_str().unwrap_or("") {
                    "user" => out.push_str(&format!(
                        "\n## Turn {}\n\n**User:** {}\n",
                        r["turn"],
                        s(&r, "text")
                    )),
                    "assistant" => out.push_str(&format!("\n**Assistant:** {}\n", s(&r, "text"))),
                    "tool_call" => out.push_str(&format!(
                        "\n- tool call `{}` `{}` {}\n",
                        s(&r, "id"),
                        s(&r, "name"),
                        r["input"]
                    )),
                    "tool_result" => out.push_str(&format!(
                        "- tool result `{}` ({}): {}\n",
                        s(&r, "id"),
                        s(&r, "status"),
                        s(&r, "result")
                    )),
                    "compaction" => out.push_str(&format!(
                        "\n---\n**Compaction up to turn {}** ({}, {}; tokens {} → {})\n\n{}\n---\n",
                        r["up_to_turn"],
                        s(&r, "status"),
                        s(&r, "trigger"),
                        r["tokens_before"],
                        r["tokens_after"],
                        s(&r, "summary")
                    )),
                    "turn_failed" | "step_failed" => {
                        out.push_str(&format!("\n**Failed:** {}\n", s(&r, "error")))
                    }
                    "forked_from" => out.push_str(&format!(
                        "\nForked from `{}` at turn {}: turns 0-{} are that session's.\n",
                        s(&r, "parent"),
                        r["at_turn"],
                        r["at_turn"]
                    )),
                    "delegated_by" => out.push_str(&format!(
                        "\nDelegated by `{}`: runs tool call `{}` of its turn {}.\n",
                        s(&r, "parent"),
                        s(&r, "call"),
                        r["parent_turn"]
                    )),
                    "child" => out.push_str(&format!(
                        "\n- {} `{}` (turn {}{})\n",
                        if s(&r, "relation") == "fork" {
                            "fork"
                        } else {
                            "delegated child"
                        },
                        s(&r, "session"),
                        r["parent_turn"],
                        r["call"]
                            .as_str()
                            .map(|c| format!(", call `{c}`"))
                            .unwrap_or_default()
                    )),
                    _ => out.push_str(&format!("\n{r}\n")),
                }
            }
        }
    }
    Ok(out)
}
