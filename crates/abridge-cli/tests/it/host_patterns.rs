//! The guarantees under a host's own patterns, not only the chaos harness's.
//!
//! Scenario: one process, many tasks. A host shares one `Runner` between its
//! tasks (or builds several with the default owner, or opens the store more
//! than once), and wraps turns in timeouts that drop the future at any await
//! point. A lease is held by a claim, not by a process name: siblings never
//! take over each other's live claims (one summariser call per boundary, one
//! runner per turn, no spurious "outcome unknown"), and a dropped future stops
//! every renewal it started, so the work is finished by the next owner at once
//! in this process and after the lease's expiry elsewhere.

use crate::common;
use abridge::compaction::{SummaryRequest, SummaryResponse};
use abridge::{
    Error, ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner,
    RunnerConfig, Store, Summariser, Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools,
};
use abridge_testkit::demo::{demo_tools, user_turn};
use common::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SEED: u64 = 33;

/// A summariser with a fixed answer and latency.
struct Slow(Duration);

#[abridge::async_trait]
impl Summariser for Slow {
    async fn summarise(&self, _: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        tokio::time::sleep(self.0).await;
        Ok(SummaryResponse {
            text: "orders ORD-1 and ORD-2; nothing open".into(),
            usage: Default::default(),
        })
    }
}

/// The default owner (one per process), as a host that sets none gets it.
fn default_owner_runner(store: &Store, summariser: Arc<dyn Summariser>) -> Runner {
    let cfg = RunnerConfig::default()
        .with_compaction(test_config(Threshold::Tokens(1), None, "x").compaction);
    Runner::builder(store.clone(), Arc::new(demo_model(SEED, &[])))
        .tools(demo_tools(None, Duration::ZERO))
        .summariser_arc(summariser)
        .config(cfg)
        .build()
        .unwrap()
}

/// A session with `turns` completed turns and no compaction.
async fn history(store: &abridge::Store, turns: u64) -> abridge::store::SessionRow {
    uncompacted_history(store, SEED, turns).await
}

fn compaction_rows(store: &Store) -> Vec<(String, i64)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare("SELECT status, attempts FROM compactions")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Sharing {
    OneRunner,
    RunnersOnOneStore,
    SeparateStores,
}

