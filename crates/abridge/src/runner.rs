//! The durable turn/step runner.
//!
//! One step, in order: claim or resume the step row; `ensure()` the compaction
//! it reads; build the messages (a pure function of rows), serialise once and
//! hash those bytes; call the model; persist response, usage, hash and the
//! compaction id in ONE transaction; run each tool call per its effect mode,
//! exactly once per (step, tool_call_id); mark the step completed. Every write
//! is fenced by the turn's lease, so a runner whose lease was taken over cannot
//! write anything more.

use crate::compaction::{CompactionConfig, Compactor, ExtractiveSummariser, Plan, Summariser};
use crate::context::{Context, ContextCache};
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
use crate::store::{
    self, CompactionRow, Effect, InvocationStatus, Lease, NewInvocation, Responded, SessionRow,
    StepStatus, Store, TurnRow, TurnStatus,
};
use crate::store::{HistoryStep, HistoryTurn};
use crate::tools::{idempotency_key, render_result, ToolCall, ToolImpl, Tools};
use crate::unwind::{panic_message, CatchUnwind};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tracing::{instrument, warn};

/// Runner settings. Start from [`RunnerConfig::default`] and set fields (new
/// fields may be added: the struct is `#[non_exhaustive]`).
#[derive(Clone)]
#[non_exhaustive]
pub struct RunnerConfig {
    /// Lease owner identity. Default: [`crate::owner::process_owner`]`("abridge")`.
    /// A stable identity lets a restarted host take over its own leases at once.
    pub owner: String,
    /// Turn lease; renewed by a heartbeat while the runner works. Default 30 s.
    pub lease_ttl: Duration,
    /// Steps per turn before the turn fails with [`Error::MaxSteps`]. Default 25.
    pub max_steps: u32,
    /// Attempts per step for transient model errors, and the delays between
    /// them (doubling, capped, jittered). Default: 3 attempts, 500 ms doubling
    /// to at most 30 s, 20 % jitter.
    pub model_retry: RetryPolicy,
    /// Timeout of one model call; the call is dropped (cancelled) when it
    /// passes. Default 300 s.
    pub model_timeout: Duration,
    /// Take over a lease at once when its owner is a dead process on this machine.
    /// Default true.
    pub take_over_dead_local_owners: bool,
    /// Bytes of message contexts kept between turns, one per session, least
    /// recently used out. With its context kept, a turn's first step reads only
    /// the rows written since the session's previous step instead of rebuilding
    /// everything after the summary. Default 64 MiB; 0 keeps none.
    pub context_cache_bytes: usize,
    /// Let events and tracing output carry the texts providers and
    /// summarisers send back in their errors (which can quote what they
    /// were sent). Default false: events and logs carry ids, counts, sizes
    /// and hashes, never message text or tool arguments; such a text shows
    /// as its length and a hash (the stored turn error keeps it whole).
    pub log_content: bool,
    /// Compaction settings.
    pub compaction: CompactionConfig,
    /// Finds the facts a compaction must never lose (G8) when a turn is
    /// stored. Default the built-in [`crate::pins::RuleExtractor`]; None
    /// pins only what the host pins ([`Runner::pin`]).
    pub pin_extractor: Option<Arc<dyn PinExtractor>>,
    /// Crash-test knobs (fault injection, a frozen heartbeat); leave at the
    /// default outside tests.
    pub testing: TestKnobs,
}

impl std::fmt::Debug for RunnerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerConfig")
            .field("owner", &self.owner)
            .field("lease_ttl", &self.lease_ttl)
            .field("max_steps", &self.max_steps)
            .field("compaction", &self.compaction)
            .finish_non_exhaustive()
    }
}

impl RunnerConfig {
    /// Sets the lease owner name.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Sets the compaction settings.
    pub fn with_compaction(mut self, c: CompactionConfig) -> Self {
        self.compaction = c;
        self
    }
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            owner: crate::owner::process_owner("abridge"),
            lease_ttl: Duration::from_secs(30),
            max_steps: 25,
            model_retry: RetryPolicy::default(),
            model_timeout: Duration::from_secs(300),
            take_over_dead_local_owners: true,
            context_cache_bytes: 64 << 20,
            log_content: false,
            compaction: CompactionConfig::default(),
            pin_extractor: Some(Arc::new(RuleExtractor)),
            testing: TestKnobs::default(),
        }
    }
}

/// What `prepare` found for the next step. The session's message context
/// travels with it.
enum Prepared {
    /// A step with a persisted response: run its tools.
    Resume(store::StepRow, Option<Context>),
    /// The step fails the turn (max steps, compaction failure policy).
    Fail(store::StepRow, Error),
    /// A step to execute.
    Run(store::StepRow, Box<Work>),
}

/// The context-overflow remedies a step has used (each at most once).
#[derive(Default)]
struct Remedies {
    compacted: bool,
    tried_elision: bool,
    /// The steps of the turn whose results the step's context elides.
    elided: i64,
}

/// The work of a step to execute: what its compaction plan says must
/// happen first, and its context.
struct Work {
    /// Carried out by the compactor before the model call.
    plan: Plan,
    /// Built already when the plan let the step read its compaction now.
    context: StepContext,
}

/// A step's context, as far as `prepare` could build it.
enum StepContext {
    /// Built on the compaction the plan lets the step read now.
    Built(Context),
    /// To build on the compaction the plan's resolution returns: from the
    /// turn's previous context (if kept), eliding the results of the turn's
    /// first steps as its previous step did.
    After(Option<Context>, i64),
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The turn row, as finished.
    pub turn: TurnRow,
    /// The final answer.
    pub output: String,
    /// Steps the turn took.
    pub steps: i64,
}

