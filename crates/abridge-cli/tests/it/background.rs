//! Background compaction: a summary claimed at the soft threshold is made
//! while the session's steps go on; no step waits for it below the hard
//! threshold; a turn keeps the compaction it began with; a step at the hard
//! threshold waits for the pending summary, made exactly once; a background
//! summariser that dies leaves a row the next runner finishes; rows queued
//! for another process are served exactly once (`serve_pending`, `abridge
//! serve`); a turn resumed after a crash, while its session's background
//! row was left pending by the same crash, reads the newest completed row
//! (never the pending one); the next turn finishes the row in the background, once.
//!
//! The summariser here is gated: it does not answer until the test opens the
//! gate, so "while the summary is pending" is a state the test holds, not a
//! race it hopes to win.

use crate::common;

use abridge::compaction::{
    Background, BackgroundWorker, ExtractiveSummariser, Summariser, SummaryRequest, SummaryResponse,
};
use abridge::{
    CompactionConfig, EventKind, FaultPoint, ModelClient, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Runner, RunnerConfig, SessionId, Store, Threshold, Tool, ToolCall, ToolError,
    ToolSpec, Tools, Usage,
};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The hard threshold of these tests, tokens; the soft one is 80 % of it.
const HARD: u64 = 1_200;
const SOFT: i64 = 960;

/// Answers every step with a sentence; an input with "tool please" calls the
/// `hold` tool first. Reports no usage: the measure is the estimate.
struct Chat;

