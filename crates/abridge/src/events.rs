//! The event stream hosts and UIs subscribe to ([`crate::Runner::subscribe`]).
//!
//! Every event names what it is about ([`Subject`]: the session as the host
//! named it, its model, the turn) and what happened ([`EventKind`]): a turn
//! started, finished or failed; a step started, got its response, completed; a
//! tool call started and completed (with its effect mode); a lease was taken
//! over; a compaction was claimed, waited on, completed or failed.
//!
//! Events are also emitted as `tracing` events where they matter to an
//! operator; the stream is for code that wants to react (a progress view, a
//! metrics exporter). Sending never blocks: a subscriber that falls more than
//! 1,024 events behind misses the oldest (tokio broadcast semantics,
//! `RecvError::Lagged`), and goes on from the oldest still held. A
//! subscriber that is one more task on a runtime busy with many sessions can
//! fall that far behind between its turns: give it a thread of its own where
//! it must see every event, and read counts that must be exact (steps that
//! waited for a summary, compactions) from the store, which records each one
//! ([`crate::inspect`], `abridge report`).
//!
//! ```no_run
//! use abridge::events::EventKind;
//! use tokio::sync::broadcast::error::RecvError;
//! # async fn run(runner: abridge::Runner) {
//! let mut events = runner.subscribe();
//! tokio::spawn(async move {
//!     loop {
//!         let e = match events.recv().await {
//!             Ok(e) => e,
//!             // Fell behind: the oldest events are gone, the stream goes on.
//!             Err(RecvError::Lagged(missed)) => {
//!                 eprintln!("missed {missed} events");
//!                 continue;
//!             }
//!             Err(RecvError::Closed) => break,
//!         };
//!         match &e.kind {
//!             EventKind::TurnStarted { .. } => println!("{} turn {:?}: working", e.subject.session, e.subject.turn),
//!             EventKind::ToolStarted { tool, effect, .. } => println!("  calling {tool} ({effect:?})"),
//!             EventKind::Compacted { tokens_before, tokens_after, summariser_model, .. } => println!(
//!                 "{}: context {tokens_before} -> {tokens_after} tokens (by {summariser_model:?})",
//!                 e.subject.session
//!             ),
//!             EventKind::TurnFailed { error, .. } => eprintln!("{}: {error}", e.subject.session),
//!             _ => {}
//!         }
//!     }
//! });
//! # }
//! ```

use crate::ids::{CompactionId, InvocationId, SessionId, StepId, TurnId};
use crate::store::{Effect, SessionRow};
use serde::Serialize;
use tokio::sync::broadcast;

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subject {
    /// The session's row id.
    pub session_id: SessionId,
    /// The session as the host named it (its external id).
    pub session: String,
    /// The session's model.
    pub model: String,
    /// The turn's index, when the event belongs to one (a manual compaction
    /// does not).
    pub turn: Option<i64>,
    /// The session's parent, for a fork or a delegated child: the tree the
    /// event belongs to.
    pub parent: Option<SessionId>,
}

impl Subject {
    pub(crate) fn of(session: &SessionRow, turn: Option<i64>) -> Subject {
        Subject {
            session_id: session.id,
            session: session.external_id.clone(),
            model: session.model.clone(),
            turn,
            parent: session.parent.as_ref().map(|p| p.session_id),
        }
    }
}

