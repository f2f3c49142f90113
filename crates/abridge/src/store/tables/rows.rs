//! Row structs: one per table, exactly as stored. Domain logic lives elsewhere.

use crate::ids::{CallId, CompactionId, InvocationId, SessionId, StepId, TurnId};
use crate::store::db::Row;
use serde::Serialize;

macro_rules! status_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            /// The value stored in the status column.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),+ }
            }
            pub(crate) fn parse(s: &str) -> rusqlite::Result<Self> {
                match s {
                    $($s => Ok($name::$variant),)+
                    other => Err(rusqlite::Error::FromSqlConversionFailure(
                        0,
                        rusqlite::types::Type::Text,
                        format!("unknown {} {other:?}", stringify!($name)).into(),
                    )),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status_enum!(
    /// A turn's status.
    TurnStatus {
        /// Steps are being run (or the runner crashed; resume it).
        Running = "running",
        /// The model gave a final answer.
        Completed = "completed",
        /// Failed by policy (max steps, bad response, failed compaction).
        Failed = "failed",
    }
);

status_enum!(
    /// A step's status.
    StepStatus {
        /// Claimed; the model response is not persisted yet.
        Running = "running",
        /// The model response is persisted; tools may still be running.
        Responded = "responded",
        /// Every tool call is recorded.
        Completed = "completed",
        /// The step failed the turn.
        Failed = "failed",
    }
);

status_enum!(
    /// A tool invocation's status.
    InvocationStatus {
        /// Recorded before the call; no result yet.
        Started = "started",
        /// Finished with a result.
        Completed = "completed",
        /// Finished with an error result the model sees.
        Failed = "failed",
    }
);

status_enum!(
    /// A compaction's status.
    CompactionStatus {
        /// Claimed; the summary is being written.
        Pending = "pending",
        /// The summary is final and never changes (G2).
        Completed = "completed",
        /// Every attempt failed; no step reads it.
        Failed = "failed",
    }
);

status_enum!(
    /// How a tool's effect is made exactly-once (or at-most-once).
    Effect {
        /// The tool's writes commit in the transaction that records its result.
        Transactional = "transactional",
        /// Called again with the same idempotency key after a crash.
        Idempotent = "idempotent",
        /// Never called twice; a crash mid-call gives an "outcome unknown" result.
        AtMostOnce = "at_most_once",
        /// No tool ran (unknown tool, malformed arguments): an error result.
        None = "none",
    }
);

/// A `sessions` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionRow {
    /// Primary key.
    pub id: SessionId,
    /// The host's id for the session.
    pub external_id: String,
    /// Model the steps call.
    pub model: String,
    /// System prompt, first in every message array.
    pub system_prompt: String,
    /// Host metadata, JSON.
    pub config: String,
    /// Creation time, ms.
    pub created_at: i64,
    /// The newest redaction of the session (its id in `redactions`), 0 when
    /// none: a message context kept from before a newer one is built again.
    pub redaction: i64,
    /// Where the session comes from: a fork's parent and fork point, or the
    /// tool call a delegated child runs for. None for a session of its own.
    pub parent: Option<ParentLink>,
    /// A fork: the compaction its parent had completed at or before the fork
    /// point, which it reads until it completes one of its own.
    pub base_compaction: Option<CompactionId>,
}

/// How a session hangs off another (see [`SessionRow::parent`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParentLink {
    /// The parent session.
    pub session_id: SessionId,
    /// `fork` or `delegate`.
    pub kind: ParentKind,
    /// A fork: its fork point (the last of the parent's turns it reads). A
    /// delegated child: the index of the parent's turn whose call it runs.
    pub turn: i64,
    /// A delegated child: the id of the tool call it runs for.
    pub call: Option<String>,
}

/// What a [`ParentLink`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ParentKind {
    /// A branch: the parent's history up to a turn, then its own.
    Fork,
    /// A sub-agent: runs one tool call of its parent; its final answer is
    /// that call's result.
    Delegate,
}

impl ParentKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ParentKind::Fork => "fork",
            ParentKind::Delegate => "delegate",
        }
    }
}

impl SessionRow {
    /// The fork point, for a fork.
    pub fn fork_point(&self) -> Option<i64> {
        self.parent
            .as_ref()
            .filter(|p| p.kind == ParentKind::Fork)
            .map(|p| p.turn)
    }

    /// The index of the session's first own turn: after its fork point for a
    /// fork, 0 otherwise.
    pub fn first_own_turn(&self) -> i64 {
        self.fork_point().map_or(0, |t| t + 1)
    }
}

