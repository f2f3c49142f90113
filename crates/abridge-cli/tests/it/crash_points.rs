//! Crash injected at every named point of a step and of a compaction.
//!
//! Scenario: a control run executes a scripted multi-session workload with no
//! fault. For each fault point and for several occurrences of it, the same
//! workload runs on a fresh database with a hook that fails the runner at
//! exactly that point (as a crash would: nothing cleaned up), then a new runner
//! resumes the turn. Afterwards: the transcript equals the control run's, every
//! transactional effect was applied exactly once (the effect set equals the
//! control's, and `verify` finds no duplicate), each idempotent tool's key was
//! seen with no different arguments, and every executed step's rebuilt hash
//! equals its recorded one.

use crate::common;
use abridge::{FaultPoint, Threshold};
use common::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

const SEED: u64 = 11;
const TURNS: u64 = 12;
const EXTRAS: &[&str] = &["notify_customer"];

/// Runs the script on a fresh store; with `fault`, the first runner fails at the
/// `nth` time it reaches the point and a new runner resumes. Returns the faults seen.
async fn run(fault: Option<(FaultPoint, usize)>) -> (tempfile::TempDir, abridge::Store, usize) {
    let (d, path) = temp_db();
    let store = open(&path);
    let hook = fault.map(|(point, nth)| fail_at(point, nth));
    let runner = |hook| {
        demo_runner_with(
            &store,
            SEED,
            Threshold::Tokens(1_500),
            hook,
            EXTRAS,
            "runner",
        )
    };
    let faults = run_script(&runner(hook), || runner(None), SEED, 0, TURNS).await;
    (d, store, faults)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_point_resumes_to_the_control_transcript() {
    let (_c, control, faults) = run(None).await;
    assert_eq!(faults, 0);
    let want = transcript(&control, SEED, 0);
    let want_effects = effects(&control);
    assert_verified(&control);
    for point in FaultPoint::ALL {
        for nth in [1, 2, 5] {
            let (_d, store, faults) = run(Some((point, nth))).await;
            assert_eq!(faults, 1, "{point} #{nth} was never reached");
            assert_eq!(
                transcript(&store, SEED, 0),
                want,
                "{point} #{nth}: transcript differs"
            );
            assert_eq!(
                effects(&store),
                want_effects,
                "{point} #{nth}: effects differ"
            );
            assert_verified(&store);
            assert!(assert_all_steps_rebuild(&store) > 0);
        }
    }
}

/// The session beside the one that fails (session 1; the failing one is 0),
/// on a runner of its own over the same store: their turns' writes are parts
/// of the same group commits. It runs twice the failing session's turns, so
/// it is still writing when that one resumes.
const MATE: u64 = 1;

/// The points a turn's write transaction (a part of a group commit's batch)
/// is open at.
const INSIDE_A_PART: [FaultPoint; 4] = [
    FaultPoint::AfterResponseWritten,
    FaultPoint::BetweenTools,
    FaultPoint::InsideTransactionalTool,
    FaultPoint::BeforeStepComplete,
];

/// How long either session waits for the other at a meeting (a bound, not
/// a timing: each normally waits for the other's next step).
const MEETING: Duration = Duration::from_millis(200);

/// Sets the two sessions' steps to meet: before each of its step's write
/// transactions (its response's, and the one an outside tool's result
/// opens), the failing session waits until the mate's step holds the writer
/// at its end (its part kept so far); the mate's part waits there until the
/// failing session's write queues for the writer, then ends and hands it
/// over. The failing session's write transaction then joins a batch that
/// holds the mate's part. The mate begins each step only once the failing
/// session waits (or is done), so it never runs out of turns first.
#[derive(Default)]
struct Meeting {
    /// The failing session waits for the mate's part.
    ready: AtomicBool,
    /// The mate's part holds the writer, waiting.
    mate_in_part: AtomicBool,
    /// The failing session has run all its turns.
    done: AtomicBool,
}

fn wait_until(what: impl Fn() -> bool) {
    let until = std::time::Instant::now() + MEETING;
    while !what() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// The failing session's hook: meets the mate before each of its step's
/// write transactions, and with `fault` (point, nth) fails at the `nth`
/// arrival at the point or, for a point inside a turn's write transaction
/// on a store with a group commit, at the first arrival from the `nth` on
/// whose transaction joined a batch holding a kept part of the mate's.
fn failing_hook(
    store: &abridge::Store,
    meeting: &Arc<Meeting>,
    fault: Option<(FaultPoint, usize)>,
) -> abridge::FaultHook {
    let (store, meeting) = (store.clone(), meeting.clone());
    let grouped = store.backend() == abridge::store::BackendKind::Sqlite;
    let hits = Arc::new(AtomicUsize::new(0));
    let fired = Arc::new(AtomicBool::new(false));
    Arc::new(move |p| {
        if grouped && matches!(p, FaultPoint::BeforeModelCall | FaultPoint::AfterToolEffect) {
            meeting.ready.store(true, SeqCst);
            wait_until(|| meeting.mate_in_part.load(SeqCst));
        }
        let Some((point, nth)) = fault else {
            return Ok(());
        };
        if p != point || fired.load(SeqCst) || hits.fetch_add(1, SeqCst) + 1 < nth {
            return Ok(());
        }
        let beside = !grouped || !INSIDE_A_PART.contains(&p) || store.group_commit_open_parts() > 0;
        match beside && !fired.swap(true, SeqCst) {
            true => Err(p),
            false => Ok(()),
        }
    })
}

/// The mate's hook (on a store with a group commit): begins a step once the
/// failing session waits to meet it, and at the step's end holds its part
/// until another write queues for the writer.
fn mate_hook(store: &abridge::Store, meeting: &Arc<Meeting>) -> abridge::FaultHook {
    let (store, meeting) = (store.clone(), meeting.clone());
    let grouped = store.backend() == abridge::store::BackendKind::Sqlite;
    Arc::new(move |p| {
        if !grouped {
            return Ok(());
        }
        if p == FaultPoint::BeforeModelCall {
            wait_until(|| meeting.ready.load(SeqCst) || meeting.done.load(SeqCst));
        }
        if p == FaultPoint::BeforeStepComplete && meeting.ready.swap(false, SeqCst) {
            meeting.mate_in_part.store(true, SeqCst);
            wait_until(|| store.group_commit_waiting() > 0);
            meeting.mate_in_part.store(false, SeqCst);
        }
        Ok(())
    })
}

/// Runs session 0 with the fault and the mate (session [`MATE`]) at the same
/// time on the same store, every turn write on the batched path. Returns the
/// faults seen and the group commits' (batches, parts, parts undone beside
/// kept ones).
async fn run_beside_the_mate(
    fault: Option<(FaultPoint, usize)>,
) -> (tempfile::TempDir, abridge::Store, usize, (u64, u64, u64)) {
    let (d, path) = temp_db();
    let store = open(&path);
    store.group_commit_every_write(true);
    let meeting = Arc::new(Meeting::default());
    let runner = |hook, owner: &str| {
        demo_runner_with(
            &store,
            SEED,
            Threshold::Tokens(1_500),
            Some(hook),
            EXTRAS,
            owner,
        )
    };
    // The mate on a runtime of its own: its part waiting on a worker of the
    // failing session's runtime could hold up that session's task behind it.
    let mate = runner(mate_hook(&store, &meeting), "mate");
    let mate = std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { run_script(&mate, || mate.clone(), SEED, MATE, 2 * TURNS).await })
    });
    let first = runner(failing_hook(&store, &meeting, fault), "runner");
    // A resumed runner meets the mate too, without the fault.
    let fresh = || runner(failing_hook(&store, &meeting, None), "runner");
    let faults = run_script(&first, fresh, SEED, 0, TURNS).await;
    meeting.done.store(true, SeqCst);
    let mate_faults = tokio::task::block_in_place(|| mate.join()).unwrap();
    assert_eq!(mate_faults, 0, "the failing session's batch-mate failed");
    let (batches, parts) = store.group_commits();
    let undone = store.group_commits_undone_beside_kept();
    (d, store, faults, (batches, parts, undone))
}