/// One event: what it is about and what happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// The session, its model and the turn.
    #[serde(flatten)]
    pub subject: Subject,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// This runner took the turn's lease and is running it (`resumed`: the
    /// turn had been started before, by this or another runner).
    TurnStarted {
        /// The turn.
        turn_id: TurnId,
        /// True when the turn existed already.
        resumed: bool,
    },
    /// The turn ended with a final answer.
    TurnFinished {
        /// The turn.
        turn_id: TurnId,
        /// Steps it took.
        steps: i64,
    },
    /// The turn ended failed (its error is stored with it).
    TurnFailed {
        /// The turn.
        turn_id: TurnId,
        /// The error.
        error: String,
    },
    /// A step is about to be prepared (a compaction it needs first) and sent
    /// to the model.
    StepStarted {
        /// The step.
        step_id: StepId,
        /// Its index in the turn.
        step: i64,
    },
    /// The model answered and the response is stored.
    StepResponded {
        /// The step.
        step_id: StepId,
        /// Its index in the turn.
        step: i64,
        /// Tool calls in the response.
        tool_calls: usize,
        /// Reported input tokens.
        input_tokens: Option<i64>,
        /// Reported output tokens.
        output_tokens: Option<i64>,
    },
    /// A piece of the model's answer to a step, as it arrived (only from a
    /// runner that streams, [`crate::RunnerConfig::stream`]: the host's
    /// opt-in to events carrying the answer's text). Sent before the
    /// response is stored; a step whose call is tried again sends its
    /// pieces again, from the start. What is stored is the whole response,
    /// as [`EventKind::StepResponded`] says.
    ModelDelta {
        /// The step.
        step_id: StepId,
        /// Its index in the turn.
        step: i64,
        /// The call's attempt, from 1: a new attempt starts the answer over.
        attempt: u32,
        /// The piece.
        delta: crate::model::Delta,
    },
    /// The step's tools all finished and the step is complete.
    StepCompleted {
        /// The step.
        step_id: StepId,
        /// Its index in the turn.
        step: i64,
    },
    /// A tool call is about to run (for a transactional tool, inside the
    /// step's transaction: it happens when that commits).
    ToolStarted {
        /// The step.
        step_id: StepId,
        /// The model's id of the call.
        tool_call_id: String,
        /// The tool.
        tool: String,
        /// Its effect mode.
        effect: Effect,
    },
    /// A tool call finished; `ok` is false for an error result.
    ToolCompleted {
        /// The step.
        step_id: StepId,
        /// The invocation row.
        invocation_id: InvocationId,
        /// The model's id of the call.
        tool_call_id: String,
        /// The tool.
        tool: String,
        /// Its effect mode.
        effect: Effect,
        /// False when the model gets an error result.
        ok: bool,
    },
    /// A tool call waits for a decision or a delivered result (committed
    /// with its step's transaction).
    ApprovalRequested {
        /// The step that made the call.
        step_id: StepId,
        /// The parked call (`abridge approve --call`).
        call: crate::ids::CallId,
        /// The tool.
        tool: String,
        /// What it waits for.
        kind: crate::store::ApprovalKind,
    },
    /// A delegating call runs its child session (created now, or found
    /// again after a crash); the child's own events name it, and their
    /// subject names this session as their parent.
    Delegated {
        /// The parent's step.
        step_id: StepId,
        /// The call it runs for.
        tool_call_id: String,
        /// The child session's row id.
        child_id: SessionId,
        /// The child session's external id.
        child: String,
        /// Whether this call created it (false: found again).
        created: bool,
    },
    /// The turn stopped to wait: its lease is released, no process holds it.
    TurnParked {
        /// The turn.
        turn_id: TurnId,
        /// How many of its calls wait.
        calls: usize,
    },
    /// A parked turn went on: the decisions taken for its calls were applied.
    TurnResumed {
        /// The turn.
        turn_id: TurnId,
    },
    /// A deferred call's result was delivered (by [`crate::Runner::decide`]).
    ResultDelivered {
        /// The call.
        call: crate::ids::CallId,
        /// The tool.
        tool: String,
    },
    /// A decision was taken for a parked call (by [`crate::Runner::decide`]);
    /// `status` is `approved` or `rejected`.
    CallDecided {
        /// The call.
        call: crate::ids::CallId,
        /// The tool.
        tool: String,
        /// The decision's outcome.
        status: crate::store::ApprovalStatus,
    },
    /// This runner took over a turn's lease from another holder (expired, or
    /// provably gone).
    LeaseTakenOver {
        /// The turn.
        turn_id: TurnId,
        /// The owner name of the previous holder.
        from: String,
    },
    /// A compaction row was claimed (or taken over) and the summariser runs.
    CompactionClaimed {
        /// The row.
        compaction_id: CompactionId,
        /// Turns 0..=boundary are being summarised.
        boundary: i64,
        /// Claims and takeovers of the row so far.
        attempt: i64,
        /// The measure that triggered it (None: a manual compaction).
        trigger_tokens: Option<i64>,
    },
    /// A step waited for a summary before its model call: it reached the
    /// hard threshold with no completed compaction at its boundary, and the
    /// summary was made, finished or waited for inline. Background
    /// compaction exists so that this is rare; the wait is also stored on
    /// the step (`summary_wait_ms`).
    WaitedForSummary {
        /// The step.
        step_id: StepId,
        /// The boundary of the compaction it waited for.
        boundary: i64,
        /// Milliseconds waited.
        waited_ms: i64,
    },
    /// The model (or the estimate against its window) said a step's context
    /// is too long; the step is tried once more with a smaller one.
    ContextOverflow {
        /// The step.
        step_id: StepId,
        /// What was done: `"compacted"` (every turn before this one folded
        /// into a summary) or `"elided"` (the results of this turn's first
        /// `elided_steps` steps sent as placeholders).
        remedy: &'static str,
        /// For `"elided"`, the steps whose results are placeholders.
        elided_steps: i64,
        /// What the provider said.
        message: String,
    },
    /// The row is pending under another live claim (another task, runner or
    /// process is summarising): this caller waits for it to settle, up to
    /// the compaction's `wait_timeout`. Sent once per wait.
    CompactionWaiting {
        /// The row.
        compaction_id: CompactionId,
        /// Boundary.
        boundary: i64,
        /// The owner name of the claim being waited on.
        holder: String,
    },
    /// A compaction completed (sent by the holder whose summary won).
    Compacted {
        /// The row.
        compaction_id: CompactionId,
        /// Turns 0..=boundary are summarised.
        boundary: i64,
        /// The measure that triggered it (None: a manual compaction).
        trigger_tokens: Option<i64>,
        /// Tokens of what the summary replaces.
        tokens_before: i64,
        /// Tokens of the summary.
        tokens_after: i64,
        /// The summariser's model.
        summariser_model: Option<String>,
        /// Summariser input tokens.
        input_tokens: Option<i64>,
        /// Summariser output tokens.
        output_tokens: Option<i64>,
        /// Summariser calls.
        summary_calls: i64,
        /// Live pins stated at or before the boundary (all in the summary, G8).
        pins_live: i64,
        /// Of those, how many the guard appended because the summariser's
        /// text lacked them.
        pins_added: i64,
    },
    /// A compaction is claimed one turn after the previous one: the last
    /// summary left no room under the threshold (raise the threshold, lower
    /// `max_summary_share`, or keep fewer recent turns). `verify` and
    /// `inspect` list such compactions too.
    CompactingOften {
        /// The boundary being claimed.
        boundary: i64,
        /// The previous completed compaction's boundary.
        previous_boundary: i64,
    },
    /// The pinned facts the guard appended to a summary did not fit the pins
    /// budget even without their sentences; they were all kept (a live pin
    /// is never dropped).
    PinsOverBudget {
        /// The row.
        compaction_id: CompactionId,
        /// Pins appended.
        pins: usize,
        /// Chars of the block.
        chars: usize,
        /// The budget, chars.
        budget: usize,
    },
    /// The pins live for good (what the user stated for a slot, rules, the
    /// host's pins) alone fill the pinned facts' share of the threshold
    /// ([`crate::CompactionConfig::pins_max_share`]): every fact mentioned
    /// in passing was folded and they were all kept, so the summary leaves
    /// less room (raise the threshold or the share). `verify` notes it.
    PinsOverShare {
        /// The row.
        compaction_id: CompactionId,
        /// Live pins kept.
        pins: usize,
        /// Chars of those pins as block lines without sentences.
        chars: usize,
        /// The share, chars.
        share: usize,
    },
    /// A summariser attempt failed; `last` is true when the row is now failed.
    CompactionFailed {
        /// The row.
        compaction_id: CompactionId,
        /// Boundary.
        boundary: i64,
        /// The error.
        error: String,
        /// True after the last attempt.
        last: bool,
    },
    /// A warning a host should see once (e.g. an unknown context window).
    Warning {
        /// What.
        message: String,
    },
}

