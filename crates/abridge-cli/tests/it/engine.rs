//! End-to-end runs of the engine on the demo workload.

use crate::common;
use abridge::{
    ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner, Threshold, Tool,
    ToolCall, ToolError, ToolSpec, Tools, TransactionalTool, Usage,
};
use common::*;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// Step 0 calls one tool of each effect mode; step 1 answers. Records the
/// task it runs in (see `in_place_blocking_...`).
struct ThreeModes(Arc<Mutex<Vec<Option<tokio::task::Id>>>>);

#[abridge::async_trait]
impl ModelClient for ThreeModes {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.0.lock().unwrap().push(tokio::task::try_id());
        let last = serde_json::to_string(&req.messages.last().unwrap().content).unwrap();
        if last.contains("tool_result") {
            return Ok(ModelResponse {
                blocks: vec![ResponseBlock::Text {
                    text: "done".into(),
                }],
                usage: Usage::default(),
                ..Default::default()
            });
        }
        let call = |id: &str, name: &str| ResponseBlock::ToolUse {
            id: id.into(),
            name: name.into(),
            input: json!({"order": "ORD-7", "turn": req.messages.len()}),
            raw_input: None,
        };
        Ok(ModelResponse {
            blocks: vec![call("a", "note"), call("b", "lookup"), call("c", "send")],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// Transactional: writes an effect row in the invocation's transaction and
/// records the task it ran in.
struct Note(Arc<Mutex<Vec<Option<tokio::task::Id>>>>);
impl TransactionalTool for Note {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<Value, ToolError> {
        self.0.lock().unwrap().push(tokio::task::try_id());
        // A transactional tool writes for its store's backend (PostgreSQL
        // gets the host's SQL as written).
        let sql = match tx.kind() {
            abridge::store::BackendKind::Postgres => "INSERT INTO notes (key) VALUES ($1)",
            _ => "INSERT INTO notes (key) VALUES (?1)",
        };
        tx.execute(sql, [&call.idempotency_key])
            .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(json!({"noted": true}))
    }
}

/// Idempotent and at-most-once: count calls and keep the keys they got.
struct Outside(Arc<Mutex<Vec<String>>>);
#[abridge::async_trait]
impl Tool for Outside {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        self.0.lock().unwrap().push(call.idempotency_key.clone());
        Ok(json!({"ok": call.name}))
    }
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: name.into(),
        input_schema: json!({"type": "object"}),
    }
}

type Ids = Arc<Mutex<Vec<Option<tokio::task::Id>>>>;
type Keys = Arc<Mutex<Vec<String>>>;

/// A runner whose model calls a tool of each mode, on a store with the
/// `notes` table; returns the runner, the model's and the transactional
/// tool's task ids, and the keys the idempotent and at-most-once tools got.
fn three_mode_runner(store: &abridge::Store) -> (Runner, Ids, Ids, Keys, Keys) {
    store
        .with_conn(|c| {
            c.execute_batch("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE)")?;
            Ok(())
        })
        .unwrap();
    let (model_ids, tool_ids) = (Ids::default(), Ids::default());
    let (idem, once) = (Arc::default(), Arc::default());
    let tools = Tools::new()
        .transactional(spec("note"), Note(tool_ids.clone()))
        .idempotent(spec("lookup"), Outside(Arc::clone(&idem)))
        .at_most_once(spec("send"), Outside(Arc::clone(&once)));
    let runner = Runner::builder(store.clone(), Arc::new(ThreeModes(model_ids.clone())))
        .tools(tools)
        .config(test_config(Threshold::Off, None, "three"))
        .build()
        .unwrap();
    (runner, model_ids, tool_ids, idem, once)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_run_with_tools_in_all_three_modes() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let (runner, _, _, idem, once) = three_mode_runner(&store);
    let sid = runner
        .create_session("three", "m", "system")
        .await
        .unwrap()
        .id;
    for i in 0..6 {
        let out = runner
            .run_turn_at(sid, i, &format!("turn {i}"))
            .await
            .unwrap();
        assert_eq!((out.output.as_str(), out.steps), ("done", 2));
    }
    let rows: Vec<(String, String, String, i64)> = store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT effect, status, idempotency_key, attempts FROM tool_invocations ORDER BY id",
            )?;
            let v = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            Ok(v.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap();
    assert_eq!(rows.len(), 18);
    let of = |mode: &str| -> Vec<String> {
        rows.iter()
            .filter(|r| r.0 == mode)
            .map(|r| {
                assert_eq!((r.1.as_str(), r.3), ("completed", 1), "{r:?}");
                r.2.clone()
            })
            .collect()
    };
    // Each mode ran six times, once per turn, with the keys recorded.
    let notes: Vec<String> = store
        .with_conn(|c| {
            let mut st = c.prepare("SELECT key FROM notes ORDER BY id")?;
            let v = st.query_map([], |r| r.get(0))?;
            Ok(v.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap();
    assert_eq!(
        of("transactional"),
        notes,
        "one effect row per transactional call"
    );
    assert_eq!(of("idempotent"), *idem.lock().unwrap());
    assert_eq!(of("at_most_once"), *once.lock().unwrap());
    for mode in ["transactional", "idempotent", "at_most_once"] {
        let keys = of(mode);
        assert_eq!(keys.len(), 6, "{mode}");
        let distinct: std::collections::BTreeSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), 6, "{mode}: keys are per call");
    }
    let n = assert_all_steps_rebuild(&store);
    assert_eq!(n, 12);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_on_many_turns_verifies() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let runner = demo_runner(&store, 2, Threshold::Tokens(600), None);
    let sid = demo_session(&runner, 2, 0).await;
    for i in 0..20 {
        let input = abridge_testkit::demo::user_turn(2, 0, i);
        runner.run_turn_at(sid, i as i64, &input).await.unwrap();
    }
    let report = store.with_conn(|c| verify_demo(c)).unwrap();
    assert!(report.ok, "{report:#?}");
    let detail = store
        .with_conn(|c| abridge::inspect::session_detail(c, &sid.to_string()))
        .unwrap();
    assert!(
        detail.summary.counts.compactions_completed >= 3,
        "{:?}",
        detail.summary.counts
    );
}

/// `Blocking::InPlace` runs store calls on the calling worker (multi-thread
/// runtime) and falls back to the blocking pool on a current-thread runtime;
/// the guarantees hold either way. Which path ran is seen from the task a
/// transactional tool (run inside the store call) finds itself in: the turn's
/// own task in place, a blocking-pool task otherwise. In place is the
/// default: a step makes no thread hand-off.
#[test]
fn in_place_blocking_runs_turns_on_both_runtime_flavors() {
    for (multi, blocking, in_place) in [
        (true, abridge::StoreOptions::default().blocking, true),
        (true, abridge::Blocking::InPlace, true),
        (false, abridge::Blocking::InPlace, false),
        (true, abridge::Blocking::Pool, false),
    ] {
        let rt = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (_d, path) = temp_db();
        let store = abridge::Store::open_with(
            common::db_for(&path),
            abridge::StoreOptions::default().with_blocking(blocking),
        )
        .unwrap();
        let (runner, model_ids, tool_ids, _, _) = three_mode_runner(&store);
        rt.block_on(async {
            let sid = runner.create_session("p", "m", "s").await.unwrap().id;
            for i in 0..4 {
                let r = runner.clone();
                // A task of its own, as a host runs turns.
                tokio::spawn(async move { r.run_turn_at(sid, i, "go").await })
                    .await
                    .unwrap()
                    .unwrap();
            }
        });
        let model_ids = model_ids.lock().unwrap().clone();
        let tool_ids = tool_ids.lock().unwrap().clone();
        assert_eq!(tool_ids.len(), 4);
        // The model's first call of each turn ran in the turn's task.
        let turn_tasks: Vec<_> = model_ids.iter().step_by(2).cloned().collect();
        assert!(turn_tasks.iter().all(Option::is_some));
        let same: Vec<bool> = turn_tasks
            .iter()
            .zip(&tool_ids)
            .map(|(t, tool)| t == tool)
            .collect();
        assert_eq!(
            same,
            // A PostgreSQL store's calls always run on the blocking pool.
            vec![in_place && !on_postgres(); 4],
            "multi-thread {multi}, {blocking:?}: {turn_tasks:?} vs {tool_ids:?}"
        );
        assert_verified(&store);
        assert_eq!(assert_all_steps_rebuild(&store), 8);
    }
}

/// A runner like `demo_runner`'s, keeping `cache_bytes` of contexts between turns.
fn runner_with_cache(
    store: &abridge::Store,
    seed: u64,
    owner: &str,
    cache_bytes: usize,
) -> abridge::Runner {
    let mut cfg = test_config(Threshold::Tokens(900), None, owner);
    cfg.context_cache_bytes = cache_bytes;
    abridge::Runner::builder(store.clone(), std::sync::Arc::new(demo_model(seed, &[])))
        .tools(abridge_testkit::demo::demo_tools(
            Some(abridge_testkit::demo::OutsideService {
                db: store.path().to_path_buf(),
                key: common::key_option(),
            }),
            std::time::Duration::ZERO,
        ))
        .config(cfg)
        .build()
        .unwrap()
}

/// Every executed step's (turn idx, step idx, recorded hash), in order.
fn step_hashes(store: &abridge::Store) -> Vec<(i64, i64, String)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT t.idx, s.idx, s.messages_sha256 FROM steps s JOIN turns t \
                 ON t.id = s.turn_id WHERE s.messages_sha256 IS NOT NULL ORDER BY t.idx, s.idx",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

/// Scenario: two runners (two hosts) take turns on one session, each keeping
/// the session's message context between its turns; each runner's kept
/// context is behind by the turns the other ran, and compactions complete in
/// between. Every step's messages, extended from a kept context, hash the same
/// as in a control run by one runner that keeps no context (each turn's first
/// step built in full), and every step rebuilds from the store to its hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_contexts_extend_over_turns_other_runners_ran() {
    const SEED: u64 = 5;
    const TURNS: i64 = 18;
    let (_c, control_path) = temp_db();
    let control = open(&control_path);
    let single = runner_with_cache(&control, SEED, "host", 0);
    let sid = demo_session(&single, SEED, 0).await;
    for t in 0..TURNS {
        let input = abridge_testkit::demo::user_turn(SEED, 0, t as u64);
        single.run_turn_at(sid, t, &input).await.unwrap();
    }

    let (_d, path) = temp_db();
    let store = open(&path);
    let a = runner_with_cache(&store, SEED, "host", 64 << 20);
    let b = runner_with_cache(&store, SEED, "host", 64 << 20);
    let sid = demo_session(&a, SEED, 0).await;
    for t in 0..TURNS {
        // a, a, b, a, b, b, a, ...: both runners fall behind by one or two turns.
        let runner = if [0, 1, 3, 6, 7, 9, 12, 15].contains(&t) {
            &a
        } else {
            &b
        };
        let input = abridge_testkit::demo::user_turn(SEED, 0, t as u64);
        runner.run_turn_at(sid, t, &input).await.unwrap();
    }
    let compactions: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM compactions WHERE status = 'completed'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(
        compactions >= 2,
        "{compactions} compactions: the run must cross several"
    );
    assert_eq!(step_hashes(&store), step_hashes(&control));
    assert_eq!(transcript(&store, SEED, 0), transcript(&control, SEED, 0));
    assert_all_steps_rebuild(&store);
    assert_verified(&store);
}

/// Regression: `.config()` after `.compaction()` (or `.fault_hook()`) replaced
/// the whole configuration and silently dropped them. Each builder call now
/// sets its own part, in any order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_builder_call_discards_an_earlier_one() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let compaction = abridge::CompactionConfig::default().with_compact_at(Threshold::Tokens(1234));
    for compaction_first in [true, false] {
        let hook = fail_at(abridge::FaultPoint::BeforeModelCall, 1);
        let b = Runner::builder(store.clone(), Arc::new(demo_model(1, &[])));
        let cfg = abridge::RunnerConfig::default().with_owner("ordered");
        let b = if compaction_first {
            b.compaction(compaction.clone())
                .fault_hook(hook)
                .config(cfg)
        } else {
            b.config(cfg)
                .compaction(compaction.clone())
                .fault_hook(hook)
        };
        let runner = b.build().unwrap();
        assert_eq!(
            runner.compactor().config().compact_at,
            Threshold::Tokens(1234),
            "compaction first: {compaction_first}"
        );
        let sid = runner
            .create_session(&format!("s{compaction_first}"), "m", "sys")
            .await
            .unwrap()
            .id;
        let err = runner.run_turn(sid, "hi").await.unwrap_err();
        assert!(
            matches!(err, abridge::Error::Injected(_)),
            "the fault hook was dropped: {err}"
        );
    }
}