/// The enumeration above on the batched path: while the failing session
/// runs, a mate runs its turns on the same store, and the failing session's
/// steps write in batches that hold a part of the mate's; a fault inside a
/// step's write transaction lands in such a batch. The failing part is
/// rolled back alone: the mate never sees an error (any error fails the
/// test), both sessions' transcripts equal the control run's, every effect
/// was applied once, and every executed step rebuilds to its hash. On
/// PostgreSQL (the suite run against a server) there is no group: the
/// server commits the sessions side by side, and the same holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_point_beside_a_batch_mate_fails_no_other_session() {
    let (_c, control, faults, _) = run_beside_the_mate(None).await;
    assert_eq!(faults, 0);
    let grouped = control.backend() == abridge::store::BackendKind::Sqlite;
    if grouped {
        // The steps' reads ran on the batch's idle writer too: the faults
        // below land on that path as well.
        assert!(control.group_commit_reads_lent() > 0);
    }
    let want = [
        transcript(&control, SEED, 0),
        transcript(&control, SEED, MATE),
    ];
    let want_effects = effects(&control);
    assert_verified(&control);
    for point in FaultPoint::ALL {
        for nth in [1, 2, 5] {
            let (_d, store, faults, (b, p, u)) = run_beside_the_mate(Some((point, nth))).await;
            assert_eq!(
                faults, 1,
                "{point} #{nth} was never reached beside the mate"
            );
            if grouped {
                assert!(
                    p > b,
                    "{point} #{nth}: no batch held two parts ({b} of {p})"
                );
                if INSIDE_A_PART.contains(&point) {
                    assert_eq!(
                        u, 1,
                        "{point} #{nth}: the fault's part was not undone beside a kept one"
                    );
                }
            }
            for (i, want) in [0, MATE].into_iter().zip(&want) {
                assert_eq!(
                    &transcript(&store, SEED, i),
                    want,
                    "{point} #{nth}: session {i}'s transcript differs"
                );
            }
            assert_eq!(
                effects(&store),
                want_effects,
                "{point} #{nth}: effects differ"
            );
            assert_verified(&store);
            assert!(assert_all_steps_rebuild(&store) > 0);
        }
    }
}

