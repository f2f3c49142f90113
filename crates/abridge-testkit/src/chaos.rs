//! The chaos harness behind `abridge chaos`: kill at every point, race, inject
//! faults, lose nothing.
//!
//! A supervisor spawns worker processes (this binary, hidden verb
//! `chaos-worker`) that run a seeded, deterministic workload against one
//! database file. It SIGKILLs workers at random times and restarts them, freezes
//! some (SIGSTOP) past their leases so that others take their turns and
//! compactions over, and runs a third process that holds the write lock for a
//! while. Workers also kill themselves at named fault points (the
//! `ABRIDGE_CHAOS_KILL` variable), and their model and summariser inject errors,
//! timeouts and empty replies. At the end the database must pass `verify`, every
//! transactional effect must be applied exactly once, and every session's
//! transcript and step hashes must equal those of a control run with the same
//! seed and no kills or races.
//!
//! Faults are a function of the request and of how many times this process
//! has sent it: a process that runs a step again (after its lease was taken,
//! or a frozen call timed out) meets other faults than the control run did.
//! So transient faults never use up a call's attempts ([`FAULT_FREE_EVERY`]
//! and [`ATTEMPTS`]): a turn fails by policy only by a rule of the request
//! alone (a request answered empty on every attempt), the same in both runs.

use crate::demo::{
    demo_tools, stable_hash, user_turn, OutsideService, Rng, ScriptedModel, SlowSummariser,
    DEMO_MODEL, SYSTEM_PROMPT,
};
use abridge::compaction::{CompactionConfig, Threshold};
use abridge::compaction::{Summariser, SummaryRequest, SummaryResponse};
use abridge::error::{Error, Result};
use abridge::fault::{FaultHook, FaultPoint};
use abridge::message::{sha256_hex, to_bytes, ModelRequest, ModelResponse};
use abridge::model::{ModelClient, ModelError};
use abridge::runner::{Runner, RunnerConfig};
use abridge::store::Store;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The system prompt of the sub-agent the workload delegates to: every
/// turn whose seed says so asks it (`ask_specialist`, a delegating tool),
/// so workers are killed inside child turns and around the parent's
/// completion of the call.
pub const SPECIALIST_PROMPT: &str =
    "You are the shop's specialist: answer one question in a sentence.";

/// The environment variable a worker reads for self-kills: `p=0.02` (probability
/// per fault point reached) or `at=N` (the N-th fault point reached).
pub const KILL_ENV: &str = "ABRIDGE_CHAOS_KILL";

/// The workload every worker and the control run execute.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// Seed of everything.
    pub seed: u64,
    /// Sessions per epoch.
    pub sessions: u64,
    /// Turns per session.
    pub turns: u64,
    /// Epochs (each adds `sessions` sessions; the supervisor adds one when the
    /// workload finished before enough kills landed).
    pub epochs: u64,
    /// Compaction threshold, tokens.
    pub compact_at: u64,
    /// Background compaction (at 80 % of the threshold, summarised by a task
    /// while the steps go on). Which turns a summary covers then depends on
    /// timing: the comparison with the control run leaves compaction records
    /// and step hashes out (every step still rebuilds to its own hash, G3).
    pub background: bool,
    /// Model faults per thousand attempts that may fail (errors and late
    /// replies, eight to three). Default [`MODEL_FAULTS_PER_MILLE`].
    pub model_faults_per_mille: u64,
}

/// The model's transient faults per thousand attempts, by default: 40
/// errors and 15 late replies.
pub const MODEL_FAULTS_PER_MILLE: u64 = 55;

impl Workload {
    /// (external id, seed for its turns, index) of every session.
    pub fn session_ids(&self) -> Vec<(String, u64, u64)> {
        let mut v = Vec::new();
        for e in 0..self.epochs {
            for i in 0..self.sessions {
                v.push((
                    format!("chaos-{}-{e}-{i}", self.seed),
                    self.seed ^ (e << 32),
                    i,
                ));
            }
        }
        v
    }
}

/// A model wrapper that injects errors, timeouts and empty replies, as a
/// function of (request, attempt in this process) that never uses up a
/// call's attempts by transient faults alone (see the module docs).
pub struct FaultyModel {
    inner: ScriptedModel,
    seed: u64,
    faults_per_mille: u64,
    attempts: Mutex<HashMap<String, u32>>,
    report: bool,
}

/// The key of a request's faults: its turn's own messages (the turn's input
/// and what its steps added), not what comes before it, so that a step meets
/// the same faults whichever summary it reads (with background compaction
/// that depends on timing).
fn turn_key(request: &ModelRequest) -> String {
    use abridge::message::{ContentBlock, Role};
    let from = request
        .messages
        .iter()
        .rposition(|m| {
            m.role == Role::User
                && matches!(m.content.first(), Some(ContentBlock::Text { text }) if !text.starts_with("[Summary of"))
        })
        .unwrap_or(0);
    sha256_hex(&to_bytes(&request.messages[from..]))
}

/// Every this-many-th time a process sends a request, no transient fault is
/// injected: any [`FAULT_FREE_EVERY`] attempts in a row hold one that
/// answers, whichever attempt of its process a call starts at.
pub const FAULT_FREE_EVERY: u32 = 3;

/// Attempts of a model call or a summary in the chaos workload: twice
/// [`FAULT_FREE_EVERY`], so that a call fails only if two of its fault-free
/// attempts time out for real (a worker frozen or starved past the 200 ms
/// timeout in each).
pub const ATTEMPTS: u32 = 2 * FAULT_FREE_EVERY;

/// The roll (0..1000) of a transient fault at a process's `attempt`-th
/// sending of a request; `None` on the fault-free attempts.
fn fault_roll(seed: u64, key: &str, attempt: u32) -> Option<u64> {
    (!attempt.is_multiple_of(FAULT_FREE_EVERY))
        .then(|| stable_hash(seed, &[key, &attempt.to_string()]) % 1000)
}

fn say(line: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
    let _ = e.flush();
}

