//! The durable turn/step runner.
//!
//! One step, in order: claim or resume the step row; `ensure()` the compaction
//! it reads; build the messages (a pure function of rows), serialise once and
//! hash those bytes; call the model; persist response, usage, hash and the
//! compaction id in ONE transaction; run each tool call per its effect mode,
//! exactly once per (step, tool_call_id); mark the step completed. Every write
//! is fenced by the turn's lease, so a runner whose lease was taken over cannot
//! write anything more.

mod branch;
mod config;
pub(crate) mod context;
mod delegate;
mod model_call;
mod queue;
mod step;
mod tool_calls;

pub use config::{RunnerBuilder, RunnerConfig};
pub use delegate::in_child;
use model_call::*;
pub use queue::QueueStats;
use queue::{Slot, StepQueue};
use step::*;
use tool_calls::*;

use crate::compaction::{CompactionConfig, Compactor, ExtractiveSummariser, Plan, Summariser};
use crate::error::{Error, Result};
use crate::events::{Event, EventKind, EventSink, Subject};
use crate::fault::{FaultHook, FaultPoint, TestKnobs};
use crate::ids::{InvocationId, SessionId, StepId, TurnId};
use crate::message::{ModelRequest, ModelResponse};
use crate::model::{ModelClient, ModelError};
use crate::owner::ClaimGuard;
use crate::pins::{Fact, PinExtractor, RuleExtractor};
use crate::replay::{rebuild_step, Rebuilt};
use crate::retry::RetryPolicy;
use crate::runner::context::{Context, ContextCache};
use crate::store::{
    self, ApprovalKind, ApprovalRow, ApprovalStatus, CompactionRow, Effect, InvocationStatus,
    Lease, NewApproval, NewInvocation, Responded, SessionRow, StepStatus, Store, TurnRow,
    TurnStatus,
};
use crate::store::{HistoryStep, HistoryTurn};
use crate::tools::{idempotency_key, render_result, ToolCall, ToolImpl, Tools};
use crate::unwind::{panic_message, CatchUnwind};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tracing::{instrument, warn};

/// How a turn ended, or where it stopped to wait.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The turn row, as finished (or as parked: still `running`, its lease
    /// released).
    pub turn: TurnRow,
    /// The final answer (empty while the turn is parked).
    pub output: String,
    /// Steps the turn took (so far).
    pub steps: i64,
    /// The tool calls the turn is parked on, waiting for a decision or a
    /// delivered result (see [`Runner::decide`]); empty when it finished.
    pub pending: Vec<ApprovalRow>,
}

impl TurnOutcome {
    /// Whether the turn stopped to wait ([`TurnOutcome::pending`]) rather
    /// than finished.
    pub fn is_parked(&self) -> bool {
        !self.pending.is_empty()
    }
}

struct Inner {
    store: Store,
    model: Arc<dyn ModelClient>,
    tools: Tools,
    cfg: RunnerConfig,
    compactor: Compactor,
    events: EventSink,
    /// The `chat` spans of model calls (the other spans come from `events`).
    #[cfg(feature = "otel")]
    telemetry: Option<crate::telemetry::Telemetry>,
    contexts: ContextCache,
    /// The fair queue of the steps' store-and-CPU parts.
    queue: StepQueue,
    /// Renews the leases of the turns this runner runs.
    renewals: crate::lease::Renewals,
}

/// Runs turns durably. Cheap to clone; share one per store and model.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("store", &self.inner.store)
            .field("tools", &self.inner.tools)
            .field("config", &self.inner.cfg)
            .finish()
    }
}