/// The runner's events, as a UI sees them: one turn's life in order, each
/// naming the session as the host named it, its model and the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_emits_its_life_in_order_naming_the_session() {
    use abridge::EventKind as K;
    let (_d, path) = temp_db();
    let store = open(&path);
    let (runner, _, _, _, _) = three_mode_runner(&store);
    let mut rx = runner.subscribe();
    let s = runner
        .create_session("ui-session", "model-x", "sys")
        .await
        .unwrap();
    runner.run_turn_at(s.id, 0, "go").await.unwrap();
    let got: Vec<abridge::Event> = common::drained(&mut rx);
    for e in &got {
        assert_eq!(
            (
                e.subject.session.as_str(),
                e.subject.model.as_str(),
                e.subject.turn
            ),
            ("ui-session", "model-x", Some(0)),
            "{e:?}"
        );
    }
    let names: Vec<String> = got
        .iter()
        .map(|e| match &e.kind {
            K::TurnStarted { resumed, .. } => format!("turn started resumed={resumed}"),
            K::StepStarted { step, .. } => format!("step {step} started"),
            K::StepResponded {
                step, tool_calls, ..
            } => format!("step {step} responded with {tool_calls} calls"),
            K::ToolStarted { tool, effect, .. } => format!("{tool} started {effect:?}"),
            K::ToolCompleted {
                tool, effect, ok, ..
            } => format!("{tool} completed {effect:?} ok={ok}"),
            K::StepCompleted { step, .. } => format!("step {step} completed"),
            K::TurnFinished { steps, .. } => format!("turn finished in {steps} steps"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        names,
        [
            "turn started resumed=false",
            "step 0 started",
            "step 0 responded with 3 calls",
            "note started Transactional",
            "note completed Transactional ok=true",
            "lookup started Idempotent",
            "lookup completed Idempotent ok=true",
            "send started AtMostOnce",
            "send completed AtMostOnce ok=true",
            "step 0 completed",
            "step 1 started",
            "step 1 responded with 0 calls",
            "step 1 completed",
            "turn finished in 2 steps",
        ],
        "{got:#?}"
    );
}

/// A turn resumed after a crash says so, and names whose lease it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_reports_the_takeover_and_a_failed_turn_its_error() {
    use abridge::EventKind as K;
    let (_d, path) = temp_db();
    let store = open(&path);
    let crashing = Runner::builder(store.clone(), Arc::new(demo_model(1, &[])))
        .config(test_config(
            Threshold::Off,
            Some(fail_at(abridge::FaultPoint::AfterResponseWritten, 1)),
            "first-host",
        ))
        .build()
        .unwrap();
    let sid = demo_session(&crashing, 1, 0).await;
    let input = abridge_testkit::demo::user_turn(1, 0, 0);
    crashing.run_turn_at(sid, 0, &input).await.unwrap_err();
    drop(crashing);
    let host = demo_runner(&store, 1, Threshold::Off, None);
    let mut rx = host.subscribe();
    host.run_turn_at(sid, 0, &input).await.unwrap();
    let got: Vec<K> = common::drained(&mut rx)
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(
        matches!(&got[0], K::LeaseTakenOver { from, .. } if from == "first-host"),
        "{got:?}"
    );
    assert!(
        matches!(got[1], K::TurnStarted { resumed: true, .. }),
        "{got:?}"
    );

    struct Refuses;
    #[abridge::async_trait]
    impl ModelClient for Refuses {
        async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> {
            Err(ModelError::Permanent("no".into()))
        }
    }
    let failing = Runner::builder(store.clone(), Arc::new(Refuses))
        .build()
        .unwrap();
    let mut rx = failing.subscribe();
    failing.run_turn_at(sid, 1, "hello").await.unwrap_err();
    let got: Vec<K> = common::drained(&mut rx)
        .into_iter()
        .map(|e| e.kind)
        .collect();
    // The provider's words ("no") show as their length and a hash: they can
    // quote a conversation (RunnerConfig::log_content shows them whole).
    assert!(
        matches!(got.last(), Some(K::TurnFailed { error, .. })
            if error.starts_with("model call failed: [2 characters, sha256 ")),
        "{got:?}"
    );
}

