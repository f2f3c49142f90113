//! In-crate benchmarks: what a step costs, against the floor SQLite sets.
//!
//! Groups: `step` (a full two-step turn of the runner: ensure, build, hash,
//! persist the response, one transactional tool, complete; then the final step)
//! at history H = 100, 1,000, 10,000 with compaction on and off, and at
//! H = 1,000 in place, without pins, and in the default configuration (in
//! place, background compaction on; its turns also run as tasks, as a host
//! runs them); `floor` (one
//! bare rusqlite IMMEDIATE transaction inserting the bytes a step persists);
//! `ensure_noop`; `claim_race` (16 tasks on one boundary); `build` (the message
//! builder with its history read); `extract` (the built-in pin extractor over
//! a demo session's texts, apart from the step). Under `synchronous=NORMAL`
//! and `FULL`.
//!
//! At the end a table of ratios measured in this one run is printed (the
//! machine is shared and noisy: compare ratios, not absolute times).

#[path = "fixture/step.rs"]
mod step_fixture;

use abridge::{
    Blocking, CompactionConfig, ExtractiveSummariser, Runner, RunnerConfig, StoreOptions,
    Synchronous, Threshold,
};
use abridge_testkit::demo::ScriptedModel;
use abridge_testkit::seed::truncate_from;
use criterion::{BenchmarkId, Criterion};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use step_fixture::{fixture, input, rt, RESULT_SIZES};

static MEANS: Mutex<BTreeMap<String, (Duration, u64)>> = Mutex::new(BTreeMap::new());

fn record(key: &str, d: Duration, n: u64) {
    let mut m = MEANS.lock().unwrap();
    let e = m.entry(key.to_string()).or_default();
    e.0 += d;
    e.1 += n;
}

fn mean(key: &str) -> Option<f64> {
    let m = MEANS.lock().unwrap();
    m.get(key)
        .map(|(d, n)| d.as_secs_f64() / (*n).max(1) as f64)
}

fn sync_name(s: Synchronous) -> &'static str {
    match s {
        Synchronous::Normal => "normal",
        Synchronous::Full => "full",
    }
}

fn bench_step(c: &mut Criterion, rt: &tokio::runtime::Runtime, sync: Synchronous, hs: &[i64]) {
    let mut g = c.benchmark_group(format!("step/{}", sync_name(sync)));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    // (H, compaction, where store calls run): every H both ways with the
    // default blocking pool, and compaction on at H = 1,000 in place as well.
    // And at H = 1,000 with no facts pinned (what extracting them costs).
    // And the default configuration as a whole (in place, background
    // compaction on), its turns run on the thread that blocks on them and,
    // as a host runs them, as tasks on the runtime's workers (`task`).
    let mut variants: Vec<(i64, bool, Blocking, bool, bool, bool)> = hs
        .iter()
        .flat_map(|&h| {
            [
                (h, true, Blocking::Pool, true, false, false),
                (h, false, Blocking::Pool, true, false, false),
            ]
        })
        .collect();
    if hs.contains(&1_000) {
        variants.push((1_000, true, Blocking::InPlace, true, false, false));
        variants.push((1_000, true, Blocking::Pool, false, false, false));
        variants.push((1_000, true, Blocking::InPlace, true, true, false));
        variants.push((1_000, true, Blocking::InPlace, true, true, true));
    }
    for (h, compaction, blocking, pins, background, task) in variants {
        let f = fixture(
            rt,
            h,
            compaction,
            StoreOptions::default()
                .with_synchronous(sync)
                .with_blocking(blocking),
            pins,
            background,
        );
        let in_place = if blocking == Blocking::InPlace {
            "/inplace"
        } else {
            ""
        };
        let no_pins = if pins { "" } else { "/nopins" };
        let bg = if background { "/background" } else { "" };
        let as_task = if task { "/task" } else { "" };
        let key = format!(
            "step/{}/{}/H={h}{in_place}{no_pins}{bg}{as_task}",
            sync_name(sync),
            if compaction { "on" } else { "off" }
        );
        let next = std::cell::Cell::new(f.h);
        g.bench_function(
            BenchmarkId::new(
                match (compaction, blocking, pins) {
                    _ if task => "compaction_on_default_task",
                    _ if background => "compaction_on_default",
                    (true, _, false) => "compaction_on_no_pins",
                    (true, Blocking::InPlace, _) => "compaction_on_in_place",
                    (true, _, _) => "compaction_on",
                    (false, _, _) => "compaction_off",
                },
                h,
            ),
            |b| {
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let idx = next.get();
                        let t0 = Instant::now();
                        let out = if task {
                            let (r, sid, text) = (f.runner.clone(), f.session.id, input(idx));
                            rt.block_on(rt.spawn(async move { r.run_turn(sid, &text).await }))
                                .unwrap()
                        } else {
                            rt.block_on(f.runner.run_turn(f.session.id, &input(idx)))
                        }
                        .unwrap();
                        let d = t0.elapsed();
                        assert_eq!(out.steps, 2);
                        // Per step: the turn is two steps.
                        timed += d / 2;
                        if compaction {
                            next.set(idx + 1); // flat by design: history may grow
                        } else {
                            // Keep H fixed: drop the measured turn (untimed).
                            let sid = f.session.id;
                            f.store.with_conn(|c| truncate_from(c, sid, f.h)).unwrap();
                        }
                    }
                    record(&key, timed, iters);
                    timed
                })
            },
        );
    }
    g.finish();
}

