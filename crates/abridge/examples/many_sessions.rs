//! Many sessions at once: a host (or several processes) running N sessions
//! concurrently on one store for S seconds, with a scripted instant model
//! and background compaction on, measured beside the store's floor.
//!
//! ```sh
//! cargo run --release --example many_sessions -- --sessions 1000 --seconds 10 --json
//! cargo run --release --example many_sessions -- --sessions 400 --procs 4 --json
//! cargo run --release --features postgres --example many_sessions -- \
//!     --sessions 100 --procs 4 --db 'postgres://postgres@127.0.0.1/test?schema=many' --json
//! ```
//!
//! Each turn is two steps: a tool call (an idempotent instant tool) and an
//! answer; the model reports the request's size as its input tokens, so the
//! sessions compact (in the background, at 80% of 4,000 tokens). With
//! `--procs P` the example runs itself P times as child processes, each with
//! N/P sessions on the same store, and merges what they measured.
//!
//! The JSON (one object): `steps_per_s` (all processes), `floor_tx_per_s`
//! (bare one-row insert transactions on the same store, one writer, measured
//! right after), `cpu_us_per_step` (process CPU, user and system, over
//! steps), `step_p50_ms`/`step_p99_ms` (from a step's start event to its
//! completion event; `step_samples` steps were timed, and
//! `step_events_lagged` events were lost to a full channel: 0 in a sound
//! run), `turn_p50_ms`/`turn_p99_ms` (one `run_turn_at`),
//! `progressed_share` (sessions that finished a turn in every whole 10 s
//! window; every session when the run is shorter than one),
//! `session_turns_min`/`session_turns_p50`/`session_turns_max` (the turns
//! one session finished in the run: how evenly the sessions were served),
//! `group_commits_per_step` and `turn_writes_per_group_commit` (on an SQLite
//! store: the group commits of the measured window over its steps, and the
//! turns' write transactions each committed; `--no-group-commit` commits
//! each alone), `reads_lent_per_step` (the steps' read transactions run on
//! the group commit's idle writer, whose page cache its commits keep, over
//! steps), `turn_retries` (turn attempts that ended in a resumable
//! error and were run again: a failed attempt's time is in no turn's
//! latency), `queue_beside_slow` (step parts that ran beside a part that
//! had worked the store alone past the runner's `step_alone_for`),
//! `summary_waits`/`summary_wait_s` (the steps that waited for a
//! summary, and how long in all, as the store recorded them), and the
//! counts behind them, and `model_ms` (the latency below). `--full` runs the
//! store (and its floor) with every commit fsynced (`Synchronous::Full`);
//! `--slots K` sets the runner's fair-queue slots, `--alone-us U` its
//! `step_alone_for` in microseconds (0: None, the slots' holders at once)
//! and `--workers W` the
//! runtime's worker threads (by default one a core), each process's;
//! `--model-ms M` makes every model call take M ms (a model's I/O, waited on
//! the runtime; by default 0, an instant model). Machines are shared and
//! noisy: read the ratios of one run.

use abridge::events::EventKind;
use abridge::{
    CompactionConfig, ContentBlock, ModelClient, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Role, Runner, RunnerConfig, Store, Threshold, Tool, ToolCall, ToolError,
    ToolSpec, Tools, Usage,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast::error::TryRecvError;

/// Step 0 of every turn calls `lookup`; step 1 answers. Input tokens: the
/// request's characters / 4. Each call takes `latency` (`--model-ms`; zero:
/// an instant model), waited out on the runtime as a model's I/O would be.
struct Scripted {
    latency: Duration,
}

#[async_trait::async_trait]
impl ModelClient for Scripted {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let chars: usize = req
            .messages
            .iter()
            .flat_map(|m| m.content.iter())
            .map(|b| match b {
                ContentBlock::Text { text } => text.len(),
                ContentBlock::ToolResult { content, .. } => content.len(),
                _ => 40,
            })
            .sum();
        let answered = matches!(
            req.messages.last().map(|m| (m.role, m.content.first())),
            Some((Role::User, Some(ContentBlock::ToolResult { .. })))
        );
        let blocks = if answered {
            vec![ResponseBlock::Text {
                text: "Order ORD-10042 left the warehouse; it arrives Friday.".into(),
            }]
        } else {
            vec![ResponseBlock::ToolUse {
                id: "call_1".into(),
                name: "lookup".into(),
                input: json!({"order_id": "ORD-10042"}),
                raw_input: None,
            }]
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: Some((chars / 4) as u64),
                output_tokens: Some(20),
                ..Usage::default()
            },
            stop_reason: None,
            model: None,
        })
    }
}