/// Counts bytes: a counter that needs the text (it has no `count_chars`).
struct Bytes;

impl abridge::TokenCounter for Bytes {
    fn count(&self, text: &str) -> u64 {
        text.len() as u64
    }
}

/// Remembers the bytes of every request it answers; reports no usage.
struct Recording(Mutex<Vec<Vec<u8>>>);

#[abridge::async_trait]
impl ModelClient for Recording {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.0
            .lock()
            .unwrap()
            .push(abridge::message::to_bytes(&req.messages));
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text {
                text: "noted — ça va 👍".into(),
            }],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// Without reported usage a step's measure is the token counter's count of
/// the exact bytes it sent: the default counter counts them from the kept
/// counts (no copy of the context), a counter that needs the text gets the
/// text, and both equal counting the bytes sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_counts_the_exact_bytes_sent_with_any_token_counter() {
    for custom in [false, true] {
        let (_d, path) = temp_db();
        let store = abridge::Store::open(common::db_for(&path)).unwrap();
        let model = Arc::new(Recording(Mutex::new(Vec::new())));
        let mut compaction = abridge::CompactionConfig::default().with_compact_at(Threshold::Off);
        if custom {
            compaction = compaction.with_token_counter(Bytes);
        }
        let runner = Runner::builder(store.clone(), model.clone())
            .compaction(compaction)
            .build()
            .unwrap();
        let s = runner.create_session("s", "m", "système").await.unwrap();
        for t in 0..4 {
            runner
                .run_turn(s.id, &format!("turn {t}: naïve 👩‍👩‍👧 \"quoted\""))
                .await
                .unwrap();
        }
        let sent = model.0.lock().unwrap().clone();
        let mut measured = Vec::new();
        for turn in store.turns(s.id).await.unwrap() {
            for step in store.steps(turn.id).await.unwrap() {
                assert!(step.estimated);
                measured.push(step.context_tokens.unwrap() as u64);
            }
        }
        let want: Vec<u64> = sent
            .iter()
            .map(|b| {
                let text = std::str::from_utf8(b).unwrap();
                if custom {
                    text.len() as u64
                } else {
                    (text.chars().count() as u64).div_ceil(4)
                }
            })
            .collect();
        assert_eq!(measured, want, "custom counter: {custom}");
    }
}

