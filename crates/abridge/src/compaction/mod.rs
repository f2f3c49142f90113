//! Exactly-once compaction: decide, claim, summarise, complete.
//!
//! [`Compactor::ensure`] runs inside every step, before the messages are built.
//! It returns the completed compaction the step reads (G4), creating it first
//! when the context has outgrown the threshold. See `docs/design.md` for the
//! protocol and its outcome table.

mod config;
mod decide;
mod offline;
mod plan;
pub mod planner;
mod preview;
mod summarise;
#[cfg(feature = "tiktoken")]
mod tiktoken;

pub use config::{
    builtin_context_window, Background, BackgroundWorker, CharsPerFour, CompactionConfig,
    FailurePolicy, PromptStyle, Threshold, TokenCounter, CONTEXT_WINDOWS, DEFAULT_SOFT_SHARE,
};
pub use offline::{extract, ExtractiveSummariser};
pub use preview::{preview, CompactionPreview};
pub use summarise::{
    cap_block, chunk_entries, rules_for, transcript_entries, truncate_chars, ModelSummariser,
    Summariser, SummaryRequest, SummaryResponse, PROSE_RULES, PROSE_UPDATE_RULES, STRUCTURED_RULES,
    STRUCTURED_UPDATE_RULES,
};
#[cfg(feature = "tiktoken")]
pub use tiktoken::TiktokenCounter;

use decide::{Decision, Facts};
pub(crate) use plan::Plan;

use crate::error::{Error, Result};
use crate::events::{EventKind, EventSink, Subject};
use crate::fault::{FaultHook, FaultPoint, TestKnobs};
use crate::ids::{CompactionId, SessionId};
use crate::message::sha256_hex;
use crate::owner::ClaimGuard;
use crate::pins::Pin;
use crate::render::SummaryView;
use crate::store::{
    self, ClaimOutcome, CompactionRow, CompactionStats, CompactionStatus, SessionRow, Store,
};
use crate::unwind::{panic_message, CatchUnwind};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{info, instrument, warn};

tokio::task_local! {
    static BACKGROUND: ();
}

/// Whether the caller runs inside a background compaction task of this
/// process (fault hooks use it to say where a point was reached).
pub fn in_background() -> bool {
    BACKGROUND.try_with(|_| ()).is_ok()
}

/// A manual compaction's focus is cut to this many chars (it rides in the rules).
pub const MAX_FOCUS_CHARS: usize = 1_000;

/// Summaries made again, at most, when the session is redacted while each
/// is made (its source changed under it).
const MAX_REDACTED_REDOS: usize = 3;

/// Whether a lease holder is provably gone, as seen by an owner name:
/// `(holder, owner) -> gone` (see [`crate::owner::holder_is_gone`]).
pub(crate) type GoneCheck = fn(&str, &str) -> bool;

/// Runs the compaction protocol for one store.
#[derive(Clone)]
pub struct Compactor {
    pub(crate) store: Store,
    pub(crate) summariser: Arc<dyn Summariser>,
    pub(crate) config: CompactionConfig,
    pub(crate) owner: String,
    pub(crate) events: EventSink,
    pub(crate) fault: Option<FaultHook>,
    pub(crate) holder_is_gone: GoneCheck,
    heartbeat: bool,
    /// Sabotage::read_drafts (deliberately wrong; off unless a test kit sets it).
    read_drafts: bool,
    /// Renews the leases of the rows this compactor's claims are summarising.
    renewals: Arc<crate::lease::Renewals>,
    warned: Arc<Mutex<HashSet<String>>>,
    tasks: Tasks,
}

impl std::fmt::Debug for Compactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compactor")
            .field("owner", &self.owner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Where a compaction request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// A step at the hard threshold (it waits).
    Auto,
    /// The soft threshold: summarised in the background.
    Background,
    Manual,
}

/// What [`Compactor::serve_pending`] did.
#[derive(Debug, Clone, Default)]
pub struct Served {
    /// The rows it completed.
    pub completed: Vec<CompactionRow>,
    /// The rows whose every attempt failed: (row, last error).
    pub failed: Vec<(CompactionId, String)>,
}

/// A row claimed for a background summary, with the claim that holds it.
struct BackgroundClaim {
    row: CompactionRow,
    claim: ClaimGuard,
}

/// Background compaction tasks of a compactor, by (session, boundary).
type Tasks = Arc<Mutex<HashMap<(SessionId, i64), tokio::task::JoinHandle<()>>>>;

impl Compactor {
    pub(crate) fn new(
        store: Store,
        summariser: Arc<dyn Summariser>,
        owner: String,
        config: CompactionConfig,
        testing: TestKnobs,
        events: EventSink,
        holder_is_gone: GoneCheck,
    ) -> Result<Compactor> {
        config.validate()?;
        let renewals = Arc::new(crate::lease::Renewals::new(&store, config.lease_ttl));
        Ok(Compactor {
            renewals,
            store,
            summariser,
            config,
            owner,
            events,
            fault: testing.fault_hook,
            holder_is_gone,
            heartbeat: testing.heartbeat,
            read_drafts: testing.sabotage.read_drafts,
            warned: Arc::default(),
            tasks: Arc::default(),
        })
    }