/// The states a database can be in right after the crash: each step's status
/// and its invocations' statuses, in order.
fn step_states(store: &abridge::Store) -> Vec<(i64, i64, String, Vec<String>)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT t.idx, s.idx, s.status, \
                 (SELECT group_concat(status, ',') FROM (SELECT status FROM tool_invocations \
                  WHERE step_id = s.id ORDER BY position) AS i) \
                 FROM steps s JOIN turns t ON t.id = s.turn_id ORDER BY t.idx, s.idx",
            )?;
            let rows = st.query_map([], |r| {
                let inv: Option<String> = r.get(3)?;
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    inv.map(|s| s.split(',').map(String::from).collect())
                        .unwrap_or_default(),
                ))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

/// Step 0 calls `lookup_order` (transactional), then the tool named here;
/// step 1 answers.
struct ToolsThenAnswer(&'static str);

#[abridge::async_trait]
impl abridge::ModelClient for ToolsThenAnswer {
    async fn complete(
        &self,
        req: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        let first = req.messages.len() == 2; // system prompt, user input
        let blocks = if first {
            ["lookup_order", self.0]
                .iter()
                .enumerate()
                .map(|(i, name)| abridge::ResponseBlock::ToolUse {
                    id: format!("c{i}"),
                    name: (*name).into(),
                    input: serde_json::json!({"order_id": "ORD-1"}),
                    raw_input: None,
                })
                .collect()
        } else {
            vec![abridge::ResponseBlock::Text {
                text: "done".into(),
            }]
        };
        Ok(abridge::ModelResponse {
            blocks,
            usage: Default::default(),
            ..Default::default()
        })
    }
}

/// An idempotent tool that records the keys it was called with.
#[derive(Clone, Default)]
struct Recording(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

#[abridge::async_trait]
impl abridge::Tool for Recording {
    async fn call(
        &self,
        call: &abridge::ToolCall,
    ) -> Result<serde_json::Value, abridge::ToolError> {
        self.0.lock().unwrap().push(call.idempotency_key.clone());
        Ok(serde_json::json!("sent"))
    }
}

fn spec(name: &str) -> abridge::ToolSpec {
    abridge::ToolSpec {
        name: name.into(),
        description: "d".into(),
        input_schema: serde_json::json!({"type": "object"}),
    }
}

/// A runner over `store` with the transactional `lookup_order` and, with
/// `external`, that idempotent outside tool as `notify`.
fn two_tool_runner(
    store: &abridge::Store,
    model: std::sync::Arc<Counting<ToolsThenAnswer>>,
    external: Option<Recording>,
    hook: Option<abridge::FaultHook>,
) -> abridge::Runner {
    let tools = abridge::Tools::new().transactional(
        spec("lookup_order"),
        abridge_testkit::demo::DemoTxTool("lookup_order"),
    );
    let tools = match external {
        Some(t) => tools.idempotent(spec("notify"), t),
        None => tools,
    };
    abridge::Runner::builder(store.clone(), model)
        .tools(tools)
        .config(test_config(Threshold::Off, hook, "runner"))
        .build()
        .unwrap()
}

fn demo_effect_count(store: &abridge::Store) -> i64 {
    store
        .with_conn(|c| c.query_row("SELECT count(*) FROM demo_effects", [], |r| r.get(0)))
        .unwrap()
}

fn statuses(n: usize, status: &str) -> Vec<String> {
    vec![status.to_string(); n]
}

/// Scenario: a step whose tool calls are all transactional commits once: its
/// response, both tools' writes and results, its completion and the next
/// step's claim. A crash after the tools' results are written and before that
/// commit leaves none of it: step 0 is `running` again, without a response, no
/// invocation and no effect is recorded, no step 1 exists. The resumed run
/// calls the model for step 0 again (at-least-once), applies each effect once
/// and verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_commits_its_response_tools_completion_and_next_claim_together() {
    let (_d, path) = temp_db();
    let store = open(&path);
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let model = Counting::new(ToolsThenAnswer("lookup_order"));
    let crashing = two_tool_runner(
        &store,
        model.clone(),
        None,
        Some(fail_at(FaultPoint::BeforeStepComplete, 1)),
    );
    let s = crashing.create_session("s", "m", "sys").await.unwrap();
    let err = crashing.run_turn(s.id, "go").await.unwrap_err();
    assert!(matches!(err, abridge::Error::Injected(_)), "{err}");
    assert_eq!(step_states(&store), vec![(0, 0, "running".into(), vec![])]);
    assert_eq!(demo_effect_count(&store), 0);

    let resumed = two_tool_runner(&store, model.clone(), None, None);
    let out = resumed.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(out.output, "done");
    assert_eq!(
        model.count(),
        3,
        "step 0 twice (its response was lost), step 1 once"
    );
    assert_eq!(
        step_states(&store),
        vec![
            (0, 0, "completed".into(), statuses(2, "completed")),
            (0, 1, "completed".into(), vec![])
        ]
    );
    assert_eq!(demo_effect_count(&store), 2);
    assert_verified(&store);
}

/// Scenario: a step that calls an outside (idempotent) tool commits its
/// response, the transactional tool before it and the outside call's claim
/// before the outside call happens. A crash after the outside call and before
/// its result is recorded keeps all of that: on resume the model is not called
/// again for step 0, the transactional effect is not repeated, and the outside
/// tool is called again with the same idempotency key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_call_happens_after_the_response_and_earlier_tools_commit() {
    let (_d, path) = temp_db();
    let store = open(&path);
    store
        .with_conn(abridge_testkit::demo_tables::create_demo_tables)
        .unwrap();
    let model = Counting::new(ToolsThenAnswer("notify"));
    let external = Recording::default();
    let crashing = two_tool_runner(
        &store,
        model.clone(),
        Some(external.clone()),
        Some(fail_at(FaultPoint::AfterToolEffect, 1)),
    );
    let s = crashing.create_session("s", "m", "sys").await.unwrap();
    crashing.run_turn(s.id, "go").await.unwrap_err();
    let mut want = statuses(1, "completed");
    want.push("started".into());
    assert_eq!(step_states(&store), vec![(0, 0, "responded".into(), want)]);
    assert_eq!(demo_effect_count(&store), 1);

    let resumed = two_tool_runner(&store, model.clone(), Some(external.clone()), None);
    resumed.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(model.count(), 2, "step 0's response was reused");
    assert_eq!(demo_effect_count(&store), 1);
    let keys = external.0.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0], keys[1],
        "the repeated outside call has the same key"
    );
    assert_verified(&store);
}

