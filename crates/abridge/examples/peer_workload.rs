//! The abridge side of `benches/peers/run.sh`: the peer workload at one history
//! length, printed as one JSON line.
//!
//! Each turn is a user message, K tool steps (results of 200 B to 4 KB, 50 KB
//! every 25th) and a final answer. History is written in bulk up to H turns; then
//! whole turns run through the runner and each step is timed: ensure, build the
//! context, hash, persist the response, run the transactional tool, complete.
//!
//! `cargo run --release --example peer_workload -- H K STEPS on|off normal|full [pool|inplace]`

use abridge::{
    Blocking, CompactionConfig, ContentBlock, ModelClient, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Runner, RunnerConfig, Store, StoreOptions, Synchronous, Threshold, ToolCall,
    ToolError, ToolSpec, Tools, TransactionalTool, Usage,
};
use abridge_testkit::seed::{peer_result_size, seed_history, truncate_from, SeedShape};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// K tool calls, one per step, then a final answer.
struct PeerModel {
    k: usize,
}

#[async_trait::async_trait]
impl ModelClient for PeerModel {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last_user = req
            .messages
            .iter()
            .rposition(|m| {
                m.role == abridge::Role::User && matches!(m.content[0], ContentBlock::Text { .. })
            })
            .unwrap_or(0);
        let done = req.messages[last_user..]
            .iter()
            .filter(|m| m.role == abridge::Role::Assistant)
            .count();
        let blocks = if done < self.k {
            vec![
                ResponseBlock::Text {
                    text: "Let me check that for you.".into(),
                },
                ResponseBlock::ToolUse {
                    id: format!("call_{done}_0"),
                    name: "lookup_order".into(),
                    input: json!({"order_id": "ORD-10042"}),
                    raw_input: None,
                },
            ]
        } else {
            vec![ResponseBlock::Text {
                text: "Order ORD-10042 is in transit; shipping costs 7.50 EUR.".into(),
            }]
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: None, // estimated by abridge from the built bytes
                output_tokens: Some(20),
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

/// A transactional tool whose result follows the peer workload's size sequence.
struct Lookup(AtomicU64);

impl TransactionalTool for Lookup {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<Value, ToolError> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        abridge_testkit::demo_tables::append_effect(
            tx,
            abridge_testkit::demo_tables::DemoTable::Effects,
            &call.idempotency_key,
            "lookup_order",
            "{}",
        )
        .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(Value::String("x".repeat(peer_result_size(n))))
    }

    fn may_block(&self) -> bool {
        false // one INSERT on its transaction
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Starts the peak RSS over (Linux: `/proc/self/clear_refs`); false when it
/// cannot.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The database's size once its WAL is checkpointed into it (a WAL file keeps
/// its largest size until truncated, which would count pages twice).
fn db_bytes(path: &std::path::Path) -> u64 {
    if let Ok(c) = rusqlite::Connection::open(path) {
        let _ = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
    ["", "-wal"]
        .iter()
        .map(|s| std::fs::metadata(format!("{}{s}", path.display())).map_or(0, |m| m.len()))
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let h: i64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let k: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let steps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(40);
    let compaction = args.get(4).is_none_or(|s| s == "on");
    let sync = if args.get(5).is_some_and(|s| s == "full") {
        Synchronous::Full
    } else {
        Synchronous::Normal
    };
    let blocking = if args.get(6).is_some_and(|s| s == "inplace") {
        Blocking::InPlace
    } else {
        Blocking::Pool
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peer.db");
    let store = Store::open_with(
        &path,
        StoreOptions::default()
            .with_synchronous(sync)
            .with_blocking(blocking),
    )
    .unwrap();
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let mut cfg = RunnerConfig::default().with_owner("peer");
    cfg.compaction = CompactionConfig::default().with_compact_at(if compaction {
        Threshold::Tokens(12_000)
    } else {
        Threshold::Off
    });
    // The measured turn is removed after each iteration when compaction is
    // off (H stays fixed), so a context kept between turns would never
    // continue: each turn's first step rebuilds the whole history, which is
    // what is measured.
    cfg.context_cache_bytes = if compaction { 64 << 20 } else { 0 };
    let spec = ToolSpec {
        name: "lookup_order".into(),
        description: "Look up an order".into(),
        input_schema: json!({"type": "object"}),
    };
    let runner = Runner::builder(store.clone(), Arc::new(PeerModel { k }))
        .tools(Tools::new().transactional(spec, Lookup(AtomicU64::new(0))))
        .config(cfg)
        .build()
        .unwrap();
    let session = rt
        .block_on(runner.create_session("peer", "peer-model", "You are a support agent."))
        .unwrap();
    let seed_started = Instant::now();
    store
        .with_conn(|c| {
            seed_history(
                c,
                session.id,
                &SeedShape {
                    turns: h,
                    tool_result_bytes: Vec::new(),
                    compact_every: compaction.then_some(3),
                    tool_steps: k,
                },
            )
        })
        .unwrap();
    let seed_seconds = seed_started.elapsed().as_secs_f64();
    let bytes_at_h = db_bytes(&path);

    // Time each step through the event-free path: a turn is K + 1 steps; the
    // per-step figure is the turn's time spread over its steps, sampled per turn.
    let mut per_step = Vec::new();
    let mut build = Vec::new();
    let mut context_bytes = 0;
    // The peak while the runner works (its turns), apart from this harness's
    // own build of the messages below.
    let mut turn_peak_mb: Option<f64> = Some(0.0);
    let mut next = h;
    while per_step.len() < steps {
        if !reset_peak_rss() {
            turn_peak_mb = None;
        }
        let t0 = Instant::now();
        let out = rt
            .block_on(runner.run_turn(session.id, &format!("Turn {next}: where is ORD-10042?")))
            .unwrap();
        turn_peak_mb = turn_peak_mb.map(|p| p.max(peak_rss_mb()));
        let d = t0.elapsed().as_secs_f64() / out.steps as f64;
        for _ in 0..out.steps {
            per_step.push(d * 1e3);
        }
        let b0 = Instant::now();
        let msgs = store
            .with_conn(|c| abridge::replay::build_at(c, session.id, next + 1, 0))
            .unwrap();
        let bytes = abridge::message::to_bytes(&msgs);
        context_bytes = bytes.len();
        std::hint::black_box(abridge::message::sha256_hex(&bytes));
        build.push(b0.elapsed().as_secs_f64() * 1e3);
        if compaction {
            next += 1;
        } else {
            store
                .with_conn(|c| truncate_from(c, session.id, h))
                .unwrap();
        }
    }

    // The floor with the same driver: one IMMEDIATE transaction inserting a step's bytes.
    let mut floor = Vec::new();
    {
        let conn = rusqlite::Connection::open(dir.path().join("floor.db")).unwrap();
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {}; CREATE TABLE f (id INTEGER PRIMARY KEY, a TEXT, b TEXT);",
            if sync == Synchronous::Full {
                "FULL"
            } else {
                "NORMAL"
            }
        ))
        .unwrap();
        let a = "x".repeat(300);
        let b = "y".repeat(1_500);
        let mut conn = conn;
        for _ in 0..300 {
            let t0 = Instant::now();
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            tx.execute("INSERT INTO f (a, b) VALUES (?1, ?2)", [&a, &b])
                .unwrap();
            tx.commit().unwrap();
            floor.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let step_p50 = pct(&mut per_step, 0.5);
    let floor_p50 = pct(&mut floor, 0.5);
    let out = json!({
        "lib": match (compaction, blocking) {
            (true, Blocking::Pool) => "abridge (compaction on)",
            (false, Blocking::Pool) => "abridge (compaction off)",
            (true, Blocking::InPlace) => "abridge (compaction on, Blocking::InPlace)",
            (false, Blocking::InPlace) => "abridge (compaction off, Blocking::InPlace)",
        },
        "h": h,
        "k": k,
        "step_p50_ms": step_p50,
        "step_p99_ms": pct(&mut per_step, 0.99),
        "build_p50_ms": pct(&mut build, 0.5),
        "build_p99_ms": pct(&mut build, 0.99),
        "db_bytes": bytes_at_h,
        "bytes_per_turn": bytes_at_h as f64 / h.max(1) as f64,
        "peak_rss_mb": peak_rss_mb(),
        "context_bytes": context_bytes,
        "turn_peak_rss_mb": turn_peak_mb,
        "bare_insert_ms": floor_p50,
        "relative_to_bare": step_p50 / floor_p50,
        "seed_seconds": seed_seconds,
    });
    println!("{out}");
}