struct Lookup;

#[async_trait::async_trait]
impl Tool for Lookup {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        Ok(
            json!({"order": "ORD-10042", "status": "in transit", "eta": "Friday",
                  "notes": "x".repeat(600)}),
        )
    }
}

struct Opts {
    sessions: usize,
    procs: usize,
    db: Option<String>,
    seconds: f64,
    json: bool,
    /// The runner's fair-queue slots (None: the default).
    slots: Option<usize>,
    /// The runtime's worker threads (None: tokio's default, one a core).
    workers: Option<usize>,
    /// `--alone-us U`: the runner's `step_alone_for` in microseconds (0:
    /// None, the slots' holders at once; unset: the default).
    alone_us: Option<u64>,
    /// A child process: its index (its sessions are named after it).
    child: Option<usize>,
    /// This run's name, in every session's: a run on a store that earlier
    /// runs used makes sessions of its own (an earlier run's turns would be
    /// answered from the store, not run).
    run: String,
    /// Seconds of the same workload, on sessions of their own, before the
    /// measured run (default: 3 on PostgreSQL, 0 on a file); see `main`.
    warmup: Option<f64>,
    /// `--no-group-commit`: each turn's write transaction commits alone.
    group_commit: bool,
    /// `--full`: every commit fsynced (`Synchronous::Full`).
    full: bool,
    /// `--model-ms M`: each model call takes M ms (0: instant).
    model_ms: u64,
}

impl Opts {
    /// The store as the run opens it (and its floor: `--full` fsyncs both).
    fn store_options(&self) -> abridge::StoreOptions {
        abridge::StoreOptions::default()
            .with_group_commit(self.group_commit)
            .with_synchronous(if self.full {
                abridge::store::Synchronous::Full
            } else {
                abridge::store::Synchronous::Normal
            })
    }
}

const USAGE: &str = "usage: many_sessions [--sessions N] [--procs P] [--db PATH|URL] \
[--seconds S] [--slots K] [--alone-us U] [--workers W] [--warmup S] [--model-ms M] [--no-group-commit] [--full] \
[--json]";