/// The turn a runner returns is the row as stored: the rows it writes at a
/// turn's begin and end are not read back, so this checks them field by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_turn_is_returned_as_stored() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let (runner, ..) = three_mode_runner(&store);
    let sid = runner
        .create_session("rows", "m", "system")
        .await
        .unwrap()
        .id;
    let mut returned = Vec::new();
    for i in 0..3 {
        returned.push(
            runner
                .run_turn_at(sid, i, &format!("turn {i}"))
                .await
                .unwrap()
                .turn,
        );
    }
    // Run again at an index that finished: the stored row, as it is.
    returned.push(runner.run_turn_at(sid, 1, "turn 1").await.unwrap().turn);
    let stored = store.turns(sid).await.unwrap();
    assert_eq!(returned[..3], stored[..]);
    assert_eq!(returned[3], stored[1]);
    assert!(stored
        .iter()
        .all(|t| t.status == abridge::store::TurnStatus::Completed));
}

/// Answers every step with text: each turn is one step.
struct Plain;
#[abridge::async_trait]
impl ModelClient for Plain {
    async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text { text: "ok".into() }],
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// The WAL's sizes between `turns` turns of 64 KiB messages (the largest,
/// and whether it was ever shorter than the one before) and the
/// connection's `wal_autocheckpoint` after them.
async fn wal_after_turns(
    checkpoints: abridge::Checkpoints,
    turns: usize,
) -> (abridge::Store, (u64, bool), i64, tempfile::TempDir) {
    let (dir, path) = temp_db();
    let store =
        abridge::Store::open_with(&path, store_options().with_checkpoints(checkpoints)).unwrap();
    let runner = Runner::builder(store.clone(), Arc::new(Plain))
        .config(test_config(Threshold::Off, None, "wal"))
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    let wal = dir.path().join("test.db-wal");
    let (mut largest, mut before, mut shortened) = (0, 0, false);
    for t in 0..turns {
        let message = format!("turn {t} {}", "x".repeat(64 * 1024));
        runner.run_turn(s.id, &message).await.unwrap();
        let len = std::fs::metadata(&wal).map_or(0, |m| m.len());
        shortened |= len < before;
        (largest, before) = (largest.max(len), len);
    }
    let auto = store
        .with_conn(|c| c.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0)))
        .unwrap();
    (store, (largest, shortened), auto, dir)
}