/// Scenario: a running turn whose newest step is completed and whose next step
/// was never claimed (the layout of a database where completing a step did not
/// also claim the next one). Resuming claims the next step with a write of its
/// own and finishes the turn as the control run did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_without_a_claimed_next_step_resumes() {
    let (_c, control, _) = run(None).await;
    let (_d, path) = temp_db();
    let store = open(&path);
    let crashing = demo_runner_with(
        &store,
        SEED,
        Threshold::Tokens(1_500),
        Some(fail_at(FaultPoint::BeforeModelCall, 2)),
        EXTRAS,
        "runner",
    );
    let sid = demo_session(&crashing, SEED, 0).await;
    let input = abridge_testkit::demo::user_turn(SEED, 0, 0);
    crashing.run_turn_at(sid, 0, &input).await.unwrap_err();
    // The layout of an older version: the schema's guard against deleting
    // history is lifted for this one edit, then put back.
    let removed = store
        .with_conn(|c| {
            let guard: String = if on_postgres() {
                c.execute_batch("ALTER TABLE steps DISABLE TRIGGER steps_never_deleted")?;
                "ALTER TABLE steps ENABLE TRIGGER steps_never_deleted".into()
            } else {
                let sql = c.query_row(
                    "SELECT sql FROM sqlite_master WHERE name = 'steps_never_deleted'",
                    [],
                    |r| r.get(0),
                )?;
                c.execute_batch("DROP TRIGGER steps_never_deleted")?;
                sql
            };
            let n = c.execute(
                "DELETE FROM steps WHERE status = 'running' AND idx > 0 \
                 AND NOT EXISTS (SELECT 1 FROM tool_invocations WHERE step_id = steps.id)",
                [],
            )?;
            c.execute_batch(&guard)?;
            Ok(n)
        })
        .unwrap();
    assert_eq!(removed, 1, "{:?}", step_states(&store));
    assert_eq!(step_states(&store).last().unwrap().2, "completed");

    let fresh = || {
        demo_runner_with(
            &store,
            SEED,
            Threshold::Tokens(1_500),
            None,
            EXTRAS,
            "runner",
        )
    };
    run_script(&fresh(), fresh, SEED, 0, TURNS).await;
    assert_eq!(transcript(&store, SEED, 0), transcript(&control, SEED, 0));
    assert_verified(&store);
}