    /// Whether a lease holder is provably gone, as this compactor's owner sees it.
    fn gone_check(&self) -> impl Fn(&str) -> bool + Send + Sync + 'static {
        let gone = self.holder_is_gone;
        let owner = self.owner.clone();
        move |holder: &str| gone(holder, &owner)
    }

    /// The configuration.
    pub fn config(&self) -> &CompactionConfig {
        &self.config
    }

    fn warn_once(&self, subject: &Subject, key: String, message: String) {
        let first = self
            .warned
            .lock()
            .map(|mut w| w.insert(key))
            .unwrap_or(false);
        if first {
            warn!(%message);
            self.events.emit(subject, EventKind::Warning { message });
        }
    }

    /// The threshold in tokens for `model`, None when compaction is off for it.
    fn threshold_tokens(&self, session: &SessionRow, turn_idx: i64) -> Option<u64> {
        let model = session.model.as_str();
        let window = self.config.context_window(model);
        if matches!(self.config.compact_at, Threshold::Fraction(_)) && window.is_none() {
            self.warn_once(
                &Subject::of(session, Some(turn_idx)),
                format!("window:{model}"),
                format!("no context window known for model {model:?}: automatic compaction is off for it"),
            );
        }
        self.config.compact_at.tokens(window)
    }

    /// Returns the completed compaction a step of `turn_idx` reads, after
    /// compacting when the context has outgrown the threshold.
    ///
    /// - The boundary is fixed for the turn (`turn_idx - 1 - keep_last_turns`), so
    ///   a turn compacts at most once and can never loop.
    /// - A pending row at the boundary (a crash mid-summary) is finished without
    ///   re-deciding the threshold.
    /// - The measure is the newest executed step's persisted context tokens, so a
    ///   re-run decides exactly as the first run did.
    /// - With background compaction ([`CompactionConfig::background`]), a
    ///   measure at the soft threshold claims the row and starts its summary
    ///   in a task of this compactor, and this call returns at once with the
    ///   last completed row; at the hard threshold it waits, as without.
    ///   Called outside a turn, it reads the newest completed row (a runner's
    ///   steps also keep the compaction their turn began with).
    #[instrument(skip(self, session), fields(session = %session.id))]
    pub async fn ensure(
        &self,
        session: &SessionRow,
        turn_idx: i64,
        step_idx: i64,
    ) -> Result<Option<CompactionRow>> {
        let (this, s) = (self.clone(), session.clone());
        let plan = self
            .store
            .read(move |c| {
                this.prefetch_decision(c, &s, turn_idx, step_idx)?;
                this.plan(c, &s, turn_idx, step_idx, None)
            })
            .await?;
        let subject = Subject::of(session, Some(turn_idx));
        Ok(self.resolve(&subject, turn_idx, plan).await?.row)
    }

    /// Says which of [`Compactor::plan`]'s reads for step `step_idx` of
    /// turn `turn_idx` follow (see [`crate::store::Connection::prefetch`]):
    /// the caller's next read takes them along, on PostgreSQL in one round
    /// trip. A read that the plan turns out not to need costs the server
    /// one indexed lookup, and no round trip.
    pub(crate) fn prefetch_decision(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn_idx: i64,
        step_idx: i64,
    ) -> Result<()> {
        store::prefetch_latest_completed(c, session.id, turn_idx)?;
        let Some(b) = planner::boundary(turn_idx, self.config.keep_last_turns) else {
            return Ok(());
        };
        if self.config.keep_recent_tokens == 0 {
            store::prefetch_compaction_at(c, session.id, b)?;
        }
        let window = self.config.context_window(&session.model);
        if self.config.compact_at.tokens(window).is_some() {
            store::prefetch_latest_context_tokens(c, session.id, turn_idx, step_idx)?;
        }
        Ok(())
    }

    /// The asynchronous half: claims, summarises and completes when the decision
    /// says so; returns the completed compaction the step reads.
    async fn act(
        &self,
        subject: &Subject,
        turn_idx: i64,
        decision: Decision,
    ) -> Result<Option<CompactionRow>> {
        let sid = subject.session_id;
        let (b, measure, latest) = match decision {
            Decision::Read(row) => return Ok(row),
            Decision::Background {
                boundary,
                measure,
                read,
            } => {
                self.background(subject, boundary, measure, read.as_ref())
                    .await?;
                return Ok(read);
            }
            Decision::Claim {
                boundary,
                measure,
                latest,
            } => (boundary, measure, latest),
        };
        self.say_if_often(subject, b, measure, latest.as_ref());
        let row = self
            .claim_and_finish(subject, b, Trigger::Auto, None, measure, true)
            .await;
        match row {
            Ok(_row) => {
                crate::error::check_fault(&self.fault, FaultPoint::AfterCompactionComplete)?;
                if self.read_drafts && _row.status != CompactionStatus::Completed {
                    return Ok(Some(_row));
                }
                self.store
                    .call(move |c| store::latest_completed(c, sid, turn_idx))
                    .await
            }
            Err(Error::CompactionFailed { .. })
                if self.config.on_failure == FailurePolicy::ProceedUncompacted =>
            {
                Ok(latest)
            }
            Err(e) => Err(e),
        }
    }

    /// Compacts every turn before `turn_idx` now, for a step whose context
    /// the model refused as too long (the claim and protocol of any other
    /// compaction; exactly once). None when there is nothing more to fold
    /// or the compaction failed: the caller tries the next remedy.
    pub(crate) async fn compact_for_overflow(
        &self,
        subject: &Subject,
        turn_idx: i64,
    ) -> Result<Option<CompactionRow>> {
        let (sid, b) = (subject.session_id, turn_idx - 1);
        if b < 0 {
            return Ok(None);
        }
        let latest = self
            .store
            .read(move |c| store::latest_completed(c, sid, turn_idx))
            .await?;
        if latest.is_some_and(|l| l.up_to_turn_index >= b) {
            return Ok(None);
        }
        match self
            .claim_and_finish(subject, b, Trigger::Auto, None, None, true)
            .await
        {
            Ok(row) if row.status == CompactionStatus::Completed => {
                crate::error::check_fault(&self.fault, FaultPoint::AfterCompactionComplete)?;
                Ok(Some(row))
            }
            Ok(_) | Err(Error::CompactionFailed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A new compaction one turn after the previous one: said in an event.
    fn say_if_often(
        &self,
        subject: &Subject,
        b: i64,
        measure: Option<i64>,
        latest: Option<&CompactionRow>,
    ) {
        // (Not after a background summary: it was read late, with the turns
        // that ran while it was made, which took the room.)
        if let Some(prev) = latest.filter(|l| b - l.up_to_turn_index <= 1 && !l.background) {
            if measure.is_some() {
                warn!(session_id = %subject.session_id, boundary = b, "compacting again one turn after the last compaction");
                self.events.emit(
                    subject,
                    EventKind::CompactingOften {
                        boundary: b,
                        previous_boundary: prev.up_to_turn_index,
                    },
                );
            }
        }
    }

    /// Starts the background compaction of `boundary`: a task of this
    /// compactor claims and summarises it ([`BackgroundWorker::Task`]; at most
    /// one task per session in this process), or the pending row is recorded
    /// for another process to serve ([`BackgroundWorker::Elsewhere`]).
    async fn background(
        &self,
        subject: &Subject,
        boundary: i64,
        measure: Option<i64>,
        latest: Option<&CompactionRow>,
    ) -> Result<()> {
        let (this, sid) = (self.clone(), subject.session_id);
        let claimed = self
            .store
            .call(move |c| this.claim_background(c, sid, boundary, measure))
            .await?;
        self.say_if_often(subject, boundary, measure, latest);
        if let Some(claimed) = claimed {
            self.spawn_background(subject, claimed);
        }
        Ok(())
    }

    /// The synchronous half of [`Compactor::background`], run on a store
    /// connection: claims the row for a task of this compactor, or queues it
    /// for another process (then None).
    fn claim_background(
        &self,
        c: &mut crate::store::Connection,
        sid: SessionId,
        boundary: i64,
        measure: Option<i64>,
    ) -> Result<Option<BackgroundClaim>> {
        if self.config.background.unwrap_or_default().worker == BackgroundWorker::Elsewhere {
            if store::enqueue_compaction(c, sid, boundary, measure)? {
                info!(session_id = %sid, boundary, "compaction queued for a background server");
            }
            return Ok(None);
        }
        // One background summary of a session at a time.
        if self.background_running_for(sid) {
            return Ok(None);
        }
        // Claimed before the step goes on: the boundary is fixed now, and the
        // next decide() sees the pending row. The task summarises under this
        // claim (and its lease's heartbeat).
        let claim = ClaimGuard::new(&self.owner);
        let outcome = store::claim_compaction(
            c,
            &store::Claim {
                session_id: sid,
                boundary,
                owner: claim.holder(),
                ttl_ms: self.config.lease_ttl.as_millis() as i64,
                trigger: "auto",
                focus: None,
                trigger_tokens: measure,
                background: true,
            },
            &self.gone_check(),
        )?;
        info!(session_id = %sid, boundary, outcome = outcome_name(&outcome), "background compaction claim");
        Ok(match outcome {
            ClaimOutcome::Claimed(row) | ClaimOutcome::TakenOver(row) => {
                Some(BackgroundClaim { row, claim })
            }
            // Completed, failed, or someone else's: nothing to do here.
            _ => None,
        })
    }

    /// Summarises a claimed row in a task of this compactor (on the caller's
    /// tokio runtime).
    fn spawn_background(&self, subject: &Subject, claimed: BackgroundClaim) {
        let BackgroundClaim { row, claim } = claimed;
        let (sid, boundary) = (row.session_id, row.up_to_turn_index);
        let (this, subject) = (self.clone(), subject.clone());
        let task = tokio::spawn(async move {
            let done = BACKGROUND
                .scope((), async {
                    crate::error::check_fault(&this.fault, FaultPoint::AfterClaim)?;
                    this.summarise_and_complete(row, &claim, &subject).await?;
                    crate::error::check_fault(&this.fault, FaultPoint::AfterCompactionComplete)
                })
                .await;
            if let Err(e) = done {
                warn!(session_id = %sid, boundary, error = %this.events.error(&e), "background compaction did not finish");
            }
        });
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.insert((sid, boundary), task);
    }

    /// Waits for every background compaction task of this compactor (and of
    /// the runners that share it) to end: what a host awaits before it
    /// exits, so that no summary it started is left to the next runner.
    /// Returns how many it waited for.
    pub async fn finish_background(&self) -> usize {
        let mut n = 0;
        loop {
            let tasks: Vec<_> = {
                let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
                t.drain().map(|(_, task)| task).collect()
            };
            if tasks.is_empty() {
                return n;
            }
            for task in tasks {
                n += 1;
                let _ = task.await;
            }
        }
    }

    fn background_running_for(&self, sid: SessionId) -> bool {
        let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|_, task| !task.is_finished());
        t.keys().any(|(s, _)| *s == sid)
    }

    /// Background compactions of this compactor still running.
    pub fn background_running(&self) -> usize {
        let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|_, task| !task.is_finished());
        t.len()
    }

    /// Finishes every pending compaction of the store that no live other
    /// holds: a row queued for a background server
    /// ([`BackgroundWorker::Elsewhere`]), or one left by a summariser that
    /// died. Each is claimed under its lease and summarised by this
    /// compactor's summariser, exactly once as ever (a row another server
    /// claims first is left to it). Returns the rows completed by this call,
    /// and the boundaries that failed.
    pub async fn serve_pending(&self) -> Result<Served> {
        let (owner, dead) = (self.owner.clone(), self.gone_check());
        let rows = self
            .store
            .read(move |c| {
                let now = c.now_ms();
                let mut out = Vec::new();
                for row in store::pending_compactions(c)? {
                    if !store::held_by_live_other(&row, &owner, now, &dead) {
                        let session = store::get_session(c, row.session_id)?;
                        out.push((row, session));
                    }
                }
                Ok(out)
            })
            .await?;
        let mut served = Served::default();
        for (row, session) in rows {
            let subject = Subject::of(&session, None);
            match self
                .claim_and_finish(
                    &subject,
                    row.up_to_turn_index,
                    Trigger::Background,
                    None,
                    None,
                    false,
                )
                .await
            {
                Ok(done) if done.status == CompactionStatus::Completed => {
                    served.completed.push(done)
                }
                Ok(_) => {}
                Err(Error::CompactionFailed {
                    compaction_id,
                    message,
                    ..
                }) => served.failed.push((compaction_id, message)),
                Err(e) => return Err(e),
            }
        }
        Ok(served)
    }

    /// Manual compaction of every turn of the session (less `keep_last_turns`),
    /// from any process, while no turn is running. Uses the same unique index as
    /// automatic compaction, so the two can never double.
    ///
    /// Idempotent: when the session is already compacted up to the boundary this
    /// call would use, that completed row is returned (asked with no focus or
    /// the same one).
    ///
    /// Errors: [`Error::TurnRunning`] while a turn runs; [`Error::NothingToCompact`]
    /// when there is no turn to compact (an empty session, or fewer turns than
    /// `keep_last_turns + 1`) or the newest compaction already reaches further;
    /// [`Error::AlreadyCompacted`] when that row was made with another focus
    /// than the one asked for.
    pub async fn compact_now(
        &self,
        session_id: SessionId,
        focus: Option<String>,
    ) -> Result<CompactionRow> {
        let focus = focus.filter(|f| !f.trim().is_empty());
        let this = self.clone();
        let (plan, session) = self
            .store
            .call(move |c| {
                let plan = preview::manual_plan(&this.config, c, session_id)?;
                Ok((plan, store::get_session(c, session_id)?))
            })
            .await?;
        if let Some(row) = plan.existing {
            if row.status == CompactionStatus::Completed {
                // Already compacted up to exactly here: the same answer again
                // (asked with no focus, or the same one); another focus is
                // refused (G2: the summary cannot be redone).
                let other = focus
                    .as_deref()
                    .is_some_and(|f| row.focus.as_deref().map(str::trim) != Some(f.trim()));
                if other {
                    return Err(Error::AlreadyCompacted {
                        session_id,
                        boundary: row.up_to_turn_index,
                        existing: row.focus,
                    });
                }
                return Ok(row);
            }
        }
        self.claim_and_finish(
            &Subject::of(&session, None),
            plan.boundary,
            Trigger::Manual,
            focus,
            None,
            true,
        )
        .await
    }

    /// Re-arms a failed boundary; the next ensure() or compact_now() claims it.
    pub async fn retry_failed(&self, session_id: SessionId, boundary: i64) -> Result<bool> {
        self.store
            .call(move |c| store::retry_compaction(c, session_id, boundary))
            .await
    }

    /// Claims the row at the boundary in a write transaction (see
    /// [`store::claim_compaction`] for the outcomes).
    async fn claim(
        &self,
        session_id: SessionId,
        boundary: i64,
        trigger: Trigger,
        focus: &Option<String>,
        measure: Option<i64>,
        holder: &str,
    ) -> Result<ClaimOutcome> {
        let owner = holder.to_string();
        let ttl = self.config.lease_ttl.as_millis() as i64;
        let focus_c = focus.clone();
        let dead = self.gone_check();
        self.store
            .call(move |c| {
                store::claim_compaction(
                    c,
                    &store::Claim {
                        session_id,
                        boundary,
                        owner: &owner,
                        ttl_ms: ttl,
                        trigger: if trigger == Trigger::Manual {
                            "manual"
                        } else {
                            "auto"
                        },
                        background: trigger == Trigger::Background,
                        focus: focus_c.as_deref(),
                        trigger_tokens: measure,
                    },
                    &dead,
                )
            })
            .await
    }

    /// Claims the boundary and drives the row to completed (or failed).
    /// Without `wait`, a row a live other holds is left to it (its pending
    /// row is returned).
    async fn claim_and_finish(
        &self,
        subject: &Subject,
        boundary: i64,
        trigger: Trigger,
        focus: Option<String>,
        measure: Option<i64>,
        wait: bool,
    ) -> Result<CompactionRow> {
        let session_id = subject.session_id;
        let deadline = tokio::time::Instant::now() + self.config.wait_timeout;
        let mut poll = Duration::from_millis(2);
        // The claim lives as long as this future: a task of this process that
        // drops it frees the row for its siblings at once (see crate::owner).
        let claim = ClaimGuard::new(&self.owner);
        let mut waiting_said = false;
        // A step that measured its context over the threshold (the only
        // caller with a measure) has just read no row at this boundary: it
        // claims at once (a row made since is found by the claim itself).
        let mut look = measure.is_none();
        loop {
            // A look first; only a missing or abandoned row is claimed, in a
            // write transaction.
            let peeked = match std::mem::replace(&mut look, true) {
                true => self.peek(session_id, boundary, claim.holder()).await?,
                false => None,
            };
            let outcome = match peeked {
                Some(outcome) => outcome,
                None => {
                    self.claim(
                        session_id,
                        boundary,
                        trigger,
                        &focus,
                        measure,
                        claim.holder(),
                    )
                    .await?
                }
            };
            info!(
                session_id = %session_id,
                boundary,
                attempt = outcome.row().attempts,
                outcome = outcome_name(&outcome),
                "compaction claim"
            );
            match outcome {
                ClaimOutcome::Claimed(row) | ClaimOutcome::TakenOver(row) => {
                    crate::error::check_fault(&self.fault, FaultPoint::AfterClaim)?;
                    return self.summarise_and_complete(row, &claim, subject).await;
                }
                ClaimOutcome::AlreadyCompleted(row) => return Ok(row),
                ClaimOutcome::Failed(row) => {
                    return Err(Error::CompactionFailed {
                        compaction_id: row.id,
                        session_id,
                        boundary,
                        message: row.error.unwrap_or_default(),
                    })
                }
                ClaimOutcome::HeldByLiveOther(row) if !wait => return Ok(row),
                ClaimOutcome::HeldByLiveOther(row) => {
                    if self.read_drafts {
                        // Deliberately wrong (Sabotage::read_drafts): read the draft instead of waiting.
                        return Ok(row);
                    }
                    if !waiting_said {
                        waiting_said = true;
                        self.events.emit(
                            subject,
                            EventKind::CompactionWaiting {
                                boundary,
                                compaction_id: row.id,
                                holder: crate::owner::owner_name(
                                    row.lease_owner.as_deref().unwrap_or_default(),
                                )
                                .to_string(),
                            },
                        );
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::CompactionWaitTimeout {
                            compaction_id: row.id,
                            owner: crate::owner::owner_name(
                                row.lease_owner.as_deref().unwrap_or_default(),
                            )
                            .to_string(),
                        });
                    }
                    self.wait_for_settlement(session_id, boundary, row.id, poll)
                        .await?;
                    poll = (poll * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// A look at the row, without a write: a completed, failed or live-held
    /// row needs none (after a wait, the common case); `None` means missing or
    /// abandoned, to be claimed.
    async fn peek(
        &self,
        session_id: SessionId,
        boundary: i64,
        me: &str,
    ) -> Result<Option<ClaimOutcome>> {
        let (me, dead) = (me.to_string(), self.gone_check());
        self.store
            .read(move |c| {
                Ok(
                    store::compaction_at(c, session_id, boundary)?.and_then(|row| {
                        match row.status {
                            CompactionStatus::Completed => {
                                Some(ClaimOutcome::AlreadyCompleted(row))
                            }
                            CompactionStatus::Failed => Some(ClaimOutcome::Failed(row)),
                            CompactionStatus::Pending
                                if store::held_by_live_other(&row, &me, c.now_ms(), &dead) =>
                            {
                                Some(ClaimOutcome::HeldByLiveOther(row))
                            }
                            CompactionStatus::Pending => None,
                        }
                    }),
                )
            })
            .await
    }

    /// Waits, up to `poll`, for the pending row `id` to settle: woken at once
    /// by a holder in this process; a holder in another process is polled
    /// for (the caller doubles `poll`).
    async fn wait_for_settlement(
        &self,
        session_id: SessionId,
        boundary: i64,
        id: CompactionId,
        poll: Duration,
    ) -> Result<()> {
        let looked = {
            let settled = self.store.compaction_settled(session_id, boundary);
            let woken = settled.notified();
            tokio::pin!(woken);
            // Registered first, then the row looked at again: a settlement
            // between the claim and here is not missed.
            woken.as_mut().enable();
            let still_pending = self
                .store
                .read(
                    move |c| Ok(store::get_compaction(c, id)?.status == CompactionStatus::Pending),
                )
                .await;
            if let Ok(true) = still_pending {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
            still_pending
        };
        self.store.forget_settled(session_id, boundary);
        looked.map(|_| ())
    }

    /// Summarises the row's span (folding the previous summary), checks G7, and
    /// completes the row; the first completion wins (G2).
    async fn summarise_and_complete(
        &self,
        row: CompactionRow,
        claim: &ClaimGuard,
        subject: &Subject,
    ) -> Result<CompactionRow> {
        // A redaction of the session while the summary was made changed its
        // source: made again from the redacted rows (a few times at most).
        for _ in 0..MAX_REDACTED_REDOS {
            if let Some(done) = self.summarise_once(&row, claim, subject).await? {
                return Ok(done);
            }
        }
        Err(Error::CompactionFailed {
            compaction_id: row.id,
            session_id: row.session_id,
            boundary: row.up_to_turn_index,
            message: "the session was redacted again while each summary was made".into(),
        })
    }

    /// One summary of the row's span, completed; None when a redaction of the
    /// session since the span was read kept it from completing.
    async fn summarise_once(
        &self,
        row: &CompactionRow,
        claim: &ClaimGuard,
        subject: &Subject,
    ) -> Result<Option<CompactionRow>> {
        let row = row.clone();
        let span = self.load_span(&row).await?;
        self.events.emit(
            subject,
            EventKind::CompactionClaimed {
                boundary: row.up_to_turn_index,
                compaction_id: row.id,
                attempt: row.attempts,
                trigger_tokens: row.trigger_tokens,
            },
        );
        let tokens_before =
            preview::replaced_tokens(&self.config, span.prev.as_ref(), &span.turns)?;
        let rules = Rules {
            first: self.rules(&row, false),
            update: self.rules(&row, true),
            focus: row.focus.clone().filter(|f| !f.trim().is_empty()),
            summary_chars: self.config.summary_chars(&subject.model),
        };
        // Heartbeat: keep the row's lease while this claim is alive and working.
        // Dropped with the future, so a dropped future renews nothing.
        let hb = self.heartbeat.then(|| {
            let owner = claim.holder().to_string();
            let (id, ms) = (row.id, self.config.lease_ttl.as_millis() as i64);
            self.renewals
                .keep(move |c| store::renew_compaction_lease(c, id, &owner, ms))
        });
        let previous_present = span.prev.as_ref().is_some_and(|p| p.summary.is_some());
        let result = self
            .attempts(&row, &rules, &span, tokens_before, subject)
            .await;
        drop(hb);
        match result {
            Ok((summary, mut stats)) => {
                crate::error::check_fault(&self.fault, FaultPoint::MidSummary)?;
                let used = rules.for_request(previous_present);
                stats.prompt_sha256 = sha256_hex(used.as_bytes());
                self.complete(&row, summary, stats, span.redaction, subject)
                    .await
            }
            Err(Error::Injected(p)) => Err(Error::Injected(p)),
            Err(e) => self.fail(&row, claim, e, subject).await.map(Some),
        }
    }

    /// The previous completed compaction the row folds in, and the turns it
    /// summarises.
    async fn load_span(&self, row: &CompactionRow) -> Result<Span> {
        let (sid, b, prev_id) = (row.session_id, row.up_to_turn_index, row.previous_id);
        let window = self.config.pins_window;
        self.store
            .call(move |c| {
                // One snapshot; on PostgreSQL two round trips: the redaction
                // mark and the live pins go with the previous summary's read,
                // then the span's history.
                c.in_read_tx(|c| {
                    store::prefetch_session_redaction(c, sid)?;
                    store::prefetch_live_pins(c, sid, b, window)?;
                    let prev = match prev_id {
                        Some(id) => Some(store::get_compaction(c, id)?),
                        None => None,
                    };
                    let redaction = store::session_redaction(c, sid)?;
                    let pins = store::live_pins(c, sid, b, window)?;
                    let after = prev.as_ref().map_or(-1, |p| p.up_to_turn_index);
                    let turns = store::load_history(c, sid, after, b, i64::MAX)?;
                    Ok(Span {
                        redaction,
                        prev,
                        turns,
                        pins,
                    })
                })
            })
            .await
    }

    /// The summariser's rules: the style's (its first or its update variant),
    /// and a manual compaction's focus.
    fn rules(&self, row: &CompactionRow, update: bool) -> String {
        let mut rules = rules_for(&self.config.style, update).to_string();
        if let Some(focus) = row.focus.as_deref().filter(|f| !f.trim().is_empty()) {
            rules.push_str("\n\nFocus of this compaction (give it priority): ");
            rules.push_str(&truncate_chars(focus, MAX_FOCUS_CHARS));
        }
        rules
    }

    /// Completes the row with `summary`; the first completion wins (G2), a
    /// later one gets the winner's row back. None: the session was redacted
    /// after `redaction` (the summary's source read), the row is left pending.
    async fn complete(
        &self,
        row: &CompactionRow,
        summary: String,
        stats: CompactionStats,
        redaction: i64,
        subject: &Subject,
    ) -> Result<Option<CompactionRow>> {
        let (sid, b, id) = (row.session_id, row.up_to_turn_index, row.id);
        let (done, won) = {
            let stats = stats.clone();
            self.store
                .call(move |c| store::complete_compaction(c, id, &summary, &stats, redaction))
                .await?
        };
        if done.status == CompactionStatus::Pending {
            info!(session_id = %sid, boundary = b, "the session was redacted while its summary was made: making it again");
            return Ok(None);
        }
        self.store.compaction_has_settled(sid, b);
        if done.status != CompactionStatus::Completed {
            // Failed by another holder after a takeover; report it as failed.
            return Err(Error::CompactionFailed {
                compaction_id: done.id,
                session_id: sid,
                boundary: b,
                message: done.error.clone().unwrap_or_default(),
            });
        }
        info!(
            session_id = %sid,
            boundary = b,
            won,
            tokens_before = done.tokens_before,
            tokens_after = done.tokens_after,
            "compaction completed"
        );
        if won {
            self.events.emit(
                subject,
                EventKind::Compacted {
                    boundary: b,
                    compaction_id: done.id,
                    trigger_tokens: done.trigger_tokens,
                    tokens_before: stats.tokens_before,
                    tokens_after: stats.tokens_after,
                    summariser_model: stats.model.clone(),
                    input_tokens: stats.input_tokens,
                    output_tokens: stats.output_tokens,
                    summary_calls: stats.summary_calls,
                    pins_live: stats.pins_live.unwrap_or(0),
                    pins_added: stats.pins_added.unwrap_or(0),
                },
            );
        }
        Ok(Some(done))
    }

    /// Fails the row after its last attempt (unless another holder completed
    /// it meanwhile: their summary stands).
    async fn fail(
        &self,
        row: &CompactionRow,
        claim: &ClaimGuard,
        err: Error,
        subject: &Subject,
    ) -> Result<CompactionRow> {
        let (sid, b, id) = (row.session_id, row.up_to_turn_index, row.id);
        let msg = err.to_string();
        let owner = claim.holder().to_string();
        let m = msg.clone();
        let failed = self
            .store
            .call(move |c| store::fail_compaction(c, id, &owner, &m))
            .await?;
        self.store.compaction_has_settled(sid, b);
        warn!(session_id = %sid, boundary = b, error = %self.events.shown(&msg), "compaction failed");
        self.events.emit(
            subject,
            EventKind::CompactionFailed {
                boundary: b,
                compaction_id: id,
                error: self.events.shown(&msg),
                last: true,
            },
        );
        if failed.status == CompactionStatus::Completed {
            return Ok(failed);
        }
        Err(Error::CompactionFailed {
            compaction_id: id,
            session_id: sid,
            boundary: b,
            message: msg,
        })
    }

    /// Up to `retry.max_attempts` runs of the whole (possibly chunked) summary, with
    /// backoff; an empty or not-smaller summary is a failed attempt (G7).
    async fn attempts(
        &self,
        row: &CompactionRow,
        rules: &Rules,
        span: &Span,
        tokens_before: u64,
        subject: &Subject,
    ) -> Result<(String, CompactionStats)> {
        let cfg = &self.config;
        let counter = &*cfg.token_counter;
        let previous = span.prev.as_ref().and_then(|p| p.summary.clone());
        let pins = &span.pins;
        let entries = transcript_entries(&span.turns, cfg.text_cap, cfg.tool_result_cap);
        // The budget left for the transcript once the rules, the running summary
        // (at most max_summary_chars) and the framing are in.
        let fixed = cfg.fixed_request_tokens(&rules.update);
        let chunk_budget = cfg.input_budget_tokens.saturating_sub(fixed).max(64);
        let chunks = chunk_entries(entries, chunk_budget, counter);
        // A span no larger than the summary message's own framing cannot be
        // replaced by anything smaller (G7): failed at once, without spending
        // the summariser's attempts on it.
        let framing = message_tokens(
            counter,
            &[crate::render::summary_message(SummaryView {
                up_to_turn_index: row.up_to_turn_index,
                summary: "",
            })],
        );
        if framing >= tokens_before {
            return Err(Error::Summary(format!(
                "what would be replaced ({tokens_before} tokens) is no larger than an empty \
                 summary message ({framing} tokens): no summary can be smaller; not summarised"
            )));
        }
        let mut last_err = String::from("no attempt made");
        for attempt in 1..=cfg.retry.max_attempts {
            if attempt > 1 {
                tokio::time::sleep(cfg.retry.delay(attempt - 1)).await;
            }
            match self.one_attempt(rules, previous.clone(), &chunks).await {
                Ok((text, input, output, calls)) => {
                    let text = clean_summary(&text, rules.summary_chars);
                    let (text, pins_added, calls) = if text.is_empty() || !cfg.guard_pins {
                        (text, 0, calls)
                    } else {
                        self.guard(row, rules, text, pins, calls, subject).await?
                    };
                    let after = message_tokens(
                        counter,
                        &[crate::render::summary_message(SummaryView {
                            up_to_turn_index: row.up_to_turn_index,
                            summary: &text,
                        })],
                    );
                    if text.is_empty() {
                        last_err = "summariser returned an empty summary".into();
                    } else if after >= tokens_before {
                        last_err = format!(
                            "summary ({after} tokens) is not smaller than what it replaces ({tokens_before} tokens)"
                        );
                    } else {
                        return Ok((
                            text,
                            CompactionStats {
                                model: self.summariser.model(),
                                prompt_sha256: String::new(),
                                tokens_before: tokens_before as i64,
                                tokens_after: after as i64,
                                input_tokens: input,
                                output_tokens: output,
                                summary_calls: calls,
                                pins_live: cfg.guard_pins.then_some(pins.len() as i64),
                                pins_added: cfg.guard_pins.then_some(pins_added as i64),
                                pins_window: cfg
                                    .guard_pins
                                    .then(|| i64::try_from(cfg.pins_window).unwrap_or(i64::MAX)),
                            },
                        ));
                    }
                }
                Err(Error::Injected(p)) => return Err(Error::Injected(p)),
                Err(e) => last_err = e.to_string(),
            }
            let last = attempt == cfg.retry.max_attempts;
            self.events.emit(
                subject,
                EventKind::CompactionFailed {
                    boundary: row.up_to_turn_index,
                    compaction_id: row.id,
                    error: self.events.shown(&last_err),
                    last: false,
                },
            );
            if !last {
                let id = row.id;
                let m = last_err.clone();
                self.store
                    .call(move |c| store::note_compaction_error(c, id, &m))
                    .await?;
            }
        }
        Err(Error::Summary(last_err))
    }

    /// G8: the summary as stored is the summariser's `text` plus a block of
    /// every live pin it lacks (after asking the summariser once more, when
    /// configured). Returns the text, the pins appended and the calls made.
    async fn guard(
        &self,
        row: &CompactionRow,
        rules: &Rules,
        text: String,
        pins: &[Pin],
        calls: i64,
        subject: &Subject,
    ) -> Result<(String, usize, i64)> {
        let cfg = &self.config;
        let mut text = text;
        let mut calls = calls;
        let mut missing = crate::pins::missing(pins, &text);
        if cfg.reask_missing_pins && !missing.is_empty() {
            let list: Vec<String> = missing.iter().map(|p| p.line(false)).collect();
            let req = SummaryRequest {
                rules: format!(
                    "{}\n\nThe summary below leaves out facts that must survive. Rewrite it \
                     so that it contains each of these values verbatim, changing nothing else:\n{}",
                    rules.update,
                    list.join("\n")
                ),
                previous: Some(text.clone()),
                transcript: String::new(),
                max_chars: rules.summary_chars,
                focus: None,
            };
            let again = tokio::time::timeout(
                cfg.attempt_timeout,
                CatchUnwind(self.summariser.summarise(&req)),
            );
            if let Ok(Ok(Ok(resp))) = again.await {
                calls += 1;
                let better = clean_summary(&resp.text, rules.summary_chars);
                let still = crate::pins::missing(pins, &better);
                if !better.is_empty() && still.len() < missing.len() {
                    text = better;
                    missing = still;
                }
            }
        }
        let (block, over) = crate::pins::render_block(&missing, cfg.pins_budget_chars);
        if over {
            let chars = block.chars().count();
            warn!(
                compaction_id = %row.id,
                pins = missing.len(),
                chars,
                budget = cfg.pins_budget_chars,
                "pinned facts exceed their budget; all kept"
            );
            self.events.emit(
                subject,
                EventKind::PinsOverBudget {
                    compaction_id: row.id,
                    pins: missing.len(),
                    chars,
                    budget: cfg.pins_budget_chars,
                },
            );
        }
        let added = missing.len();
        if !block.is_empty() {
            text.push_str("\n\n");
            text.push_str(&block);
        }
        Ok((text, added, calls))
    }

    /// One pass over the chunks, each folded into the running summary.
    async fn one_attempt(
        &self,
        rules: &Rules,
        previous: Option<String>,
        chunks: &[String],
    ) -> Result<(String, Option<i64>, Option<i64>, i64)> {
        let mut running = previous;
        let (mut input, mut output) = (None::<i64>, None::<i64>);
        let mut calls = 0i64;
        let chunks: Vec<&str> = if chunks.is_empty() {
            vec![""]
        } else {
            chunks.iter().map(String::as_str).collect()
        };
        for chunk in chunks {
            let previous = running.take();
            let req = SummaryRequest {
                rules: rules.for_request(previous.is_some()).to_string(),
                focus: rules.focus.clone(),
                previous,
                transcript: chunk.to_string(),
                max_chars: rules.summary_chars,
            };
            // A summariser that panics (a provider client's bug, a host's) fails
            // this attempt; the row is retried and failed under the policy.
            let fut = CatchUnwind(self.summariser.summarise(&req));
            let resp = match tokio::time::timeout(self.config.attempt_timeout, fut).await {
                Ok(Ok(Ok(r))) => r,
                Ok(Ok(Err(e))) => return Err(Error::Summary(e.to_string())),
                Ok(Err(p)) => {
                    return Err(Error::Summary(format!(
                        "summariser panicked: {}",
                        panic_message(&p)
                    )))
                }
                Err(_) => {
                    return Err(Error::Summary(format!(
                        "summariser timed out after {:?}",
                        self.config.attempt_timeout
                    )))
                }
            };
            calls += 1;
            let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            if let Some(n) = resp.usage.input_tokens {
                input = Some(input.unwrap_or(0).saturating_add(clamp(n)));
            }
            if let Some(n) = resp.usage.output_tokens {
                output = Some(output.unwrap_or(0).saturating_add(clamp(n)));
            }
            running = Some(truncate_chars(resp.text.trim(), rules.summary_chars));
        }
        Ok((running.unwrap_or_default(), input, output, calls))
    }
}

/// What a compaction summarises: the previous completed row it folds in, the
/// turns after it up to the boundary, and the live pins it must carry.
/// The rules of one compaction: the first and the update variant (a request
/// with a running summary to fold in gets the update one), and its focus.
struct Rules {
    first: String,
    update: String,
    focus: Option<String>,
    /// The summary's cap, chars ([`CompactionConfig::summary_chars`]).
    summary_chars: usize,
}

impl Rules {
    fn for_request(&self, has_previous: bool) -> &str {
        if has_previous {
            &self.update
        } else {
            &self.first
        }
    }
}

struct Span {
    /// The session's newest redaction when the span was read: a summary
    /// made from text a newer one changed is not completed (made again).
    redaction: i64,
    prev: Option<CompactionRow>,
    turns: Vec<crate::store::HistoryTurn>,
    pins: Vec<Pin>,
}

/// Tokens of messages as a step sends them (their JSON bytes).
fn message_tokens(counter: &dyn TokenCounter, messages: &[crate::message::Message]) -> u64 {
    counter.count(&String::from_utf8_lossy(&crate::message::to_bytes(
        messages,
    )))
}

/// A summary as stored: NUL characters removed (SQLite's `length()` stops at
/// the first one), trimmed, cut to `max_chars`; empty when nothing visible is
/// left (only whitespace, control characters, byte-order marks or zero-width
/// characters), which is a failed attempt (G7).
pub(crate) fn clean_summary(text: &str, max_chars: usize) -> String {
    let text: String = text.chars().filter(|&c| c != '\0').collect();
    let text = truncate_chars(text.trim(), max_chars);
    let invisible = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(
                c,
                '\u{00AD}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}'
            )
    };
    if text.chars().all(invisible) {
        String::new()
    } else {
        text
    }
}

fn outcome_name(o: &ClaimOutcome) -> &'static str {
    match o {
        ClaimOutcome::Claimed(_) => "claimed",
        ClaimOutcome::AlreadyCompleted(_) => "already_completed",
        ClaimOutcome::TakenOver(_) => "taken_over",
        ClaimOutcome::HeldByLiveOther(_) => "held_by_live_other",
        ClaimOutcome::Failed(_) => "failed",
    }
}

/// The store's answers to [`decide()`]'s questions, for one step.
struct StoreFacts<'a> {
    compactor: &'a Compactor,
    c: &'a crate::store::Connection,
    session: &'a SessionRow,
    turn_idx: i64,
    step_idx: i64,
}

impl Facts for StoreFacts<'_> {
    fn latest_completed(&mut self) -> Result<Option<CompactionRow>> {
        store::latest_completed(self.c, self.session.id, self.turn_idx)
    }

    fn compaction(&mut self, id: CompactionId) -> Result<CompactionRow> {
        store::get_compaction(self.c, id)
    }

    fn recent_window_boundary(&mut self, after: i64, boundary: i64) -> Result<i64> {
        store::recent_window_boundary(
            self.c,
            self.session.id,
            self.turn_idx,
            after,
            boundary,
            self.compactor.config.keep_recent_tokens,
        )
    }

    fn threshold_tokens(&mut self) -> Option<u64> {
        self.compactor.threshold_tokens(self.session, self.turn_idx)
    }

    fn latest_measure(&mut self) -> Result<Option<(i64, Option<CompactionId>)>> {
        store::latest_context_tokens(self.c, self.session.id, self.turn_idx, self.step_idx)
    }

    fn compaction_at(&mut self, boundary: i64) -> Result<Option<CompactionRow>> {
        store::compaction_at(self.c, self.session.id, boundary)
    }

    fn newest_pending(&mut self) -> Result<Option<CompactionRow>> {
        store::newest_pending(self.c, self.session.id)
    }

    fn held_by_live_other(&mut self, row: &CompactionRow) -> bool {
        let dead = self.compactor.gone_check();
        store::held_by_live_other(row, &self.compactor.owner, self.c.now_ms(), &dead)
    }
}