fn parse() -> Opts {
    let mut o = Opts {
        sessions: 100,
        procs: 1,
        db: None,
        seconds: 10.0,
        json: false,
        slots: None,
        workers: None,
        alone_us: None,
        child: None,
        run: format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        ),
        warmup: None,
        group_commit: true,
        full: false,
        model_ms: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let value = |i: usize| {
        args.get(i + 1)
            .unwrap_or_else(|| panic!("{} needs a value", args[i]))
            .clone()
    };
    while i < args.len() {
        match args[i].as_str() {
            "--sessions" => o.sessions = value(i).parse().expect("--sessions N"),
            "--procs" => o.procs = value(i).parse().expect("--procs P"),
            "--db" => o.db = Some(value(i)),
            "--seconds" => o.seconds = value(i).parse().expect("--seconds S"),
            "--child" => o.child = Some(value(i).parse().expect("--child I")),
            "--slots" => o.slots = Some(value(i).parse().expect("--slots K")),
            "--workers" => o.workers = Some(value(i).parse().expect("--workers W")),
            "--alone-us" => o.alone_us = Some(value(i).parse().expect("--alone-us U")),
            "--run" => o.run = value(i),
            "--warmup" => o.warmup = Some(value(i).parse().expect("--warmup S")),
            "--model-ms" => o.model_ms = value(i).parse().expect("--model-ms M"),
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--json" => {
                o.json = true;
                i += 1;
                continue;
            }
            "--full" => {
                o.full = true;
                i += 1;
                continue;
            }
            "--no-group-commit" => {
                o.group_commit = false;
                i += 1;
                continue;
            }
            other => {
                eprintln!("unknown argument {other}\n{USAGE}");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    assert!(o.sessions >= 1 && o.procs >= 1 && o.seconds > 0.0);
    o
}

/// This process's CPU time (user + system), from /proc (Linux); None
/// elsewhere.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel's USER_HZ, 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

/// What one process measured.
#[derive(Default)]
struct Measured {
    steps: u64,
    turns: u64,
    cpu_us: u64,
    step_us: Vec<u64>,
    turn_us: Vec<u64>,
    /// Per session, the 10 s windows in which it finished a turn.
    windows: Vec<Vec<u64>>,
    /// Per session, the turns it finished.
    session_turns: Vec<u64>,
    lagged: u64,
    elapsed_s: f64,
    /// Microseconds the steps slept in SQLite's busy handler.
    busy_sleep_us: u64,
    /// Step parts that waited in the runner's fair queue, and for how long.
    queue_waits: u64,
    queue_wait_us: u64,
    /// Step parts that ran beside a part past `step_alone_for`.
    queue_beside_slow: u64,
    /// Steps that waited for a summary, and for how long.
    summary_waits: u64,
    summary_wait_ms: u64,
    /// Group commits in the measured window, and the turns' write
    /// transactions they committed.
    group_commits: u64,
    group_parts: u64,
    /// Steps' read transactions run on the group commit's idle writer.
    reads_lent: u64,
    /// Turn attempts that ended in a resumable error and were run again (a
    /// failed attempt's time is in no turn's latency).
    turn_retries: u64,
}

impl Measured {
    fn to_json(&self) -> Value {
        json!({"steps": self.steps, "turns": self.turns, "cpu_us": self.cpu_us,
               "step_us": self.step_us, "turn_us": self.turn_us, "windows": self.windows,
               "session_turns": self.session_turns,
               "lagged": self.lagged, "elapsed_s": self.elapsed_s,
               "busy_sleep_us": self.busy_sleep_us, "queue_waits": self.queue_waits,
               "queue_wait_us": self.queue_wait_us, "queue_beside_slow": self.queue_beside_slow,
               "summary_waits": self.summary_waits,
               "summary_wait_ms": self.summary_wait_ms,
               "group_commits": self.group_commits, "group_parts": self.group_parts,
               "reads_lent": self.reads_lent,
               "turn_retries": self.turn_retries})
    }

    fn from_json(v: &Value) -> Measured {
        let list = |k: &str| -> Vec<u64> {
            v[k].as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default()
        };
        Measured {
            steps: v["steps"].as_u64().unwrap_or(0),
            turns: v["turns"].as_u64().unwrap_or(0),
            cpu_us: v["cpu_us"].as_u64().unwrap_or(0),
            step_us: list("step_us"),
            turn_us: list("turn_us"),
            windows: v["windows"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|w| {
                            w.as_array()
                                .map(|x| x.iter().filter_map(Value::as_u64).collect())
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            session_turns: list("session_turns"),
            lagged: v["lagged"].as_u64().unwrap_or(0),
            elapsed_s: v["elapsed_s"].as_f64().unwrap_or(0.0),
            busy_sleep_us: v["busy_sleep_us"].as_u64().unwrap_or(0),
            queue_waits: v["queue_waits"].as_u64().unwrap_or(0),
            queue_wait_us: v["queue_wait_us"].as_u64().unwrap_or(0),
            queue_beside_slow: v["queue_beside_slow"].as_u64().unwrap_or(0),
            summary_waits: v["summary_waits"].as_u64().unwrap_or(0),
            summary_wait_ms: v["summary_wait_ms"].as_u64().unwrap_or(0),
            group_commits: v["group_commits"].as_u64().unwrap_or(0),
            group_parts: v["group_parts"].as_u64().unwrap_or(0),
            reads_lent: v["reads_lent"].as_u64().unwrap_or(0),
            turn_retries: v["turn_retries"].as_u64().unwrap_or(0),
        }
    }

    fn merge(&mut self, other: Measured) {
        self.steps += other.steps;
        self.turns += other.turns;
        self.cpu_us += other.cpu_us;
        self.step_us.extend(other.step_us);
        self.turn_us.extend(other.turn_us);
        self.windows.extend(other.windows);
        self.session_turns.extend(other.session_turns);
        self.lagged += other.lagged;
        self.elapsed_s = self.elapsed_s.max(other.elapsed_s);
        self.busy_sleep_us += other.busy_sleep_us;
        self.queue_waits += other.queue_waits;
        self.queue_wait_us += other.queue_wait_us;
        self.queue_beside_slow += other.queue_beside_slow;
        self.summary_waits += other.summary_waits;
        self.summary_wait_ms += other.summary_wait_ms;
        self.group_commits += other.group_commits;
        self.group_parts += other.group_parts;
        self.reads_lent += other.reads_lent;
        self.turn_retries += other.turn_retries;
    }
}

/// Runs `sessions` sessions on `db` for `seconds`, as `o` says (the store's
/// options, the queue's slots); `tag` names them apart
/// from other processes'.
async fn run_sessions(db: &str, sessions: usize, seconds: f64, tag: &str, o: &Opts) -> Measured {
    let store = Store::open_with(db, o.store_options()).expect("open the store");
    let tools = Tools::new().idempotent(
        ToolSpec {
            name: "lookup".into(),
            description: "Looks an order up.".into(),
            input_schema: json!({"type": "object"}),
        },
        Lookup,
    );
    let runner = Runner::builder(
        store.clone(),
        Arc::new(Scripted {
            latency: Duration::from_millis(o.model_ms),
        }),
    )
    .tools(tools)
    .config({
        let mut cfg = RunnerConfig::default().with_owner(format!("many-{tag}"));
        if let Some(k) = o.slots {
            cfg.step_slots = k;
        }
        if let Some(us) = o.alone_us {
            cfg.step_alone_for = (us > 0).then(|| Duration::from_micros(us));
        }
        cfg
    })
    .compaction(CompactionConfig::default().with_compact_at(Threshold::Tokens(4_000)))
    .build()
    .expect("a runner");
    // Step latencies from the runner's events: start to completion. The
    // listener has a thread of its own: as one more task on the runtime's
    // workers it ran behind every session's task, and the channel (1,024
    // events) overflowed between its turns, so the percentiles came from
    // whichever steps it happened to see (318 of 23,918 with 1,000
    // sessions). It polls, every millisecond, instead of waiting in
    // `blocking_recv`: a receiver that waits is woken by every event sent, a
    // system call on the sending step's thread (1.2x the CPU a step, and the
    // summaries starved). `step_samples` and `step_events_lagged` say how
    // many steps it saw and how many events it lost.
    let step_us = Arc::new(Mutex::new(Vec::new()));
    let lagged = Arc::new(Mutex::new(0u64));
    let mut events = runner.subscribe();
    let (su, lg) = (step_us.clone(), lagged.clone());
    let listener = std::thread::spawn(move || {
        let mut started: HashMap<abridge::StepId, Instant> = HashMap::new();
        loop {
            match events.try_recv() {
                Ok(e) => match e.kind {
                    EventKind::StepStarted { step_id, .. } => {
                        started.insert(step_id, Instant::now());
                    }
                    EventKind::StepCompleted { step_id, .. } => {
                        if let Some(t) = started.remove(&step_id) {
                            su.lock().unwrap().push(t.elapsed().as_micros() as u64);
                        }
                    }
                    _ => {}
                },
                Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(1)),
                Err(TryRecvError::Lagged(n)) => *lg.lock().unwrap() += n,
                Err(TryRecvError::Closed) => return,
            }
        }
    });
    let mut ids = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let s = runner
            .create_session(
                &format!("many-{tag}-s{i}"),
                "scripted",
                "You help with orders.",
            )
            .await
            .expect("a session");
        ids.push(s.id);
    }
    // Every session's task is spawned first and starts at one signal, and the
    // window (its clock, CPU and commit counters) begins there: otherwise the
    // first tasks could run turns before the last were spawned, and the
    // spawning would be counted in the window's CPU.
    let (go, ready) = tokio::sync::watch::channel(None::<(Instant, Instant)>);
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let runner = runner.clone();
        let mut ready = ready.clone();
        tasks.spawn(async move {
            let (start, until) = ready
                .wait_for(Option::is_some)
                .await
                .expect("the start signal")
                .expect("a start");
            let (mut turns, mut turn_us, mut windows) = (0u64, Vec::new(), Vec::new());
            let mut retries = 0u64;
            while Instant::now() < until {
                let t = Instant::now();
                match runner
                    .run_turn_at(id, turns as i64, "Where is my order?")
                    .await
                {
                    Ok(_) => {
                        turn_us.push(t.elapsed().as_micros() as u64);
                        let w = start.elapsed().as_secs() / 10;
                        if windows.last() != Some(&w) {
                            windows.push(w);
                        }
                        turns += 1;
                    }
                    Err(e) if e.is_resumable() => {
                        retries += 1;
                        continue;
                    }
                    Err(e) => panic!("turn failed: {e}"),
                }
            }
            (turns, turn_us, windows, retries)
        });
    }
    let cpu0 = cpu_time();
    let commits0 = store.group_commits();
    let lent0 = store.group_commit_reads_lent();
    let start = Instant::now();
    go.send_replace(Some((start, start + Duration::from_secs_f64(seconds))));
    let mut m = Measured::default();
    while let Some(r) = tasks.join_next().await {
        let (turns, turn_us, windows, retries) = r.expect("a session task");
        m.turn_retries += retries;
        m.turns += turns;
        m.session_turns.push(turns);
        m.turn_us.extend(turn_us);
        m.windows.push(windows);
    }
    m.elapsed_s = start.elapsed().as_secs_f64();
    m.steps = m.turns * 2;
    m.cpu_us = match (cpu0, cpu_time()) {
        (Some(a), Some(b)) => (b - a).as_micros() as u64,
        _ => 0,
    };
    m.busy_sleep_us = store.busy_sleep().as_micros() as u64;
    let commits = store.group_commits();
    (m.group_commits, m.group_parts) = (commits.0 - commits0.0, commits.1 - commits0.1);
    m.reads_lent = store.group_commit_reads_lent() - lent0;
    let q = runner.queue_stats();
    (m.queue_waits, m.queue_wait_us) = (q.waits, q.waited_us);
    m.queue_beside_slow = q.beside_slow;
    runner.finish_background().await;
    drop(runner);
    // The channel closes once the runner's last handle is gone; the
    // listener has then read every event sent before it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !listener.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    m.step_us = std::mem::take(&mut *step_us.lock().unwrap());
    m.lagged = *lagged.lock().unwrap();
    (m.summary_waits, m.summary_wait_ms) = summary_waits(&store, tag);
    m
}

/// The steps of this process's sessions that waited for a summary, and
/// their waits summed (ms), as the store recorded them: every one, where an
/// event stream may drop some.
fn summary_waits(store: &Store, tag: &str) -> (u64, u64) {
    store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(s.summary_wait_ms), coalesce(sum(s.summary_wait_ms), 0) \
                 FROM steps s JOIN turns t ON t.id = s.turn_id \
                 JOIN sessions x ON x.id = t.session_id WHERE x.external_id LIKE ?1",
                [format!("many-{tag}-s%")],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
        })
        .expect("the steps' summary waits")
}

