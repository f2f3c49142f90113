//! Where the `cargo bench --bench step` step spends its time: in SQLite's
//! statements (each one timed by SQLite's profile hook, grouped by its text),
//! and outside them.
//!
//! The workload is the bench's `step/normal/compaction_on` at H = 1,000: a
//! two-step turn with one transactional tool, pins extracted, compaction inline
//! at 2,500 tokens, on one connection so the hook sees every statement.
//!
//! `cargo run --release --example step_sql_profile -- [TURNS] [pool|inplace] [background] [pooled]`
//!
//! SQLite reports a statement's time in whole milliseconds of its clock, so a
//! statement's figure is an average over many runs of it: run enough turns
//! (the default is 2,000) for the table to settle.

use abridge::demo::{DemoTxTool, ScriptedModel};
use abridge::store::bench::{seed_history, SeedShape};
use abridge::{
    Blocking, CompactionConfig, ExtractiveSummariser, Runner, RunnerConfig, Store, StoreOptions,
    Threshold, ToolSpec, Tools,
};
use rusqlite::trace::{TraceEvent, TraceEventCodes};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per statement text: runs and total time.
static PROFILE: Mutex<Option<HashMap<String, (u64, Duration)>>> = Mutex::new(None);

fn hook(event: TraceEvent<'_>) {
    if let TraceEvent::Profile(stmt, took) = event {
        // Looked up by the borrowed text: no allocation per statement run.
        let sql = stmt.sql();
        let mut guard = PROFILE.lock().unwrap();
        let map = guard.get_or_insert_with(HashMap::new);
        let e = match map.get_mut(sql.as_ref()) {
            Some(e) => e,
            None => map.entry(sql.to_string()).or_default(),
        };
        e.0 += 1;
        e.1 += took;
    }
}

fn input(idx: i64) -> String {
    format!(
        "Turn {idx}: where is order ORD-{} and can you ship to 10{:03}?",
        10_000 + idx,
        idx % 1000
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let turns: i64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let blocking = if args.iter().any(|a| a == "pool") {
        Blocking::Pool
    } else {
        Blocking::InPlace
    };
    let background = args.iter().any(|a| a == "background");
    // `pooled`: the store's default pool size (the hook then sees only the
    // statements of the connection it was set on).
    let pooled = args.iter().any(|a| a == "pooled");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = StoreOptions::default().with_blocking(blocking);
    if !pooled {
        opts = opts.with_max_connections(1);
    }
    let store = Store::open_with(dir.path().join("profile.db"), opts).unwrap();
    store
        .with_conn(abridge::store::demo::create_demo_tables)
        .unwrap();
    let mut cfg = RunnerConfig::default().with_owner("profile");
    cfg.compaction = CompactionConfig::default().with_compact_at(Threshold::Tokens(2_500));
    if !background {
        cfg.compaction.background = None;
    }
    let spec = ToolSpec {
        name: "lookup_order".into(),
        description: "Look up an order".into(),
        input_schema: serde_json::json!({"type": "object"}),
    };
    let runner = Runner::builder(store.clone(), Arc::new(ScriptedModel::new(1)))
        .tools(Tools::new().transactional(spec, DemoTxTool("lookup_order")))
        .summariser(ExtractiveSummariser)
        .config(cfg)
        .build()
        .unwrap();
    let session = rt
        .block_on(runner.create_session("profile", "bench-model", abridge::demo::SYSTEM_PROMPT))
        .unwrap();
    let shape = SeedShape {
        turns: 1_000,
        tool_result_bytes: vec![200, 800, 2_000, 4_000, 1_200, 600],
        compact_every: Some(4),
        tool_steps: 1,
    };
    store
        .with_conn(|c| seed_history(c, session.id, &shape))
        .unwrap();
    // Warm up: statement caches, the kept context, the first compactions.
    for i in 0..200 {
        rt.block_on(runner.run_turn(session.id, &input(1_000 + i)))
            .unwrap();
    }
    store
        .with_conn(|c| {
            c.as_sqlite()
                .expect("a SQLite store")
                .trace_v2(TraceEventCodes::SQLITE_TRACE_PROFILE, Some(hook));
            Ok(())
        })
        .unwrap();
    let t0 = Instant::now();
    for i in 0..turns {
        let out = rt
            .block_on(runner.run_turn(session.id, &input(1_200 + i)))
            .unwrap();
        assert_eq!(out.steps, 2);
    }
    let wall = t0.elapsed();
    let steps = (2 * turns) as f64;
    let guard = PROFILE.lock().unwrap();
    let mut rows: Vec<_> = guard.iter().flat_map(|m| m.iter()).collect();
    rows.sort_by_key(|(_, (_, took))| std::cmp::Reverse(*took));
    let in_sql: Duration = rows.iter().map(|(_, (_, took))| *took).sum();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / steps;
    // A closed pipe (`| head`) ends the listing, not the process with a panic.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "per step: {:.1} µs, of which {:.1} µs in SQLite statements ({:.0}%)",
        us(wall),
        us(in_sql),
        100.0 * in_sql.as_secs_f64() / wall.as_secs_f64()
    );
    let _ = writeln!(out, "{:>10} {:>10}  statement", "µs/step", "runs/step");
    for (sql, (runs, took)) in rows {
        let one_line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        let short: String = one_line.chars().take(100).collect();
        let _ = writeln!(
            out,
            "{:>10.2} {:>10.2}  {short}",
            us(*took),
            *runs as f64 / steps
        );
    }
}