struct Inner {
    store: Store,
    model: Arc<dyn ModelClient>,
    tools: Tools,
    cfg: RunnerConfig,
    compactor: Compactor,
    events: EventSink,
    contexts: ContextCache,
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

/// Builds a [`Runner`]. Each call sets its own part and no call undoes
/// another, in any order: [`compaction`](Self::compaction) and
/// [`fault_hook`](Self::fault_hook) win over the same parts of a
/// [`config`](Self::config) given before or after them.
pub struct RunnerBuilder {
    store: Store,
    model: Arc<dyn ModelClient>,
    tools: Tools,
    summariser: Option<Arc<dyn Summariser>>,
    cfg: RunnerConfig,
    compaction: Option<CompactionConfig>,
    fault_hook: Option<FaultHook>,
    models: Vec<String>,
}

impl RunnerBuilder {
    /// The model ids the host will create sessions with: `build` refuses one
    /// whose context window is unknown while the threshold is a fraction of
    /// the window ([`Error::UnknownWindow`]), rather than the first
    /// `create_session` with it.
    pub fn models<I, S>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.models.extend(models.into_iter().map(Into::into));
        self
    }

    /// The tools offered to the model.
    pub fn tools(mut self, tools: Tools) -> Self {
        self.tools = tools;
        self
    }
    /// The summariser. Default: the offline [`ExtractiveSummariser`].
    pub fn summariser(mut self, s: impl Summariser + 'static) -> Self {
        self.summariser = Some(Arc::new(s));
        self
    }
    /// The summariser, shared.
    pub fn summariser_arc(mut self, s: Arc<dyn Summariser>) -> Self {
        self.summariser = Some(s);
        self
    }
    /// Runner settings.
    pub fn config(mut self, cfg: RunnerConfig) -> Self {
        self.cfg = cfg;
        self
    }
    /// Compaction settings (over those of any [`config`](Self::config)).
    pub fn compaction(mut self, c: CompactionConfig) -> Self {
        self.compaction = Some(c);
        self
    }
    /// A fault hook, for crash tests (over that of any [`config`](Self::config)).
    pub fn fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault_hook = Some(hook);
        self
    }
    /// Validates the configuration and builds the runner.
    pub fn build(self) -> Result<Runner> {
        let mut cfg = self.cfg;
        if let Some(c) = self.compaction {
            cfg.compaction = c;
        }
        if let Some(h) = self.fault_hook {
            cfg.testing.fault_hook = Some(h);
        }
        if cfg.max_steps == 0 {
            return Err(Error::Config("max_steps must be > 0".into()));
        }
        cfg.model_retry.validate("model retry")?;
        if cfg.lease_ttl < Duration::from_millis(10) {
            return Err(Error::Config("lease_ttl must be at least 10 ms".into()));
        }
        if cfg.owner.is_empty() {
            return Err(Error::Config("owner must not be empty".into()));
        }
        for model in &self.models {
            cfg.compaction.check_model(model)?;
        }
        let events = EventSink::new(cfg.log_content);
        // A store shared by several machines frees a lease held elsewhere
        // only by its expiry (see holder_is_gone_shared).
        let shared = self.store.backend() == crate::store::BackendKind::Postgres;
        let dead: crate::compaction::GoneCheck = match (shared, cfg.take_over_dead_local_owners) {
            (false, true) => |h, o| crate::owner::holder_is_gone(h, o, true),
            (false, false) => |h, o| crate::owner::holder_is_gone(h, o, false),
            (true, true) => |h, o| crate::owner::holder_is_gone_shared(h, o, true),
            (true, false) => |h, o| crate::owner::holder_is_gone_shared(h, o, false),
        };
        let summariser = self
            .summariser
            .unwrap_or_else(|| Arc::new(ExtractiveSummariser));
        let compactor = Compactor::new(
            self.store.clone(),
            summariser,
            cfg.owner.clone(),
            cfg.compaction.clone(),
            cfg.testing.clone(),
            events.clone(),
            dead,
        )?;
        let renewals = crate::lease::Renewals::new(&self.store, cfg.lease_ttl);
        Ok(Runner {
            inner: Arc::new(Inner {
                renewals,
                store: self.store,
                model: self.model,
                tools: self.tools,
                contexts: ContextCache::new(cfg.context_cache_bytes),
                cfg,
                compactor,
                events,
            }),
        })
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
            models: Vec::new(),
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

    /// Subscribes to compaction events.
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
        self.begun(begun, claim).await
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
        self.begun(begun, claim).await
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

    async fn begun(&self, begun: Begun, claim: ClaimGuard) -> Result<TurnOutcome> {
        match begun {
            Begun::Drive(b) => {
                let (turn, lease, session, first) = *b;
                let out = self.drive(turn, lease, session, first).await;
                drop(claim);
                out
            }
            Begun::Finished(turn) => self.finished_outcome(turn).await,
        }
    }

    /// Turns left running whose lease has expired (or whose owner is a dead
    /// process on this machine): what a host resumes at start-up.
    pub async fn recoverable_turns(&self) -> Result<Vec<TurnRow>> {
        let gone = self.gone_check();
        let rows = self.inner.store.call(store::running_turns).await?;
        let now = self.inner.store.now_ms();
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

    #[instrument(skip(self, turn, lease, session, first), fields(session = %turn.session_id, turn = turn.idx, turn_id = %turn.id))]
    async fn drive(
        &self,
        turn: TurnRow,
        lease: Lease,
        session: SessionRow,
        first: Prepared,
    ) -> Result<TurnOutcome> {
        let _hb = self.heartbeat(&lease);
        let turn_idx = Some(turn.idx);
        if let Some(from) = &lease.taken_from {
            self.tell(&session, turn_idx, || EventKind::LeaseTakenOver {
                turn_id: turn.id,
                from: from.clone(),
            });
        }
        self.tell(&session, turn_idx, || EventKind::TurnStarted {
            turn_id: turn.id,
            resumed: lease.epoch > 1,
        });
        let mut at_step = None;
        let out = match self
            .drive_steps(&turn, &lease, &session, first, &mut at_step)
            .await
        {
            Ok(done) => Ok(done),
            Err(Stop::Recorded(e)) => Err(e),
            Err(Stop::Error(e)) if e.is_resumable() => Err(e),
            // Anything that cannot succeed on a retry (a row that does not read
            // back, a constraint refused) fails the turn: never left running.
            Err(Stop::Error(e)) => Err(self.fail(&lease, at_step, e).await),
        };
        match &out {
            Ok(done) => self.tell(&session, turn_idx, || EventKind::TurnFinished {
                turn_id: turn.id,
                steps: done.steps,
            }),
            Err(e) if !e.is_resumable() => {
                self.tell(&session, turn_idx, || EventKind::TurnFailed {
                    turn_id: turn.id,
                    error: self.inner.events.error(e),
                })
            }
            Err(_) => {}
        }
        out
    }

    async fn drive_steps(
        &self,
        turn: &TurnRow,
        lease: &Lease,
        session: &SessionRow,
        first: Prepared,
        at_step: &mut Option<StepId>,
    ) -> std::result::Result<TurnOutcome, Stop> {
        let mut next = first;
        // The turn's steps as this process wrote them, while it wrote every
        // one from the first (see `StepPlan::written`).
        let mut journal = match &next {
            Prepared::Run(step, _) if step.idx == 0 => Some(Vec::new()),
            _ => None,
        };
        loop {
            let (step, response, persist, ctx) = match next {
                Prepared::Resume(step, ctx) => {
                    *at_step = Some(step.id);
                    let r: ModelResponse =
                        serde_json::from_str(step.response.as_deref().unwrap_or("{}"))
                            .map_err(Error::from)?;
                    (step, r, None, ctx)
                }
                Prepared::Fail(step, e) => {
                    return Err(Stop::Recorded(self.fail(lease, Some(step.id), e).await))
                }
                Prepared::Run(step, work) => {
                    *at_step = Some(step.id);
                    self.tell(session, Some(turn.idx), || EventKind::StepStarted {
                        step_id: step.id,
                        step: step.idx,
                    });
                    match self.execute(session, turn, &step, *work).await {
                        Ok((r, persist, ctx)) => (step, r, Some(persist), Some(ctx)),
                        Err(e) if e.is_resumable() => return Err(Stop::Recorded(e)),
                        Err(e) => {
                            return Err(Stop::Recorded(self.fail(lease, Some(step.id), e).await))
                        }
                    }
                }
            };
            let calls: Vec<_> = response
                .tool_calls()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect();
            let written = Written {
                // A fresh step's response is set as it is written.
                response: persist.is_none().then(|| step.response.clone()).flatten(),
                results: vec![None; calls.len()],
                turn: journal.take(),
            };
            let plan = Arc::new(StepPlan {
                calls,
                written: std::sync::Mutex::new(written),
                final_text: response.text(),
                session: session.clone(),
                turn: turn.clone(),
                lease: lease.clone(),
                step_id: step.id,
                step_idx: step.idx,
                ctx: std::sync::Mutex::new(ctx),
            });
            let mut advanced = self.advance(&plan, 0, persist, None).await?;
            next = loop {
                match advanced {
                    Advanced::Next(p) => {
                        journal = plan
                            .written
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .turn
                            .take();
                        break *p;
                    }
                    Advanced::Finished(turn, output) => {
                        return Ok(TurnOutcome {
                            turn,
                            output,
                            steps: step.idx + 1,
                        })
                    }
                    Advanced::Async {
                        pos,
                        tool,
                        row,
                        inserted,
                    } => {
                        self.tell(session, Some(turn.idx), || EventKind::ToolStarted {
                            step_id: step.id,
                            tool: row.tool_name.clone(),
                            effect: row.effect,
                        });
                        let result = self.run_async_tool(&plan, pos, tool, &row, inserted).await;
                        crate::error::check_fault(
                            &self.inner.cfg.testing.fault_hook,
                            FaultPoint::AfterToolEffect,
                        )?;
                        advanced = self
                            .advance(&plan, pos + 1, None, Some((row.id, result)))
                            .await?;
                    }
                }
            };
        }
    }

    /// The finding of `prepare`, run in the caller's blocking call: the step to
    /// run (a read: the transaction that completed the previous step, or began
    /// the turn, claimed it); if it is to run, its compaction decided and, when
    /// there is nothing to compact, its messages built.
    fn prepare(
        &self,
        c: &mut crate::store::Connection,
        session: &SessionRow,
        turn: &TurnRow,
        lease: &Lease,
        mut ctx: Option<Context>,
    ) -> Result<Prepared> {
        let max_steps = self.inner.cfg.max_steps as i64;
        // The common case: the step claimed by the transaction that completed
        // the previous one (or began the turn) is read in the same read
        // transaction as the rest, in one round trip with its first reads on
        // PostgreSQL.
        let mut running = None;
        let compactor = &self.inner.compactor;
        let fast = store::in_read_tx(c, |c| {
            let next = Context::prefetch_next(ctx.as_ref(), c, session.id, turn.idx)?;
            compactor.prefetch_decision(c, session, turn.idx, next)?;
            match store::last_step(c, lease.turn_id)? {
                Some(s) if s.status == StepStatus::Running && s.idx < max_steps => {
                    let found = self.read_step(c, session, turn, &s, ctx.take());
                    running = Some(s);
                    found.map(Some)
                }
                _ => Ok(None),
            }
        })?;
        let (step, found) = match (running, fast) {
            (Some(step), Some(found)) => (step, found),
            _ => {
                let step = store::claim_step(c, lease)?;
                if step.status != StepStatus::Running {
                    return Ok(Prepared::Resume(step, ctx));
                }
                if step.idx >= max_steps {
                    return Ok(Prepared::Fail(
                        step,
                        Error::MaxSteps {
                            turn_id: turn.id,
                            max_steps: self.inner.cfg.max_steps,
                        },
                    ));
                }
                let found = store::in_read_tx(c, |c| {
                    compactor.prefetch_decision(c, session, turn.idx, step.idx)?;
                    self.read_step(c, session, turn, &step, ctx)
                })?;
                (step, found)
            }
        };
        match found {
            Ok(work) => Ok(Prepared::Run(step, Box::new(work))),
            Err(e) => Ok(Prepared::Fail(step, e)),
        }
    }

    /// The reads of a running step, in the caller's read transaction: its
    /// compaction decided and, when there is nothing to compact, its
    /// messages built. An error that fails the step (not the call) is the
    /// inner one.
    fn read_step(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn: &TurnRow,
        step: &store::StepRow,
        ctx: Option<Context>,
    ) -> Result<Result<Work>> {
        let (at, compactor) = ((turn.idx, step.idx), &self.inner.compactor);

        // What the turn's previous step read: the turn keeps it, and
        // the results it elided (context overflow) stay elided.
        let (prior, elided) = match &ctx {
            _ if step.idx == 0 => (None, 0),
            Some(ctx) if ctx.at().0 == turn.idx => (Some(ctx.compaction_id()), ctx.elided()),
            _ => {
                let (read, elided) = store::step_read(c, turn.id, step.idx - 1)?;
                (Some(read), elided)
            }
        };
        let plan = match compactor.plan(c, session, turn.idx, step.idx, prior) {
            Ok(p) => p,
            Err(e) if e.is_resumable() => return Err(e),
            Err(e) => return Ok(Err(e)),
        };
        let context = match plan.read_now() {
            Some(row) => StepContext::Built(Context::advance(ctx, c, session, row, at, elided)?),
            None => StepContext::After(ctx, elided),
        };
        Ok(Ok(Work { plan, context }))
    }

    /// Runs a claimed step up to its model response: compaction if one is due,
    /// the messages assembled and hashed, the model call. Returns the response
    /// and what [`Runner::advance`] persists with it.
    async fn execute(
        &self,
        session: &SessionRow,
        turn: &TurnRow,
        step: &store::StepRow,
        work: Work,
    ) -> Result<(ModelResponse, Responded, Context)> {
        let (step_id, step_idx) = (step.id, step.idx);
        let subject = || Subject::of(session, Some(turn.idx));
        let mut summary_wait_ms = None;
        // The hook where compaction runs: the step reads only what the
        // compactor returns, and waits for it when it must.
        let Work { plan, context } = work;
        let resolved = self
            .inner
            .compactor
            .resolve(&subject(), turn.idx, plan)
            .await?;
        if let Some((boundary, waited_ms)) = resolved.waited {
            summary_wait_ms = Some(waited_ms);
            self.tell(session, Some(turn.idx), || EventKind::WaitedForSummary {
                step_id,
                boundary,
                waited_ms,
            });
        }
        let mut compaction = resolved.row;
        let mut ctx = match context {
            StepContext::Built(ctx) => ctx,
            StepContext::After(ctx, elided) => {
                let (s, at, r) = (session.clone(), (turn.idx, step_idx), compaction.clone());
                self.inner
                    .store
                    .call(move |conn| Context::advance(ctx, conn, &s, r.as_ref(), at, elided))
                    .await?
            }
        };
        crate::error::check_fault(
            &self.inner.cfg.testing.fault_hook,
            FaultPoint::BeforeModelCall,
        )?;

        // A context the model refuses as too long is made smaller, once by
        // each remedy, and the step tried again; see `Runner::shrink`.
        let mut remedies = Remedies {
            elided: ctx.elided(),
            ..Remedies::default()
        };
        let mut response = loop {
            let request = ctx.request(&session.model, self.inner.tools.specs());
            match self.call_model(request, step_id).await {
                Err(Error::ContextOverflow { message, .. }) => {
                    match self
                        .shrink(session, turn, step, &compaction, &mut remedies, &message)
                        .await?
                    {
                        Some((row, smaller)) => (compaction, ctx) = (row, smaller),
                        None => return Err(Error::ContextOverflow { step_id, message }),
                    }
                }
                other => break other?,
            }
        };
        let sha = ctx.sha256();
        // What is committed must read back: nothing deeper than the parser takes.
        if response.cap_depth() > 0 {
            warn!(step_id = %step_id, "a response value nested too deep was replaced");
        }
        if response.is_empty() {
            return Err(Error::EmptyResponse { step_id });
        }
        validate_calls(&response, step_id)?;

        let (context_tokens, estimated) = match response.usage.input_tokens {
            Some(n) => (saturating_tokens(n, "input", step_id), false),
            None => {
                let counter = &self.inner.cfg.compaction.token_counter;
                let n = counter
                    .count_chars(ctx.chars())
                    .unwrap_or_else(|| counter.count(&ctx.text()));
                (n as i64, true)
            }
        };
        let r = Responded {
            step_id,
            compaction_id: compaction.as_ref().map(|c| c.id),
            messages_sha256: sha,
            response_json: serde_json::to_string(&response)?,
            input_tokens: response
                .usage
                .input_tokens
                .map(|n| saturating_tokens(n, "input", step_id)),
            output_tokens: response
                .usage
                .output_tokens
                .map(|n| saturating_tokens(n, "output", step_id)),
            context_tokens,
            estimated,
            summary_wait_ms,
            cache_read_tokens: response
                .usage
                .cache_read_tokens
                .map(|n| saturating_tokens(n, "cache read", step_id)),
            cache_write_tokens: response
                .usage
                .cache_write_tokens
                .map(|n| saturating_tokens(n, "cache write", step_id)),
            elided_steps: ctx.elided(),
        };
        Ok((response, r, ctx))
    }

    /// A smaller context for a step the model refused as too long, by the
    /// first remedy not yet tried: every turn before this one compacted now
    /// (exactly once, as any compaction), then the tool results of this
    /// turn's steps before its newest one sent as placeholders (recorded on
    /// the step as `elided_steps`, so a rebuild gives the bytes sent). None
    /// when neither is left or makes a difference.
    async fn shrink(
        &self,
        session: &SessionRow,
        turn: &TurnRow,
        step: &store::StepRow,
        compaction: &Option<CompactionRow>,
        remedies: &mut Remedies,
        message: &str,
    ) -> Result<Option<(Option<CompactionRow>, Context)>> {
        let subject = Subject::of(session, Some(turn.idx));
        let at = (turn.idx, step.idx);
        let mut elided = remedies.elided;
        let mut row = compaction.clone();
        let remedy = loop {
            if !remedies.compacted {
                remedies.compacted = true;
                let folded = self
                    .inner
                    .compactor
                    .compact_for_overflow(&subject, turn.idx)
                    .await?;
                if let Some(folded) = folded.filter(|f| Some(f.id) != row.as_ref().map(|r| r.id)) {
                    row = Some(folded);
                    break "compacted";
                }
            } else if !remedies.tried_elision {
                remedies.tried_elision = true;
                let newest = step.idx - 1;
                if newest > remedies.elided {
                    elided = newest;
                    break "elided";
                }
            } else {
                return Ok(None);
            }
        };
        warn!(step_id = %step.id, remedy, "the model refused the context as too long");
        self.tell(session, Some(turn.idx), || EventKind::ContextOverflow {
            step_id: step.id,
            remedy,
            elided_steps: elided,
            message: self.inner.events.shown(message),
        });
        remedies.elided = elided;
        let (s, r) = (session.clone(), row.clone());
        let ctx = self
            .inner
            .store
            .call(move |c| Context::build(c, &s, r.as_ref(), at, elided))
            .await?;
        Ok(Some((row, ctx)))
    }

    async fn call_model(&self, request: ModelRequest, step_id: StepId) -> Result<ModelResponse> {
        let cfg = &self.inner.cfg;
        let request = Arc::new(request);
        let mut last = String::new();
        let mut not_before = Duration::ZERO;
        for attempt in 1..=cfg.model_retry.max_attempts {
            if attempt > 1 {
                // A provider's Retry-After is honoured when longer.
                tokio::time::sleep(cfg.model_retry.delay(attempt - 1).max(not_before)).await;
            }
            not_before = Duration::ZERO;
            let call = CatchUnwind(self.inner.model.complete(&request));
            match tokio::time::timeout(cfg.model_timeout, call).await {
                Ok(Ok(Ok(resp))) => return Ok(resp),
                Ok(Ok(Err(ModelError::Permanent(m)))) => {
                    return Err(Error::Model {
                        step_id,
                        message: m,
                    });
                }
                Ok(Ok(Err(ModelError::ContextOverflow(message)))) => {
                    return Err(Error::ContextOverflow { step_id, message });
                }
                Ok(Ok(Err(ModelError::RateLimited {
                    message,
                    retry_after: Some(wait),
                }))) if wait > cfg.model_retry.max_backoff => {
                    // Never waited past the policy: the host sees the demand
                    // and the turn stays resumable.
                    return Err(Error::RateLimited {
                        step_id,
                        retry_after: wait,
                        allowed: cfg.model_retry.max_backoff,
                        message,
                    });
                }
                Ok(Ok(Err(e @ ModelError::RateLimited { retry_after, .. }))) => {
                    not_before = retry_after.unwrap_or_default();
                    last = e.to_string();
                }
                Ok(Ok(Err(e @ ModelError::ResponseTooLarge { .. }))) => {
                    return Err(Error::Model {
                        step_id,
                        message: e.to_string(),
                    });
                }
                Ok(Ok(Err(e))) => last = e.to_string(),
                Ok(Err(p)) => last = format!("model client panicked: {}", panic_message(&p)),
                Err(_) => last = format!("model call timed out after {:?}", cfg.model_timeout),
            }
            warn!(step_id = %step_id, attempt, error = %self.inner.events.shown(&last), "model call failed");
        }
        Err(Error::Model {
            step_id,
            message: last,
        })
    }

    /// One blocking call, and ONE fenced transaction, that takes a step as far
    /// as it can go without awaiting: writes the response (`persist`), records
    /// the result of the async tool that just ran (`finished`, the call before
    /// `from`), runs the transactional tool calls from `from` on, and either
    /// stops at the next async tool call, committing with its invocation claimed
    /// (everything before an outside effect is durable before it happens), or
    /// completes the step and claims the next one (completes the turn, for a
    /// final answer) and commits. The next step is then prepared in the same
    /// call. A crash anywhere inside rolls back to the previous commit: a step
    /// whose response is lost is called again (the model call is at-least-once),
    /// a tool whose record is lost had no effect outside this transaction.
    async fn advance(
        &self,
        plan: &Arc<StepPlan>,
        from: usize,
        persist: Option<Responded>,
        finished: Option<(InvocationId, (bool, String))>,
    ) -> Result<Advanced> {
        let (this, p) = (self.clone(), plan.clone());
        let (advanced, happened) = self
            .inner
            .store
            .call_inline(move |c| {
                let mut happened = Vec::new();
                let advanced = this
                    .advance_blocking(c, &p, from, persist, finished, &mut happened)
                    .map_err(|e| store::explain_lost(c, e))?;
                Ok((advanced, happened))
            })
            .await?;
        // Sent once what they report has committed.
        if !happened.is_empty() {
            let subject = Subject::of(&plan.session, Some(plan.turn.idx));
            for kind in happened {
                self.inner.events.emit(&subject, kind);
            }
        }
        Ok(advanced)
    }

    /// The step's fenced transaction (a lease lost on a deleted turn is
    /// told apart by the caller, once it has ended: `store::explain_lost`).
    fn advance_blocking(
        &self,
        c: &mut crate::store::Connection,
        plan: &StepPlan,
        from: usize,
        persist: Option<Responded>,
        finished: Option<(InvocationId, (bool, String))>,
        happened: &mut Vec<EventKind>,
    ) -> Result<Advanced> {
        let hook = &self.inner.cfg.testing.fault_hook;
        let lease = &plan.lease;
        let n = plan.calls.len();
        // Events only when someone listens (building them costs allocations).
        let tell = self.inner.events.listened();
        let tx = store::fenced_tx(c, lease)?;
        let fresh = persist.is_some();
        if let Some(r) = persist {
            store::write_response(&tx, lease, &r)?;
            crate::error::check_fault(hook, FaultPoint::AfterResponseWritten)?;
            if tell {
                happened.push(EventKind::StepResponded {
                    step_id: plan.step_id,
                    step: plan.step_idx,
                    tool_calls: n,
                    input_tokens: r.input_tokens,
                    output_tokens: r.output_tokens,
                });
            }
            // The very string stored, for what is built from this step's rows.
            plan.written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .response = Some(r.response_json);
        }
        if let Some((id, (ok, result))) = &finished {
            let rerun = self.inner.cfg.testing.sabotage.rerun_completed_effects;
            store::finish_invocation(&tx, lease, *id, *ok, result, rerun)?;
            if from > 0 {
                plan.wrote_result(from - 1, *ok, result);
            }
            if tell && from > 0 {
                let call = plan.call(from - 1);
                let effect = self.prepare_tool(&call).map_or(Effect::None, |t| t.1);
                happened.push(EventKind::ToolCompleted {
                    step_id: plan.step_id,
                    invocation_id: *id,
                    tool: call.name.clone(),
                    effect,
                    ok: *ok,
                });
            }
        }
        for pos in from..n {
            if pos > 0 {
                crate::error::check_fault(hook, FaultPoint::BetweenTools)?;
            }
            if let ToolStep::Outside {
                tool,
                row,
                inserted,
            } = self.tool_in_tx(&tx, plan, pos, fresh, tell, happened)?
            {
                // Everything so far is durable before the outside effect.
                tx.commit()?;
                return Ok(Advanced::Async {
                    pos,
                    tool,
                    row,
                    inserted,
                });
            }
        }
        crate::error::check_fault(hook, FaultPoint::BeforeStepComplete)?;
        let final_output = (n == 0).then_some(plan.final_text.as_str());
        let finished = store::complete_step(
            &tx,
            lease,
            &plan.turn,
            plan.step_id,
            plan.step_idx,
            final_output,
        )?;
        let mut ctx = plan.ctx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let step_completed = || EventKind::StepCompleted {
            step_id: plan.step_id,
            step: plan.step_idx,
        };
        // The step's rows as written here, when every one of them was: the
        // next step's context and the turn's pins need not read them back.
        let mut written = plan.written.lock().unwrap_or_else(|e| e.into_inner());
        let done = written.step(plan.step_idx);
        if let Some(turn) = finished {
            let whole = match (written.turn.take(), done) {
                (Some(mut steps), Some(done)) => {
                    steps.push(done);
                    Some(HistoryTurn {
                        idx: plan.turn.idx,
                        input: plan.turn.input.clone(),
                        steps,
                    })
                }
                _ => None,
            };
            drop(written);
            self.pin_turn(&tx, &plan.session, plan.turn.idx, whole.as_ref())?;
            tx.commit()?;
            if tell {
                happened.push(step_completed());
            }
            if let Some(ctx) = ctx {
                self.inner.contexts.put(ctx); // for the session's next turn
            }
            return Ok(Advanced::Finished(turn, plan.final_text.clone()));
        }
        match done {
            Some(done) => {
                // On a failure the next step builds its context as usual.
                if let Some(c) = &mut ctx {
                    if c.extend_written(plan.turn.idx, &done).is_err() {
                        ctx = None;
                    }
                }
                if let Some(steps) = &mut written.turn {
                    steps.push(done);
                }
            }
            None => written.turn = None,
        }
        drop(written);
        // The next step's reads go with this COMMIT (on PostgreSQL).
        let next = tx.commit_then(|c| self.prepare(c, &plan.session, &plan.turn, lease, ctx))?;
        if tell {
            happened.push(step_completed());
        }
        Ok(Advanced::Next(Box::new(next?)))
    }

    /// Tool call `pos` of the step, inside the step's transaction: a refusal
    /// or a transactional tool runs here (its write and result commit with the
    /// step); an outside tool's invocation is claimed and handed back to run
    /// once this transaction has committed; one completed before is skipped
    /// (its stored result is reused, G5).
    fn tool_in_tx(
        &self,
        tx: &crate::store::Transaction<'_>,
        plan: &StepPlan,
        pos: usize,
        fresh: bool,
        tell: bool,
        happened: &mut Vec<EventKind>,
    ) -> Result<ToolStep> {
        let hook = &self.inner.cfg.testing.fault_hook;
        let rerun = self.inner.cfg.testing.sabotage.rerun_completed_effects;
        let lease = &plan.lease;
        let call = plan.call(pos);
        let (ran, effect) = match self.prepare_tool(&call) {
            Err(refusal) => {
                // No tool runs: record the error result the model sees.
                let inv = new_invocation(plan.step_id, pos, &call, Effect::None);
                let body = Box::new(move |_: &crate::store::Transaction<'_>| Ok(Err(refusal)));
                (
                    store::run_transactional(tx, lease, &inv, body, tell, fresh, rerun)?,
                    Effect::None,
                )
            }
            Ok((ToolImpl::Transactional(tool), _)) => {
                let inv = new_invocation(plan.step_id, pos, &call, Effect::Transactional);
                let tc = call.clone();
                let body = move |tx: &crate::store::Transaction<'_>| {
                    // The tool's statements are the host's: on PostgreSQL they
                    // reach the server as written.
                    let run = || {
                        std::panic::catch_unwind(AssertUnwindSafe(|| {
                            tx.as_host(|| tool.call(tx, &tc))
                        }))
                    };
                    let r = match tool.may_block() {
                        true => crate::store::may_block(run),
                        false => run(),
                    };
                    let out = match r {
                        Ok(Ok(v)) => render_result(v),
                        Ok(Err(e)) => Err(e.0),
                        Err(p) => Err(format!("tool panicked: {}", panic_message(&p))),
                    };
                    crate::error::check_fault(hook, FaultPoint::InsideTransactionalTool)?;
                    Ok(out)
                };
                let ran =
                    store::run_transactional(tx, lease, &inv, Box::new(body), tell, fresh, rerun)?;
                (ran, Effect::Transactional)
            }
            Ok((ToolImpl::Async(tool), effect)) => {
                let inv = new_invocation(plan.step_id, pos, &call, effect);
                let (row, inserted) = store::start_invocation(tx, &inv)?;
                if row.status == InvocationStatus::Started || rerun {
                    return Ok(ToolStep::Outside {
                        tool,
                        row,
                        inserted,
                    });
                }
                return Ok(ToolStep::Ran);
            }
        };
        if let Some((_, ok, result)) = &ran {
            plan.wrote_result(pos, *ok, result);
        }
        if let Some((Some(invocation_id), ok, _)) = ran {
            happened.push(EventKind::ToolStarted {
                step_id: plan.step_id,
                tool: call.name.clone(),
                effect,
            });
            happened.push(EventKind::ToolCompleted {
                step_id: plan.step_id,
                invocation_id,
                tool: call.name.clone(),
                effect,
                ok,
            });
        }
        Ok(ToolStep::Ran)
    }

    /// The registered tool for a call, or the refusal the model sees instead.
    fn prepare_tool(&self, call: &ToolCall) -> std::result::Result<(ToolImpl, Effect), String> {
        match self.inner.tools.get(&call.name) {
            None => Err(format!("unknown tool: {}", call.name)),
            Some(_) if !call.input.is_object() => Err(format!(
                "malformed arguments for {}: expected a JSON object, got {}",
                call.name,
                crate::compaction::truncate_chars(&call.input.to_string(), 200)
            )),
            Some(r) => Ok((r.imp.clone(), r.effect)),
        }
    }

    /// Calls an idempotent or at-most-once tool whose invocation is claimed;
    /// returns (ok, result). At-most-once: a call that had started before (a
    /// crash cut it) is not repeated; its outcome is reported as unknown.
    async fn run_async_tool(
        &self,
        plan: &StepPlan,
        pos: usize,
        tool: Arc<dyn crate::tools::Tool>,
        row: &store::InvocationRow,
        inserted: bool,
    ) -> (bool, String) {
        let mut call = plan.call(pos);
        // A call that had started goes out again under the key it first had.
        call.idempotency_key = row.idempotency_key.clone();
        if row.effect == Effect::AtMostOnce && !inserted {
            return (
                false,
                format!(
                    "outcome unknown: the call to {} may or may not have taken effect \
                     (the process stopped during it); it was not repeated",
                    call.name
                ),
            );
        }
        match CatchUnwind(tool.call(&call)).await {
            Ok(Ok(v)) => match render_result(v) {
                Ok(text) => (true, text),
                Err(text) => (false, text),
            },
            Ok(Err(e)) => (false, e.0),
            Err(p) => (false, format!("tool panicked: {}", panic_message(&p))),
        }
    }
}

/// A step with its model response, as the blocking half needs it.
struct StepPlan {
    calls: Vec<(String, String, serde_json::Value)>,
    /// The step's rows as this process writes them.
    written: std::sync::Mutex<Written>,
    final_text: String,
    session: SessionRow,
    turn: TurnRow,
    lease: Lease,
    step_id: StepId,
    step_idx: i64,
    /// The session's message context, handed to the next step's `prepare`.
    ctx: std::sync::Mutex<Option<Context>>,
}

/// A step's rows as this process writes them, rendered later exactly as the
/// stored rows are (`render::render_steps`): the response JSON and each
/// call's result, None where it was written before (a resumed step), and the
/// turn's earlier steps while this process wrote every one of them. Each
/// string is the very one bound to the statement that stored it, so what is
/// built from them is what a read of the rows gives (G3).
struct Written {
    response: Option<String>,
    results: Vec<Option<(String, String, bool)>>,
    turn: Option<Vec<HistoryStep>>,
}

impl Written {
    /// The completed step `idx`, when all of it was written here.
    fn step(&mut self, idx: i64) -> Option<HistoryStep> {
        if !self.results.iter().all(Option::is_some) {
            return None;
        }
        Some(HistoryStep {
            idx,
            response: self.response.take()?,
            results: self.results.drain(..).flatten().collect(),
        })
    }
}

impl StepPlan {
    /// Records the result written for call `pos`.
    fn wrote_result(&self, pos: usize, ok: bool, result: &str) {
        let mut w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(slot), Some((id, _, _))) = (w.results.get_mut(pos), self.calls.get(pos)) {
            *slot = Some((id.clone(), result.to_string(), !ok));
        }
    }

    fn call(&self, pos: usize) -> ToolCall {
        let (id, name, input) = &self.calls[pos];
        ToolCall {
            session: self.session.external_id.clone(),
            turn_idx: self.turn.idx,
            step_idx: self.step_idx,
            tool_call_id: id.clone(),
            name: name.clone(),
            input: input.clone(),
            idempotency_key: idempotency_key(
                &self.session.external_id,
                (self.session.id.0, self.session.created_at),
                self.turn.idx,
                self.step_idx,
                id,
            ),
        }
    }
}