impl Runner {
    /// Starts building a runner over `store` calling `model`.
    pub fn builder(store: Store, model: Arc<dyn ModelClient>) -> RunnerBuilder {
        RunnerBuilder {
            store,
            model,
            tools: Tools::new(),
            summariser: None,
            cfg: RunnerConfig::default(),
            compaction: None,
            fault_hook: None,
            stream: None,
            approval: None,
            models: Vec::new(),
            #[cfg(feature = "otel")]
            telemetry: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The compactor (manual compaction, retries).
    pub fn compactor(&self) -> &Compactor {
        &self.inner.compactor
    }

    /// The configuration.
    pub fn config(&self) -> &RunnerConfig {
        &self.inner.cfg
    }

    /// Subscribes to the runner's events: its turns, steps, tool calls and
    /// compactions ([`crate::events`]). A receiver more than 1,024 events
    /// behind misses the oldest (`RecvError::Lagged`) and goes on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Whether a lease holder is provably gone, as this runner's owner sees it.
    fn gone_check(&self) -> impl Fn(&str) -> bool + Send + Sync + 'static {
        let gone = self.inner.compactor.holder_is_gone;
        let owner = self.inner.cfg.owner.clone();
        move |holder: &str| gone(holder, &owner)
    }

    /// A session by its id or the host's external id (see
    /// [`crate::inspect::SessionKey`]); the rest of the read API is on
    /// [`Store`] (see [`Runner::store`]).
    pub async fn session(&self, key: impl Into<crate::inspect::SessionKey>) -> Result<SessionRow> {
        self.inner.store.session(key).await
    }

    /// Creates a session, or returns the one with this external id.
    ///
    /// Refuses a model whose context window is unknown while the threshold
    /// is a fraction of it ([`Error::UnknownWindow`]).
    pub async fn create_session(
        &self,
        external_id: &str,
        model: &str,
        system_prompt: &str,
    ) -> Result<SessionRow> {
        self.inner.cfg.compaction.check_model(model)?;
        let (e, m, s) = (
            external_id.to_string(),
            model.to_string(),
            system_prompt.to_string(),
        );
        self.inner
            .store
            .call(move |c| store::create_session(c, &e, &m, &s, "{}"))
            .await
    }

    /// Runs a new turn with the user's `input` to its final answer.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point (a task abort, a `timeout`
    /// around it) leaves the store consistent: what committed stays, nothing
    /// half-written is visible, and every lease renewal it started stops. The
    /// turn stays `running`: [`Runner::resume_turn`] or [`Runner::run_turn_at`]
    /// continues it, at once from this process and after the lease's expiry
    /// (`RunnerConfig::lease_ttl`) from any other. A compaction it was writing
    /// is likewise free at once here and after its lease elsewhere.
    pub async fn run_turn(&self, session_id: SessionId, input: &str) -> Result<TurnOutcome> {
        self.run_turn_inner(session_id, None, input).await
    }

    /// Runs turn `idx` of the session: starts it if it is the next one, resumes
    /// it if it exists with the same input and is still running, and returns it
    /// as it ended if it already finished. For hosts that replay a script after a
    /// crash: calling it again is always safe. Another task of this process
    /// running the same turn gets [`Error::LeaseHeld`]: one runner per turn.
    ///
    /// Cancel safety: as [`Runner::run_turn`].
    pub async fn run_turn_at(
        &self,
        session_id: SessionId,
        idx: i64,
        input: &str,
    ) -> Result<TurnOutcome> {
        self.run_turn_inner(session_id, Some(idx), input).await
    }

    async fn run_turn_inner(
        &self,
        session_id: SessionId,
        idx: Option<i64>,
        input: &str,
    ) -> Result<TurnOutcome> {
        // The claim lives as long as this future: dropped at any await point,
        // its lease is free for this process at once and renewed no more.
        let claim = ClaimGuard::new(&self.inner.cfg.owner);
        let holder = claim.holder().to_string();
        let ttl = self.inner.cfg.lease_ttl.as_millis() as i64;
        let input = input.to_string();
        let gone = self.gone_check();
        let this = self.clone();
        // The turn's begin (its row, its first step found and planned) works
        // the store and the CPU: it waits in the fair queue's line as every
        // other such part does (behind the tasks ready before it, see
        // `take_for_turn`), and its slot goes on to the first step.
        let slot = self.inner.queue.take_for_turn().await;
        let begun = self
            .inner
            .store
            .call_inline(move |c| {
                this.inner.store.check_file()?;
                let then = |c: &mut crate::store::Connection, turn, lease, session| match lease {
                    Some(lease) => this.start(c, turn, lease, Some(session)),
                    None => Ok(Begun::Finished(turn)),
                };
                store::begin_turn(c, session_id, idx, &input, &holder, ttl, &gone, then)
            })
            .await?;
        self.begun(begun, claim, slot).await
    }

    /// Resumes a running turn (from any process) at its first incomplete step.
    /// A persisted model response is reused, never requested again; completed tool
    /// invocations are never called again.
    ///
    /// Cancel safety: as [`Runner::run_turn`].
    pub async fn resume_turn(&self, turn_id: TurnId) -> Result<TurnOutcome> {
        let claim = ClaimGuard::new(&self.inner.cfg.owner);
        let holder = claim.holder().to_string();
        let ttl = self.inner.cfg.lease_ttl.as_millis() as i64;
        let gone = self.gone_check();
        let this = self.clone();
        let slot = self.inner.queue.take_for_turn().await;
        let begun = self
            .inner
            .store
            .call(move |c| {
                this.inner.store.check_file()?;
                match store::acquire_lease(c, turn_id, &holder, ttl, &gone) {
                    Ok((turn, lease)) => this.start(c, turn, lease, None),
                    Err(Error::TurnFinished { .. }) => {
                        Ok(Begun::Finished(store::get_turn(c, turn_id)?))
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        self.begun(begun, claim, slot).await
    }

    /// After taking a turn's lease, in the same blocking call: the session
    /// (read now unless the caller read it with the turn) and the first step
    /// to run, prepared.
    fn start(
        &self,
        c: &mut crate::store::Connection,
        turn: TurnRow,
        lease: Lease,
        session: Option<SessionRow>,
    ) -> Result<Begun> {
        let session = match session {
            Some(s) => s,
            None => store::get_session(c, turn.session_id)?,
        };
        let ctx = self.inner.contexts.take(session.id);
        let first = self.prepare(c, &session, &turn, &lease, ctx)?;
        Ok(Begun::Drive(Box::new((turn, lease, session, first))))
    }

    async fn begun(&self, begun: Begun, claim: ClaimGuard, slot: Slot) -> Result<TurnOutcome> {
        match begun {
            Begun::Drive(b) => {
                let (turn, lease, session, first) = *b;
                let out = self.drive(turn, lease, session, first, slot).await;
                drop(claim);
                out
            }
            Begun::Finished(turn) => self.finished_outcome(turn).await,
        }
    }

    /// Turns left running whose lease has expired (or whose owner is a dead
    /// process on this machine): what a host resumes at start-up. A parked
    /// turn is among them once none of its calls waits, or once a call has
    /// waited past [`RunnerConfig::decision_deadline`].
    pub async fn recoverable_turns(&self) -> Result<Vec<TurnRow>> {
        let gone = self.gone_check();
        let deadline = self.inner.cfg.decision_deadline;
        let now = self.inner.store.now_ms();
        let rows = self
            .inner
            .store
            .call(move |c| {
                let mut rows = store::running_turns(c)?;
                // Parked turns a deadline has passed for: resuming them
                // rejects the calls that wait.
                if let Some(d) = deadline {
                    rows.extend(store::parked_since(c, now - d.as_millis() as i64)?);
                    rows.sort_by_key(|t| t.id);
                }
                Ok(rows)
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter(|t| {
                !store::lease_held_by_live_other(
                    t.lease_owner.as_deref(),
                    t.lease_expires_at,
                    "",
                    now,
                    &gone,
                )
            })
            .collect())
    }

    /// Manual compaction; see [`Compactor::compact_now`].
    pub async fn compact_now(
        &self,
        session_id: SessionId,
        focus: Option<String>,
    ) -> Result<CompactionRow> {
        self.inner.compactor.compact_now(session_id, focus).await
    }

    /// What the runner's fair queue has seen since it was built (see
    /// [`RunnerConfig::step_slots`]): its slots, how many step parts waited
    /// in line, and for how long.
    pub fn queue_stats(&self) -> QueueStats {
        self.inner.queue.stats()
    }

    /// Waits for the background compactions this runner started (see
    /// [`crate::compaction::Background`]) to end; returns how many it waited
    /// for. A host awaits it before it exits so that no summary it started is
    /// left pending (one left anyway, by a crash or a dropped runtime, is
    /// finished by the next runner or by [`Runner::serve_pending`]).
    pub async fn finish_background(&self) -> usize {
        self.inner.compactor.finish_background().await
    }

    /// Background compactions of this runner still running.
    pub fn background_running(&self) -> usize {
        self.inner.compactor.background_running()
    }

    /// Finishes the store's pending compactions that no live other holds
    /// (see [`Compactor::serve_pending`]): the background work of hosts that
    /// leave it to another process (`abridge serve`).
    pub async fn serve_pending(&self) -> Result<crate::compaction::Served> {
        self.inner.compactor.serve_pending().await
    }

    /// What [`Runner::compact_now`] would do now, without writing anything:
    /// the turns it would fold, the tokens before and expected after, the
    /// pinned facts it would carry (see [`crate::compaction::preview`]).
    pub async fn preview_compaction(
        &self,
        session_id: SessionId,
        focus: Option<String>,
    ) -> Result<crate::compaction::CompactionPreview> {
        let cfg = self.inner.cfg.compaction.clone();
        self.inner
            .store
            .read(move |c| crate::compaction::preview(&cfg, c, session_id, focus.as_deref()))
            .await
    }

    /// Rebuilds an executed step's messages (G3).
    pub async fn rebuild_step(&self, step_id: StepId) -> Result<Rebuilt> {
        self.inner
            .store
            .call(move |c| rebuild_step(c, step_id))
            .await
    }

    async fn finished_outcome(&self, turn: TurnRow) -> Result<TurnOutcome> {
        let tid = turn.id;
        let steps = self
            .inner
            .store
            .call(move |c| Ok(store::list_steps(c, tid)?.len() as i64))
            .await?;
        match turn.status {
            TurnStatus::Completed => Ok(TurnOutcome {
                output: turn.output.clone().unwrap_or_default(),
                turn,
                steps,
                pending: Vec::new(),
            }),
            _ => Err(Error::TurnFinished {
                turn_id: turn.id,
                status: format!("{} ({})", turn.status, turn.error.unwrap_or_default()),
            }),
        }
    }

    /// Keeps the turn's lease renewed (by the runner's one renewal task)
    /// while the returned guard lives.
    fn heartbeat(&self, lease: &Lease) -> Option<crate::lease::Kept> {
        if !self.inner.cfg.testing.heartbeat {
            return None;
        }
        let lease = lease.clone();
        Some(
            self.inner
                .renewals
                .keep(move |c| store::renew_lease(c, &lease)),
        )
    }

    /// Sends an event about `session`'s turn, built only when someone listens.
    fn tell(&self, session: &SessionRow, turn: Option<i64>, kind: impl FnOnce() -> EventKind) {
        if self.inner.events.listened() {
            self.inner.events.emit(&Subject::of(session, turn), kind());
        }
    }

    /// Pins the facts of turn `turn_idx` inside the transaction that finishes it.
    fn pin_turn(
        &self,
        tx: &crate::store::Transaction<'_>,
        session: &SessionRow,
        turn_idx: i64,
        written: Option<&HistoryTurn>,
    ) -> Result<()> {
        if let Some(extractor) = &self.inner.cfg.pin_extractor {
            store::pin_turn(tx, session.id, turn_idx, &**extractor, written)?;
        }
        Ok(())
    }

    /// Pins a fact the host states for a session (`slot`: a newer value of the
    /// same slot supersedes it). Every compaction from the session's next turn
    /// on carries it (G8). Returns the turn index it counts as stated in.
    ///
    /// ```no_run
    /// # async fn f(runner: abridge::Runner, id: abridge::SessionId) -> abridge::Result<()> {
    /// use abridge::pins::Fact;
    /// runner.pin(id, Fact::host(Some("ship-to address"), "12 Rue de Rivoli, 75001 Paris")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn pin(&self, session_id: SessionId, fact: Fact) -> Result<i64> {
        if fact.value.trim().is_empty() {
            return Err(Error::Config("a pinned fact must not be empty".into()));
        }
        self.inner
            .store
            .call(move |c| {
                let tx = store::write_tx(c)?;
                store::get_session(&tx, session_id)?;
                let at = store::pin_host_fact(&tx, session_id, &fact)?;
                tx.commit()?;
                Ok(at)
            })
            .await
    }

    /// Takes a decision for a parked call (see [`Store::decide`]) and tells
    /// subscribers ([`EventKind::CallDecided`], [`EventKind::ResultDelivered`]).
    /// The turn is not resumed
    /// here: resume it ([`Runner::resume_turn`]) once none of its calls
    /// waits, from this process or any other.
    ///
    /// ```no_run
    /// # async fn f(runner: abridge::Runner, outcome: abridge::TurnOutcome) -> abridge::Result<()> {
    /// use abridge::store::Decision;
    /// for call in &outcome.pending {
    ///     runner.decide(call.id, Decision::approve(), Some("alice")).await?;
    /// }
    /// let done = runner.resume_turn(outcome.turn.id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn decide(
        &self,
        call: crate::ids::CallId,
        decision: store::Decision,
        by: Option<&str>,
    ) -> Result<ApprovalRow> {
        let row = self.inner.store.decide(call, decision, by).await?;
        if self.inner.events.listened() {
            let session = self.inner.store.session(row.session_id).await?;
            let turn = self
                .inner
                .store
                .call(move |c| store::get_turn(c, row.turn_id))
                .await;
            let (id, tool, status) = (row.id, row.tool_name.clone(), row.status);
            self.tell(&session, turn.ok().map(|t| t.idx), || match status {
                ApprovalStatus::Delivered => EventKind::ResultDelivered { call: id, tool },
                _ => EventKind::CallDecided {
                    call: id,
                    tool,
                    status,
                },
            });
        }
        Ok(row)
    }

    /// Abandons a parked turn: its waiting calls are marked abandoned and
    /// the turn failed with `abandoned: {reason}`, in one transaction (an
    /// explicit, recorded action), so the session can take a new turn.
    /// Refuses a turn a live runner holds ([`Error::LeaseHeld`]) and one
    /// that finished ([`Error::TurnFinished`]). The running turns of the
    /// sub-agents its delegating calls started ([`crate::Tools::delegate`])
    /// are abandoned with it.
    pub async fn abandon_turn(&self, turn_id: TurnId, reason: &str) -> Result<TurnRow> {
        let claim = ClaimGuard::new(&self.inner.cfg.owner);
        let holder = claim.holder().to_string();
        let ttl = self.inner.cfg.lease_ttl.as_millis() as i64;
        let gone = self.gone_check();
        let msg = format!("abandoned: {reason}");
        let pins = self.inner.cfg.pin_extractor.clone();
        let (turn, children) = self
            .inner
            .store
            .call(move |c| {
                let (_, lease) = store::acquire_lease(c, turn_id, &holder, ttl, &gone)?;
                store::abandon_turn(c, &lease, &msg, pins.as_deref())?;
                let turn = store::get_turn(c, turn_id)?;
                let children = store::running_child_turns(c, turn.session_id, turn.idx)?;
                Ok((turn, children))
            })
            .await?;
        // The sub-agents its calls were running stop with it.
        for child in children {
            Box::pin(self.abandon_turn(child, "its parent's turn was abandoned")).await?;
        }
        Ok(turn)
    }

    /// Fails the turn (policy), then returns `err` to the caller (or the error
    /// that kept it from being recorded).
    async fn fail(&self, lease: &Lease, step_id: Option<StepId>, err: Error) -> Error {
        match self.fail_inner(lease, step_id, err).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn fail_inner(
        &self,
        lease: &Lease,
        step_id: Option<StepId>,
        err: Error,
    ) -> Result<std::convert::Infallible> {
        let msg = err.to_string();
        let l = lease.clone();
        let pins = self.inner.cfg.pin_extractor.clone();
        self.inner
            .store
            .call(move |c| store::fail_turn(c, &l, step_id, &msg, pins.as_deref()))
            .await?;
        warn!(turn = %lease.turn_id, error = %self.inner.events.error(&err), "turn failed");
        Err(err)
    }
}

/// What the turn's first blocking call found.
enum Begun {
    /// The lease is held: drive from the prepared first step.
    Drive(Box<(TurnRow, Lease, SessionRow, Prepared)>),
    /// The turn had already finished.
    Finished(TurnRow),
}