async fn racing_ensure(tasks: usize, sharing: Sharing) {
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 6).await;
    let summ = Counting::new(Slow(Duration::from_millis(150)));
    let shared = default_owner_runner(&store, summ.clone());
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let r = match sharing {
            Sharing::OneRunner => shared.clone(),
            Sharing::RunnersOnOneStore => default_owner_runner(&store, summ.clone()),
            Sharing::SeparateStores => default_owner_runner(&common::store_at(&path), summ.clone()),
        };
        let s = s.clone();
        set.spawn(async move { r.compactor().ensure(&s, 6, 0).await });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(r) = set.join_next().await {
        ids.insert(r.unwrap().unwrap().unwrap().id);
    }
    assert_eq!(ids.len(), 1, "{sharing:?}");
    assert_eq!(summ.count(), 1, "{sharing:?}: summariser calls");
    assert_eq!(
        compaction_rows(&store),
        vec![("completed".to_string(), 1)],
        "{sharing:?}: one row, claimed once"
    );
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_on_one_runner_make_one_summariser_call() {
    racing_ensure(16, Sharing::OneRunner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_runner_make_one_summariser_call() {
    racing_ensure(64, Sharing::OneRunner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_runners_with_the_default_owner_on_one_store_make_one_summariser_call() {
    racing_ensure(16, Sharing::RunnersOnOneStore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_separate_stores_make_one_summariser_call() {
    racing_ensure(64, Sharing::SeparateStores).await;
}

/// Step 0 calls the at-most-once `charge`, step 1 answers.
struct ChargeModel;

#[abridge::async_trait]
impl ModelClient for ChargeModel {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = serde_json::to_string(&req.messages.last().unwrap().content).unwrap();
        let blocks = if last.contains("tool_result") {
            vec![ResponseBlock::Text {
                text: "charged".into(),
            }]
        } else {
            vec![ResponseBlock::ToolUse {
                id: "c1".into(),
                name: "charge".into(),
                input: json!({"amount": 12}),
                raw_input: None,
            }]
        };
        Ok(ModelResponse {
            blocks,
            usage: Default::default(),
            ..Default::default()
        })
    }
}

struct Charge(Arc<AtomicUsize>);

#[abridge::async_trait]
impl Tool for Charge {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(json!({"charged": true}))
    }
}

fn charge_runner(store: &Store, calls: Arc<AtomicUsize>, cfg: RunnerConfig) -> Runner {
    let spec = ToolSpec {
        name: "charge".into(),
        description: "charges a card".into(),
        input_schema: json!({"type": "object"}),
    };
    Runner::builder(store.clone(), Arc::new(ChargeModel))
        .tools(Tools::new().at_most_once(spec, Charge(calls)))
        .config(cfg)
        .build()
        .unwrap()
}

fn invocation_results(store: &Store) -> Vec<String> {
    store
        .with_conn(|c| {
            let mut st = c.prepare("SELECT coalesce(result, '') FROM tool_invocations")?;
            let rows = st.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_running_one_turn_make_one_runner_and_no_outcome_unknown() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let calls = Arc::new(AtomicUsize::new(0));
    let runner = charge_runner(&store, calls.clone(), RunnerConfig::default());
    let sid = runner
        .create_session("host", "gpt-4o", "sys")
        .await
        .unwrap()
        .id;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let r = runner.clone();
        set.spawn(async move { r.run_turn_at(sid, 0, "charge me").await });
    }
    let (mut ran, mut refused) = (0, 0);
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok(o) => {
                assert_eq!(o.output, "charged");
                ran += 1;
            }
            Err(Error::LeaseHeld { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ran + refused, 16);
    assert!(ran >= 1);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the at-most-once call ran once"
    );
    assert_eq!(
        invocation_results(&store),
        vec![r#"{"charged":true}"#.to_string()]
    );
    assert_verified(&store);
}

/// Step 0 calls the idempotent `measure` with floats serde_json's default
/// parser reads one unit in the last place off; step 1 answers.
struct FloatModel;

#[abridge::async_trait]
impl ModelClient for FloatModel {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = serde_json::to_string(&req.messages.last().unwrap().content).unwrap();
        let blocks = if last.contains("tool_result") {
            vec![ResponseBlock::Text { text: "ok".into() }]
        } else {
            vec![ResponseBlock::ToolUse {
                id: "m1".into(),
                name: "measure".into(),
                input: json!({"w": 1.0715660391465826e-75, "v": [-1.81996730402717e-179, -1.603964615428183e143]}),
                raw_input: None,
            }]
        };
        Ok(ModelResponse {
            blocks,
            usage: Default::default(),
            ..Default::default()
        })
    }
}

/// (idempotency key, the bits of every float received), per call.
type Seen = Arc<std::sync::Mutex<Vec<(String, Vec<u64>)>>>;

struct Measure(Seen);

#[abridge::async_trait]
impl Tool for Measure {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        let mut bits = vec![call.input["w"].as_f64().unwrap().to_bits()];
        bits.extend(
            call.input["v"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap().to_bits()),
        );
        self.0
            .lock()
            .unwrap()
            .push((call.idempotency_key.clone(), bits));
        Ok(json!("measured"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_idempotent_call_gets_its_float_arguments_bit_for_bit() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let build = |hook| {
        let spec = ToolSpec {
            name: "measure".into(),
            description: "measures".into(),
            input_schema: json!({"type": "object"}),
        };
        Runner::builder(store.clone(), Arc::new(FloatModel))
            .tools(Tools::new().idempotent(spec, Measure(seen.clone())))
            .config(test_config(Threshold::Off, hook, "host"))
            .build()
            .unwrap()
    };
    let crashing = build(Some(fail_at(abridge::FaultPoint::AfterToolEffect, 1)));
    let sid = crashing
        .create_session("floats", "m", "sys")
        .await
        .unwrap()
        .id;
    let err = crashing.run_turn_at(sid, 0, "measure").await.unwrap_err();
    assert!(matches!(err, Error::Injected(_)), "{err}");
    // The restarted host resumes the turn: the call runs again, same key.
    build(None).run_turn_at(sid, 0, "measure").await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "called, then called again on resume");
    assert_eq!(seen[0], seen[1], "same key, same arguments, bit for bit");
    assert_eq!(
        seen[0].1,
        vec![
            1.0715660391465826e-75f64.to_bits(),
            (-1.81996730402717e-179f64).to_bits(),
            (-1.603964615428183e143f64).to_bits()
        ]
    );
    assert_verified(&store);
}

/// A store whose file is deleted while open notices (at a turn's start, and
/// on a lease renewal in the middle of one) and fails with a typed error,
/// instead of writing on into an unlinked file whose work is lost at exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_file_is_deleted_while_open_fails_with_a_typed_error() {
    if on_postgres() {
        return; // a file of one machine; a server's database is not deleted under its clients
    }
    let remove = |path: &std::path::Path| {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    };
    // Between turns.
    let (_d, path) = temp_db();
    let store = open(&path);
    let r = default_owner_runner(&store, Arc::new(Slow(Duration::ZERO)));
    let sid = demo_session(&r, SEED, 0).await;
    r.run_turn_at(sid, 0, &user_turn(SEED, 0, 0)).await.unwrap();
    remove(&path);
    let err = r
        .run_turn_at(sid, 1, &user_turn(SEED, 0, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StoreFileGone { .. }), "{err}");

    // In the middle of a turn: the heartbeat notices during the model call.
    let (_d2, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(Threshold::Off, None, "host");
    cfg.lease_ttl = Duration::from_millis(90);
    let mut model = demo_model(SEED, &[]);
    model.latency = Duration::from_millis(300);
    let r = Runner::builder(store.clone(), Arc::new(model))
        .tools(demo_tools(None, Duration::ZERO))
        .config(cfg)
        .build()
        .unwrap();
    let sid = demo_session(&r, SEED, 0).await;
    let running = {
        let r = r.clone();
        tokio::spawn(async move { r.run_turn_at(sid, 0, &user_turn(SEED, 0, 0)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    remove(&path);
    let err = running.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::StoreFileGone { .. }), "{err}");
    assert!(!path.exists(), "nothing recreated the file");
}

/// Runs turn `t` of the demo session `sid` as a host runs it: a task on the
/// runtime's workers.
async fn turn_as_task(r: &Runner, sid: abridge::SessionId, t: i64) -> abridge::TurnOutcome {
    let r = r.clone();
    tokio::spawn(async move { r.run_turn_at(sid, t, &user_turn(SEED, 0, t as u64)).await })
        .await
        .unwrap()
        .unwrap()
}

/// A step run as a task on a multi-thread runtime does its store work on
/// the worker it runs on, with `Blocking::InPlace` (the default): no thread
/// hand-off in a turn, whatever its tools; with `Blocking::Pool`, one at
/// every store call. (A server's calls always go to the blocking pool.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_run_as_a_task_hands_no_work_to_another_thread() {
    if on_postgres() {
        return;
    }
    for blocking in [abridge::Blocking::InPlace, abridge::Blocking::Pool] {
        let (_d, path) = temp_db();
        let store = Store::open_with(&path, store_options().with_blocking(blocking)).unwrap();
        store
            .with_conn(abridge_testkit::demo_tables::create_demo_tables)
            .unwrap();
        let r = demo_runner(&store, SEED, Threshold::Off, None);
        let sid = demo_session(&r, SEED, 0).await;
        let before = store.thread_handoffs();
        let mut steps = 0;
        for t in 0..8 {
            steps += turn_as_task(&r, sid, t).await.steps;
        }
        let handed = store.thread_handoffs() - before;
        match blocking {
            abridge::Blocking::InPlace => assert_eq!(handed, 0, "{steps} steps"),
            _ => assert!(handed >= steps as u64, "{handed} hand-offs, {steps} steps"),
        }
    }
}

/// A step that waits for another writer's lock hands its worker's other
/// tasks to the runtime while it waits: on a runtime of one worker, a task
/// beside it goes on ticking through the wait, and the step completes once
/// the lock is free.
#[test]
fn a_step_waiting_for_the_write_lock_leaves_the_runtime_running() {
    if on_postgres() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_d, path) = temp_db();
        let store = open(&path);
        let r = demo_runner(&store, SEED, Threshold::Off, None);
        let sid = demo_session(&r, SEED, 0).await;
        turn_as_task(&r, sid, 0).await;

        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Another writer takes the write lock and keeps it 400 ms.
        let (locked_tx, locked) = tokio::sync::oneshot::channel();
        let holder = {
            let (store, ticks) = (store.clone(), ticks.clone());
            std::thread::spawn(move || {
                store
                    .with_conn(|c| {
                        c.execute_batch("BEGIN IMMEDIATE")?;
                        let at_lock = ticks.load(Ordering::Relaxed);
                        let _ = locked_tx.send(());
                        std::thread::sleep(Duration::from_millis(400));
                        let during = ticks.load(Ordering::Relaxed) - at_lock;
                        c.execute_batch("COMMIT")?;
                        Ok(during)
                    })
                    .unwrap()
            })
        };
        locked.await.unwrap();
        let before = store.thread_handoffs();
        let out = turn_as_task(&r, sid, 1).await;
        assert!(out.steps >= 1);
        let during = holder.join().unwrap();
        ticker.abort();
        // 80 ticks of 5 ms in 400 ms; none if the step held the one worker.
        assert!(during >= 20, "{during} ticks while the step waited");
        assert!(store.thread_handoffs() > before, "the wait handed off");
    });
}

/// Building a context from a long history (no kept context: a new runner)
/// is work that grows with the history: it runs off the worker's other
/// tasks. The next turn extends the kept context and hands nothing off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_built_from_a_long_history_hands_the_workers_tasks_off() {
    if on_postgres() {
        return;
    }
    let (_d, path) = temp_db();
    let store = open(&path);
    let s = history(&store, 40).await;
    let r = demo_runner(&store, SEED, Threshold::Off, None);
    let before = store.thread_handoffs();
    turn_as_task(&r, s.id, 40).await;
    let first = store.thread_handoffs() - before;
    assert!(first >= 1, "the full build of 40 turns handed off");
    turn_as_task(&r, s.id, 41).await;
    assert_eq!(
        store.thread_handoffs() - before,
        first,
        "the extension did not"
    );
}

/// A transactional tool that blocks on async work inside its call (its
/// default `may_block`): it runs where blocking is allowed, so
/// `Handle::block_on` works there, the turn completes with the tool's
/// results, and the tool's run is the one hand-off of its step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_tool_that_may_block_can_block_on_async_work() {
    struct BlocksOnAsync(Arc<AtomicUsize>);
    impl abridge::TransactionalTool for BlocksOnAsync {
        fn call(
            &self,
            _tx: &abridge::store::Transaction<'_>,
            call: &ToolCall,
        ) -> Result<Value, ToolError> {
            let waited = tokio::runtime::Handle::current().block_on(async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                "waited"
            });
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"order": call.input, "status": waited}))
        }
    }
    let (_d, path) = temp_db();
    let store = open(&path);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tools = demo_tools(None, Duration::ZERO);
    for spec in tools.specs() {
        tools = tools.transactional(spec, BlocksOnAsync(calls.clone()));
    }
    let r = Runner::builder(store.clone(), Arc::new(demo_model(SEED, &[])))
        .tools(tools)
        .config(test_config(Threshold::Off, None, "host"))
        .build()
        .unwrap();
    let sid = demo_session(&r, SEED, 0).await;
    let before = store.thread_handoffs();
    for t in 0..6 {
        turn_as_task(&r, sid, t).await;
    }
    let ran = calls.load(Ordering::SeqCst);
    assert!(ran > 0, "the model called the tool");
    assert!(invocation_results(&store)
        .iter()
        .all(|r| r.contains("waited")));
    if !on_postgres() {
        assert_eq!(store.thread_handoffs() - before, ran as u64);
    }
}

/// A query that must return a row and returns none is the engine's own
/// error kind on either backend (`Error::NoRow`, not an SQLite error on a
/// PostgreSQL store), and `.optional()` turns it into `None` on both.
#[test]
fn a_query_with_no_row_is_the_engines_own_kind_on_either_backend() {
    use abridge::store::OptionalExtension;
    let (_d, path) = temp_db();
    let store = open(&path);
    store
        .with_conn(|c| {
            let none = c.query_row("SELECT id FROM sessions WHERE id = -1", [], |r| {
                r.get::<_, i64>(0)
            });
            assert!(matches!(none, Err(abridge::Error::NoRow)), "{none:?}");
            let optional = c
                .query_row("SELECT id FROM sessions WHERE id = -1", [], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()?;
            assert_eq!(optional, None);
            let mut st = c.prepare("SELECT id FROM sessions WHERE id = ?1")?;
            let none = st.query_row([-1i64], |r| r.get::<_, i64>(0));
            assert!(matches!(none, Err(abridge::Error::NoRow)), "{none:?}");
            Ok(())
        })
        .unwrap();
}
