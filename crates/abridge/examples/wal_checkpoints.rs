//! What a WAL checkpoint costs the step that runs it: a session's step
//! latency while it writes some 50 MB of WAL, with checkpoints off the
//! step's path (`Checkpoints::OffTheStep`, the default) and with SQLite's own
//! policy (`Checkpoints::OnCommit`: the commit that finds 1,000 pages in the
//! WAL copies them into the file and syncs it, on the step's worker).
//!
//! `cargo run --release --example wal_checkpoints -- [MB] [ROUNDS] [MODEL_MS]`
//!
//! Each round runs both policies, one after the other, on fresh files; the
//! figures are pooled per policy over the rounds, and the ratios are of
//! figures measured in the same run. A turn is one step whose user message
//! is 16 KiB; a session holds 10 turns, so the context (and the step's own
//! work) stays the same size throughout. The model answers after MODEL_MS
//! milliseconds (default 0: steps commit back to back, the worst case for
//! a checkpoint that runs beside them); the latency reported is the step's
//! own, the model's wait taken out.

use abridge::{
    Checkpoints, ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner,
    RunnerConfig, Store, StoreOptions, Threshold, Usage,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Answers "ok" after its latency; keeps how long its last call took.
struct Model(Duration, Arc<std::sync::atomic::AtomicU64>);
#[async_trait::async_trait]
impl ModelClient for Model {
    async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> {
        if !self.0.is_zero() {
            let began = Instant::now();
            tokio::time::sleep(self.0).await;
            let took = began.elapsed().as_nanos() as u64;
            self.1.store(took, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text { text: "ok".into() }],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

const MESSAGE: usize = 16 * 1024;
const TURNS_PER_SESSION: usize = 10;

/// Runs `turns` turns on a fresh store; returns each turn's latency and the
/// WAL bytes it wrote (measured with no checkpoint, on one connection).
async fn run(
    opts: StoreOptions,
    turns: usize,
    model: Duration,
    measure_wal: bool,
) -> (Vec<Duration>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal.db");
    let store = Store::open_with(&path, opts).unwrap();
    if measure_wal {
        store
            .with_conn(|c| c.execute_batch("PRAGMA wal_autocheckpoint = 0"))
            .unwrap();
    }
    let mut cfg = RunnerConfig::default().with_owner("wal");
    cfg.compaction = cfg.compaction.with_compact_at(Threshold::Off);
    let waited = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let runner = Runner::builder(store.clone(), Arc::new(Model(model, waited.clone())))
        .config(cfg)
        .build()
        .unwrap();
    let filler = "x".repeat(MESSAGE);
    let mut took = Vec::with_capacity(turns);
    let mut session = None;
    for t in 0..turns {
        if t % TURNS_PER_SESSION == 0 {
            let s = runner
                .create_session(&format!("s{t}"), "m", "sys")
                .await
                .unwrap();
            session = Some(s.id);
        }
        let message = format!("turn {t} {filler}");
        let began = Instant::now();
        runner.run_turn(session.unwrap(), &message).await.unwrap();
        let model_ns = waited.load(std::sync::atomic::Ordering::Relaxed);
        took.push(
            began
                .elapsed()
                .saturating_sub(Duration::from_nanos(model_ns)),
        );
    }
    let wal = std::fs::metadata(dir.path().join("wal.db-wal")).map_or(0, |m| m.len());
    if !measure_wal {
        let n = store.wal_checkpoints();
        eprintln!(
            "  {turns} turns, {n} checkpoints off the step's path, WAL {wal} bytes at the end"
        );
    }
    (took, wal)
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mb: u64 = args.next().map_or(50, |a| a.parse().expect("MB"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let model = Duration::from_millis(args.next().map_or(0, |a| a.parse().expect("MODEL_MS")));

    // WAL bytes per turn: 100 turns on one connection, never checkpointed.
    let one = StoreOptions::default()
        .with_checkpoints(Checkpoints::OnCommit)
        .with_max_connections(1);
    let (_, wal) = run(one, 100, Duration::ZERO, true).await;
    let per_turn = (wal / 100).max(1);
    let turns = (mb * 1_000_000 / per_turn) as usize;
    eprintln!("{per_turn} WAL bytes per turn: {turns} turns for {mb} MB");

    let policies = [Checkpoints::OffTheStep, Checkpoints::OnCommit];
    let mut all: [Vec<Duration>; 2] = Default::default();
    for round in 0..rounds {
        for (i, p) in policies.iter().enumerate() {
            eprintln!("round {round}: {p:?}");
            let opts = StoreOptions::default().with_checkpoints(*p);
            let (took, _) = run(opts, turns, model, false).await;
            all[i].extend(took);
        }
    }
    let mut rows = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        all[i].sort();
        let s = &all[i];
        let q = |q| quantile(s, q);
        rows.push([q(0.5), q(0.99), q(0.999), q(1.0)]);
        let slow = s.iter().filter(|d| d.as_millis() >= 5).count();
        println!(
            "{p:?}: p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, max {:.0} µs; {slow} of {} steps took 5 ms or more",
            rows[i][0],
            rows[i][1],
            rows[i][2],
            rows[i][3],
            s.len()
        );
    }
    let names = ["p50", "p99", "p99.9", "max"];
    for (k, name) in names.iter().enumerate() {
        println!(
            "OnCommit / OffTheStep, {name}: {:.2}",
            rows[1][k] / rows[0][k]
        );
    }
}
