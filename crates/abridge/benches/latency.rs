//! What a user of a host waits for: per-step latency with a slow summariser.
//!
//! The demo workload (3 concurrent sessions × 40 turns, threshold 4,000
//! tokens) with a simulated model latency of 200 ms and a summariser latency
//! of 2 s, run three ways on fresh stores: background compaction on (the
//! default), off (every compaction inline), and a session that never compacts
//! (threshold off: the latency floor). A step's latency is the time from its
//! claim to its stored response (`steps.created_at` → `responded_at`): the
//! summary it waited for, if any, and the model call. Printed: p50, p99 and
//! max per run, the steps that waited for a summary and how many of them
//! waited while their context was still under the hard threshold (target:
//! none), and p99 with background compaction over p99 never compacting
//! (target ≤ 1.2), in one run. Per session too: `demo-42-0` carries ~1,000-token
//! tool results (a quarter of the threshold), which take a turn from under
//! the soft threshold to past the hard one in one step.
//!
//! `cargo bench --bench latency` (about 3 minutes); `ABRIDGE_BENCH_QUICK=1`
//! divides both latencies by 10.

use abridge::Threshold;
use abridge_testkit::demo::{run_demo, DemoOptions};
use std::time::Duration;

struct Run {
    name: &'static str,
    /// Per session: step latencies (ms), steps that waited, of them under the hard threshold.
    sessions: Vec<(String, Vec<i64>, usize, usize)>,
    compactions: i64,
    background: i64,
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn all(r: &Run) -> Vec<i64> {
    let mut v: Vec<i64> = r.sessions.iter().flat_map(|s| s.1.clone()).collect();
    v.sort();
    v
}

async fn run(
    name: &'static str,
    compact_at: Threshold,
    background: bool,
    model: Duration,
    summary: Duration,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("latency.db");
    let opts = DemoOptions {
        db: db.clone(),
        compact_at,
        model_latency: model,
        summary_latency: summary,
        background,
        ..Default::default()
    };
    let report = run_demo(&opts, |_| {}).await.unwrap();
    let hard = match compact_at {
        Threshold::Tokens(n) => n as i64,
        _ => i64::MAX,
    };
    let conn = abridge::store::open_read_only(&db).unwrap();
    let mut sessions = Vec::new();
    let mut st = conn
        .prepare(
            "SELECT x.external_id, s.responded_at - s.created_at, s.summary_wait_ms, \
             s.context_tokens FROM steps s JOIN turns t ON t.id = s.turn_id \
             JOIN sessions x ON x.id = t.session_id WHERE s.responded_at IS NOT NULL \
             ORDER BY x.external_id, t.idx, s.idx",
        )
        .unwrap();
    let rows: Vec<(String, i64, Option<i64>, Option<i64>)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // The measure a step decided on is the previous step's context.
    let mut prev: Option<(String, Option<i64>)> = None;
    for (ext, ms, waited, context) in rows {
        if sessions
            .last()
            .is_none_or(|s: &(String, Vec<i64>, usize, usize)| s.0 != ext)
        {
            sessions.push((ext.clone(), Vec::new(), 0, 0));
        }
        let s = sessions.last_mut().unwrap();
        s.1.push(ms);
        if waited.is_some() {
            s.2 += 1;
            let measure = prev.as_ref().filter(|p| p.0 == ext).and_then(|p| p.1);
            if measure.is_none_or(|m| m < hard) {
                s.3 += 1;
            }
        }
        prev = Some((ext, context));
    }
    Run {
        name,
        sessions,
        compactions: report.compactions_completed,
        background: report.compactions_background,
    }
}

fn main() {
    let quick = std::env::var("ABRIDGE_BENCH_QUICK").is_ok_and(|v| v == "1");
    let scale = if quick { 10 } else { 1 };
    let model = Duration::from_millis(200 / scale);
    let summary = Duration::from_millis(2_000 / scale);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let runs = rt.block_on(async {
        vec![
            run(
                "background on",
                Threshold::Tokens(4_000),
                true,
                model,
                summary,
            )
            .await,
            run(
                "background off (inline)",
                Threshold::Tokens(4_000),
                false,
                model,
                summary,
            )
            .await,
            run("never compacts", Threshold::Off, true, model, summary).await,
        ]
    });
    println!(
        "\nper-step latency, model {} ms, summariser {} ms (ms: p50 / p99 / max)\n",
        model.as_millis(),
        summary.as_millis()
    );
    println!(
        "{:<26} {:>6} {:>6} {:>6} {:>7} {:>8} {:>12} {:>11}",
        "run", "p50", "p99", "max", "steps", "waited", "under hard", "compactions"
    );
    for r in &runs {
        let v = all(r);
        let waited: usize = r.sessions.iter().map(|s| s.2).sum();
        let under: usize = r.sessions.iter().map(|s| s.3).sum();
        println!(
            "{:<26} {:>6} {:>6} {:>6} {:>7} {:>8} {:>12} {:>5} ({} bg)",
            r.name,
            pct(&v, 0.5),
            pct(&v, 0.99),
            v.last().copied().unwrap_or(0),
            v.len(),
            waited,
            under,
            r.compactions,
            r.background
        );
        for (ext, lat, waited, under) in &r.sessions {
            let mut l = lat.clone();
            l.sort();
            println!(
                "  {:<24} {:>6} {:>6} {:>6} {:>7} {:>8} {:>12}",
                ext,
                pct(&l, 0.5),
                pct(&l, 0.99),
                l.last().copied().unwrap_or(0),
                l.len(),
                waited,
                under
            );
        }
    }
    let p99 = |r: &Run| pct(&all(r), 0.99) as f64;
    let base = p99(&runs[2]).max(1.0);
    println!(
        "\nratio (one run): p99 background on / never compacts = {:.2} (target <= 1.2); \
         background off / never compacts = {:.2}",
        p99(&runs[0]) / base,
        p99(&runs[1]) / base
    );
    // Per session, without the one whose single steps jump past the threshold.
    let light = |r: &Run| {
        let mut v: Vec<i64> = r
            .sessions
            .iter()
            .filter(|s| s.0 != "demo-42-0")
            .flat_map(|s| s.1.clone())
            .collect();
        v.sort();
        pct(&v, 0.99) as f64
    };
    println!(
        "ratio (one run), demo-42-1 and demo-42-2: p99 background on / never compacts = {:.2}; \
         background off / never compacts = {:.2}",
        light(&runs[0]) / light(&runs[2]).max(1.0),
        light(&runs[1]) / light(&runs[2]).max(1.0)
    );
}