#[abridge::async_trait]
impl ModelClient for FaultyModel {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let key = turn_key(request);
        let attempt = {
            let mut a = self.attempts.lock().expect("attempts lock");
            let n = a.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        // Latency first: random in 0..6 ms (kills land mid-call).
        let lat = stable_hash(self.seed, &[&key, "lat"]) % 6;
        tokio::time::sleep(Duration::from_millis(lat)).await;
        let roll = fault_roll(self.seed, &key, attempt);
        let errors = self.faults_per_mille * 8 / 11;
        let fault = match roll {
            Some(r) if r < errors => Some("model_error"),
            Some(r) if r < self.faults_per_mille => Some("model_timeout"),
            _ => None,
        };
        // One request in 400 gets an empty reply on every attempt: the turn fails by policy.
        let empty = stable_hash(self.seed, &[&key, "empty"]).is_multiple_of(400);
        if self.report {
            if let Some(f) = fault {
                say(&format!("FAULT {f}"));
            } else if empty {
                say("FAULT model_empty");
            }
        }
        match fault {
            Some("model_error") => Err(ModelError::Transient("injected model error".into())),
            Some(_) => {
                tokio::time::sleep(Duration::from_millis(400)).await;
                Err(ModelError::Transient("injected slow reply".into()))
            }
            None if empty => Ok(ModelResponse {
                blocks: Vec::new(),
                usage: Default::default(),
                ..Default::default()
            }),
            None => match request.messages.first().and_then(|m| m.content.first()) {
                // The specialist (a delegated child) answers its task.
                Some(abridge::message::ContentBlock::Text { text })
                    if text == SPECIALIST_PROMPT =>
                {
                    let task = request
                        .messages
                        .get(1)
                        .and_then(|m| m.content.first())
                        .map(|b| match b {
                            abridge::message::ContentBlock::Text { text } => text.clone(),
                            _ => String::new(),
                        })
                        .unwrap_or_default();
                    Ok(ModelResponse {
                        blocks: vec![abridge::message::ResponseBlock::Text {
                            text: format!(
                                "The specialist checked {} and confirms it.",
                                &sha256_hex(task.as_bytes())[..12]
                            ),
                        }],
                        usage: abridge::message::Usage::new(Some(50), Some(12)),
                        ..Default::default()
                    })
                }
                _ => self.inner.complete(request).await,
            },
        }
    }
}

/// A summariser wrapper with the same kind of faults.
pub struct FaultySummariser {
    seed: u64,
    attempts: Mutex<HashMap<String, u32>>,
    report: bool,
}

#[abridge::async_trait]
impl Summariser for FaultySummariser {
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        let key = sha256_hex(format!("{:?}{}", request.previous, request.transcript).as_bytes());
        let attempt = {
            let mut a = self.attempts.lock().expect("attempts lock");
            let n = a.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let lat = 5 + stable_hash(self.seed, &[&key, "lat"]) % 40;
        tokio::time::sleep(Duration::from_millis(lat)).await;
        let roll = fault_roll(self.seed ^ 0x5eed, &key, attempt);
        // One summary request in 100 is answered empty on every attempt:
        // its compaction fails (a rule of the request alone, as the model's
        // empty replies).
        let always_empty = stable_hash(self.seed ^ 0x5eed, &[&key, "empty"]).is_multiple_of(100);
        let fault = match roll {
            _ if always_empty => Some("summary_empty"),
            Some(0..=79) => Some("summary_error"),
            Some(80..=109) => Some("summary_timeout"),
            Some(110..=139) => Some("summary_empty"),
            _ => None,
        };
        if let (true, Some(f)) = (self.report, fault) {
            say(&format!("FAULT {f}"));
        }
        match fault {
            Some("summary_error") => Err(ModelError::Transient("injected summariser error".into())),
            Some("summary_timeout") => {
                tokio::time::sleep(Duration::from_millis(600)).await;
                Err(ModelError::Transient("injected slow summary".into()))
            }
            Some(_) => Ok(SummaryResponse {
                text: String::new(),
                usage: Default::default(),
            }),
            None => SlowSummariser::default().summarise(request).await,
        }
    }
    fn model(&self) -> Option<String> {
        Some("abridge-extractive".into())
    }
}

/// The chaos workload's compaction settings.
fn chaos_compaction(w: &Workload) -> CompactionConfig {
    let mut compaction = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(w.compact_at))
        .with_context_window(DEMO_MODEL, 32_000);
    if !w.background {
        compaction.background = None;
    }
    compaction.retry = abridge::retry::RetryPolicy::default()
        .with_max_attempts(ATTEMPTS)
        .with_backoff(Duration::from_millis(2), Duration::from_millis(20))
        .with_jitter(0.0);
    compaction.attempt_timeout = Duration::from_millis(300);
    // Longer than the turn lease: a frozen summariser's row is still held when its
    // turn is taken over, so the taker must wait for it (a boundary race).
    compaction.lease_ttl = Duration::from_millis(1_500);
    compaction.wait_timeout = Duration::from_secs(30);
    compaction
}

/// Lease, timeout and threshold settings of the chaos workload.
fn chaos_config(owner: String, hook: Option<FaultHook>, w: &Workload) -> RunnerConfig {
    let compaction = chaos_compaction(w);
    let mut cfg = RunnerConfig::default();
    cfg.owner = owner;
    cfg.lease_ttl = Duration::from_millis(500);
    cfg.max_steps = 8;
    cfg.model_retry = abridge::retry::RetryPolicy::default()
        .with_max_attempts(ATTEMPTS)
        .with_backoff(Duration::from_millis(2), Duration::from_millis(20))
        .with_jitter(0.0);
    cfg.model_timeout = Duration::from_millis(200);
    cfg.take_over_dead_local_owners = true;
    cfg.context_cache_bytes = 64 << 20;
    cfg.log_content = false;
    cfg.compaction = compaction;
    cfg.pin_extractor = Some(Arc::new(abridge::pins::RuleExtractor));
    cfg.testing = crate::sabotage::apply(abridge::fault::TestKnobs {
        fault_hook: hook,
        heartbeat: true,
        ..Default::default()
    });
    cfg
}

fn chaos_runner(
    store: &Store,
    w: &Workload,
    owner: String,
    hook: Option<FaultHook>,
    report: bool,
) -> Result<Runner> {
    let mut model = ScriptedModel::new(w.seed);
    model.extra_tools = vec![
        "notify_customer".into(),
        "charge_card".into(),
        "ask_specialist".into(),
    ];
    let specialist = abridge::ToolSpec {
        name: "ask_specialist".into(),
        description: "Ask the shop's specialist one question.".into(),
        input_schema: serde_json::json!({"type": "object"}),
    };
    Runner::builder(
        store.clone(),
        Arc::new(FaultyModel {
            inner: model,
            seed: w.seed,
            faults_per_mille: w.model_faults_per_mille,
            attempts: Mutex::default(),
            report,
        }),
    )
    .tools(
        demo_tools(
            Some(OutsideService {
                db: store.path().to_path_buf(),
                key: None,
            }),
            Duration::from_millis(1),
        )
        .delegate(
            specialist,
            abridge::SubAgent::new(DEMO_MODEL, SPECIALIST_PROMPT),
        ),
    )
    .summariser(FaultySummariser {
        seed: w.seed,
        attempts: Mutex::default(),
        report,
    })
    .config(chaos_config(owner, hook, w))
    // Every charge waits for a decision: workers park turns, decide their
    // calls (racing each other) and resume them while they are killed.
    .approval(abridge::Approval::tools(["charge_card"]))
    .build()
}

