//! Exactly-once compaction: decide, claim, summarise, complete.
//!
//! [`Compactor::ensure`] runs inside every step, before the messages are built.
//! It returns the completed compaction the step reads (G4), creating it first
//! when the context has outgrown the threshold. See `docs/design.md` for the
//! protocol and its outcome table.

mod attempt;
mod background;
mod claim;
mod config;
mod decide;
mod offline;
mod plan;
pub mod planner;
mod preview;
mod summarise;
#[cfg(feature = "tiktoken")]
mod tiktoken;
mod user_words;

pub use config::{
    builtin_context_window, Background, BackgroundWorker, CharsPerFour, CompactionConfig,
    FailurePolicy, PromptStyle, Threshold, TokenCounter, CONTEXT_WINDOWS, DEFAULT_SOFT_SHARE,
    MAX_HEADROOM_TURNS,
};
pub use offline::{extract, ExtractiveSummariser};
pub use preview::{preview, CompactionPreview};
pub use summarise::{
    cap_block, chunk_entries, rules_for, transcript_entries, truncate_chars, ModelSummariser,
    Summariser, SummaryRequest, SummaryResponse, DEFAULT_SUMMARY_WORKERS, PROSE_RULES,
    PROSE_UPDATE_RULES, STRUCTURED_RULES, STRUCTURED_UPDATE_RULES,
};
#[cfg(feature = "tiktoken")]
pub use tiktoken::TiktokenCounter;
pub use user_words::USER_WORDS_HEADING;

use attempt::*;
use claim::*;
use decide::Facts;
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
    /// The pool of background workers: a claimed row's task summarises
    /// holding one (see [`Background::workers`]).
    workers: Arc<tokio::sync::Semaphore>,
    /// Its size.
    pool_size: usize,
    /// Each session's recent-window boundary, found once a turn.
    windows: Arc<plan::RecentWindows>,
    /// Each session's newest completed compaction, its text read once.
    completed: Arc<plan::CompletedRows>,
    /// Each session's last turns as its pace reads them, each read once.
    paces: Arc<plan::Paces>,
    /// Each session's last turns' sizes as its verbatim tail walks them,
    /// each read once.
    sizes: Arc<plan::TurnSizes>,
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
        let workers = config
            .background
            .and_then(|b| b.workers)
            .unwrap_or_else(|| summariser.parallelism())
            .max(1);
        Ok(Compactor {
            workers: Arc::new(tokio::sync::Semaphore::new(workers)),
            pool_size: workers,
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
            windows: Arc::default(),
            completed: Arc::default(),
            paces: Arc::default(),
            sizes: Arc::default(),
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

    /// The size of this compactor's pool of background workers (see
    /// [`Background::workers`]).
    pub fn background_workers(&self) -> usize {
        self.pool_size
    }

    /// Renews the lease `claim` holds on `row` until the guard is dropped
    /// (nothing when the heartbeat is off for a test).
    fn keep_lease(&self, row: &CompactionRow, claim: &ClaimGuard) -> Option<crate::lease::Kept> {
        self.heartbeat.then(|| {
            let owner = claim.holder().to_string();
            let (id, ms) = (row.id, self.config.lease_ttl.as_millis() as i64);
            self.renewals
                .keep(move |c| store::renew_compaction_lease(c, id, &owner, ms))
        })
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

    /// The thresholds in force for `model` (recorded on a new row).
    fn thresholds(&self, model: &str) -> store::Thresholds {
        let hard = self
            .config
            .compact_at
            .tokens(self.config.context_window(model));
        let soft = hard.and_then(|h| self.config.background.map(|b| b.soft_tokens(h)));
        let tokens = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
        store::Thresholds {
            hard: hard.map(tokens),
            soft: soft.map(tokens),
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
    #[instrument(skip(self, session), fields(session = %session.external_id, session_id = %session.id))]
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
}