/// The bytes a step persists: its response JSON, its tool result, its hash.
fn step_bytes() -> (String, String, String) {
    let response = r#"{"blocks":[{"type":"text","text":"Let me check that for you."},{"type":"tool_use","id":"call_0_0","name":"lookup_order","input":{"order_id":"ORD-10042"}}],"usage":{"input_tokens":1000,"output_tokens":20}}"#;
    let avg = RESULT_SIZES.iter().sum::<usize>() / RESULT_SIZES.len();
    (response.to_string(), "x".repeat(avg), "0".repeat(64))
}

fn bench_floor(c: &mut Criterion, sync: Synchronous) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = rusqlite::Connection::open(dir.path().join("floor.db")).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {}; CREATE TABLE floor (id INTEGER PRIMARY KEY, response TEXT, result TEXT, sha TEXT);",
        if sync == Synchronous::Full { "FULL" } else { "NORMAL" }
    ))
    .unwrap();
    let (response, result, sha) = step_bytes();
    let key = format!("floor/{}", sync_name(sync));
    let mut g = c.benchmark_group("floor");
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    g.bench_function(sync_name(sync), |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .unwrap();
                tx.prepare_cached("INSERT INTO floor (response, result, sha) VALUES (?1, ?2, ?3)")
                    .unwrap()
                    .execute([&response, &result, &sha])
                    .unwrap();
                tx.commit().unwrap();
            }
            let d = t0.elapsed();
            record(&key, d, iters);
            d
        })
    });
    g.finish();
}

fn bench_ensure_noop(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let f = fixture(
        rt,
        1_000,
        true,
        StoreOptions::default().with_blocking(Blocking::Pool),
        true,
        false,
    );
    // Below the threshold: a fresh runner with a threshold nothing reaches.
    let cfg = RunnerConfig::default().with_owner("noop").with_compaction(
        CompactionConfig::default().with_compact_at(Threshold::Tokens(1_000_000_000)),
    );
    let runner = Runner::builder(f.store.clone(), Arc::new(ScriptedModel::new(1)))
        .config(cfg)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("ensure_noop");
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    g.bench_function("below_threshold", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                let r = rt
                    .block_on(runner.compactor().ensure(&f.session, f.h + 1, 0))
                    .unwrap();
                assert!(r.is_some());
            }
            let d = t0.elapsed();
            record("ensure_noop", d, iters);
            d
        })
    });
    g.finish();
}

/// The texts a session of the demo workload gives the pin extractor: user
/// turns, `lookup_order` results (one in eight a long history of dated
/// events), shipping quotes and assistant answers, 1,600 in all.
fn extract_texts() -> Vec<(abridge::pins::FactSource, String)> {
    use abridge::pins::FactSource;
    use abridge_testkit::demo::{tool_result, user_turn};
    let mut texts = Vec::new();
    for t in 0..400u64 {
        texts.push((FactSource::User, user_turn(7, t % 10, t)));
        let order = format!("ORD-{}", 10_000 + t * 37 % 90_000);
        let postcode = format!("{:05}", t * 7_919 % 100_000);
        for (name, args) in [
            ("lookup_order", serde_json::json!({"order_id": order})),
            (
                "quote_shipping",
                serde_json::json!({"order_id": order, "postcode": postcode}),
            ),
        ] {
            let result = tool_result(name, &args).unwrap();
            texts.push((FactSource::Tool, result.to_string()));
        }
        texts.push((
            FactSource::Assistant,
            format!(
                "Order {order} is on its way; it should arrive on 2026-12-{:02}. I have noted \
                 the postal code {postcode} and will write to jane.doe{t}@example.com.",
                1 + t % 28
            ),
        ));
    }
    texts
}