/// Why a turn's steps stopped short of a final answer.
enum Stop {
    /// Handled already: the turn was failed (the error says why), or the error
    /// leaves it running to be resumed.
    Recorded(Error),
    /// Not handled yet: fails the turn unless it is resumable.
    Error(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Error(e)
    }
}

/// Where [`Runner::advance`] stopped.
enum Advanced {
    /// The async tool call at `pos` is to run; its invocation row is claimed.
    Async {
        pos: usize,
        tool: Arc<dyn crate::tools::Tool>,
        row: store::InvocationRow,
        inserted: bool,
    },
    /// The step was the turn's last.
    Finished(TurnRow, String),
    /// The step is completed; the next one is prepared.
    Next(Box<Prepared>),
}

/// What [`Runner::tool_in_tx`] did with a tool call.
enum ToolStep {
    /// Ran in the step's transaction (or had run before): go on.
    Ran,
    /// An outside tool whose invocation is claimed: commit, then call it.
    Outside {
        tool: Arc<dyn crate::tools::Tool>,
        row: store::InvocationRow,
        inserted: bool,
    },
}

/// What the turn's first blocking call found.
enum Begun {
    /// The lease is held: drive from the prepared first step.
    Drive(Box<(TurnRow, Lease, SessionRow, Prepared)>),
    /// The turn had already finished.
    Finished(TurnRow),
}

