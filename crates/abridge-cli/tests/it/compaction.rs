//! Exactly-once compaction: thresholds, boundaries, racing claims, crashes
//! mid-summary, stale completers, folding, chunking, acceptance (G1, G2, G4, G7)
//! and G3 holding with compaction on.

use crate::common;
use abridge::compaction::{FailurePolicy, SummaryRequest, SummaryResponse};
use abridge::{Error, Event, EventKind, ModelError, Runner, RunnerConfig, Summariser, Threshold};
use abridge_testkit::demo::{demo_tools, user_turn, DEMO_MODEL};
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SEED: u64 = 21;

/// A summariser with a fixed answer and latency.
struct Fixed(String, Duration);

#[abridge::async_trait]
impl Summariser for Fixed {
    async fn summarise(&self, _: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        tokio::time::sleep(self.1).await;
        Ok(SummaryResponse {
            text: self.0.clone(),
            usage: Default::default(),
        })
    }
}

/// A summariser that says when it has started and then waits for its gate:
/// lets a test order two holders of one row without sleeping.
struct Gated {
    text: String,
    started: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
    returned: Arc<std::sync::atomic::AtomicBool>,
}

impl Gated {
    fn new(text: &str) -> Arc<Gated> {
        Arc::new(Gated {
            text: text.into(),
            started: Default::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            returned: Default::default(),
        })
    }
    fn open(&self) {
        self.gate.add_permits(1);
    }
    fn returned(&self) -> bool {
        self.returned.load(Ordering::SeqCst)
    }
}

#[abridge::async_trait]
impl Summariser for Gated {
    async fn summarise(&self, _: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        self.started.notify_one();
        self.gate.acquire().await.unwrap().forget();
        self.returned.store(true, Ordering::SeqCst);
        Ok(SummaryResponse {
            text: self.text.clone(),
            usage: Default::default(),
        })
    }
}

/// Waits (up to 30 s, failing rather than hanging) for the first event `want`
/// accepts.
async fn wait_for_event(
    rx: &mut tokio::sync::broadcast::Receiver<Event>,
    want: impl Fn(&Event) -> bool,
) -> Event {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = rx
                .recv()
                .await
                .expect("the event stream ended before the event came");
            if want(&e) {
                return e;
            }
        }
    })
    .await
    .expect("the event never came")
}

fn runner_with(
    store: &abridge::Store,
    owner: &str,
    summariser: Arc<dyn Summariser>,
    tune: impl FnOnce(&mut RunnerConfig),
) -> Runner {
    runner_with_model(
        store,
        owner,
        Arc::new(demo_model(SEED, &[])),
        summariser,
        tune,
    )
}

fn runner_with_model(
    store: &abridge::Store,
    owner: &str,
    model: Arc<dyn abridge::ModelClient>,
    summariser: Arc<dyn Summariser>,
    tune: impl FnOnce(&mut RunnerConfig),
) -> Runner {
    let mut cfg = test_config(Threshold::Tokens(1), None, owner);
    tune(&mut cfg);
    Runner::builder(store.clone(), model)
        .tools(demo_tools(None, Duration::ZERO))
        .summariser_arc(summariser)
        .config(cfg)
        .build()
        .unwrap()
}

fn extractive() -> Arc<dyn Summariser> {
    Arc::new(abridge::ExtractiveSummariser)
}

/// A session with `turns` completed turns and no compaction.
async fn history(store: &abridge::Store, turns: u64) -> abridge::store::SessionRow {
    uncompacted_history(store, SEED, turns).await
}