/// An at-most-once outside tool that counts its calls.
#[derive(Clone, Default)]
struct Charge(std::sync::Arc<std::sync::atomic::AtomicUsize>);

#[abridge::async_trait]
impl abridge::Tool for Charge {
    async fn call(&self, _: &abridge::ToolCall) -> Result<serde_json::Value, abridge::ToolError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(serde_json::json!("charged"))
    }
}

fn charge_runner(
    store: &abridge::Store,
    model: std::sync::Arc<Counting<ToolsThenAnswer>>,
    charge: Charge,
    hook: Option<abridge::FaultHook>,
) -> abridge::Runner {
    let tools = abridge::Tools::new()
        .transactional(
            spec("lookup_order"),
            abridge_testkit::demo::DemoTxTool("lookup_order"),
        )
        .at_most_once(spec("charge"), charge);
    abridge::Runner::builder(store.clone(), model)
        .tools(tools)
        .config(test_config(Threshold::Off, hook, "runner"))
        .build()
        .unwrap()
}

/// (status, result) of the `charge` invocation.
fn charge_row(store: &abridge::Store) -> Option<(String, Option<String>)> {
    use abridge::store::OptionalExtension;
    store
        .with_conn(|c| {
            c.query_row(
                "SELECT status, result FROM tool_invocations WHERE tool_name = 'charge'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
        })
        .unwrap()
}

/// Scenario: a step calls a transactional tool, then an at-most-once one; the
/// runner crashes at each point around the at-most-once call. Whatever the
/// point, the call happens at most once over the crash and the resume; when
/// it had started and its completion was not recorded, the resumed turn does
/// not repeat it and tells the model its outcome is unknown; the turn
/// completes and the store verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_around_an_at_most_once_call_never_repeats_it() {
    // (point, calls made before the crash, invocation status at the crash).
    // The call's result is committed with the step's completion, so a crash
    // after the call and before that commit leaves it `started`.
    for (point, calls_at_crash, at_crash) in [
        (FaultPoint::BetweenTools, 0, None),
        (FaultPoint::AfterToolEffect, 1, Some("started")),
        (FaultPoint::BeforeStepComplete, 1, Some("started")),
    ] {
        let (_d, path) = temp_db();
        let store = open(&path);
        let model = Counting::new(ToolsThenAnswer("charge"));
        let charge = Charge::default();
        let calls = || charge.0.load(std::sync::atomic::Ordering::SeqCst);
        let crashing = charge_runner(
            &store,
            model.clone(),
            charge.clone(),
            Some(fail_at(point, 1)),
        );
        let s = crashing.create_session("s", "m", "sys").await.unwrap();
        let err = crashing.run_turn(s.id, "go").await.unwrap_err();
        assert!(
            matches!(err, abridge::Error::Injected(p) if p == point),
            "{point}: {err}"
        );
        drop(crashing);
        assert_eq!(calls(), calls_at_crash, "{point}: calls before the crash");
        let row = charge_row(&store);
        assert_eq!(
            row.as_ref().map(|r| r.0.as_str()),
            at_crash,
            "{point}: {row:?}"
        );

        let resumed = charge_runner(&store, model.clone(), charge.clone(), None);
        let out = resumed.run_turn_at(s.id, 0, "go").await.unwrap();
        assert_eq!(out.output, "done", "{point}");
        assert_eq!(
            calls(),
            1,
            "{point}: the at-most-once call ran {} times",
            calls()
        );
        let (status, result) = charge_row(&store).unwrap();
        let result = result.unwrap_or_default();
        if at_crash == Some("started") {
            assert_eq!(status, "failed", "{point}");
            assert!(result.starts_with("outcome unknown"), "{point}: {result}");
        } else {
            assert_eq!(status, "completed", "{point}");
            assert!(result.contains("charged"), "{point}: {result}");
        }
        assert_verified(&store);
        assert!(assert_all_steps_rebuild(&store) >= 2);
    }
}