#[abridge::async_trait]
impl ModelClient for Chat {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = serde_json::to_string(&req.messages.last().unwrap().content).unwrap();
        let block = if last.contains("tool please") {
            ResponseBlock::ToolUse {
                id: "h1".into(),
                name: "hold".into(),
                input: json!({}),
                raw_input: None,
            }
        } else {
            ResponseBlock::Text {
                text: "Noted.".into(),
            }
        };
        Ok(ModelResponse {
            blocks: vec![block],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// The offline summariser behind a gate, counting its calls.
struct Gated {
    open: watch::Receiver<bool>,
    calls: AtomicUsize,
}

#[abridge::async_trait]
impl Summariser for Gated {
    async fn summarise(&self, r: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.clone();
        open.wait_for(|o| *o)
            .await
            .map_err(|e| ModelError::Transient(e.to_string()))?;
        ExtractiveSummariser.summarise(r).await
    }
}

struct Gate {
    tx: watch::Sender<bool>,
    summariser: Arc<Gated>,
}

impl Gate {
    fn closed() -> Gate {
        let (tx, rx) = watch::channel(false);
        Gate {
            tx,
            summariser: Arc::new(Gated {
                open: rx,
                calls: AtomicUsize::new(0),
            }),
        }
    }
    fn open(&self) {
        self.tx.send_replace(true);
    }
    fn calls(&self) -> usize {
        self.summariser.calls.load(Ordering::SeqCst)
    }
}

/// A tool that runs `on_call` (a test's hook into the middle of a turn).
struct Hold(Arc<dyn Fn() -> tokio::task::JoinHandle<()> + Send + Sync>);

#[abridge::async_trait]
impl Tool for Hold {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        (self.0)().await.unwrap();
        Ok(json!("held"))
    }
}

fn compaction(worker: BackgroundWorker) -> CompactionConfig {
    let mut c = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(HARD))
        .with_background(Some(Background {
            worker,
            ..Background::default()
        }));
    c.lease_ttl = Duration::from_secs(5);
    c
}

fn runner_with(
    store: &Store,
    summariser: Arc<dyn Summariser>,
    cfg: CompactionConfig,
    owner: &str,
    hold: Option<Hold>,
) -> Runner {
    let spec = ToolSpec {
        name: "hold".into(),
        description: "hold".into(),
        input_schema: json!({"type": "object"}),
    };
    let tools = match hold {
        Some(h) => Tools::new().idempotent(spec, h),
        None => Tools::new(),
    };
    Runner::builder(store.clone(), Arc::new(Chat))
        .tools(tools)
        .summariser_arc(summariser)
        .config(RunnerConfig::default().with_owner(owner))
        .compaction(cfg)
        .build()
        .unwrap()
}

/// About 40 tokens a turn: from the soft threshold to the hard one is
/// several turns.
fn turn_input(i: usize) -> String {
    format!(
        "turn {i}: {}",
        "a few words about the garden and the weather. ".repeat(2)
    )
}

/// (context tokens, compaction read, waited ms) of every step, in order.
fn steps(store: &Store, sid: SessionId) -> Vec<(i64, Option<i64>, Option<i64>)> {
    store
        .with_conn(move |c| {
            let mut st = c.prepare(
                "SELECT s.context_tokens, s.compaction_id, s.summary_wait_ms FROM steps s \
                 JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?1 ORDER BY t.idx, s.idx",
            )?;
            let rows = st.query_map([sid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap()
}

/// (id, boundary, status, background, attempts, lease owner) of every row.
type Row = (i64, i64, String, bool, i64, Option<String>);

fn rows(store: &Store, sid: SessionId) -> Vec<Row> {
    store
        .with_conn(move |c| {
            let mut st = c.prepare(
                "SELECT id, up_to_turn_index, status, background, attempts, lease_owner \
                 FROM compactions WHERE session_id = ?1 ORDER BY up_to_turn_index",
            )?;
            let rows = st.query_map([sid], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap()
}

/// A crash takes down a turn (before its step's model call) and the
/// background summary it had claimed (mid-summary). The next runner resumes
/// the turn: its step reads what the store held completed when the step was
/// prepared (here no summary: the full history, as the turn began; G4, never
/// the pending draft); the session's next turn takes the pending row over in
/// the background, exactly once (same row and boundary, one more attempt, one
/// summariser call), and the turn after reads it. docs/design.md,
/// "Background compaction", says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_reads_the_completed_rows_while_the_crashed_pending_one_is_finished_behind_it(
) {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let crash_turn = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let armed = crash_turn.clone();
    let hook: abridge::FaultHook = Arc::new(move |p| {
        if p == FaultPoint::MidSummary && abridge::compaction::in_background() {
            return Err(p);
        }
        if p == FaultPoint::BeforeModelCall && armed.load(Ordering::SeqCst) {
            return Err(p);
        }
        Ok(())
    });
    let mut a_cfg = RunnerConfig::default().with_owner("host-a");
    a_cfg.compaction = compaction(BackgroundWorker::Task);
    a_cfg.testing.fault_hook = Some(hook);
    let a = Runner::builder(store.clone(), Arc::new(Chat))
        .summariser(ExtractiveSummariser)
        .config(a_cfg)
        .build()
        .unwrap();
    let s = a.create_session("s", "m", "sys").await.unwrap();
    let next = until_pending(&a, &store, s.id, 0).await;
    a.finish_background().await;
    let before = steps(&store, s.id).len();
    crash_turn.store(true, Ordering::SeqCst);
    let err = a
        .run_turn_at(s.id, next as i64, &turn_input(next))
        .await
        .unwrap_err();
    assert!(err.is_resumable(), "{err}");
    // Whatever the crashed turn's step handed to the background has died too.
    a.finish_background().await;
    let left = rows(&store, s.id);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].2, "pending", "{left:?}");
    drop(a);

    let counting = common::Counting::new(ExtractiveSummariser);
    let b = runner_with(
        &store,
        counting.clone(),
        compaction(BackgroundWorker::Task),
        "host-b",
        None,
    );
    let running = b.recoverable_turns().await.unwrap();
    assert_eq!(running.len(), 1);
    b.resume_turn(running[0].id).await.unwrap();
    let resumed = steps(&store, s.id)[before..].to_vec();
    assert!(
        !resumed.is_empty() && resumed.iter().all(|st| st.1.is_none()),
        "the resumed turn read a summary: {resumed:?}"
    );
    // The session's next turn takes the pending row over in the background
    // (the same row, one more attempt, one summariser call)...
    b.run_turn(s.id, &turn_input(next + 1)).await.unwrap();
    b.finish_background().await;
    let done = rows(&store, s.id);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        (done[0].0, done[0].1, done[0].2.as_str(), done[0].4),
        (left[0].0, left[0].1, "completed", left[0].4 + 1)
    );
    assert_eq!(
        counting.count(),
        1,
        "the row was summarised once more, once"
    );
    // ...and the turn after reads it.
    b.run_turn(s.id, &turn_input(next + 2)).await.unwrap();
    assert_eq!(steps(&store, s.id).last().unwrap().1, Some(done[0].0));
    common::assert_verified(&store);
}

/// Runs turns until the session has a pending row; returns the turns run.
async fn until_pending(r: &Runner, store: &Store, sid: SessionId, from: usize) -> usize {
    for i in from..from + 40 {
        r.run_turn(sid, &turn_input(i)).await.unwrap();
        if rows(store, sid).iter().any(|row| row.2 == "pending") {
            return i + 1;
        }
    }
    panic!("no background compaction was claimed");
}

/// A session of a runner with a shut gate, run until its background
/// compaction is claimed (pending).
struct GatedSession {
    _dir: tempfile::TempDir,
    store: Store,
    gate: Gate,
    r: Runner,
    s: abridge::store::SessionRow,
    /// The next turn's number.
    next: usize,
}

async fn gated_until_pending() -> GatedSession {
    let (_dir, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let gate = Gate::closed();
    let r = runner_with(
        &store,
        gate.summariser.clone(),
        compaction(BackgroundWorker::Task),
        "bg",
        None,
    );
    let s = r.create_session("s", "m", "sys").await.unwrap();
    let next = until_pending(&r, &store, s.id, 0).await;
    GatedSession {
        _dir,
        store,
        gate,
        r,
        s,
        next,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_hard_threshold_no_step_waits_for_a_summary() {
    let GatedSession {
        _dir,
        store,
        gate,
        r,
        s,
        mut next,
    } = gated_until_pending().await;
    // The summary stays pending (the gate is shut) while the session goes on,
    // up to just below the hard threshold.
    let claimed_after = steps(&store, s.id).len();
    while steps(&store, s.id).last().unwrap().0 + 50 < HARD as i64 {
        r.run_turn(s.id, &turn_input(next)).await.unwrap();
        next += 1;
    }
    let all = steps(&store, s.id);
    assert!(
        all.len() >= claimed_after + 2,
        "steps went on while the summary was pending: {all:?}"
    );
    assert!(all.iter().all(|s| s.2.is_none()), "a step waited: {all:?}");
    let pending = rows(&store, s.id);
    assert_eq!(pending.len(), 1);
    assert_eq!((pending[0].2.as_str(), pending[0].3), ("pending", true));
    // The soft threshold claimed it: the measure that did was at or over 80 %.
    assert!(all[..claimed_after].iter().any(|s| s.0 >= SOFT));
    assert!(all.iter().all(|s| s.1.is_none()), "nothing completed yet");
    gate.open();
    assert_eq!(r.finish_background().await, 1);
    let done = rows(&store, s.id);
    assert_eq!(done[0].2, "completed");
    // The next turn reads it, and its context is smaller than before.
    let before = steps(&store, s.id).last().unwrap().0;
    r.run_turn(s.id, &turn_input(next)).await.unwrap();
    let last = *steps(&store, s.id).last().unwrap();
    assert_eq!(last.1, Some(done[0].0));
    assert!(last.0 < before, "{} >= {before}", last.0);
    assert_eq!(gate.calls(), 1);
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_keeps_the_compaction_it_began_with() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let gate = Arc::new(Gate::closed());
    // In the middle of the turn (its first step's tool call): the gate opens
    // and the background summary completes before the second step.
    let (g, st) = (gate.clone(), store.clone());
    let hold = Hold(Arc::new(move || {
        let (g, st) = (g.clone(), st.clone());
        tokio::spawn(async move {
            g.open();
            loop {
                let done = st
                    .with_conn(|c| {
                        c.query_row(
                            "SELECT count(*) FROM compactions WHERE status = 'completed'",
                            [],
                            |r| r.get::<_, i64>(0),
                        )
                    })
                    .unwrap();
                if done == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    }));
    let r = runner_with(
        &store,
        gate.summariser.clone(),
        compaction(BackgroundWorker::Task),
        "bg",
        Some(hold),
    );
    let s = r.create_session("s", "m", "sys").await.unwrap();
    let next = until_pending(&r, &store, s.id, 0).await;
    let before = steps(&store, s.id).len();
    r.run_turn(s.id, &format!("{} tool please", turn_input(next)))
        .await
        .unwrap();
    let turn: Vec<_> = steps(&store, s.id)[before..].to_vec();
    assert_eq!(turn.len(), 2, "{turn:?}");
    let completed = rows(&store, s.id)[0].0;
    assert_eq!(
        (turn[0].1, turn[1].1),
        (None, None),
        "the second step read what the first did, though the summary completed between them"
    );
    r.run_turn(s.id, &turn_input(next + 1)).await.unwrap();
    assert_eq!(
        steps(&store, s.id).last().unwrap().1,
        Some(completed),
        "the next turn reads the new summary"
    );
    assert!(steps(&store, s.id).iter().all(|s| s.2.is_none()));
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaching_the_hard_threshold_while_a_background_summary_is_pending_waits_for_it() {
    let GatedSession {
        _dir,
        store,
        gate,
        r,
        s,
        mut next,
    } = gated_until_pending().await;
    let mut events = r.subscribe();
    let pending = rows(&store, s.id)[0].0;
    // Past the hard threshold with the gate shut: a turn must wait.
    let waiting = loop {
        let (r2, sid, input) = (r.clone(), s.id, turn_input(next));
        next += 1;
        assert!(next < 60, "the hard threshold was never reached");
        let mut turn = tokio::spawn(async move { r2.run_turn(sid, &input).await });
        // The turn ends (it did not wait: the gate is shut), or it waits.
        let waiting = async {
            loop {
                match events.recv().await {
                    Ok(e) if matches!(e.kind, EventKind::CompactionWaiting { .. }) => {
                        return e.kind
                    }
                    Ok(_) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        };
        tokio::select! {
            done = &mut turn => done.unwrap().map(|_| ()).unwrap(),
            kind = waiting => break (turn, kind),
        }
    };
    let (turn, kind) = waiting;
    let EventKind::CompactionWaiting { compaction_id, .. } = kind else {
        unreachable!()
    };
    assert_eq!(compaction_id.0, pending, "it waits for the pending row");
    assert!(!turn.is_finished());
    gate.open();
    turn.await.unwrap().unwrap();
    let all = steps(&store, s.id);
    let waited: Vec<_> = all.iter().filter(|s| s.2.is_some()).collect();
    assert_eq!(waited.len(), 1, "{all:?}");
    assert_eq!(waited[0].1, Some(pending), "the waiting step read it");
    assert_eq!(gate.calls(), 1, "one summary, made once");
    let mut told = false;
    for e in common::drained(&mut events) {
        if let EventKind::WaitedForSummary { waited_ms, .. } = e.kind {
            told = waited_ms >= 0;
        }
    }
    assert!(told, "a WaitedForSummary event");
    let rows = rows(&store, s.id);
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].2.as_str(), rows[0].4), ("completed", 1));
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_summariser_that_dies_leaves_a_row_the_next_runner_finishes() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    // Runner A's background summariser dies mid-summary (an injected fault
    // inside the task: its claim is dropped with it).
    let hook: abridge::FaultHook = Arc::new(|p| {
        if p == FaultPoint::MidSummary && abridge::compaction::in_background() {
            return Err(p);
        }
        Ok(())
    });
    let summariser: Arc<dyn Summariser> = Arc::new(ExtractiveSummariser);
    let mut a_cfg = RunnerConfig::default().with_owner("host-a");
    a_cfg.compaction = compaction(BackgroundWorker::Task);
    a_cfg.testing.fault_hook = Some(hook);
    let a = Runner::builder(store.clone(), Arc::new(Chat))
        .summariser_arc(summariser.clone())
        .config(a_cfg)
        .build()
        .unwrap();
    let s = a.create_session("s", "m", "sys").await.unwrap();
    let next = until_pending(&a, &store, s.id, 0).await;
    a.finish_background().await;
    let left = rows(&store, s.id);
    assert_eq!(left.len(), 1);
    assert_eq!((left[0].2.as_str(), left[0].4), ("pending", 1), "{left:?}");
    drop(a);
    // Runner B finishes the same row (not re-decided: same boundary).
    let counting = common::Counting::new(ExtractiveSummariser);
    let b = runner_with(
        &store,
        counting.clone(),
        compaction(BackgroundWorker::Task),
        "host-b",
        None,
    );
    b.run_turn(s.id, &turn_input(next)).await.unwrap();
    b.finish_background().await;
    let done = rows(&store, s.id);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        (done[0].0, done[0].1, done[0].2.as_str(), done[0].4),
        (left[0].0, left[0].1, "completed", 2)
    );
    assert_eq!(counting.count(), 1);
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_queued_for_another_process_are_served_exactly_once() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let host_summariser = common::Counting::new(ExtractiveSummariser);
    let host = runner_with(
        &store,
        host_summariser.clone(),
        compaction(BackgroundWorker::Elsewhere),
        "host",
        None,
    );
    let s = host.create_session("s", "m", "sys").await.unwrap();
    let next = until_pending(&host, &store, s.id, 0).await;
    let queued = rows(&store, s.id);
    assert_eq!(queued.len(), 1);
    assert_eq!(
        (queued[0].3, queued[0].4, queued[0].5.as_deref()),
        (true, 0, None),
        "queued unleased for a server"
    );
    assert_eq!(host.background_running(), 0);
    // The host goes on without summarising it.
    host.run_turn(s.id, &turn_input(next)).await.unwrap();
    assert_eq!(host_summariser.count(), 0);
    // Two servers race for it: one summary.
    let counting = common::Counting::new(ExtractiveSummariser);
    let servers: Vec<Runner> = (0..2)
        .map(|i| {
            runner_with(
                &store,
                counting.clone(),
                compaction(BackgroundWorker::Elsewhere),
                &format!("server-{i}"),
                None,
            )
        })
        .collect();
    let (x, y) = tokio::join!(servers[0].serve_pending(), servers[1].serve_pending());
    let completed = x.unwrap().completed.len() + y.unwrap().completed.len();
    assert_eq!((completed, counting.count()), (1, 1));
    let done = rows(&store, s.id);
    assert_eq!((done[0].2.as_str(), done[0].4), ("completed", 1));
    host.run_turn(s.id, &turn_input(next + 1)).await.unwrap();
    assert_eq!(steps(&store, s.id).last().unwrap().1, Some(done[0].0));
    assert_eq!(host_summariser.count(), 0);
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abridge_serve_finishes_the_queued_rows_of_a_store() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let host = runner_with(
        &store,
        Arc::new(ExtractiveSummariser),
        compaction(BackgroundWorker::Elsewhere),
        "host",
        None,
    );
    let s = host.create_session("s", "m", "sys").await.unwrap();
    until_pending(&host, &store, s.id, 0).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args(["serve", "--db", common::db_for(&path).to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("session s up to turn") && text.contains("served 1 pending compaction(s)"),
        "{text}"
    );
    assert_eq!(rows(&store, s.id)[0].2, "completed");
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args(["serve", "--db", common::db_for(&path).to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("served 0 pending"));
}

#[tokio::test]
async fn inline_compaction_records_the_wait_of_every_step_that_made_one() {
    let (_d, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let cfg = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(HARD))
        .with_background(None);
    let r = runner_with(&store, Arc::new(ExtractiveSummariser), cfg, "inline", None);
    let s = r.create_session("s", "m", "sys").await.unwrap();
    for i in 0..90 {
        r.run_turn(s.id, &turn_input(i)).await.unwrap();
    }
    let rows = rows(&store, s.id);
    assert!(rows.len() >= 2);
    assert!(rows.iter().all(|r| !r.3), "none in the background");
    let waited = steps(&store, s.id).iter().filter(|s| s.2.is_some()).count();
    assert_eq!(waited, rows.len(), "each compaction was waited for once");
}

#[test]
fn a_soft_share_outside_zero_to_one_is_refused() {
    for share in [0.0, 1.0, 1.5, -0.1, f64::NAN] {
        let cfg = CompactionConfig::default().with_background(Some(Background {
            soft_share: share,
            worker: BackgroundWorker::Task,
            ..Background::default()
        }));
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("soft_share"), "{share}: {err}");
    }
    assert_eq!(Background::default().soft_tokens(1_000), 800);
    assert!(
        CompactionConfig::default().background.is_some(),
        "on by default"
    );
}

/// The compactor's pool of background workers bounds how many summaries
/// run at once: with 2 workers and 5 sessions past the soft threshold, 2
/// summaries are being made and 3 rows wait, claimed, their leases kept
/// while they wait (past the lease's whole length) and their sessions'
/// steps going on; when the gate opens every row completes, each summarised
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_of_background_workers_bounds_the_summaries_made_at_once() {
    let (_dir, path) = common::temp_db();
    let store = Store::open(common::db_for(&path)).unwrap();
    let gate = Gate::closed();
    let mut cfg = compaction(BackgroundWorker::Task);
    cfg.background = cfg.background.map(|b| Background {
        workers: Some(2),
        ..b
    });
    cfg.lease_ttl = Duration::from_secs(2);
    let r = runner_with(&store, gate.summariser.clone(), cfg, "pool", None);
    assert_eq!(r.compactor().background_workers(), 2);
    let mut sessions = Vec::new();
    for i in 0..5 {
        let s = r
            .create_session(&format!("s{i}"), "m", "sys")
            .await
            .unwrap();
        let next = until_pending(&r, &store, s.id, 0).await;
        sessions.push((s.id, next));
    }
    // Two summaries in the making, five claimed rows.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gate.calls() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(gate.calls(), 2, "only as many summaries as workers");
    assert_eq!(r.compactor().background_running(), 5);
    // Past the lease's length, the waiting rows are still held (renewed),
    // and the sessions go on below the hard threshold.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let now = abridge::Clock::now_ms(&abridge::SystemClock);
    for (sid, next) in &sessions {
        let pending: Vec<_> = store
            .with_conn(move |c| {
                let mut st = c.prepare(
                    "SELECT lease_owner, lease_expires_at FROM compactions \
                     WHERE session_id = ?1 AND status = 'pending'",
                )?;
                let rows = st.query_map([sid], |r| {
                    Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<i64>>(1)?))
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .unwrap();
        assert_eq!(pending.len(), 1);
        let (owner, expires) = &pending[0];
        assert!(owner.is_some() && expires.unwrap() > now, "{pending:?}");
        r.run_turn(*sid, &turn_input(*next)).await.unwrap();
    }
    assert_eq!(gate.calls(), 2);
    gate.open();
    assert_eq!(r.finish_background().await, 5);
    assert_eq!(gate.calls(), 5, "each row summarised once");
    for (sid, _) in &sessions {
        let rows = rows(&store, *sid);
        assert!(rows.iter().all(|row| row.2 == "completed"), "{rows:?}");
        assert!(
            rows.iter().all(|row| row.4 == 1),
            "one attempt each: {rows:?}"
        );
    }
    common::assert_verified(&store);
}

#[test]
fn a_pool_of_no_background_workers_is_refused() {
    let cfg = CompactionConfig::default().with_background(Some(Background {
        workers: Some(0),
        ..Background::default()
    }));
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("workers"), "{err}");
    assert_eq!(
        ExtractiveSummariser.parallelism(),
        abridge::compaction::DEFAULT_SUMMARY_WORKERS
    );
}

/// Turns of about 240 tokens against a hard threshold of 1,200: the soft
/// threshold of 80% (960) leaves room for less than two of them, so the
/// adaptive soft threshold claims earlier, at 1,200 - 2 x the largest
/// growth of a recent turn (not below half the hard threshold); with
/// `adaptive` off the claim waits for 960.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_large_turns_claims_its_background_summary_earlier() {
    async fn claimed_at(adaptive: bool) -> (i64, i64, i64) {
        let (_dir, path) = common::temp_db();
        let store = Store::open(common::db_for(&path)).unwrap();
        let mut cfg = compaction(BackgroundWorker::Task);
        cfg.background = cfg.background.map(|b| Background { adaptive, ..b });
        let r = runner_with(&store, Arc::new(ExtractiveSummariser), cfg, "pace", None);
        let s = r.create_session("s", "m", "sys").await.unwrap();
        for i in 0..30 {
            let input = format!(
                "turn {i}: {}",
                "a few words about the garden and the weather. ".repeat(20)
            );
            r.run_turn(s.id, &input).await.unwrap();
            if !rows(&store, s.id).is_empty() {
                break;
            }
        }
        r.finish_background().await;
        let measures = steps(&store, s.id);
        // The measure the claiming step read (its turn's previous step's),
        // and the largest growth of one turn before it.
        // And the soft threshold the row records it was claimed under.
        let (claimed, soft): (i64, i64) = store
            .with_conn(move |c| {
                c.query_row(
                    "SELECT trigger_tokens, soft_threshold_tokens FROM compactions \
                     WHERE session_id = ?1 ORDER BY id LIMIT 1",
                    [s.id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
            })
            .unwrap();
        let growth = measures.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap();
        (claimed, growth, soft)
    }
    let (fixed, _, fixed_soft) = claimed_at(false).await;
    let (adaptive, growth, adaptive_soft) = claimed_at(true).await;
    assert!(fixed >= SOFT, "{fixed}");
    // The row records the threshold in force: the configured one, or the
    // one the session's pace brought down, at or below the measure claimed.
    assert_eq!(fixed_soft, SOFT);
    assert!(
        adaptive_soft < SOFT && adaptive_soft <= adaptive,
        "recorded {adaptive_soft}, claimed at {adaptive}"
    );
    assert!(
        growth > 120,
        "turns this large leave the soft threshold too little room: {growth}"
    );
    assert!(
        adaptive < SOFT,
        "claimed at {adaptive}, not earlier than {SOFT}"
    );
    assert!(adaptive >= HARD as i64 / 2, "{adaptive}");
    assert!(
        adaptive >= HARD as i64 - 4 * growth,
        "{adaptive} against a growth of {growth}"
    );
}