/// Runs turn `t`; while it parks, decides its calls as [`decision_for`]
/// says (a decision another worker took first stands: it is the same one)
/// and runs it again.
async fn run_turn_deciding(
    runner: &Runner,
    seed: u64,
    ext: &str,
    session: abridge::SessionId,
    t: i64,
    input: &str,
) -> Result<abridge::TurnOutcome> {
    loop {
        let out = runner.run_turn_at(session, t, input).await?;
        if !out.is_parked() {
            return Ok(out);
        }
        for call in &out.pending {
            let d = decision_for(seed, ext, t, call);
            match runner.decide(call.id, d, Some("chaos")).await {
                Ok(_) | Err(Error::AlreadyDecided { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The decision any decider takes for a parked call: a function of the call
/// alone, so workers racing to decide it, and the control run, agree on it
/// whoever wins.
fn decision_for(
    seed: u64,
    session: &str,
    turn: i64,
    call: &abridge::store::ApprovalRow,
) -> abridge::Decision {
    let h = stable_hash(
        seed,
        &[session, &turn.to_string(), &call.tool_call_id, "decide"],
    );
    match h % 4 {
        0 => abridge::Decision::reject("declined by the supervisor"),
        _ => abridge::Decision::approve(),
    }
}

/// Opens (creating) a workload database with the demo tables.
pub fn open_workload_db(path: &Path) -> Result<Store> {
    let store = Store::open(path)?;
    store.with_conn(|c| {
        crate::demo_tables::create_demo_tables(c)?;
        // Under the store's write lock: on PostgreSQL two workers creating
        // the same table at once can collide in the catalog (23505 on
        // pg_type), IF NOT EXISTS or not.
        let tx = abridge::testing::write_tx(c)?;
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {CHAOS_MARK} (id INTEGER PRIMARY KEY)"
        ))?;
        tx.commit()
    })?;
    Ok(store)
}

/// The table that marks a store the chaos harness made (and may replace).
const CHAOS_MARK: &str = "abridge_chaos_store";

/// A run starts from an empty store, so it replaces the file at `--db`: only
/// when there is none, or when it is a store an earlier chaos run made.
fn check_replaceable(path: &Path) -> Result<()> {
    if is_server(path) {
        // A schema on a server: empty, or one an earlier chaos run made.
        return match abridge::store::open_read_only(path) {
            Err(Error::NotFound { .. }) => Ok(()),
            Ok(c) if c.has_table(CHAOS_MARK)? => Ok(()),
            Ok(_) => Err(Error::Config(format!(
                "refusing to replace {}: chaos only replaces a store an earlier chaos run made \
                 (choose a new ?schema=)",
                path.display()
            ))),
            Err(e) => Err(e),
        };
    }
    if !path.exists() {
        return Ok(());
    }
    let ours = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| {
        c.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [CHAOS_MARK],
            |r| r.get::<_, i64>(0),
        )
    })
    .is_ok_and(|n| n == 1);
    if ours {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "refusing to replace {}: chaos only replaces a store an earlier chaos run made \
             (choose a new path)",
            path.display()
        )))
    }
}

/// What one pass over the workload left to do.
#[derive(Debug, Default)]
struct Pass {
    pending: bool,
    failed_by_policy: u64,
}

/// Sessions a worker runs at once: each lane walks its share of them one
/// after the other, on a task of its own, so that the turns of different
/// sessions write at the same moment (their transactions share the store's
/// group commits) while kills land.
const LANES: usize = 2;

async fn one_pass(runner: &Runner, w: &Workload, order_seed: u64, report: bool) -> Result<Pass> {
    let mut ids = w.session_ids();
    // Workers walk the sessions in different orders, so they meet on the same turns.
    let mut rng = Rng::new(order_seed);
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..LANES {
        let mine: Vec<_> = ids.iter().skip(lane).step_by(LANES).cloned().collect();
        let (runner, w) = (runner.clone(), w.clone());
        lanes.spawn(async move { lane_pass(&runner, &w, mine, report).await });
    }
    let mut pass = Pass::default();
    while let Some(lane) = lanes.join_next().await {
        let lane = lane.map_err(|e| Error::Task(e.to_string()))??;
        pass.pending |= lane.pending;
        pass.failed_by_policy += lane.failed_by_policy;
    }
    Ok(pass)
}