/// A step's own commit never checkpoints the WAL (a checkpoint writes and
/// syncs pages: milliseconds against the commit's microseconds); a thread
/// beside the steps does, once the WAL is past 4 MiB, and the WAL stays
/// bounded even when steps commit back to back (this model answers at once):
/// some 75 MB go through it here. Its file is not cut back when it restarts
/// (below [`abridge::store::WAL_KEPT_BYTES`]): the next frames are written
/// over the blocks it has, not into blocks the file system allocates again.
/// `OnCommit` keeps SQLite's own policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_off_the_steps_path_and_stays_bounded() {
    if on_postgres() {
        return; // a server's WAL is the server's
    }
    // About 300 turns of 64 KiB: some 40 MB through the WAL (message, step
    // row and the turn's pages).
    let (store, (largest, shortened), auto, _dir) =
        wal_after_turns(abridge::Checkpoints::OffTheStep, 300).await;
    assert!(
        largest > abridge::store::WAL_CHECKPOINT_BYTES,
        "the WAL grew past a checkpoint's size: {largest} bytes"
    );
    assert!(!shortened, "the WAL's file was cut back when it restarted");
    assert_eq!(auto, 0, "no commit checkpoints");
    assert!(
        store.wal_checkpoints() > 0,
        "the WAL was checkpointed off the step's path"
    );
    assert!(
        largest <= abridge::store::WAL_KEPT_BYTES,
        "the WAL stays bounded: {largest} bytes at most"
    );

    let (store, _, auto, _dir) = wal_after_turns(abridge::Checkpoints::OnCommit, 3).await;
    assert_eq!(auto, 1000, "SQLite's own policy");
    assert_eq!(store.wal_checkpoints(), 0);
}