fn new_invocation<'a>(
    step_id: StepId,
    position: usize,
    call: &'a ToolCall,
    effect: Effect,
) -> NewInvocation<'a> {
    NewInvocation {
        step_id,
        position: position as i64,
        tool_call_id: &call.tool_call_id,
        tool_name: &call.name,
        arguments: call.input.to_string(),
        effect,
        idempotency_key: &call.idempotency_key,
    }
}

/// A reported token count as stored: counts above `i64::MAX` (SQLite's
/// integer) are stored as `i64::MAX`, never wrapped negative (a negative
/// measure would keep the threshold from ever firing), and said in a warning.
fn saturating_tokens(n: u64, what: &str, step_id: StepId) -> i64 {
    i64::try_from(n).unwrap_or_else(|_| {
        warn!(
            step_id = %step_id,
            reported = n,
            "{what} token count above i64::MAX stored as i64::MAX"
        );
        i64::MAX
    })
}

/// Tool call ids must be non-empty and unique within the response: they key the
/// exactly-once record of each call.
fn validate_calls(response: &ModelResponse, step_id: StepId) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for (id, name, _) in response.tool_calls() {
        if id.is_empty() || name.is_empty() {
            return Err(Error::InvalidResponse {
                step_id,
                reason: "a tool call has an empty id or name".into(),
            });
        }
        if !seen.insert(id) {
            return Err(Error::InvalidResponse {
                step_id,
                reason: format!("tool call id {id:?} appears twice"),
            });
        }
    }
    Ok(())
}