/// One lane of a pass: its sessions, one after the other.
async fn lane_pass(
    runner: &Runner,
    w: &Workload,
    ids: Vec<(String, u64, u64)>,
    report: bool,
) -> Result<Pass> {
    let mut pass = Pass::default();
    'sessions: for (ext, seed, i) in ids {
        let e = ext.clone();
        // A store error about the moment (a connection the server ended) is
        // met as a host meets it: the session waits for the next pass.
        let done = match runner
            .store()
            .call(move |c| abridge::store::finished_turns(c, &e))
            .await
        {
            Ok(done) => done,
            Err(e) if e.is_resumable() => {
                pass.pending = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        if done as u64 >= w.turns {
            continue;
        }
        let session = match runner.create_session(&ext, DEMO_MODEL, SYSTEM_PROMPT).await {
            Ok(s) => s,
            Err(e) if e.is_resumable() => {
                pass.pending = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        for t in 0..w.turns {
            let input = user_turn(seed, i, t);
            let outcome =
                run_turn_deciding(runner, w.seed, &ext, session.id, t as i64, &input).await;
            match outcome {
                Ok(_) => {}
                Err(Error::TurnFinished { .. }) => pass.failed_by_policy += 1,
                Err(
                    e @ (Error::LeaseHeld { .. }
                    | Error::LeaseLost { .. }
                    | Error::CompactionWaitTimeout { .. }),
                ) => {
                    if report && matches!(e, Error::LeaseLost { .. }) {
                        say("RACE fenced");
                    }
                    pass.pending = true;
                    continue 'sessions;
                }
                Err(e) if e.is_resumable() => {
                    pass.pending = true;
                    continue 'sessions;
                }
                Err(_) => pass.failed_by_policy += 1, // failed by policy just now
            }
        }
    }
    Ok(pass)
}

/// Runs the workload until every turn of every session has finished.
/// Returns the turns failed by policy seen in the last pass.
pub async fn run_workload(
    store: &Store,
    w: &Workload,
    owner: String,
    hook: Option<FaultHook>,
    report: bool,
) -> Result<u64> {
    let runner = chaos_runner(store, w, owner, hook, report)?;
    if report {
        // Announce each summary as it starts, so the supervisor can freeze this
        // process mid-summary and make another worker meet the pending row.
        let mut events = runner.subscribe();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(e) => {
                        if let abridge::events::EventKind::CompactionClaimed { .. } = e.kind {
                            say("PHASE compacting");
                        }
                    }
                    // Behind a busy runtime it may lose the oldest events:
                    // it goes on (stopping here would end the phases the
                    // parent times its kills by).
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        // Every 200 ms in which a group commit held the parts of more than
        // one turn (the batched path, under the kills), said once.
        let store = store.clone();
        tokio::spawn(async move {
            let mut last = store.group_commits();
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let now = store.group_commits();
                if now.1 - last.1 > now.0 - last.0 {
                    say("RACE shared_commit");
                }
                last = now;
            }
        });
    }
    let mut order = stable_hash(w.seed, &[&std::process::id().to_string()]);
    loop {
        let pass = one_pass(&runner, w, order, report).await?;
        if !pass.pending {
            return Ok(pass.failed_by_policy);
        }
        order = order.wrapping_add(1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The self-kill hook a worker installs from [`KILL_ENV`].
pub fn kill_hook_from_env() -> Option<FaultHook> {
    let spec = std::env::var(KILL_ENV).ok()?;
    let hits = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let rng = Arc::new(Mutex::new(Rng::new(
        std::process::id() as u64 ^ abridge::store::now_ms() as u64,
    )));
    let (p, at) = if let Some(p) = spec.strip_prefix("p=") {
        (p.parse::<f64>().ok()?, None)
    } else if let Some(n) = spec.strip_prefix("at=") {
        (0.0, Some(n.parse::<u64>().ok()?))
    } else {
        return None;
    };
    Some(Arc::new(move |point: FaultPoint| {
        let n = hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let die = match at {
            Some(k) => n == k,
            None => (rng.lock().expect("rng").below(1_000_000) as f64) < p * 1_000_000.0,
        };
        if die {
            // Where: a point of a background summariser is named so.
            let bg = if abridge::compaction::in_background() {
                "@background"
            } else if abridge::runner::in_child() {
                "@child"
            } else {
                ""
            };
            say(&format!("KILL {point}{bg}"));
            // SIGKILL: no destructor, no flush, no rollback but SQLite's own.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        Ok(())
    }))
}

/// The hidden `chaos-worker` verb: runs the workload to the end (or to its death).
pub async fn worker_main(db: &Path, w: &Workload, worker: u64) -> Result<()> {
    let owner = abridge::owner::process_owner(&format!("chaos-w{worker}"));
    let hook = kill_hook_from_env();
    loop {
        // An error about the moment (on a server, a connection it ended)
        // anywhere outside a turn: start over, as a host's loop would.
        let run = async {
            let store = open_workload_db(db)?;
            run_workload(&store, w, owner.clone(), hook.clone(), true).await
        };
        match run.await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_resumable() => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The hidden `chaos-locker` verb: holds the write lock for 20-120 ms every
/// 50-300 ms, until killed.
pub fn locker_main(db: &Path, seed: u64) -> Result<()> {
    // On a server, the store's advisory write lock.
    let mut conn = abridge::testing::connect(db, None)?;
    let mut rng = Rng::new(seed ^ 0x10c4);
    loop {
        std::thread::sleep(Duration::from_millis(50 + rng.below(250)));
        let tx = abridge::testing::write_tx(&mut conn)?;
        std::thread::sleep(Duration::from_millis(20 + rng.below(100)));
        tx.commit()?;
        say("LOCK held");
    }
}

/// Options of a chaos run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Database file (must not exist, or is replaced).
    pub db: PathBuf,
    /// Worker processes.
    pub workers: u64,
    /// Kills to land before the run may end.
    pub kills: u64,
    /// Seed.
    pub seed: u64,
    /// Sessions per epoch.
    pub sessions: u64,
    /// Turns per session.
    pub turns: u64,
    /// Self-kill probability per fault point reached.
    pub point_kill_p: f64,
    /// Compaction threshold, tokens (low: most turns compact).
    pub compact_at: u64,
    /// Background compaction (see [`Workload::background`]). Default true.
    pub background: bool,
    /// Model faults per thousand attempts (see
    /// [`Workload::model_faults_per_mille`]).
    pub model_faults_per_mille: u64,
    /// Probability of freezing a worker as it starts a summary.
    pub freeze_mid_summary: f64,
    /// Give up after this long (a hung run is a failure).
    pub max_duration: Duration,
    /// The binary to spawn workers from (default: this one).
    pub exe: Option<PathBuf>,
}

impl Default for ChaosOptions {
    fn default() -> Self {
        ChaosOptions {
            db: PathBuf::from("abridge-chaos.db"),
            workers: 4,
            kills: 200,
            seed: 1,
            sessions: 12,
            turns: 10,
            point_kill_p: 0.01,
            compact_at: 1_200,
            background: true,
            model_faults_per_mille: MODEL_FAULTS_PER_MILLE,
            freeze_mid_summary: 0.15,
            max_duration: Duration::from_secs(1_800),
            exe: None,
        }
    }
}

/// What a chaos run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Kills landed, by point (`random_time` for the supervisor's own).
    pub kills_by_point: BTreeMap<String, u64>,
    /// Kills in all.
    pub kills: u64,
    /// Workers frozen past their lease (SIGSTOP … SIGCONT).
    pub freezes: u64,
    /// On PostgreSQL: workers' connections ended by the server
    /// (`pg_terminate_backend`), whatever they were doing.
    pub connections_terminated: u64,
    /// Races seen: fenced writes, turn takeovers, compaction takeovers.
    pub races: BTreeMap<String, u64>,
    /// Faults injected, by kind (as reported by the workers).
    pub faults: BTreeMap<String, u64>,
    /// Worker restarts after a kill.
    pub recoveries: u64,
    /// Sessions, turns and their outcome.
    pub sessions: u64,
    /// Turns run.
    pub turns: u64,
    /// Turns failed by policy (the same in the control run).
    pub turns_failed_by_policy: u64,
    /// Completed compactions.
    pub compactions: u64,
    /// Of those, the ones summarised in the background (the kills at the
    /// compaction points of those landed in background summarisers).
    pub compactions_background: u64,
    /// Steps that waited for a summary.
    pub steps_waited_for_summary: u64,
    /// Sessions where an at-most-once call was cut by a kill: the model saw
    /// "outcome unknown" instead of the result, by design, so the session's
    /// transcript and transactional effects are compared with the control's
    /// up to the cut only. With `--enumerate`, summed over the kill runs (each
    /// run counts the sessions it cut).
    pub at_most_once_unknown_sessions: u64,
    /// Delegated children (sub-agent sessions, one per `ask_specialist`
    /// call) compared with the control's: each created once, with the
    /// control's turns. With `--enumerate`, summed over the kill runs.
    pub delegated_children: u64,
    /// Tool calls that parked their turn for a decision (every `charge_card`
    /// call), and of those how many the deciders rejected: every one decided
    /// once, by whichever worker came first.
    pub calls_parked: u64,
    /// Parked calls rejected.
    pub calls_rejected: u64,
    /// Guarantee violations and differences from the control run (must be empty).
    pub violations: Vec<String>,
    /// Epochs of the workload run.
    pub epochs: u64,
    /// Wall time, seconds.
    pub wall_seconds: f64,
}

struct Worker {
    child: Child,
    killed_by_us: bool,
    id: u64,
}

fn signal(pid: u32, sig: i32) {
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The command line of one worker process on the workload.
fn worker_command(exe: &Path, db: &Path, w: &Workload, id: u64) -> Command {
    let mut c = Command::new(exe);
    c.args(["chaos-worker", "--db"]).arg(worker_db(db));
    for (flag, v) in [
        ("--seed", w.seed),
        ("--sessions", w.sessions),
        ("--turns", w.turns),
        ("--epochs", w.epochs),
        ("--worker", id),
        ("--compact-at", w.compact_at),
        ("--model-faults-per-mille", w.model_faults_per_mille),
    ] {
        c.arg(flag).arg(v.to_string());
    }
    c.arg("--background")
        .arg(if w.background { "on" } else { "off" });
    c.stdin(Stdio::null()).stdout(Stdio::null());
    c
}

fn spawn_worker(
    exe: &Path,
    o: &ChaosOptions,
    w: &Workload,
    id: u64,
    tally: &Arc<Mutex<BTreeMap<String, u64>>>,
) -> Result<Worker> {
    let mut child = worker_command(exe, &o.db, w, id)
        .env(KILL_ENV, format!("p={}", o.point_kill_p))
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().expect("piped");
    let tally = tally.clone();
    let pid = child.id();
    let freeze_mid_summary = o.freeze_mid_summary;
    let mut rng = Rng::new(w.seed ^ ((id + 1) << 20) ^ pid as u64);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if line == "PHASE compacting" {
                if rng.below(1000) < (freeze_mid_summary * 1000.0) as u64 {
                    // Past the turn lease, within the compaction lease: another
                    // worker takes the turn over and must wait for this row.
                    signal(pid, libc::SIGSTOP);
                    std::thread::sleep(Duration::from_millis(600 + rng.below(400)));
                    signal(pid, libc::SIGCONT);
                    *tally
                        .lock()
                        .expect("tally")
                        .entry("race:frozen_mid_summary".into())
                        .or_default() += 1;
                }
                continue;
            }
            let key = match line.split_once(' ') {
                Some(("KILL", p)) => format!("kill:{p}"),
                Some(("FAULT", f)) => format!("fault:{f}"),
                Some(("RACE", r)) => format!("race:{r}"),
                Some(("LOCK", _)) => "fault:write_lock_held".into(),
                _ => {
                    if line.contains("error") {
                        format!("log:{}", abridge::compaction::truncate_chars(&line, 200))
                    } else {
                        continue;
                    }
                }
            };
            *tally.lock().expect("tally").entry(key).or_default() += 1;
        }
    });
    Ok(Worker {
        child,
        killed_by_us: false,
        id,
    })
}

/// Runs the supervisor: workers, kills, freezes, the lock holder; then the
/// control run and the comparison.
pub async fn run_chaos(o: &ChaosOptions) -> Result<ChaosReport> {
    let started = Instant::now();
    check_replaceable(&o.db)?;
    remove_db(&o.db);
    let exe = match &o.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe()?,
    };
    let mut w = Workload {
        seed: o.seed,
        sessions: o.sessions,
        turns: o.turns,
        epochs: 1,
        compact_at: o.compact_at,
        background: o.background,
        model_faults_per_mille: o.model_faults_per_mille,
    };
    open_workload_db(&o.db)?;
    let tally: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let mut report = ChaosReport::default();
    let mut rng = Rng::new(o.seed ^ 0xC4A05);

    let mut locker = spawn_locker(&exe, o, &tally)?;

    let mut workers: Vec<Option<Worker>> = Vec::new();
    for id in 0..o.workers {
        workers.push(Some(spawn_worker(&exe, o, &w, id, &tally)?));
    }
    let mut random_kills = 0u64;
    // On a server, the supervisor's own connection, to cut workers' ones.
    let server = if is_server(&o.db) {
        Some(abridge::testing::connect(&o.db, None)?)
    } else {
        None
    };
    loop {
        if started.elapsed() > o.max_duration {
            report
                .violations
                .push(format!("run did not finish within {:?}", o.max_duration));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5 + rng.below(40))).await;
        let (all_done, killed_by_us) = reap(&mut workers, &exe, o, &w, &tally, &mut report)?;
        random_kills += killed_by_us;
        let point_kills: u64 = tally
            .lock()
            .expect("tally")
            .iter()
            .filter(|(k, _)| k.starts_with("kill:"))
            .map(|(_, v)| v)
            .sum();
        let kills = point_kills + random_kills;
        if all_done {
            if kills >= o.kills || !report.violations.is_empty() {
                break;
            }
            // The workload finished before enough kills landed: one more epoch.
            w.epochs += 1;
            for id in 0..o.workers {
                workers[id as usize] = Some(spawn_worker(&exe, o, &w, id, &tally)?);
            }
            continue;
        }
        if kills >= o.kills {
            continue; // enough kills: let the workload finish undisturbed
        }
        let live: Vec<usize> = workers
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|_| i))
            .collect();
        if live.is_empty() {
            continue;
        }
        if let Some(conn) = &server {
            if rng.below(100) < 10 {
                if terminate_a_backend(conn, &mut rng)? {
                    report.connections_terminated += 1;
                }
                continue;
            }
        }
        let pick = live[rng.below(live.len() as u64) as usize];
        disturb(workers[pick].as_mut().expect("live"), &mut rng, &mut report).await;
    }
    let _ = locker.child.kill();
    let _ = locker.child.wait();
    for wk in workers.iter_mut().flatten() {
        let _ = wk.child.kill();
        let _ = wk.child.wait();
    }

    tally_into(&tally.lock().expect("tally"), random_kills, &mut report);
    report.kills = report.kills_by_point.values().sum();
    report.epochs = w.epochs;
    if report.violations.is_empty() {
        compare_with_control(o, &w, &mut report).await?;
    }
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The lock-holder process; each line it prints is one write lock held.
fn spawn_locker(
    exe: &Path,
    o: &ChaosOptions,
    tally: &Arc<Mutex<BTreeMap<String, u64>>>,
) -> Result<Worker> {
    let child = Command::new(exe)
        .args(["chaos-locker", "--db"])
        .arg(&o.db)
        .args(["--seed", &o.seed.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut locker = Worker {
        child,
        killed_by_us: true,
        id: u64::MAX,
    };
    let stderr = locker.child.stderr.take().expect("piped");
    let tally = tally.clone();
    std::thread::spawn(move || {
        for _ in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            *tally
                .lock()
                .expect("tally")
                .entry("fault:write_lock_held".into())
                .or_default() += 1;
        }
    });
    Ok(locker)
}

/// Reaps the workers: one that exited by itself finished the workload; one
/// that died by SIGKILL (ours, or its own at a fault point) is restarted.
/// Returns whether all are done and how many of the kills were ours.
fn reap(
    workers: &mut [Option<Worker>],
    exe: &Path,
    o: &ChaosOptions,
    w: &Workload,
    tally: &Arc<Mutex<BTreeMap<String, u64>>>,
    report: &mut ChaosReport,
) -> Result<(bool, u64)> {
    use std::os::unix::process::ExitStatusExt;
    let (mut all_done, mut ours) = (true, 0);
    for slot in workers.iter_mut() {
        let Some(wk) = slot else { continue };
        match wk.child.try_wait()? {
            None => all_done = false,
            Some(st) if st.success() => *slot = None,
            Some(st) if st.signal() == Some(libc::SIGKILL) => {
                if wk.killed_by_us {
                    ours += 1;
                }
                let id = wk.id;
                *slot = Some(spawn_worker(exe, o, w, id, tally)?);
                report.recoveries += 1;
                all_done = false;
            }
            Some(st) => {
                // What the workers logged as errors, to say why.
                let logged: Vec<String> = tally
                    .lock()
                    .expect("tally")
                    .keys()
                    .filter_map(|k| k.strip_prefix("log:").map(str::to_string))
                    .collect();
                report.violations.push(format!(
                    "worker {} exited with {st}; errors logged: {logged:?}",
                    wk.id
                ));
                *slot = None;
            }
        }
    }
    Ok((all_done, ours))
}

/// Freezes the worker past the turn lease (but not the compaction lease:
/// others take its turn over and meet its pending compaction), or kills it.
async fn disturb(wk: &mut Worker, rng: &mut Rng, report: &mut ChaosReport) {
    if rng.below(100) < 8 {
        let pid = wk.child.id();
        signal(pid, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_millis(600 + rng.below(400))).await;
        signal(pid, libc::SIGCONT);
        report.freezes += 1;
    } else {
        wk.killed_by_us = true;
        let _ = wk.child.kill();
    }
}

/// What the workers reported (kills at named points, faults, races), into the
/// report.
fn tally_into(t: &BTreeMap<String, u64>, random_kills: u64, report: &mut ChaosReport) {
    for (k, v) in t {
        if let Some(p) = k.strip_prefix("kill:") {
            report.kills_by_point.insert(p.to_string(), *v);
        } else if let Some(f) = k.strip_prefix("fault:") {
            report.faults.insert(f.to_string(), *v);
        } else if let Some(r) = k.strip_prefix("race:") {
            report.races.insert(r.to_string(), *v);
        }
    }
    if random_kills > 0 {
        report
            .kills_by_point
            .insert("random_time".into(), random_kills);
    }
}

/// Per session: (transcript, step hashes).
fn session_fingerprints(
    conn: &abridge::store::Connection,
    w: &Workload,
) -> Result<Vec<(String, String, Vec<String>)>> {
    let mut out = Vec::new();
    for (ext, _, _) in w.session_ids() {
        let transcript =
            abridge::inspect::export(conn, &ext, abridge::inspect::ExportFormat::Jsonl)?;
        let s = abridge::inspect::resolve_session(conn, &ext)?;
        let hashes = abridge::inspect::session_step_ids(conn, s.id)?
            .into_iter()
            .map(|id| {
                Ok(abridge::testing::get_step(conn, id)?
                    .messages_sha256
                    .unwrap_or_default())
            })
            .collect::<Result<Vec<_>>>()?;
        out.push((ext, transcript, hashes));
    }
    Ok(out)
}

/// Runs the control: the same workload, same faults, one runner, no kills.
async fn build_control(o: &ChaosOptions, w: &Workload) -> Result<PathBuf> {
    let control_path = beside(&o.db, "control");
    remove_db(&control_path);
    let control = open_workload_db(&control_path)?;
    // Sessions are independent and faults depend only on the request, so the
    // control can run its sessions concurrently: the same rows come out.
    let ids = w.session_ids();
    let lanes = 8usize.min(ids.len().max(1));
    let mut set = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let (control, w) = (control.clone(), w.clone());
        let mine: Vec<(String, u64, u64)> = ids.iter().skip(lane).step_by(lanes).cloned().collect();
        set.spawn(async move {
            let runner = chaos_runner(&control, &w, format!("control-{lane}"), None, false)?;
            for (ext, seed, i) in mine {
                let session = runner
                    .create_session(&ext, DEMO_MODEL, SYSTEM_PROMPT)
                    .await?;
                for t in 0..w.turns {
                    let input = user_turn(seed, i, t);
                    match run_turn_deciding(&runner, w.seed, &ext, session.id, t as i64, &input)
                        .await
                    {
                        Ok(_) | Err(Error::TurnFinished { .. }) => {}
                        Err(e) if e.is_resumable() => return Err(e),
                        Err(_) => {} // failed by policy, as in the chaos run
                    }
                }
            }
            Ok::<_, Error>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| Error::Task(e.to_string()))??;
    }
    Ok(control_path)
}

/// Whether `db` is a PostgreSQL store's URL.
fn is_server(db: &Path) -> bool {
    abridge::store::Location::from(db).is_server()
}

/// The store beside `db` for `what` (the control run): a file `DB.what`, or
/// on a server the schema `SCHEMA_what`.
fn beside(db: &Path, what: &str) -> PathBuf {
    let abridge::store::Location::Postgres(url) = abridge::store::Location::from(db) else {
        return PathBuf::from(format!("{}.{what}", db.display()));
    };
    let url = url.as_str();
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut schema = "public".to_string();
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("schema=") {
            Some(s) => schema = s.to_string(),
            None => kept.push(pair),
        }
    }
    kept.push("");
    let rest = kept.join("&");
    PathBuf::from(format!("{base}?{rest}schema={schema}_{what}"))
}

/// `db` as the workers open it: on a server, with an application name of
/// this run's own, so the supervisor cuts only its workers' connections.
fn worker_db(db: &Path) -> PathBuf {
    match abridge::store::Location::from(db).url() {
        Some(url) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            PathBuf::from(format!("{url}{sep}application_name={}", worker_app_name()))
        }
        None => db.to_path_buf(),
    }
}