/// The built-in pin extractor over [`extract_texts`] (a whole pass a
/// sample): what a turn's extraction costs apart from the step.
fn bench_extract(c: &mut Criterion) {
    use abridge::pins::{PinExtractor, RuleExtractor};
    let texts = extract_texts();
    let bytes: usize = texts.iter().map(|(_, t)| t.len()).sum();
    let facts: usize = texts
        .iter()
        .map(|(s, t)| RuleExtractor.extract(t, *s).len())
        .sum();
    println!(
        "extract: {} texts, {bytes} bytes, {facts} facts a pass",
        texts.len()
    );
    let mut g = c.benchmark_group("extract");
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    g.bench_function("demo_texts", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                for (source, text) in &texts {
                    std::hint::black_box(RuleExtractor.extract(text, *source));
                }
            }
            let d = t0.elapsed();
            record("extract/demo_texts", d, iters);
            d
        })
    });
    g.finish();
}

fn bench_claim_race(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let f = fixture(
        rt,
        200,
        false,
        StoreOptions::default().with_blocking(Blocking::Pool),
        true,
        false,
    );
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    struct Counting(Arc<std::sync::atomic::AtomicU64>);
    #[async_trait::async_trait]
    impl abridge::Summariser for Counting {
        async fn summarise(
            &self,
            r: &abridge::SummaryRequest,
        ) -> Result<abridge::SummaryResponse, abridge::ModelError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            ExtractiveSummariser.summarise(r).await
        }
    }
    let runners: Vec<Runner> = (0..16)
        .map(|i| {
            let cfg = RunnerConfig::default()
                .with_owner(format!("racer-{i}"))
                .with_compaction(
                    CompactionConfig::default()
                        .with_compact_at(Threshold::Tokens(1))
                        .with_background(None),
                );
            Runner::builder(f.store.clone(), Arc::new(ScriptedModel::new(1)))
                .summariser(Counting(calls.clone()))
                .config(cfg)
                .build()
                .unwrap()
        })
        .collect();
    let mut g = c.benchmark_group("claim_race");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let races = std::cell::Cell::new(0u64);
    // The same compaction by one task alone, then raced by sixteen: the
    // difference is what the fifteen waiters cost.
    for (tasks, name, key) in [
        (1, "1_task_alone", "claim_alone"),
        (16, "16_tasks_one_boundary", "claim_race"),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let t0 = Instant::now();
                    rt.block_on(async {
                        let mut set = tokio::task::JoinSet::new();
                        for r in &runners[..tasks] {
                            let (r, s) = (r.clone(), f.session.clone());
                            set.spawn(async move { r.compactor().ensure(&s, 200, 0).await });
                        }
                        while let Some(x) = set.join_next().await {
                            assert!(x.unwrap().unwrap().is_some());
                        }
                    });
                    timed += t0.elapsed();
                    races.set(races.get() + 1);
                    // Remove the row (untimed) so the next race claims afresh.
                    f.store
                        .with_conn(abridge_testkit::seed::clear_compactions)
                        .unwrap();
                }
                record(key, timed, iters);
                timed
            })
        });
    }
    g.finish();
    let n = calls.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "claim_race: {} races, {} summariser calls (one per race)",
        races.get(),
        n
    );
    assert_eq!(n, races.get(), "a race made more than one summariser call");
}