fn latest_measure(store: &abridge::Store) -> i64 {
    store
        .with_conn(|c| {
            c.query_row(
                "SELECT s.context_tokens FROM steps s JOIN turns t ON s.turn_id = t.id \
                 ORDER BY t.idx DESC, s.idx DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
        })
        .unwrap()
}

fn rows(store: &abridge::Store) -> Vec<(abridge::CompactionId, i64, String)> {
    store
        .with_conn(|c| {
            let mut st =
                c.prepare("SELECT id, up_to_turn_index, status FROM compactions ORDER BY id")?;
            let v = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(v.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

/// What the summariser wrote: the stored summary less what the guard
/// added after it (the user's own words, the pinned block).
fn written(summary: &str) -> &str {
    let cut = |s: &'static str| summary.find(s).unwrap_or(summary.len());
    let end = cut("\n\n## The user's own words").min(cut("\n\n## Pinned facts\n"));
    &summary[..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_threshold_compacts_at_the_measure_and_not_below() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let m = latest_measure(&store);
    let below = runner_with(&store, "below", extractive(), |c| {
        c.compaction.compact_at = Threshold::Tokens(m as u64 + 1)
    });
    assert_eq!(below.compactor().ensure(&s, 5, 0).await.unwrap(), None);
    assert!(rows(&store).is_empty());
    let at = runner_with(&store, "at", extractive(), |c| {
        c.compaction.compact_at = Threshold::Tokens(m as u64)
    });
    let row = at.compactor().ensure(&s, 5, 0).await.unwrap().unwrap();
    assert_eq!((row.up_to_turn_index, row.trigger_tokens), (4, Some(m)));
    assert_eq!(rows(&store).len(), 1);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fraction_threshold_uses_the_context_window() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 4).await;
    let m = latest_measure(&store) as u64;
    let window = m * 2;
    let below = runner_with(&store, "below", extractive(), |c| {
        c.compaction = c
            .compaction
            .clone()
            .with_context_window(DEMO_MODEL, window)
            .with_compact_at(Threshold::Fraction(0.51));
    });
    assert_eq!(below.compactor().ensure(&s, 4, 0).await.unwrap(), None);
    let at = runner_with(&store, "at", extractive(), |c| {
        c.compaction = c
            .compaction
            .clone()
            .with_context_window(DEMO_MODEL, window)
            .with_compact_at(Threshold::Fraction(0.5));
    });
    assert!(at.compactor().ensure(&s, 4, 0).await.unwrap().is_some());
}

/// A fraction threshold needs the model's window: a model with none known is
/// refused when the runner is built (for the models it is told of) and when a
/// session is created, never silently left uncompacted; a session stored with
/// one earlier runs uncompacted, said once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_window_with_a_fraction_threshold_is_refused_and_a_stored_one_is_said_once() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let fraction = |c: &mut RunnerConfig| {
        c.compaction.context_windows.clear();
        c.compaction.compact_at = Threshold::Fraction(0.01);
    };
    let r = runner_with(&store, "u", extractive(), fraction);
    match r
        .create_session("unknown", "model-nobody-knows", "sys")
        .await
    {
        Err(abridge::Error::UnknownWindow { model }) => assert_eq!(model, "model-nobody-knows"),
        other => panic!("expected UnknownWindow, got {other:?}"),
    }
    // Told of the models, the builder refuses at once.
    let mut cfg = test_config(Threshold::Tokens(1), None, "b");
    fraction(&mut cfg);
    let built = |models: &[&str]| {
        Runner::builder(store.clone(), Arc::new(demo_model(SEED, &[])))
            .config(cfg.clone())
            .models(models.iter().copied())
            .build()
    };
    assert!(matches!(
        built(&["gpt-4o", "gpt-4.5"]),
        Err(abridge::Error::UnknownWindow { model }) if model == "gpt-4.5"
    ));
    assert!(built(&["gpt-4o", "claude-sonnet-4-20250514"]).is_ok());
    // A session stored earlier with such a model (here by a runner with a
    // token threshold) runs uncompacted, and says so once.
    let tokens = runner_with(&store, "t", extractive(), |_| {});
    let sid = tokens
        .create_session("unknown", "model-nobody-knows", "sys")
        .await
        .unwrap()
        .id;
    let mut events = r.subscribe();
    for t in 0..4 {
        r.run_turn_at(sid, t, &user_turn(SEED, 0, t as u64))
            .await
            .unwrap();
    }
    assert!(rows(&store).is_empty());
    let mut warnings = 0;
    for e in common::drained(&mut events) {
        if let EventKind::Warning { message } = e.kind {
            assert!(message.contains("model-nobody-knows"));
            warnings += 1;
        }
    }
    assert_eq!(warnings, 1);
}

/// The built-in windows are exact ids and their dated or versioned
/// snapshots; nothing matches by prefix (`gpt-4.5` is not `gpt-4`).
#[test]
fn built_in_windows_match_exact_ids_and_their_snapshots_only() {
    let cfg = abridge::CompactionConfig::default();
    let w = |m: &str| cfg.context_window(m);
    assert_eq!(w("gpt-4o-mini"), Some(128_000));
    assert_eq!(w("gpt-4o-2024-08-06"), Some(128_000));
    assert_eq!(w("gpt-4"), Some(8_192));
    assert_eq!(w("gpt-4-0613"), Some(8_192));
    assert_eq!(w("gpt-4.1-mini-2025-04-14"), Some(1_047_576));
    assert_eq!(w("claude-sonnet-4-5"), Some(200_000));
    assert_eq!(w("claude-sonnet-4-20250514"), Some(200_000));
    assert_eq!(w("claude-3-5-sonnet-latest"), Some(200_000));
    assert_eq!(w("gemini-1.5-pro-002"), Some(2_097_152));
    for unknown in [
        "gpt-4.5",
        "gpt-4o-audio",
        "claude",
        "gpt-4-",
        "llama-3-70b",
        "nope",
        "",
    ] {
        assert_eq!(w(unknown), None, "{unknown:?}");
    }
    // The host's own entries win, by exact id.
    let cfg = cfg.with_context_window("gpt-4", 9_000);
    assert_eq!(cfg.context_window("gpt-4"), Some(9_000));
    assert_eq!(cfg.context_window("gpt-4-0613"), Some(8_192));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_never_compacts_but_completed_rows_still_apply() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 4).await;
    let on = runner_with(&store, "on", extractive(), |_| {});
    let row = on.compactor().ensure(&s, 4, 0).await.unwrap().unwrap();
    let off = runner_with(&store, "off", extractive(), |c| {
        c.compaction.compact_at = Threshold::Off
    });
    assert_eq!(
        off.compactor().ensure(&s, 4, 0).await.unwrap(),
        Some(row.clone())
    );
    assert_eq!(off.compactor().ensure(&s, 9, 0).await.unwrap(), Some(row));
    assert_eq!(rows(&store).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_last_turns_stay_verbatim_after_the_summary() {
    let (_d, path) = temp_db();
    let store = open(&path);
    history(&store, 6).await;
    let r = runner_with(&store, "k", extractive(), |c| {
        c.compaction.keep_last_turns = 2
    });
    let out = r
        .run_turn_at(abridge::SessionId(1), 6, &user_turn(SEED, 0, 6))
        .await
        .unwrap();
    let (row_boundary, step_id): (i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT c.up_to_turn_index, s.id FROM steps s JOIN compactions c ON s.compaction_id = c.id \
                 ORDER BY s.id LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    assert_eq!(row_boundary, 3);
    let rebuilt = store
        .with_conn(|c| abridge::replay::rebuild_step(c, abridge::StepId(step_id)))
        .unwrap();
    let text = String::from_utf8(rebuilt.bytes).unwrap();
    for t in [4, 5, 6] {
        let input = serde_json::to_string(&user_turn(SEED, 0, t)).unwrap();
        assert!(
            text.contains(input.trim_matches('"')),
            "turn {t} not verbatim"
        );
    }
    assert!(text.contains("[Summary of the conversation so far (turns 0 to 3)"));
    assert!(out.steps >= 1);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_never_compacted_twice_and_compaction_never_loops() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let summ = Counting::new(abridge::ExtractiveSummariser);
    let r = runner_with(&store, "t", summ.clone(), |_| {}); // Tokens(1): every step is over
    let sid = demo_session(&r, SEED, 0).await;
    let mut steps = 0;
    for t in 0..10 {
        // A compaction loop would never end the turn: fail instead of hanging.
        steps += tokio::time::timeout(
            Duration::from_secs(60),
            r.run_turn_at(sid, t, &user_turn(SEED, 0, t as u64)),
        )
        .await
        .expect("the turn did not end: compaction loops")
        .unwrap()
        .steps;
    }
    let all = rows(&store);
    assert!(all.len() <= 9, "{all:?}");
    assert!(steps > 10, "multi-step turns expected: {steps}");
    // One summariser call per row, whatever the number of steps over the threshold.
    assert_eq!(summ.count(), all.len());
    let boundaries: std::collections::BTreeSet<i64> = all.iter().map(|r| r.1).collect();
    assert_eq!(boundaries.len(), all.len());
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_on_one_boundary_make_one_row_and_one_summariser_call() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 6).await;
    let summ = Counting::new(Fixed(
        "orders ORD-1 and ORD-2; nothing open".into(),
        Duration::from_millis(200),
    ));
    let runners: Vec<Runner> = (0..8)
        .map(|i| runner_with(&store, &format!("racer-{i}"), summ.clone(), |_| {}))
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for r in runners {
        let s = s.clone();
        set.spawn(async move { r.compactor().ensure(&s, 6, 0).await });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(r) = set.join_next().await {
        ids.insert(r.unwrap().unwrap().unwrap().id);
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(
        rows(&store),
        vec![(*ids.first().unwrap(), 5, "completed".into())]
    );
    assert_eq!(summ.count(), 1);
    assert_verified(&store);
}

#[test]
fn racing_processes_on_one_boundary_make_one_row() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_d, path) = temp_db();
    let store = open(&path);
    rt.block_on(history(&store, 6));
    drop(store);
    let children: Vec<_> = (0..4)
        .map(|_| {
            abridge_cmd()
                .args(["compact", "--db"])
                .arg(db_for(&path))
                .args(["--session", "1"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}: stdout {:?}, stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8(out.stdout).unwrap();
        ids.insert(line.split_whitespace().nth(1).unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let c = read_only_conn(&path);
    let (n, attempts): (i64, i64) = c
        .query_row("SELECT count(*), max(attempts) FROM compactions", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    // One row, claimed once: no process took it over and summarised again.
    assert_eq!((n, attempts), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_dropped_mid_summary_is_taken_over_at_once_by_the_next_runner() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let crashing = runner_with(&store, "crashing", extractive(), |c| {
        c.testing.fault_hook = Some(fail_at(abridge::FaultPoint::MidSummary, 1));
        c.compaction.lease_ttl = Duration::from_millis(300);
    });
    let err = crashing.compactor().ensure(&s, 5, 0).await.unwrap_err();
    assert!(matches!(err, Error::Injected(_)));
    let pending = rows(&store);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].2, "pending");
    // A different process: it waits for the lease, then takes the row over.
    let next = runner_with(&store, "next", extractive(), |c| {
        c.take_over_dead_local_owners = false
    });
    let out = next
        .run_turn_at(s.id, 5, &user_turn(SEED, 0, 5))
        .await
        .unwrap();
    let after = rows(&store);
    assert_eq!(after, vec![(pending[0].0, 4, "completed".into())]);
    let (attempts, reads): (i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT attempts, (SELECT count(*) FROM steps WHERE compaction_id = compactions.id) FROM compactions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    assert_eq!((attempts, reads), (2, out.steps));
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completer_cannot_overwrite_the_winners_summary() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let stale_summariser = Gated::new("STALE summary ORD-1");
    let stale = runner_with(&store, "stale", stale_summariser.clone(), |c| {
        c.testing.heartbeat = false; // frozen: its lease runs out mid-summary
                                     // Long enough that the winner finds the claim live even on a loaded
                                     // machine (it must wait before it takes the row over).
        c.compaction.lease_ttl = Duration::from_millis(1_000);
    });
    let winner = runner_with(
        &store,
        "winner",
        Arc::new(Fixed("WINNER summary ORD-1".into(), Duration::ZERO)),
        |_| {},
    );
    let mut stale_events = stale.subscribe();
    let mut winner_events = winner.subscribe();
    let s2 = s.clone();
    let late = tokio::spawn(async move { stale.compactor().ensure(&s2, 5, 0).await });
    // The stale holder has claimed the row and is inside its summariser.
    stale_summariser.started.notified().await;
    // The winner waits on the live claim, takes the row over once its lease
    // has run out, and completes it.
    let won = winner.compactor().ensure(&s, 5, 0).await.unwrap().unwrap();
    assert_eq!(
        won.summary.as_deref().map(written),
        Some("WINNER summary ORD-1")
    );
    assert_eq!(won.attempts, 2, "the winner took the row over");
    wait_for_event(
        &mut winner_events,
        |e| matches!(&e.kind, EventKind::CompactionWaiting { holder, .. } if holder == "stale"),
    )
    .await;
    // Only now does the stale summariser answer: its completion is refused
    // and it gets the winner's row.
    assert!(!stale_summariser.returned());
    stale_summariser.open();
    let seen_by_stale = late.await.unwrap().unwrap().unwrap();
    assert!(stale_summariser.returned(), "the stale path did not run");
    assert_eq!(seen_by_stale, won);
    let stored: String = store
        .with_conn(|c| c.query_row("SELECT summary FROM compactions", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(written(&stored), "WINNER summary ORD-1");
    // The stale holder claimed (Compacting) but never reported a completion.
    let stale_saw = common::drained(&mut stale_events);
    assert!(
        stale_saw
            .iter()
            .any(|e| matches!(e.kind, EventKind::CompactionClaimed { .. })),
        "{stale_saw:?}"
    );
    assert!(
        !stale_saw
            .iter()
            .any(|e| matches!(e.kind, EventKind::Compacted { .. })),
        "{stale_saw:?}"
    );
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_from_turn_one_survives_five_compactions() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let r = runner_with(&store, "f", extractive(), |c| {
        c.compaction.compact_at = Threshold::Tokens(700)
    });
    let sid = demo_session(&r, SEED, 0).await;
    r.run_turn_at(sid, 0, &user_turn(SEED, 0, 0)).await.unwrap();
    r.run_turn_at(
        sid,
        1,
        "Please note my loyalty card is ZX-99817, keep it on file.",
    )
    .await
    .unwrap();
    let mut t = 2;
    while rows(&store).iter().filter(|r| r.2 == "completed").count() < 5 {
        r.run_turn_at(sid, t, &user_turn(SEED, 0, t as u64))
            .await
            .unwrap();
        t += 1;
        assert!(t < 60, "fewer than five compactions in 60 turns");
    }
    let latest: String = store
        .with_conn(|c| {
            c.query_row(
                "SELECT summary FROM compactions WHERE status = 'completed' ORDER BY up_to_turn_index DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(latest.contains("ZX-99817"), "{latest}");
    assert_verified(&store);
}

/// Records the size of every request and answers with a short summary.
struct Recording {
    max_request_tokens: AtomicU64,
    calls: AtomicU64,
    previous_seen: Mutex<Vec<bool>>,
}

#[abridge::async_trait]
impl Summariser for Recording {
    async fn summarise(&self, req: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        use abridge::TokenCounter;
        let n = abridge::compaction::CharsPerFour.count(&req.rules)
            + abridge::compaction::CharsPerFour.count(&req.body());
        self.max_request_tokens.fetch_max(n, Ordering::SeqCst);
        let k = self.calls.fetch_add(1, Ordering::SeqCst);
        self.previous_seen
            .lock()
            .unwrap()
            .push(req.previous.is_some());
        Ok(SummaryResponse {
            text: format!("running summary after chunk {k}"),
            usage: abridge::Usage {
                input_tokens: Some(n),
                output_tokens: Some(5),
                ..Default::default()
            },
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_ten_times_the_budget_is_summarised_in_chunks_that_each_fit() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 34).await;
    let rec = Arc::new(Recording {
        max_request_tokens: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        previous_seen: Mutex::new(Vec::new()),
    });
    let budget = 1_000;
    let r = runner_with(&store, "chunks", rec.clone(), |c| {
        c.compaction.input_budget_tokens = budget;
        c.compaction.max_summary_chars = 300;
    });
    let row = r.compactor().ensure(&s, 34, 0).await.unwrap().unwrap();
    let calls = rec.calls.load(Ordering::SeqCst);
    assert!(
        row.tokens_before.unwrap() as u64 >= 10 * budget,
        "span {:?}",
        row.tokens_before
    );
    assert!(calls >= 10, "{calls} calls");
    assert!(rec.max_request_tokens.load(Ordering::SeqCst) <= budget);
    // Each chunk after the first folds the running summary in.
    let seen = rec.previous_seen.lock().unwrap().clone();
    assert!(!seen[0] && seen[1..].iter().all(|p| *p));
    assert_eq!(
        (row.summary_calls, row.input_tokens.is_some()),
        (calls as i64, true)
    );
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_not_smaller_summaries_are_failed_attempts_and_the_policy_decides() {
    for (answer, policy, want_err) in [
        (String::new(), FailurePolicy::ProceedUncompacted, false),
        ("x ".repeat(2_900), FailurePolicy::ProceedUncompacted, false),
        (String::new(), FailurePolicy::FailTurn, true),
    ] {
        let (_d, path) = temp_db();
        let store = open(&path);
        let s = history(&store, 2).await;
        let summ = Counting::new(Fixed(answer.clone(), Duration::ZERO));
        let r = runner_with(&store, "g7", summ.clone(), |c| {
            c.compaction.on_failure = policy;
            c.compaction.max_summary_chars = 6_000;
            // No cap by the threshold's share: the answer is stored whole.
            c.compaction.max_summary_share = None;
        });
        let out = r.run_turn_at(s.id, 2, &user_turn(SEED, 0, 2)).await;
        let all = rows(&store);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].2, "failed");
        assert_eq!(summ.count(), 3, "three attempts");
        let error: String = store
            .with_conn(|c| c.query_row("SELECT error FROM compactions", [], |r| r.get(0)))
            .unwrap();
        assert!(
            error.contains(if answer.is_empty() {
                "empty"
            } else {
                "not smaller"
            }),
            "{error}"
        );
        if want_err {
            assert!(
                matches!(out, Err(Error::CompactionFailed { .. })),
                "{out:?}"
            );
        } else {
            out.unwrap();
            let read: i64 = store
                .with_conn(|c| {
                    c.query_row(
                        "SELECT count(*) FROM steps WHERE compaction_id IS NOT NULL",
                        [],
                        |r| r.get(0),
                    )
                })
                .unwrap();
            assert_eq!(read, 0, "a step read a failed compaction");
        }
        // A failed boundary can be retried on request.
        let good = runner_with(&store, "retry", extractive(), |_| {});
        assert!(good.compactor().retry_failed(s.id, 1).await.unwrap());
        if want_err {
            // The turn failed; the boundary stays reachable by manual compaction.
            let row = good.compact_now(s.id, None).await.unwrap();
            assert_eq!(row.status, abridge::store::CompactionStatus::Completed);
        }
        assert_verified(&store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_summary_is_cut_on_a_char_boundary() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 8).await;
    let r = runner_with(
        &store,
        "cut",
        Arc::new(Fixed("é🙂漢".repeat(400), Duration::ZERO)),
        |c| {
            c.compaction.max_summary_chars = 500;
        },
    );
    let row = r.compactor().ensure(&s, 8, 0).await.unwrap().unwrap();
    let summary = row.summary.unwrap();
    let summary = written(&summary);
    assert_eq!(summary.chars().count(), 500);
    assert!("é🙂漢".repeat(400).starts_with(summary));
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_compaction_racing_an_automatic_one_makes_one_row() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let manual_summariser = Gated::new("manual: ORD-1");
    let auto_summariser = Counting::new(Fixed("auto: ORD-1".into(), Duration::ZERO));
    let manual = runner_with(&store, "manual", manual_summariser.clone(), |_| {});
    let auto = runner_with(&store, "auto", auto_summariser.clone(), |_| {});
    let mut auto_events = auto.subscribe();
    let sid = s.id;
    let m =
        tokio::spawn(async move { manual.compact_now(sid, Some("order numbers".into())).await });
    // The manual compaction holds the row at boundary 4 and is summarising.
    manual_summariser.started.notified().await;
    let input = user_turn(SEED, 0, 5);
    let a = tokio::spawn(async move { auto.run_turn_at(sid, 5, &input).await });
    // The automatic one has reached the same row and waits on it: a race.
    let waited = wait_for_event(&mut auto_events, |e| {
        matches!(e.kind, EventKind::CompactionWaiting { .. })
    })
    .await;
    assert!(
        matches!(&waited.kind, EventKind::CompactionWaiting { boundary: 4, holder, .. } if holder == "manual"),
        "{waited:?}"
    );
    manual_summariser.open();
    let row = m.await.unwrap().unwrap();
    assert_eq!(row.up_to_turn_index, 4);
    a.await.unwrap().unwrap();
    let at4: Vec<_> = rows(&store).into_iter().filter(|r| r.1 == 4).collect();
    assert_eq!(at4, vec![(row.id, 4, "completed".to_string())]);
    assert_eq!(
        auto_summariser.count(),
        0,
        "the automatic side summarised too"
    );
    let summary: String = store
        .with_conn(move |c| {
            c.query_row(
                "SELECT summary FROM compactions WHERE id = ?1",
                [row.id],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(written(&summary), "manual: ORD-1");
    assert_verified(&store);
}

/// G4: a step whose compaction is pending under another claim does not run
/// (no model call) until the row is completed, and then reads the completed
/// summary, never the draft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_a_step_waits_for_a_pending_compaction_and_reads_only_the_completed_row() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let holder_summariser = Gated::new("the summary: ORD-1");
    let holder = runner_with(&store, "holder", holder_summariser.clone(), |_| {});
    let model = Counting::new(demo_model(SEED, &[]));
    let stepper = runner_with_model(&store, "stepper", model.clone(), extractive(), |_| {});
    let mut events = stepper.subscribe();
    let sid = s.id;
    let h = tokio::spawn(async move { holder.compact_now(sid, None).await });
    holder_summariser.started.notified().await;
    let input = user_turn(SEED, 0, 5);
    let t = tokio::spawn(async move { stepper.run_turn_at(sid, 5, &input).await });
    wait_for_event(&mut events, |e| {
        matches!(e.kind, EventKind::CompactionWaiting { .. })
    })
    .await;
    // The row is a draft (pending): the step has not called the model.
    assert_eq!(rows(&store)[0].2, "pending");
    assert_eq!(model.count(), 0, "a step ran against a pending compaction");
    holder_summariser.open();
    let row = h.await.unwrap().unwrap();
    let out = t.await.unwrap().unwrap();
    assert_eq!(model.count() as i64, out.steps);
    // Every step of the turn read the completed row.
    let read: Vec<Option<abridge::CompactionId>> = store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT s.compaction_id FROM steps s JOIN turns t ON t.id = s.turn_id \
                 WHERE t.idx = 5 ORDER BY s.idx",
            )?;
            let v = st.query_map([], |r| r.get(0))?;
            Ok(v.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap();
    assert_eq!(read, vec![Some(row.id); out.steps as usize]);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_compaction_records_focus_and_prompt_hash_and_emits_events() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 4).await;
    let r = runner_with(&store, "m", extractive(), |c| {
        c.compaction.compact_at = Threshold::Off
    });
    let mut events = r.subscribe();
    let row = r
        .compact_now(s.id, Some("postal codes".into()))
        .await
        .unwrap();
    assert_eq!(
        (row.trigger.as_str(), row.focus.as_deref()),
        ("manual", Some("postal codes"))
    );
    let mut rules =
        abridge::compaction::rules_for(&abridge::PromptStyle::Prose, false).into_owned();
    rules.push_str("\n\nFocus of this compaction (give it priority): postal codes");
    assert_eq!(
        row.prompt_sha256.as_deref(),
        Some(abridge::message::sha256_hex(rules.as_bytes()).as_str())
    );
    // Again: already compacted up to there, the same row comes back.
    assert_eq!(r.compact_now(s.id, None).await.unwrap().id, row.id);
    let empty = r.create_session("empty", DEMO_MODEL, "sys").await.unwrap();
    assert!(matches!(
        r.compact_now(empty.id, None).await,
        Err(Error::NothingToCompact { .. })
    ));
    let got: Vec<Event> = common::drained(&mut events);
    assert!(
        matches!(
            got[0].kind,
            EventKind::CompactionClaimed { boundary: 3, .. }
        ),
        "{got:?}"
    );
    assert!(
        matches!(&got[1].kind, EventKind::Compacted { boundary: 3, tokens_before, tokens_after, .. } if tokens_after < tokens_before)
    );
}

/// Scenario: ensure() reads on the calling thread only when a pooled
/// connection is idle; with the only connection busy elsewhere it waits for it
/// through the blocking pool and decides as it would have, instead of failing
/// or blocking the runtime's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_waits_for_a_connection_when_none_is_idle() {
    let (_d, path) = temp_db();
    let seeded = open(&path);
    let s = history(&seeded, 4).await;
    let on = runner_with(&seeded, "on", extractive(), |_| {});
    let row = on.compactor().ensure(&s, 4, 0).await.unwrap();
    drop((on, seeded));

    let store = abridge::Store::open_with(
        common::db_for(&path),
        store_options().with_max_connections(1),
    )
    .unwrap();
    let runner = runner_with(&store, "one-connection", extractive(), |_| {});
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let holder = {
        let store = store.clone();
        std::thread::spawn(move || {
            store
                .with_conn(|_| {
                    held_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(200));
                    Ok(())
                })
                .unwrap()
        })
    };
    held_rx.recv().unwrap();
    let started = std::time::Instant::now();
    let got = runner.compactor().ensure(&s, 4, 0).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100), "it waited");
    assert_eq!(got, row);
    holder.join().unwrap();
}

/// G7 on what a reader sees: a summary with nothing visible in it (NUL, a
/// byte-order mark, zero-width characters, ideographic spaces) is an empty
/// summary, a failed attempt; the policy decides and nothing stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_of_invisible_characters_is_empty_and_nothing_stays_pending() {
    for invisible in ["\0", "\u{feff}\u{200b}\u{3000}", "\0\u{200d}\n\u{2060}"] {
        let (_d, path) = temp_db();
        let store = open(&path);
        let s = history(&store, 5).await;
        let summ = Counting::new(Fixed(invisible.into(), Duration::ZERO));
        let r = runner_with(&store, "t", summ.clone(), |_| {});
        let read = r.compactor().ensure(&s, 5, 0).await.unwrap();
        assert_eq!(read, None, "{invisible:?}: proceeds uncompacted");
        let all = rows(&store);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].2, "failed", "{invisible:?}");
        assert_eq!(summ.count(), 3, "one call per attempt");
        // The turn that needed it runs; nothing is wedged.
        r.run_turn_at(s.id, 5, &user_turn(SEED, 0, 5))
            .await
            .unwrap();
        assert_verified(&store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_starting_with_nul_is_stored_without_it() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let r = runner_with(
        &store,
        "t",
        Arc::new(Fixed("\0orders ORD-1 and ORD-2".into(), Duration::ZERO)),
        |_| {},
    );
    let row = r.compactor().ensure(&s, 5, 0).await.unwrap().unwrap();
    assert_eq!(
        row.summary.as_deref().map(written),
        Some("orders ORD-1 and ORD-2")
    );
    assert_verified(&store);
}

/// G7 on one measure: the summary is counted as the message a step sends,
/// with the counter that counted what it replaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_counts_the_summary_as_the_message_steps_send() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 5).await;
    let r = runner_with(&store, "t", extractive(), |_| {});
    let row = r.compactor().ensure(&s, 5, 0).await.unwrap().unwrap();
    let message = abridge::render::summary_message(abridge::render::SummaryView {
        up_to_turn_index: row.up_to_turn_index,
        summary: row.summary.as_deref().unwrap(),
    });
    let bytes = abridge::message::to_bytes(&[message]);
    let counted = abridge::TokenCounter::count(
        &abridge::compaction::CharsPerFour,
        std::str::from_utf8(&bytes).unwrap(),
    );
    assert_eq!(row.tokens_after, Some(counted as i64));
    assert!(row.tokens_after < row.tokens_before);
}

/// The verbatim tail (0.15 of the threshold by default) gives way when a
/// compaction is asked for and the whole session fits it: `/compact` on a
/// short session folds every finished turn rather than nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_compaction_of_a_session_that_fits_the_tail_folds_by_count() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 4).await;
    let r = runner_with(&store, "m", extractive(), |c| {
        c.compaction.compact_at = Threshold::Tokens(1_000_000);
        assert_eq!(c.compaction.keep_recent_share, Some(0.15), "the default");
    });
    let preview = r.preview_compaction(s.id, None).await.unwrap();
    assert_eq!(preview.boundary, 3, "{preview:?}");
    let row = r.compact_now(s.id, None).await.unwrap();
    assert_eq!(row.up_to_turn_index, 3);
    assert_verified(&store);
}

/// The size of each turn a session's verbatim tail walk keeps, counted from
/// the strings the turn's rows were written with when this process wrote
/// them all (not read back), is what the store's rows give: SQL `length()`
/// of the turn's input, its steps' responses and their tool results. Over a
/// run of inputs in several scripts and widths, the newest turn is among
/// those kept after most turns; a turn with a NUL in its input (which
/// SQLite's `length()` stops at) is not counted that way and is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_sizes_kept_for_the_tail_are_what_the_rows_give() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let r = runner_with(&store, "sizes", extractive(), |c| {
        c.compaction = c
            .compaction
            .clone()
            .with_compact_at(Threshold::Tokens(1_500))
            .with_keep_recent_tokens(1_200)
    });
    let sid = demo_session(&r, SEED, 0).await;
    let exotic = [
        "",
        " naïve café",
        " 👩‍👩‍👧 नमस्ते 東京 e\u{301}",
        " \u{10FFFF}\u{FEFF}\u{200D}",
    ];
    let stored = |idx: i64| -> i64 {
        store
            .with_conn(move |c| {
                c.query_row(
                    "SELECT length(t.input) \
                       + coalesce((SELECT sum(length(s.response)) FROM steps s \
                           WHERE s.turn_id = t.id), 0) \
                       + coalesce((SELECT sum(length(i.result)) FROM steps s2 \
                           JOIN tool_invocations i ON i.step_id = s2.id \
                           WHERE s2.turn_id = t.id), 0) \
                     FROM turns t WHERE t.session_id = ?1 AND t.idx = ?2",
                    rusqlite::params![sid.0, idx],
                    |row| row.get::<_, i64>(0),
                )
            })
            .unwrap()
    };
    let nul_turn = (!on_postgres()).then_some(17);
    let (mut newest_kept, mut checked) = (0, 0);
    for t in 0..30i64 {
        let mut input = format!("{}{}", user_turn(SEED, 0, t as u64), exotic[t as usize % 4]);
        if Some(t) == nul_turn {
            input.push_str(" before\0after");
        }
        r.run_turn_at(sid, t, &input).await.unwrap();
        let Some(kept) = r.compactor().kept_turn_sizes(sid) else {
            continue;
        };
        for &(idx, chars) in &kept {
            assert_eq!(chars, stored(idx), "turn {idx}'s size, kept after turn {t}");
            checked += 1;
        }
        if kept.first().map(|k| k.0) == Some(t) {
            assert_ne!(Some(t), nul_turn, "a NUL's turn is read, not counted");
            newest_kept += 1;
        }
    }
    assert!(checked >= 50, "{checked} sizes checked");
    assert!(
        newest_kept >= 15,
        "the newest turn kept after {newest_kept} turns"
    );
    assert_verified(&store);
}
