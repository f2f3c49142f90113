//! The runner's settings and its builder.

use super::*;

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
    /// Stream the model's answers: call [`ModelClient::complete_streaming`]
    /// and send each piece to subscribers as an
    /// [`crate::events::EventKind::ModelDelta`]. What is stored is the same
    /// either way. Default false.
    pub stream: bool,
    /// Which tool calls wait for a human's decision before they run.
    /// Default none.
    pub approval: crate::tools::Approval,
    /// How long a parked call waits for its decision (or its delivered
    /// result), by the store's [`Clock`](crate::Clock). Past it, the turn
    /// is among [`Runner::recoverable_turns`], and resuming it rejects the
    /// call ("rejected: no decision within …", decided by `deadline`) unless
    /// a decision came first. Default None: a call waits for ever.
    pub decision_deadline: Option<Duration>,
    /// Slots of the runner's fair queue: how many steps of its sessions
    /// may work the store and the CPU at once (claiming, planning, building
    /// the messages, committing); the others wait in line, first come first
    /// served, so that every session with work makes progress and a ready
    /// step waits for at most the parts queued before it. A step holds no
    /// slot while it calls the model, makes or waits for a summary, or runs
    /// a tool outside its transaction. A turn's begin first lets the tasks
    /// ready before it run (it yields to the runtime once, and again while
    /// the runtime's global queue holds tasks), so a session whose model
    /// answers at once does not run turn after turn while the others have
    /// not reached the line. Default two per CPU the process may use, at
    /// least 4; 0 turns the queue off (tokio's scheduling alone, with the
    /// yields at a turn's begin). On SQLite, which writes one transaction
    /// at a time, fewer slots spend less CPU a step where the store is the
    /// limit: on two cores under the default `Synchronous::Normal`, one slot
    /// ran 1.1-1.15x the steps a second of the default with a model that
    /// answers at once, and 1.24-1.37x (a turn's p50 0.72-0.80x) with 200 ms
    /// model calls and 3,000 sessions (docs/benchmarks.md, "One slot, or no
    /// group" and "With a model's latency"); under `Normal` the slots'
    /// holders take the store one at a time anyway, unless one is slow (see
    /// `step_alone_for`). More slots let commits share a transaction (under
    /// `Synchronous::Full` the default ran 1.25-1.32x one slot's steps a
    /// second), let a part waiting on PostgreSQL's round trips leave the CPU
    /// to others, and let a slow part (a long history's rebuild, a slow
    /// transactional tool) hold up fewer sessions. See
    /// [`Runner::queue_stats`].
    pub step_slots: usize,
    /// On an SQLite store under [`Synchronous::Normal`](crate::Synchronous)
    /// (the default), the slots' holders work the store one at a time: a
    /// part that has its slot waits for the part running to end, or to
    /// have run for this long (a long history's rebuild, a wait for another
    /// process's write lock, a slow transactional tool), and then runs
    /// beside it. Parts that overlap on one SQLite file mostly contend (one
    /// writer; every other connection's commit drops a connection's page
    /// cache; the group commit's hand-offs cost more than the commits they
    /// share, which under `Normal` are appends to the WAL): with 1,000
    /// sessions of a model that answers at once, on two cores, 1.14x the
    /// steps a second and 0.86x the CPU a step of the slots' holders all at
    /// once (four rounds; about 0.9x one slot's steps a second), at a
    /// part's wait behind a slow one bounded by this time
    /// (docs/benchmarks.md, "One part at a time"). Default 5 ms. None, and on PostgreSQL or under
    /// `Synchronous::Full` whatever it is: the slots' holders run at once
    /// (a round trip leaves the CPU to the others; a commit's `fsync` is
    /// shared by the group commit's batch). See
    /// [`QueueStats::beside_slow`](crate::runner::QueueStats::beside_slow).
    pub step_alone_for: Option<Duration>,
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
    /// Sets which tool calls wait for a decision.
    pub fn with_approval(mut self, approval: crate::tools::Approval) -> Self {
        self.approval = approval;
        self
    }

    /// Sets the lease owner name.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Streams the model's answers (see [`RunnerConfig::stream`]). Default: off.
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = stream;
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
            stream: false,
            approval: crate::tools::Approval::none(),
            decision_deadline: None,
            step_slots: super::queue::default_slots(),
            step_alone_for: Some(Duration::from_millis(5)),
            compaction: CompactionConfig::default(),
            pin_extractor: Some(Arc::new(RuleExtractor)),
            testing: TestKnobs::default(),
        }
    }
}

/// Builds a [`Runner`]. Each call sets its own part and no call undoes
/// another, in any order: [`compaction`](Self::compaction) and
/// [`fault_hook`](Self::fault_hook) win over the same parts of a
/// [`config`](Self::config) given before or after them.
pub struct RunnerBuilder {
    pub(super) store: Store,
    pub(super) model: Arc<dyn ModelClient>,
    pub(super) tools: Tools,
    pub(super) summariser: Option<Arc<dyn Summariser>>,
    pub(super) cfg: RunnerConfig,
    pub(super) compaction: Option<CompactionConfig>,
    pub(super) fault_hook: Option<FaultHook>,
    pub(super) stream: Option<bool>,
    pub(super) approval: Option<crate::tools::Approval>,
    pub(super) models: Vec<String>,
    #[cfg(feature = "otel")]
    pub(super) telemetry: Option<crate::telemetry::Telemetry>,
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
    /// Streams the model's answers: each piece goes to subscribers as an
    /// [`crate::events::EventKind::ModelDelta`] as it arrives (see
    /// [`RunnerConfig::stream`]; over that of any [`config`](Self::config)).
    /// Default: off.
    pub fn stream(mut self, on: bool) -> Self {
        self.stream = Some(on);
        self
    }
    /// Which tool calls wait for a human's decision (over that of any
    /// [`config`](Self::config)). Default: none.
    pub fn approval(mut self, approval: crate::tools::Approval) -> Self {
        self.approval = Some(approval);
        self
    }
    /// OpenTelemetry spans and metrics for this runner's turns, model
    /// calls, tool calls and compactions (see [`crate::telemetry`]).
    #[cfg(feature = "otel")]
    pub fn telemetry(mut self, telemetry: crate::telemetry::Telemetry) -> Self {
        self.telemetry = Some(telemetry);
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
        if let Some(on) = self.stream {
            cfg.stream = on;
        }
        if let Some(a) = self.approval {
            cfg.approval = a;
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
        #[cfg(feature = "otel")]
        let telemetry = self
            .telemetry
            .map(|t| t.bound(self.model.provider_name(), cfg.log_content));
        #[cfg(feature = "otel")]
        let events = match &telemetry {
            Some(t) => events.with_observer(Arc::new(t.clone())),
            None => events,
        };
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
        let store_synchronous = self.store.synchronous();
        let renewals = crate::lease::Renewals::new(&self.store, cfg.lease_ttl);
        Ok(Runner {
            inner: Arc::new(Inner {
                renewals,
                store: self.store,
                model: self.model,
                tools: self.tools,
                contexts: ContextCache::new(cfg.context_cache_bytes),
                queue: StepQueue::new(
                    cfg.step_slots,
                    super::queue::alone_for(cfg.step_alone_for, store_synchronous),
                ),
                cfg,
                compactor,
                events,
                #[cfg(feature = "otel")]
                telemetry,
            }),
        })
    }
}