fn worker_app_name() -> String {
    format!("abridge-chaos-{}", std::process::id())
}

/// Ends one backend of this run's workers (`pg_terminate_backend`): its
/// connection dies mid-whatever, a transaction included. True when one was
/// running.
fn terminate_a_backend(conn: &abridge::store::Connection, rng: &mut Rng) -> Result<bool> {
    let pids: Vec<i64> = {
        let mut st = conn.prepare(
            "SELECT pid::bigint FROM pg_stat_activity WHERE application_name = ?1 \
             AND datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid",
        )?;
        let v = st.query_map([worker_app_name()], |r| r.get(0))?;
        v.collect::<rusqlite::Result<_>>()?
    };
    if pids.is_empty() {
        return Ok(false);
    }
    let pid = pids[rng.below(pids.len() as u64) as usize];
    conn.query_row("SELECT pg_terminate_backend(?1::int)", [pid], |r| {
        r.get::<_, bool>(0)
    })
}

fn remove_db(path: &Path) {
    if is_server(path) {
        let _ = abridge::testing::drop_postgres_store(path.to_str().unwrap_or_default());
        return;
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

async fn compare_with_control(
    o: &ChaosOptions,
    w: &Workload,
    report: &mut ChaosReport,
) -> Result<()> {
    let control_path = build_control(o, w).await?;
    compare(o, w, &control_path, report)?;
    if report.violations.is_empty() {
        remove_db(&control_path);
    } else {
        report.violations.push(format!(
            "the control run is kept at {} for comparison",
            control_path.display()
        ));
    }
    Ok(())
}

/// Whether the control transcript `t2` matches `t1` up to the line that starts
/// at `line_start` in `t1` (the first "outcome unknown" record, in turn c).
///
/// The turn of the first JSONL record of `from` (`i64::MAX` if none).
fn record_turn(from: &str) -> i64 {
    from.lines()
        .next()
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .and_then(|r| r["turn"].as_i64())
        .unwrap_or(i64::MAX)
}

/// A compaction record is listed after the turn it ends at, but it is decided
/// in the turn `keep_last_turns + 1` later, at whichever step of that turn the
/// measure crosses the threshold. One decided in turn c or later may have been
/// measured on a context holding the "outcome unknown" text, so it may differ
/// from the control's by design, and is left out of the comparison.
fn same_before_cut(t1: &str, t2: &str, line_start: usize, keep_last_turns: u32) -> bool {
    let record = |line: &str| serde_json::from_str::<serde_json::Value>(line).unwrap_or_default();
    let cut_turn = record_turn(&t1[line_start..]);
    let keep = i64::from(keep_last_turns);
    let decided_before_cut = |line: &&str| {
        let r = record(line);
        r["kind"] != "compaction" || r["up_to_turn"].as_i64().unwrap_or(0) + 1 + keep < cut_turn
    };
    let want: Vec<&str> = t1[..line_start]
        .lines()
        .filter(decided_before_cut)
        .collect();
    let got: Vec<&str> = t2
        .lines()
        .filter(decided_before_cut)
        .take(want.len())
        .collect();
    want == got
}

/// Where two transcripts part: the first record that differs, in each run
/// (shortened), so that a failed run says what differed.
fn first_difference(got: &str, want: &str) -> String {
    let short = |l: Option<&str>| match l {
        None => "(none)".to_string(),
        Some(l) if l.chars().count() > 400 => {
            format!("{}...", l.chars().take(400).collect::<String>())
        }
        Some(l) => l.to_string(),
    };
    let (mut g, mut w) = (got.lines(), want.lines());
    for n in 1.. {
        let (a, b) = (g.next(), w.next());
        if a != b {
            return format!("record {n}: here {}; control {}", short(a), short(b));
        }
        if a.is_none() {
            break;
        }
    }
    "records equal".to_string()
}

/// Verifies the chaos database and compares it with the control database.
fn compare(
    o: &ChaosOptions,
    w: &Workload,
    control_path: &Path,
    report: &mut ChaosReport,
) -> Result<()> {
    let conn = abridge::store::open_read_only(&o.db)?;
    let verify = abridge::verify::verify_with(&conn, &[&crate::demo_tables::DemoEffects])?;
    for c in verify.checks.iter().filter(|c| !c.ok) {
        for v in &c.violations {
            report.violations.push(format!("{}: {v}", c.name));
        }
    }
    for (ext, _, _) in w.session_ids() {
        let Ok(s) = abridge::inspect::resolve_session(&conn, &ext) else {
            continue;
        };
        for a in abridge::inspect::approvals(&conn, s.id)? {
            report.calls_parked += 1;
            report.calls_rejected += (a.status == abridge::store::ApprovalStatus::Rejected) as u64;
            if a.status == abridge::store::ApprovalStatus::Pending {
                report.violations.push(format!(
                    "session {ext}: call {} still waits for a decision",
                    a.id
                ));
            }
        }
    }
    let cconn = abridge::store::open_read_only(control_path)?;
    let got = session_fingerprints(&conn, w)?;
    let want = session_fingerprints(&cconn, w)?;
    let got_fx = crate::demo_tables::effects_by_session(&conn)?;
    let want_fx = crate::demo_tables::effects_by_session(&cconn)?;
    let keep = chaos_compaction(w).keep_last_turns;
    // With background compaction, the turns a summary covers depend on
    // timing: compaction records and step hashes are left out.
    let turns_only = |t: &str| -> String {
        t.lines()
            .filter(|l| !l.contains("\"kind\":\"compaction\""))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    for ((ext, t1, h1), (_, t2, h2)) in got.iter().zip(&want) {
        let (t1, t2) = if w.background {
            (&turns_only(t1), &turns_only(t2))
        } else {
            (t1, t2)
        };
        // The turn of an at-most-once call cut by a kill, if any.
        let mut cut_turn = None;
        if let Some(cut) = t1.find("outcome unknown") {
            // At-most-once by design: never repeated, so the model saw "outcome
            // unknown" where the control saw the result. Everything before that
            // record must still match.
            report.at_most_once_unknown_sessions += 1;
            let line_start = t1[..cut].rfind('\n').map_or(0, |i| i + 1);
            cut_turn = Some(record_turn(&t1[line_start..]));
            if !same_before_cut(t1, t2, line_start, keep) {
                report.violations.push(format!(
                    "session {ext}: transcript differs from the control run before the at-most-once cut"
                ));
            }
        } else if t1 != t2 {
            report.violations.push(format!(
                "session {ext}: transcript differs from the control run ({})",
                first_difference(t1, t2)
            ));
        } else if h1 != h2 && !w.background {
            report.violations.push(format!(
                "session {ext}: step message bytes differ from the control run"
            ));
        }
        // This session's transactional effects, each exactly once: all of them,
        // or, after a cut, those of the turns before the cut's turn (later
        // turns answered a different context, by design).
        let before_cut = |fx: Option<&Vec<crate::demo_tables::SessionEffect>>| {
            fx.into_iter()
                .flatten()
                .filter(|e| cut_turn.is_none_or(|c| e.0 < c))
                .cloned()
                .collect::<Vec<_>>()
        };
        // Its delegated children: one per call, each with the control's
        // turns (before a cut, as above).
        let children = |c: &abridge::store::Connection| -> Result<Vec<(String, String)>> {
            let d = abridge::inspect::session_detail(c, ext)?;
            d.children
                .iter()
                .filter(|k| {
                    k.parent
                        .as_ref()
                        .is_some_and(|p| cut_turn.is_none_or(|cut| p.turn < cut))
                })
                .map(|k| {
                    let t = abridge::inspect::export(
                        c,
                        &k.external_id,
                        abridge::inspect::ExportFormat::Jsonl,
                    )?;
                    Ok((
                        k.external_id.clone(),
                        if w.background { turns_only(&t) } else { t },
                    ))
                })
                .collect()
        };
        let (kids, want_kids) = (children(&conn)?, children(&cconn)?);
        report.delegated_children += kids.len() as u64;
        if kids != want_kids {
            report.violations.push(format!(
                "session {ext}: its delegated children differ from the control run ({} here, {} there)",
                kids.len(),
                want_kids.len()
            ));
        }
        if before_cut(got_fx.get(ext)) != before_cut(want_fx.get(ext)) {
            report.violations.push(format!(
                "session {ext}: transactional effects differ from the control run{}",
                if cut_turn.is_some() {
                    " before the at-most-once cut"
                } else {
                    ""
                }
            ));
        }
    }
    if let Some(orphans) = got_fx.get("") {
        report.violations.push(format!(
            "{} transactional effects with no invocation recording them",
            orphans.len()
        ));
    }
    let totals: (i64, i64, i64, i64) = abridge::testing::run_totals(&conn)?;
    report.sessions = totals.0 as u64;
    report.turns = totals.1 as u64;
    report.turns_failed_by_policy = totals.2 as u64;
    report.compactions = totals.3 as u64;
    let (background, waited) = abridge::testing::background_totals(&conn)?;
    report.compactions_background = background as u64;
    report.steps_waited_for_summary = waited as u64;
    let (turn_takeovers, compaction_takeovers) = abridge::testing::takeovers(&conn)?;
    report
        .races
        .insert("turn_takeovers".into(), turn_takeovers as u64);
    report
        .races
        .insert("compaction_takeovers".into(), compaction_takeovers as u64);
    Ok(())
}

/// Enumeration, as SQLite's crash tests do: kill a single worker at the i-th
/// fault point reached, for i = 1, 2, … until a run completes with no point
/// left; after each kill, resume to the end and compare with the control run.
pub async fn run_enumerate(o: &ChaosOptions) -> Result<ChaosReport> {
    let started = Instant::now();
    let exe = match &o.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe()?,
    };
    let w = Workload {
        seed: o.seed,
        sessions: o.sessions,
        turns: o.turns,
        epochs: 1,
        compact_at: o.compact_at,
        background: o.background,
        model_faults_per_mille: o.model_faults_per_mille,
    };
    let mut report = ChaosReport::default();
    let control_path = build_control(o, &w).await?;
    let mut i = 1u64;
    loop {
        if started.elapsed() > o.max_duration {
            report.violations.push(format!(
                "enumeration did not finish within {:?}",
                o.max_duration
            ));
            break;
        }
        remove_db(&o.db);
        open_workload_db(&o.db)?;
        let mut child = worker_command(&exe, &o.db, &w, 0)
            .env(KILL_ENV, format!("at={i}"))
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("piped");
        let lines: Vec<String> = BufReader::new(stderr)
            .lines()
            .map_while(|l| l.ok())
            .collect();
        let status = child.wait()?;
        if status.success() {
            break; // point i was never reached: every point has been hit
        }
        if let Some(p) = lines.iter().rev().find_map(|l| l.strip_prefix("KILL ")) {
            *report.kills_by_point.entry(p.to_string()).or_default() += 1;
        }
        // Resume to the end with no kill.
        let out = worker_command(&exe, &o.db, &w, 1)
            .env_remove(KILL_ENV)
            .stderr(Stdio::null())
            .status()?;
        if !out.success() {
            report
                .violations
                .push(format!("point {i}: the resuming worker failed ({out})"));
        }
        let before = report.violations.len();
        compare(o, &w, &control_path, &mut report)?;
        if report.violations.len() > before {
            let new: Vec<String> = report.violations.drain(before..).collect();
            for v in new {
                report.violations.push(format!("kill at point #{i}: {v}"));
            }
            break;
        }
        i += 1;
    }
    if report.violations.is_empty() {
        remove_db(&control_path);
    }
    report.kills = report.kills_by_point.values().sum();
    report.recoveries = report.kills;
    report.epochs = 1;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod cut_tests {
    use super::same_before_cut;

    fn user(turn: i64, text: &str) -> String {
        format!(r#"{{"kind":"user","turn":{turn},"text":"{text}"}}"#)
    }
    fn compaction(up_to: i64, summary: &str) -> String {
        format!(r#"{{"kind":"compaction","up_to_turn":{up_to},"summary":"{summary}"}}"#)
    }
    fn unknown(turn: i64) -> String {
        format!(r#"{{"kind":"tool_result","turn":{turn},"result":"outcome unknown: …"}}"#)
    }
    fn cut_of(t1: &str) -> usize {
        let cut = t1.find("outcome unknown").unwrap();
        t1[..cut].rfind('\n').map_or(0, |i| i + 1)
    }

    /// Regression: a compaction decided in the cut's turn (measured on the
    /// "outcome unknown" text) is listed before the cut, and differing there from
    /// the control's is by design, not a violation.
    #[test]
    fn a_compaction_decided_in_the_cut_turn_is_not_compared() {
        let t1 = [
            user(4, "a"),
            compaction(4, "chaos"),
            user(5, "b"),
            unknown(5),
        ]
        .join("\n");
        let t2 = [user(4, "a"), user(5, "b"), compaction(5, "control")].join("\n");
        assert!(same_before_cut(&t1, &t2, cut_of(&t1), 0));
    }

    #[test]
    fn a_difference_before_the_cut_is_still_found() {
        let t1 = [user(3, "a"), compaction(2, "x"), user(5, "b"), unknown(5)].join("\n");
        let other_input = [user(3, "A"), compaction(2, "x"), user(5, "b")].join("\n");
        assert!(!same_before_cut(&t1, &other_input, cut_of(&t1), 0));
        // A compaction decided before the cut's turn must match too.
        let other_summary = [user(3, "a"), compaction(2, "y"), user(5, "b")].join("\n");
        assert!(!same_before_cut(&t1, &other_summary, cut_of(&t1), 0));
    }
}

#[cfg(test)]
mod fault_tests {
    use super::{fault_roll, first_difference, ATTEMPTS, FAULT_FREE_EVERY};

    /// Regression: faults were rolled at every attempt a process made with a
    /// request, so a worker that sent a step's request again (after its lease
    /// was taken, or a frozen call timed out) could use up the call's attempts
    /// where the control run answered, or answer where the control's turn
    /// failed by policy. Now any `FAULT_FREE_EVERY` attempts in a row, from
    /// wherever a call starts counting, hold one without a fault.
    #[test]
    fn transient_faults_never_use_up_a_calls_attempts() {
        for key in ["a", "b", "a request", "another request"] {
            for start in 1..=50u32 {
                let free = (start..start + ATTEMPTS)
                    .filter(|&a| fault_roll(7, key, a).is_none())
                    .count();
                assert!(free >= 2, "{key} from attempt {start}: {free} fault-free");
                assert!((start..start + FAULT_FREE_EVERY).any(|a| fault_roll(7, key, a).is_none()));
            }
        }
        // The other attempts still roll (faults are injected at all).
        let rolled = (1..=300u32)
            .filter(|&a| fault_roll(7, "a", a).is_some())
            .count();
        assert_eq!(rolled, 200);
    }

    #[test]
    fn a_difference_is_reported_with_both_records() {
        let d = first_difference("a\nb\nc", "a\nB\nc");
        assert_eq!(d, "record 2: here b; control B");
        assert_eq!(
            first_difference("a", "a\nb"),
            "record 2: here (none); control b"
        );
        let long = "x".repeat(1_000);
        assert!(first_difference(&long, "y").len() < 500);
    }
}