/// The sending side, shared by the runner and the compactor.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: broadcast::Sender<Event>,
    /// Whether events and logs may carry text that can hold a conversation's
    /// content (see [`EventSink::shown`]).
    log_content: bool,
    /// Sees every event as it is sent (the `otel` feature's spans).
    observer: Option<std::sync::Arc<dyn Observer>>,
}

/// Code that sees every event as it is sent, in the sender's task
/// (telemetry): it must not block.
pub(crate) trait Observer: Send + Sync + std::fmt::Debug {
    /// One event.
    fn observe(&self, event: &Event);
}

impl Default for EventSink {
    fn default() -> Self {
        EventSink::new(false)
    }
}

impl EventSink {
    /// A sink; with `log_content`, events and logs carry providers' and
    /// summarisers' error texts as they came.
    pub fn new(log_content: bool) -> EventSink {
        EventSink {
            tx: broadcast::channel(1024).0,
            log_content,
            observer: None,
        }
    }

    /// The sink with `observer` seeing every event it sends.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn with_observer(mut self, observer: std::sync::Arc<dyn Observer>) -> EventSink {
        self.observer = Some(observer);
        self
    }

    /// `text` that may hold a conversation's content (a provider's or a
    /// summariser's error message can quote what it was sent), as events and
    /// logs show it: whole when the host opted in
    /// (`RunnerConfig::log_content`), else only its length and a hash.
    pub fn shown(&self, text: &str) -> String {
        if self.log_content || text.is_empty() {
            return text.to_string();
        }
        let hash = crate::message::sha256_hex(text.as_bytes());
        format!(
            "[{} characters, sha256 {}]",
            text.chars().count(),
            &hash[..16]
        )
    }

    /// An error as events and logs show it: its own words, with any text it
    /// carries from a provider or summariser passed through
    /// [`EventSink::shown`].
    pub fn error(&self, e: &crate::error::Error) -> String {
        let full = e.to_string();
        match e.quoted_text() {
            Some(quoted) if !self.log_content && !quoted.is_empty() => {
                full.replace(quoted, &self.shown(quoted))
            }
            _ => full,
        }
    }

    /// Sends an event to every current subscriber.
    pub fn emit(&self, subject: &Subject, kind: EventKind) {
        if let Some(observer) = &self.observer {
            let event = Event {
                subject: subject.clone(),
                kind,
            };
            observer.observe(&event);
            if self.tx.receiver_count() > 0 {
                let _ = self.tx.send(event);
            }
            return;
        }
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(Event {
                subject: subject.clone(),
                kind,
            });
        }
    }

    /// Whether anyone subscribes (or an observer sees the events).
    pub(crate) fn listened(&self) -> bool {
        self.observer.is_some() || self.tx.receiver_count() > 0
    }

    /// A new subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