/// Set once the other connection's checkpoint waits in its busy handler
/// (holding the WAL's checkpoint lock); set by the test to let it give up.
static OTHER_CHECKPOINT_WAITS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
static OTHER_CHECKPOINT_ENDS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// While another connection's checkpoint holds the WAL (another process's,
/// in a host), the store's own checkpoint finds it busy; the next one is
/// tried after 4 MiB more of WAL, not at every commit after it: a busy
/// checkpoint paces its retries as a finished one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_wal_checkpoint_is_tried_again_after_the_next_4_mib_not_at_every_commit() {
    use std::sync::atomic::Ordering;
    if on_postgres() || cfg!(feature = "encryption") {
        // A server's WAL is the server's; a keyed file needs its key on the
        // test's own connections, which only the store applies.
        return;
    }
    let (_dir, path) = temp_db();
    let store = abridge::Store::open_with(
        &path,
        store_options().with_checkpoints(abridge::Checkpoints::OffTheStep),
    )
    .unwrap();
    let runner = Runner::builder(store.clone(), Arc::new(Plain))
        .config(test_config(Threshold::Off, None, "wal"))
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();

    // A writer holds the write lock; the other connection's FULL checkpoint
    // takes the checkpoint lock, then waits for the writer in its busy
    // handler, which holds on until the test lets it go. The writer then
    // leaves, so steps commit while the checkpoint lock stays taken.
    let writer = rusqlite::Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let other_path = path.clone();
    let other = std::thread::spawn(move || {
        let c = rusqlite::Connection::open(&other_path).unwrap();
        c.busy_handler(Some(|_: i32| {
            OTHER_CHECKPOINT_WAITS.store(true, Ordering::SeqCst);
            while !OTHER_CHECKPOINT_ENDS.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            false
        }))
        .unwrap();
        c.query_row("PRAGMA wal_checkpoint(FULL)", [], |r| r.get::<_, i64>(0))
            .unwrap()
    });
    while !OTHER_CHECKPOINT_WAITS.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    writer.execute_batch("ROLLBACK").unwrap();

    // Some 20 MB through the WAL in commits of about 130 KB: past 4 MiB,
    // each commit would try again if a busy try left no mark.
    let wal = path.with_extension("db-wal");
    let turns = 150;
    for t in 0..turns {
        let message = format!("turn {t} {}", "x".repeat(64 * 1024));
        runner.run_turn(s.id, &message).await.unwrap();
    }
    let grown = std::fs::metadata(&wal).unwrap().len();
    OTHER_CHECKPOINT_ENDS.store(true, Ordering::SeqCst);
    assert_eq!(
        other.join().unwrap(),
        1,
        "the other checkpoint gave up busy"
    );
    // The tries run on a thread of their own: let the last one end.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let tries = store.wal_checkpoints();
    let bound = grown / abridge::store::WAL_CHECKPOINT_BYTES + 1;
    assert!(
        grown > 3 * abridge::store::WAL_CHECKPOINT_BYTES,
        "the WAL grew while the checkpoint lock was taken: {grown} bytes"
    );
    assert!(tries >= 1, "the store tried to checkpoint");
    assert!(
        tries <= bound,
        "{tries} checkpoints tried for {grown} bytes of WAL in {turns} commits: at most {bound}"
    );
}