impl SessionRow {
    /// How many columns [`SessionRow::COLUMNS`] reads.
    pub(crate) const WIDTH: usize = 12;
    /// Read `FROM sessions` (so named, for the redaction's subquery).
    pub(crate) const COLUMNS: &'static str =
        "id, external_id, model, system_prompt, config, created_at, \
         (SELECT coalesce(max(r.id), 0) FROM redactions r WHERE r.session_id = sessions.id), \
         parent_id, parent_kind, parent_turn, parent_call, base_compaction_id";
    pub(crate) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        let parent = match r.get::<_, Option<SessionId>>(7)? {
            Some(session_id) => Some(ParentLink {
                session_id,
                kind: match r.get::<_, Option<String>>(8)?.as_deref() {
                    Some("delegate") => ParentKind::Delegate,
                    _ => ParentKind::Fork,
                },
                turn: r.get::<_, Option<i64>>(9)?.unwrap_or(-1),
                call: r.get(10)?,
            }),
            None => None,
        };
        Ok(SessionRow {
            parent,
            base_compaction: r.get(11)?,
            id: r.get(0)?,
            external_id: r.get(1)?,
            model: r.get(2)?,
            system_prompt: r.get(3)?,
            config: r.get(4)?,
            created_at: r.get(5)?,
            redaction: r.get(6)?,
        })
    }
}

/// A `turns` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnRow {
    /// Primary key.
    pub id: TurnId,
    /// Owning session.
    pub session_id: SessionId,
    /// Position in the session, from 0.
    pub idx: i64,
    /// The user's input.
    pub input: String,
    /// Status.
    pub status: TurnStatus,
    /// The final answer's text.
    pub output: Option<String>,
    /// Why the turn failed.
    pub error: Option<String>,
    /// Current lease holder.
    pub lease_owner: Option<String>,
    /// Fencing epoch.
    pub lease_epoch: i64,
    /// Lease expiry, ms.
    pub lease_expires_at: Option<i64>,
    /// Creation time, ms.
    pub created_at: i64,
    /// When it completed or failed, ms.
    pub finished_at: Option<i64>,
}

impl TurnRow {
    pub(crate) const COLUMNS: &'static str = "id, session_id, idx, input, status, output, error, \
         lease_owner, lease_epoch, lease_expires_at, created_at, finished_at";
    pub(crate) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(TurnRow {
            id: r.get(0)?,
            session_id: r.get(1)?,
            idx: r.get(2)?,
            input: r.get(3)?,
            status: TurnStatus::parse(&r.get::<_, String>(4)?)?,
            output: r.get(5)?,
            error: r.get(6)?,
            lease_owner: r.get(7)?,
            lease_epoch: r.get(8)?,
            lease_expires_at: r.get(9)?,
            created_at: r.get(10)?,
            finished_at: r.get(11)?,
        })
    }
}

/// A `steps` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRow {
    /// Primary key.
    pub id: StepId,
    /// Owning turn.
    pub turn_id: TurnId,
    /// Position in the turn, from 0.
    pub idx: i64,
    /// Status.
    pub status: StepStatus,
    /// The completed compaction the step read (None: none).
    pub compaction_id: Option<CompactionId>,
    /// SHA-256 of the exact message bytes sent.
    pub messages_sha256: Option<String>,
    /// The model response, JSON of [`crate::ModelResponse`].
    pub response: Option<String>,
    /// Reported input tokens.
    pub input_tokens: Option<i64>,
    /// Reported output tokens.
    pub output_tokens: Option<i64>,
    /// Context measure compaction decides on.
    pub context_tokens: Option<i64>,
    /// True when `context_tokens` is an estimate.
    pub estimated: bool,
    /// Why the step failed.
    pub error: Option<String>,
    /// The message renderer its hash was computed with (see
    /// [`crate::render::RenderFormat`]).
    pub render_format: i64,
    /// Milliseconds the step waited for a summary before its model call
    /// (None: it did not wait).
    pub summary_wait_ms: Option<i64>,
    /// Input tokens the provider read from its prompt cache (None: not
    /// reported).
    pub cache_read_tokens: Option<i64>,
    /// Input tokens the provider wrote to its prompt cache.
    pub cache_write_tokens: Option<i64>,
    /// The tool results of this turn's first `elided_steps` steps were sent
    /// as placeholders (context overflow inside the turn); 0 for most steps.
    pub elided_steps: i64,
}

impl StepRow {
    pub(crate) const COLUMNS: &'static str = "id, turn_id, idx, status, compaction_id, \
         messages_sha256, response, input_tokens, output_tokens, context_tokens, estimated, error, \
         render_format, summary_wait_ms, cache_read_tokens, cache_write_tokens, elided_steps";
    pub(crate) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(StepRow {
            id: r.get(0)?,
            turn_id: r.get(1)?,
            idx: r.get(2)?,
            status: StepStatus::parse(&r.get::<_, String>(3)?)?,
            compaction_id: r.get(4)?,
            messages_sha256: r.get(5)?,
            response: r.get(6)?,
            input_tokens: r.get(7)?,
            output_tokens: r.get(8)?,
            context_tokens: r.get(9)?,
            estimated: r.get(10)?,
            error: r.get(11)?,
            render_format: r.get(12)?,
            summary_wait_ms: r.get(13)?,
            cache_read_tokens: r.get(14)?,
            cache_write_tokens: r.get(15)?,
            elided_steps: r.get(16)?,
        })
    }
}