fn bench_build(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let mut g = c.benchmark_group("build");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for h in [100i64, 1_000, 10_000] {
        for compaction in [true, false] {
            let f = fixture(
                rt,
                h,
                compaction,
                StoreOptions::default().with_blocking(Blocking::Pool),
                true,
                false,
            );
            let key = format!("build/{}/H={h}", if compaction { "on" } else { "off" });
            g.bench_function(
                BenchmarkId::new(
                    if compaction {
                        "compaction_on"
                    } else {
                        "compaction_off"
                    },
                    h,
                ),
                |b| {
                    b.iter_custom(|iters| {
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            let msgs = f
                                .store
                                .with_conn(|c| abridge::replay::build_at(c, f.session.id, f.h, 0))
                                .unwrap();
                            let bytes = abridge::message::to_bytes(&msgs);
                            std::hint::black_box(abridge::message::sha256_hex(&bytes));
                        }
                        let d = t0.elapsed();
                        record(&key, d, iters);
                        d
                    })
                },
            );
        }
    }
    g.finish();
}

fn ratio(a: &str, b: &str) -> String {
    match (mean(a), mean(b)) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
        _ => "-".into(),
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let rt = rt();
    let quick = std::env::var("ABRIDGE_BENCH_QUICK").is_ok();
    let hs: &[i64] = if quick {
        &[100, 1_000]
    } else {
        &[100, 1_000, 10_000]
    };
    bench_floor(&mut c, Synchronous::Normal);
    bench_floor(&mut c, Synchronous::Full);
    bench_step(&mut c, &rt, Synchronous::Normal, hs);
    bench_step(&mut c, &rt, Synchronous::Full, &[1_000]);
    bench_ensure_noop(&mut c, &rt);
    bench_claim_race(&mut c, &rt);
    bench_build(&mut c, &rt);
    bench_extract(&mut c);
    c.final_summary();

    println!("\n== means in this run (µs) and ratios");
    let keys: Vec<String> = MEANS.lock().unwrap().keys().cloned().collect();
    for k in keys {
        println!("{k:<32} {:>12}", us_raw(&k));
    }
    let top = *hs.last().unwrap();
    println!(
        "\nstep/floor (NORMAL), compaction on, H=1000:  {}",
        ratio("step/normal/on/H=1000", "floor/normal")
    );
    println!(
        "step, pins extracted / none, NORMAL, compaction on, H=1000: {}",
        ratio("step/normal/on/H=1000", "step/normal/on/H=1000/nopins")
    );
    println!(
        "step/floor (NORMAL), compaction off, H=1000: {}",
        ratio("step/normal/off/H=1000", "floor/normal")
    );
    println!(
        "step/floor (NORMAL), compaction on, H=1000, Blocking::InPlace: {}",
        ratio("step/normal/on/H=1000/inplace", "floor/normal")
    );
    println!(
        "step/floor (NORMAL), the default configuration (in place, background compaction), H=1000: {}",
        ratio("step/normal/on/H=1000/inplace/background", "floor/normal")
    );
    println!(
        "step/floor (NORMAL), the default configuration, turns run as tasks, H=1000: {}",
        ratio(
            "step/normal/on/H=1000/inplace/background/task",
            "floor/normal"
        )
    );
    println!(
        "step/floor (FULL), compaction on, H=1000:    {}",
        ratio("step/full/on/H=1000", "floor/full")
    );
    println!(
        "step/floor (FULL), compaction on, H=1000, Blocking::InPlace: {}",
        ratio("step/full/on/H=1000/inplace", "floor/full")
    );
    println!(
        "step on, H={top} / H=100:                   {}",
        ratio(&format!("step/normal/on/H={top}"), "step/normal/on/H=100")
    );
    println!(
        "step off, H={top} / H=100:                  {}",
        ratio(&format!("step/normal/off/H={top}"), "step/normal/off/H=100")
    );
    println!(
        "build on, H={top} / H=100:                  {}",
        ratio(&format!("build/on/H={top}"), "build/on/H=100")
    );
    println!(
        "build off, H={top} / H=100:                 {}",
        ratio(&format!("build/off/H={top}"), "build/off/H=100")
    );
    println!(
        "ensure_noop / floor (NORMAL):              {}",
        ratio("ensure_noop", "floor/normal")
    );
    println!(
        "claim_race (16 tasks) / floor (NORMAL):    {}",
        ratio("claim_race", "floor/normal")
    );
    println!(
        "claim_race (16 tasks) / one task alone:    {}",
        ratio("claim_race", "claim_alone")
    );
}

fn us_raw(key: &str) -> String {
    mean(key).map_or("-".into(), |s| format!("{:.1}", s * 1e6))
}