/// Bare one-row insert transactions per second on the same store, over
/// `seconds`, one writer (each fsynced with `full`, as the steps' were).
fn floor_tx_per_s(db: &str, seconds: f64, o: &Opts) -> f64 {
    let store = Store::open_with(db, o.store_options()).expect("open the store");
    store
        .with_conn(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS bench_floor (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
            )?;
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed().as_secs_f64() < seconds {
                // Autocommit: each insert is a transaction of its own.
                c.execute(
                    "INSERT INTO bench_floor (v) VALUES (?1)",
                    ["a step's worth"],
                )?;
                n += 1;
            }
            c.execute_batch("DROP TABLE bench_floor")?;
            Ok(n as f64 / start.elapsed().as_secs_f64())
        })
        .expect("the floor")
}

/// The `p` quantile of `v` (0 when empty), nearest rank.
fn quantile(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The `p` quantile of `v`, microseconds, in milliseconds.
fn percentile(v: &mut [u64], p: f64) -> f64 {
    quantile(v, p) as f64 / 1000.0
}

fn main() {
    let o = parse();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db =
        o.db.clone()
            .unwrap_or_else(|| dir.path().join("many.db").display().to_string());
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(w) = o.workers {
        rt.worker_threads(w);
    }
    let rt = rt.enable_all().build().expect("a runtime");
    if let Some(child) = o.child {
        let tag = format!("{}-p{child}", o.run);
        let m = rt.block_on(run_sessions(&db, o.sessions, o.seconds, &tag, &o));
        println!("{}", m.to_json());
        return;
    }
    // Open once first: the schema exists before the children race to it.
    let store = Store::open(&db).expect("open the store");
    // A server plans a prepared statement from the statistics it has of
    // the tables, and keeps the plan until they change: a store made a
    // moment ago has those of empty tables until autovacuum's first ANALYZE
    // (within a minute of its first rows), and its plans read whole tables.
    // The warm-up runs the same workload on sessions of its own, then the
    // ANALYZE autovacuum would run: the measured run is a store's steady
    // state, not its first minute.
    let warmup = o.warmup.unwrap_or(match store.backend() {
        abridge::store::BackendKind::Postgres => 3.0,
        _ => 0.0,
    });
    if warmup > 0.0 {
        let tag = format!("{}-warmup", o.run);
        rt.block_on(run_sessions(&db, o.sessions, warmup, &tag, &o));
        if store.backend() == abridge::store::BackendKind::Postgres {
            store
                .with_conn(|c| {
                    c.execute_batch(
                        "ANALYZE sessions, turns, steps, tool_invocations, compactions, pins, \
                         session_lineage",
                    )
                })
                .expect("ANALYZE");
        }
    }
    drop(store);
    let mut m = Measured::default();
    if o.procs == 1 {
        let tag = format!("{}-p0", o.run);
        m = rt.block_on(run_sessions(&db, o.sessions, o.seconds, &tag, &o));
    } else {
        let me = std::env::current_exe().expect("this program");
        let per = o.sessions.div_ceil(o.procs);
        let children: Vec<_> = (0..o.procs)
            .map(|i| {
                std::process::Command::new(&me)
                    .args([
                        "--sessions",
                        &per.to_string(),
                        "--seconds",
                        &o.seconds.to_string(),
                    ])
                    .args(["--db", &db, "--child", &i.to_string(), "--run", &o.run])
                    .args((!o.group_commit).then_some("--no-group-commit"))
                    .args(o.full.then_some("--full"))
                    .args(["--model-ms", &o.model_ms.to_string()])
                    .args(
                        o.slots
                            .map(|k| ["--slots".to_string(), k.to_string()])
                            .into_iter()
                            .flatten(),
                    )
                    .args(
                        o.alone_us
                            .map(|us| ["--alone-us".to_string(), us.to_string()])
                            .into_iter()
                            .flatten(),
                    )
                    .args(
                        o.workers
                            .map(|w| ["--workers".to_string(), w.to_string()])
                            .into_iter()
                            .flatten(),
                    )
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("a child process")
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().expect("a child's output");
            assert!(out.status.success(), "a child process failed");
            let v: Value = serde_json::from_slice(&out.stdout).expect("a child's JSON");
            m.merge(Measured::from_json(&v));
        }
    }
    let floor = floor_tx_per_s(&db, 2.0, &o);
    let whole_windows = (m.elapsed_s / 10.0).floor() as u64;
    let progressed = m
        .windows
        .iter()
        .filter(|w| whole_windows == 0 || (0..whole_windows).all(|k| w.contains(&k)))
        .count();
    let sessions = m.windows.len().max(1);
    let steps_per_s = m.steps as f64 / m.elapsed_s.max(1e-9);
    let out = json!({
        "sessions": o.sessions,
        "procs": o.procs,
        "model_ms": o.model_ms,
        "seconds": m.elapsed_s,
        "steps": m.steps,
        "turns": m.turns,
        "steps_per_s": steps_per_s,
        "floor_tx_per_s": floor,
        "steps_per_floor_tx": steps_per_s / floor.max(1e-9),
        "cpu_us_per_step": m.cpu_us as f64 / (m.steps.max(1)) as f64,
        "step_p50_ms": percentile(&mut m.step_us, 0.50),
        "step_p99_ms": percentile(&mut m.step_us, 0.99),
        "step_samples": m.step_us.len(),
        "turn_p50_ms": percentile(&mut m.turn_us, 0.50),
        "turn_p99_ms": percentile(&mut m.turn_us, 0.99),
        "progressed_share": progressed as f64 / sessions as f64,
        "session_turns_min": quantile(&mut m.session_turns, 0.0),
        "session_turns_p50": quantile(&mut m.session_turns, 0.5),
        "session_turns_max": quantile(&mut m.session_turns, 1.0),
        "step_events_lagged": m.lagged,
        "busy_sleep_s": m.busy_sleep_us as f64 / 1e6,
        "queue_waits": m.queue_waits,
        "queue_wait_s": m.queue_wait_us as f64 / 1e6,
        "queue_beside_slow": m.queue_beside_slow,
        "summary_waits": m.summary_waits,
        "summary_wait_s": m.summary_wait_ms as f64 / 1e3,
        "group_commits_per_step": m.group_commits as f64 / (m.steps.max(1)) as f64,
        "turn_writes_per_group_commit": m.group_parts as f64 / (m.group_commits.max(1)) as f64,
        "reads_lent_per_step": m.reads_lent as f64 / (m.steps.max(1)) as f64,
        "turn_retries": m.turn_retries,
    });
    if m.lagged > 0 {
        eprintln!(
            "many_sessions: {} events lost to a full channel: the step percentiles are of the \
             {} steps seen, not of all {}",
            m.lagged, out["step_samples"], m.steps
        );
    }
    if o.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
    }
}