/// The pins of a finished turn, and the next step's context (the next
/// turn's first step's too: the whole turn before, and that turn's input
/// from its row), are built from the rows its runner has just written when
/// it wrote all of them, and read back otherwise (a resumed turn). Both give the same: a session run
/// through and the same session with every step stopped before it completes
/// and resumed by a new runner have the same pins and the same transcript,
/// and every step of both rebuilds to its recorded hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_and_contexts_from_the_rows_just_written_equal_those_read_back() {
    fn pins(store: &abridge::Store) -> Vec<String> {
        store
            .with_conn(|c| {
                let mut st = c.prepare(
                    "SELECT turn_index, kind, slot, value, sentence, source, \
                     superseded_by IS NULL FROM pins ORDER BY id",
                )?;
                let rows = st.query_map([], |r| {
                    Ok(format!(
                        "{}|{}|{:?}|{}|{}|{}|{}",
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, bool>(6)?,
                    ))
                })?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            })
            .unwrap()
    }
    let (_da, pa) = temp_db();
    let through = open(&pa);
    let r = demo_runner_with(&through, SEED, Threshold::Off, None, EXTRAS, "through");
    assert_eq!(run_script(&r, || r.clone(), SEED, 0, TURNS).await, 0);

    let (_db, pb) = temp_db();
    let resumed = open(&pb);
    // Every other arrival before a step's completion fails: each step
    // fails once, and is completed by the next runner from its rows.
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook: abridge::FaultHook = Arc::new(move |p| {
        let n = hits.fetch_add((p == FaultPoint::BeforeStepComplete) as usize, SeqCst);
        match p == FaultPoint::BeforeStepComplete && n.is_multiple_of(2) {
            true => Err(p),
            false => Ok(()),
        }
    });
    let fresh = || {
        demo_runner_with(
            &resumed,
            SEED,
            Threshold::Off,
            Some(hook.clone()),
            EXTRAS,
            "resumed",
        )
    };
    let faults = run_script(&fresh(), fresh, SEED, 0, TURNS).await;
    assert!(faults as u64 >= 2 * TURNS, "{faults} faults");

    let written = pins(&through);
    assert!(written.len() >= TURNS as usize, "{} pins", written.len());
    assert_eq!(written, pins(&resumed));
    assert_eq!(transcript(&through, SEED, 0), transcript(&resumed, SEED, 0));
    assert!(assert_all_steps_rebuild(&through) >= 2 * TURNS as usize);
    assert_all_steps_rebuild(&resumed);
}
