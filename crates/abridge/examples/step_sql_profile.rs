//! Where the `cargo bench --bench step` step spends its time: in SQLite's
//! statements (each one timed by SQLite's profile hook, grouped by its text),
//! and outside them.
//!
//! The workload is the bench's own (`benches/fixture/step.rs`, included by
//! path), as `step/normal/compaction_on` runs it at H = 1,000: a two-step turn
//! with one transactional tool, pins extracted, compaction inline at 2,500
//! tokens (or in the background, the default), on one connection so the hook
//! sees every statement.
//!
//! `cargo run --release --example step_sql_profile -- [TURNS] [pool|inplace] [background] [pooled] [spawned]`
//!
//! Before the statements it prints the measured turns' completed
//! compactions a step and the steps that waited for a summary (and how long
//! in all), read from the store once the run's background summaries are done.
//!
//! SQLite reports a statement's time in whole milliseconds of its clock, so a
//! statement's figure is an average over many runs of it: run enough turns
//! (the default is 2,000) for the table to settle.

#[path = "../benches/fixture/step.rs"]
#[allow(dead_code)]
mod step_fixture;

use abridge::{Blocking, StoreOptions};
use rusqlite::trace::{TraceEvent, TraceEventCodes};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use step_fixture::input;

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let turns: i64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let blocking = if args.iter().any(|a| a == "pool") {
        Blocking::Pool
    } else {
        Blocking::InPlace
    };
    let background = args.iter().any(|a| a == "background");
    // `spawned`: each turn runs as a task on the runtime's worker threads,
    // as a host runs it (otherwise on the thread that blocks on it).
    let spawned = args.iter().any(|a| a == "spawned");
    // `pooled`: the store's default pool size (the hook then sees only the
    // statements of the connection it was set on).
    let pooled = args.iter().any(|a| a == "pooled");
    let rt = step_fixture::rt();
    let mut opts = StoreOptions::default().with_blocking(blocking);
    if !pooled {
        opts = opts.with_max_connections(1);
    }
    let f = step_fixture::fixture(&rt, 1_000, true, opts, true, background);
    let (store, runner, session) = (&f.store, &f.runner, &f.session);
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
        let out = if spawned {
            // As a host runs a turn: a task on the runtime's workers.
            let (r, sid, text) = (runner.clone(), session.id, input(1_200 + i));
            rt.block_on(rt.spawn(async move { r.run_turn(sid, &text).await }))
                .unwrap()
        } else {
            rt.block_on(runner.run_turn(session.id, &input(1_200 + i)))
        }
        .unwrap();
        assert_eq!(out.steps, 2);
    }
    let wall = t0.elapsed();
    let steps = (2 * turns) as f64;
    // The measured statements, before the reads below run through the hook.
    let profile = PROFILE.lock().unwrap().take();
    // Let a background summary claimed by the last turns finish, untimed.
    rt.block_on(runner.finish_background());
    // The measured turns' compactions and the steps that waited for one.
    let first = f.h + 200;
    let sid = session.id;
    let (compactions, waits, wait_ms) = store
        .with_conn(move |c| {
            let compactions: i64 = c.query_row(
                "SELECT count(*) FROM compactions WHERE session_id = ?1 \
                 AND up_to_turn_index >= ?2 AND status = 'completed'",
                rusqlite::params![sid, first - 1],
                |r| r.get(0),
            )?;
            let (waits, wait_ms): (i64, i64) = c.query_row(
                "SELECT count(*), coalesce(sum(s.summary_wait_ms), 0) FROM steps s \
                 JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?1 AND t.idx >= ?2 \
                 AND s.summary_wait_ms > 0",
                rusqlite::params![sid, first],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok((compactions, waits, wait_ms))
        })
        .unwrap();
    let mut rows: Vec<_> = profile.iter().flat_map(|m| m.iter()).collect();
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
    let _ = writeln!(
        out,
        "compactions: {:.3} a step; steps that waited for a summary: {waits} ({wait_ms} ms in all)",
        compactions as f64 / steps
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