/// A `tool_invocations` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InvocationRow {
    /// Primary key.
    pub id: InvocationId,
    /// Owning step.
    pub step_id: StepId,
    /// Position of the call in the response.
    pub position: i64,
    /// The model's call id.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Arguments as JSON text.
    pub arguments: String,
    /// Effect mode.
    pub effect: Effect,
    /// The key passed to the tool.
    pub idempotency_key: String,
    /// Status.
    pub status: InvocationStatus,
    /// The result text the model sees.
    pub result: Option<String>,
    /// How many times the invocation was started.
    pub attempts: i64,
}

impl InvocationRow {
    pub(crate) const COLUMNS: &'static str = "id, step_id, position, tool_call_id, tool_name, \
         arguments, effect, idempotency_key, status, result, attempts";
    pub(crate) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(InvocationRow {
            id: r.get(0)?,
            step_id: r.get(1)?,
            position: r.get(2)?,
            tool_call_id: r.get(3)?,
            tool_name: r.get(4)?,
            arguments: r.get(5)?,
            effect: Effect::parse(&r.get::<_, String>(6)?)?,
            idempotency_key: r.get(7)?,
            status: InvocationStatus::parse(&r.get::<_, String>(8)?)?,
            result: r.get(9)?,
            attempts: r.get(10)?,
        })
    }
}

/// A `compactions` row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactionRow {
    /// Primary key.
    pub id: CompactionId,
    /// Owning session.
    pub session_id: SessionId,
    /// Turns `0..=up_to_turn_index` are replaced by the summary.
    pub up_to_turn_index: i64,
    /// The id of that turn.
    pub up_to_turn_id: TurnId,
    /// The completed compaction folded in.
    pub previous_id: Option<CompactionId>,
    /// Status.
    pub status: CompactionStatus,
    /// The summary (completed rows only).
    pub summary: Option<String>,
    /// SHA-256 of the summary, recorded at completion.
    pub summary_sha256: Option<String>,
    /// `auto` or `manual`.
    pub trigger: String,
    /// Focus text of a manual compaction.
    pub focus: Option<String>,
    /// Claims and takeovers so far.
    pub attempts: i64,
    /// Current lease holder (pending rows).
    pub lease_owner: Option<String>,
    /// Lease expiry, ms.
    pub lease_expires_at: Option<i64>,
    /// Summariser model.
    pub model: Option<String>,
    /// SHA-256 of the summariser's rules.
    pub prompt_sha256: Option<String>,
    /// Context tokens that triggered it.
    pub trigger_tokens: Option<i64>,
    /// Tokens of what the summary replaces.
    pub tokens_before: Option<i64>,
    /// Tokens of the summary.
    pub tokens_after: Option<i64>,
    /// Summariser input tokens.
    pub input_tokens: Option<i64>,
    /// Summariser output tokens.
    pub output_tokens: Option<i64>,
    /// Summariser calls made for the completed summary.
    pub summary_calls: i64,
    /// Last error.
    pub error: Option<String>,
    /// Creation time, ms.
    pub created_at: i64,
    /// Completion time, ms.
    pub completed_at: Option<i64>,
    /// Live pins the guard checked at completion (None: completed before
    /// pins existed, or not completed).
    pub pins_live: Option<i64>,
    /// Of those, how many the guard appended (the summariser's text lacked them).
    pub pins_added: Option<i64>,
    /// How many of the newest facts mentioned in passing counted as live.
    pub pins_window: Option<i64>,
    /// Claimed at the soft threshold and summarised in the background.
    pub background: bool,
    /// The threshold in force when it was claimed, in tokens (None: claimed
    /// before version 8, or compaction was off by threshold).
    pub threshold_tokens: Option<i64>,
    /// The soft (background) threshold in force when it was claimed (None:
    /// no background compaction, or claimed before version 8).
    pub soft_threshold_tokens: Option<i64>,
}

impl CompactionRow {
    pub(crate) const COLUMNS: &'static str = "id, session_id, up_to_turn_index, up_to_turn_id, \
         previous_id, status, summary, summary_sha256, trigger, focus, attempts, lease_owner, lease_expires_at, \
         model, prompt_sha256, trigger_tokens, tokens_before, tokens_after, input_tokens, \
         output_tokens, summary_calls, error, created_at, completed_at, pins_live, pins_added, pins_window, background, \
         threshold_tokens, soft_threshold_tokens";
    pub(crate) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(CompactionRow {
            id: r.get(0)?,
            session_id: r.get(1)?,
            up_to_turn_index: r.get(2)?,
            up_to_turn_id: r.get(3)?,
            previous_id: r.get(4)?,
            status: CompactionStatus::parse(&r.get::<_, String>(5)?)?,
            summary: r.get(6)?,
            summary_sha256: r.get(7)?,
            trigger: r.get(8)?,
            focus: r.get(9)?,
            attempts: r.get(10)?,
            lease_owner: r.get(11)?,
            lease_expires_at: r.get(12)?,
            model: r.get(13)?,
            prompt_sha256: r.get(14)?,
            trigger_tokens: r.get(15)?,
            tokens_before: r.get(16)?,
            tokens_after: r.get(17)?,
            input_tokens: r.get(18)?,
            output_tokens: r.get(19)?,
            summary_calls: r.get(20)?,
            error: r.get(21)?,
            created_at: r.get(22)?,
            completed_at: r.get(23)?,
            pins_live: r.get(24)?,
            pins_added: r.get(25)?,
            pins_window: r.get(26)?,
            background: r.get(27)?,
            threshold_tokens: r.get(28)?,
            soft_threshold_tokens: r.get(29)?,
        })
    }
}

status_enum!(
    /// What a parked call waits for.
    ApprovalKind {
        /// A human's decision: approve (maybe with edited arguments) or reject.
        Approval = "approval",
        /// A result another process delivers (a deferred tool).
        Result = "result",
    }
);

status_enum!(
    /// Where a parked call stands. Only `Pending` ever changes, once.
    ApprovalStatus {
        /// Waiting; its turn is parked.
        Pending = "pending",
        /// Approved: runs under its effect mode when the turn resumes.
        Approved = "approved",
        /// Rejected: the model sees the reason as the tool's result.
        Rejected = "rejected",
        /// Its result was delivered: the model sees it as the tool's result.
        Delivered = "delivered",
        /// Its turn was abandoned before a decision.
        Abandoned = "abandoned",
    }
);

/// An `approvals` row: one tool call that waited (or waits) for a decision
/// or a delivered result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalRow {
    /// The call's id (`abridge approve --call`).
    pub id: CallId,
    /// Its session.
    pub session_id: SessionId,
    /// Its turn.
    pub turn_id: TurnId,
    /// The step whose response made the call.
    pub step_id: StepId,
    /// Position of the call in the response.
    pub position: i64,
    /// The model's call id.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// The arguments as the model wrote them (JSON text).
    pub arguments: String,
    /// The effect mode the call runs under once approved (`deferred`: a
    /// tool whose result is delivered).
    pub effect: String,
    /// What it waits for.
    pub kind: ApprovalKind,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// Approved with edited arguments: those (JSON text).
    pub input: Option<String>,
    /// A rejection's reason or a delivered result.
    pub note: Option<String>,
    /// A delivered result: whether it is a success (false: an error result).
    pub ok: Option<bool>,
    /// Approved with "always allow this tool in this session".
    pub always: bool,
    /// Who decided, as the decider said.
    pub decided_by: Option<String>,
    /// When the call was parked, ms since the epoch.
    pub created_at: i64,
    /// When it was decided.
    pub decided_at: Option<i64>,
}

impl ApprovalRow {
    pub(crate) const COLUMNS: &'static str = "id, session_id, turn_id, step_id, position, \
         tool_call_id, tool_name, arguments, effect, kind, status, input, note, ok, always, \
         decided_by, created_at, decided_at";
    pub(crate) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(ApprovalRow {
            id: r.get(0)?,
            session_id: r.get(1)?,
            turn_id: r.get(2)?,
            step_id: r.get(3)?,
            position: r.get(4)?,
            tool_call_id: r.get(5)?,
            tool_name: r.get(6)?,
            arguments: r.get(7)?,
            effect: r.get(8)?,
            kind: ApprovalKind::parse(&r.get::<_, String>(9)?)?,
            status: ApprovalStatus::parse(&r.get::<_, String>(10)?)?,
            input: r.get(11)?,
            note: r.get(12)?,
            ok: r.get::<_, Option<i64>>(13)?.map(|v| v != 0),
            always: r.get::<_, i64>(14)? != 0,
            decided_by: r.get(15)?,
            created_at: r.get(16)?,
            decided_at: r.get(17)?,
        })
    }

    /// The arguments the call runs with: the edited ones if it was approved
    /// with them, else the model's.
    pub fn effective_arguments(&self) -> &str {
        self.input.as_deref().unwrap_or(&self.arguments)
    }

    /// How long it waited (or has waited, at `now`), ms.
    pub fn waited_ms(&self, now: i64) -> i64 {
        self.decided_at
            .unwrap_or(now)
            .saturating_sub(self.created_at)
            .max(0)
    }
}
