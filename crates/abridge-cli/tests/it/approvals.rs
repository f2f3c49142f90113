//! Waiting for a human: tool calls that park their turn until a decision (or
//! a delivered result) is recorded, from any process, once.
//!
//! Scenarios: a call that needs approval parks the turn (a row, no process
//! holds it) and the session refuses a new turn; an approval, an edited
//! approval, a rejection and a delivered result each reach the model as the
//! call's result when the turn resumes; the first of racing decisions wins
//! and the rest are refused naming it; an "always allow" decision is recorded
//! and lets later calls of the tool run at once; an abandoned turn frees the
//! session; a crash at every point between a decision and the approved
//! call's effect leaves that effect done once; a parked turn is never folded
//! into a summary; every step of a parked-then-resumed turn rebuilds byte for
//! byte, and `verify` checks the decisions.

use crate::common::*;
use abridge::store::{ApprovalKind, ApprovalStatus, TurnStatus};
use abridge::{
    CallId, ContentBlock, Decision, Error, FaultPoint, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Runner, Store, Threshold, ToolCall, ToolError, Tools, TransactionalTool,
};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// Turn by turn: the first step calls each tool of `calls` (with
/// `{"amount": N}`); the next answers with every tool result it was shown,
/// so what reached the model is in the turn's output.
struct CallsThenEcho {
    calls: Vec<&'static str>,
}

#[abridge::async_trait]
impl abridge::ModelClient for CallsThenEcho {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().expect("a message");
        let results: Vec<String> = last
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::ToolResult {
                    content, is_error, ..
                } => Some(format!(
                    "{}{content}",
                    if *is_error { "error: " } else { "" }
                )),
                _ => None,
            })
            .collect();
        let blocks = if results.is_empty() {
            self.calls
                .iter()
                .enumerate()
                .map(|(i, name)| ResponseBlock::ToolUse {
                    id: format!("c{i}"),
                    name: (*name).into(),
                    input: json!({"amount": 10 * (i + 1)}),
                    raw_input: None,
                })
                .collect()
        } else {
            vec![ResponseBlock::Text {
                text: results.join(" | "),
            }]
        };
        Ok(ModelResponse {
            blocks,
            ..Default::default()
        })
    }
}

fn spec(name: &str) -> abridge::ToolSpec {
    abridge::ToolSpec {
        name: name.into(),
        description: "d".into(),
        input_schema: json!({"type": "object"}),
    }
}

/// An outside tool that counts its calls and records their arguments.
#[derive(Clone, Default)]
struct Outside(Arc<Mutex<Vec<Value>>>);

#[abridge::async_trait]
impl abridge::Tool for Outside {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        self.0.lock().unwrap().push(call.input.clone());
        Ok(json!(format!("refunded {}", call.input["amount"])))
    }
}

/// A transactional tool that writes one `demo_effects` row per call.
struct Ledger;

impl TransactionalTool for Ledger {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<Value, ToolError> {
        // As a host writes for its backend (PostgreSQL's placeholders too).
        abridge_testkit::demo_tables::append_effect(
            tx,
            abridge_testkit::demo_tables::DemoTable::Effects,
            &call.idempotency_key,
            &call.name,
            &call.input.to_string(),
        )
        .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(json!("booked"))
    }

    fn may_block(&self) -> bool {
        false
    }
}

struct Host {
    refunds: Outside,
    runner: Runner,
}

/// A runner whose model calls `calls`; `refund` (at-most-once) and `ledger`
/// (transactional) need approval, `lookup` (idempotent) does not, `job` is
/// deferred.
fn host(store: &Store, calls: Vec<&'static str>, hook: Option<abridge::FaultHook>) -> Host {
    host_owned(store, calls, hook, "runner")
}

fn host_owned(
    store: &Store,
    calls: Vec<&'static str>,
    hook: Option<abridge::FaultHook>,
    owner: &str,
) -> Host {
    let refunds = Outside::default();
    let tools = Tools::new()
        .at_most_once(spec("refund"), refunds.clone())
        .idempotent(spec("lookup"), Outside::default())
        .transactional(spec("ledger"), Ledger)
        .deferred(spec("job"));
    let runner = Runner::builder(store.clone(), Arc::new(CallsThenEcho { calls }))
        .tools(tools)
        .config(test_config(Threshold::Off, hook, owner))
        .approval(abridge::Approval::tools(["refund", "ledger"]))
        .build()
        .unwrap();
    Host { refunds, runner }
}

/// A store whose session `s` ran turn 0 (`input`) with a model calling
/// `calls`, and what the turn returned (parked, when a call waits).
struct Parked {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    store: Store,
    h: Host,
    s: abridge::store::SessionRow,
    parked: abridge::TurnOutcome,
}

async fn parked(calls: Vec<&'static str>, input: &str) -> Parked {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let h = host(&store, calls, None);
    let s = h
        .runner
        .create_session("s", "demo-model", "sys")
        .await
        .unwrap();
    let parked = h.runner.run_turn_at(s.id, 0, input).await.unwrap();
    Parked {
        _dir,
        path,
        store,
        h,
        s,
        parked,
    }
}

fn ledger_rows(store: &Store) -> i64 {
    store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM demo_effects WHERE tool = 'ledger'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_needs_approval_parks_its_turn_and_runs_once_approved() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let h = host(&store, vec!["lookup", "refund"], None);
    let s = h
        .runner
        .create_session("s", "demo-model", "sys")
        .await
        .unwrap();
    let events = h.runner.subscribe();

    let parked = h.runner.run_turn_at(s.id, 0, "refund me").await.unwrap();
    assert!(parked.is_parked());
    assert_eq!(parked.output, "");
    let call = &parked.pending[0];
    assert_eq!(
        (
            parked.pending.len(),
            call.tool_name.as_str(),
            call.effect.as_str()
        ),
        (1, "refund", "at_most_once")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&call.arguments).unwrap(),
        json!({"amount": 20})
    );
    // A row, not a future: no lease is held, the turn is still running, the
    // call that needed no approval ran, the one that did did not.
    let turn = store.turns(s.id).await.unwrap().remove(0);
    assert_eq!(
        (turn.status, turn.lease_owner.clone()),
        (TurnStatus::Running, None)
    );
    assert!(h.refunds.0.lock().unwrap().is_empty());
    assert_eq!(store.pending_calls(None).await.unwrap(), parked.pending);
    // Not among the turns to recover: nothing to do until a decision.
    assert!(h.runner.recoverable_turns().await.unwrap().is_empty());
    // The session refuses a new turn, saying why.
    match h.runner.run_turn(s.id, "another").await {
        Err(Error::TurnParked {
            parked_idx: 0,
            calls: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Running it again before a decision parks it again, changing nothing.
    let again = h.runner.run_turn_at(s.id, 0, "refund me").await.unwrap();
    assert_eq!(again.pending, parked.pending);

    let decided = h
        .runner
        .decide(call.id, Decision::approve(), Some("alice"))
        .await
        .unwrap();
    assert_eq!(
        (decided.status, decided.decided_by.as_deref()),
        (ApprovalStatus::Approved, Some("alice"))
    );
    assert_eq!(h.runner.recoverable_turns().await.unwrap().len(), 1);
    let done = h.runner.resume_turn(turn.id).await.unwrap();
    assert!(!done.is_parked());
    assert_eq!(done.output, "refunded 10 | refunded 20");
    assert_eq!(h.refunds.0.lock().unwrap().len(), 1);
    // Resuming the finished turn again runs nothing.
    h.runner.resume_turn(turn.id).await.unwrap();
    assert_eq!(h.refunds.0.lock().unwrap().len(), 1);

    let mut events = events;
    let mut seen = Vec::new();
    for e in drained(&mut events) {
        let name = serde_json::to_value(&e).unwrap()["event"]
            .as_str()
            .unwrap()
            .to_string();
        if [
            "approval_requested",
            "turn_parked",
            "call_decided",
            "turn_resumed",
            "turn_finished",
        ]
        .contains(&name.as_str())
        {
            seen.push(name);
        }
    }
    seen.dedup();
    assert_eq!(
        seen,
        [
            "approval_requested",
            "turn_parked",
            "call_decided",
            "turn_resumed",
            "turn_finished"
        ]
    );
    assert_verified(&store);
    assert!(assert_all_steps_rebuild(&store) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_calls_message_reaches_the_model_and_the_tool_never_runs() {
    let Parked {
        _dir,
        store,
        h,
        s,
        parked,
        ..
    } = parked(vec!["refund", "ledger"], "go").await;
    let [refund, ledger] = [&parked.pending[0], &parked.pending[1]];
    h.runner
        .decide(refund.id, Decision::reject("over the limit"), None)
        .await
        .unwrap();
    // One decided of two: the turn still waits.
    let still = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(still.pending.len(), 1);
    assert_eq!(still.pending[0].id, ledger.id);
    // Approved with edited arguments, recorded as such.
    let edited = h
        .runner
        .decide(
            ledger.id,
            Decision::Approve {
                input: Some(json!({"amount": 5})),
                always: false,
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(edited.input.as_deref(), Some(r#"{"amount":5}"#));
    assert_eq!(edited.effective_arguments(), r#"{"amount":5}"#);
    let done = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(done.output, "error: rejected: over the limit | booked");
    assert!(h.refunds.0.lock().unwrap().is_empty());
    assert_eq!(ledger_rows(&store), 1);
    let args: String = store
        .with_conn(|c| {
            c.query_row(
                "SELECT arguments FROM demo_effects WHERE tool = 'ledger'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(args, r#"{"amount":5}"#);
    assert_verified(&store);
    assert!(assert_all_steps_rebuild(&store) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_tools_result_is_delivered_once_and_reaches_the_model() {
    let Parked {
        _dir,
        store,
        h,
        s,
        parked,
        ..
    } = parked(vec!["job"], "go").await;
    let call = parked.pending[0].id;
    assert_eq!(parked.pending[0].kind, ApprovalKind::Result);
    // A result is not an approval.
    assert!(matches!(
        store.decide(call, Decision::approve(), None).await,
        Err(Error::WrongDecision { .. })
    ));
    let mut events = h.runner.subscribe();
    h.runner
        .decide(call, Decision::deliver("report ready"), Some("queue"))
        .await
        .unwrap();
    let e = serde_json::to_value(events.try_recv().unwrap()).unwrap();
    assert_eq!(
        (e["event"].as_str(), e["tool"].as_str()),
        (Some("result_delivered"), Some("job"))
    );
    match store.decide(call, Decision::deliver("again"), None).await {
        Err(Error::AlreadyDecided { status, by, .. }) => {
            assert_eq!(
                (status.as_str(), by.as_deref()),
                ("delivered", Some("queue"))
            )
        }
        other => panic!("{other:?}"),
    }
    let done = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(done.output, "report ready");
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_for_a_call_that_is_not_pending_is_a_typed_error() {
    let (_d, path) = temp_db();
    let store = open(&path);
    match store.decide(CallId(4_242), Decision::approve(), None).await {
        Err(Error::UnknownCall { call }) => assert_eq!(call, 4_242),
        other => panic!("{other:?}"),
    }
    let h = host(&store, vec!["refund"], None);
    let s = h
        .runner
        .create_session("s", "demo-model", "sys")
        .await
        .unwrap();
    let parked = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    let call = parked.pending[0].id;
    let bad = Decision::Approve {
        input: Some(json!([1, 2])),
        always: false,
    };
    assert!(matches!(
        store.decide(call, bad, None).await,
        Err(Error::WrongDecision { .. })
    ));
    assert!(matches!(
        store.decide(call, Decision::deliver("x"), None).await,
        Err(Error::WrongDecision { .. })
    ));
    // Abandoned: the session takes a new turn; a decision is refused.
    let turn = h
        .runner
        .abandon_turn(parked.turn.id, "customer left")
        .await
        .unwrap();
    assert_eq!(
        (turn.status, turn.error.as_deref()),
        (TurnStatus::Failed, Some("abandoned: customer left"))
    );
    match store.decide(call, Decision::approve(), None).await {
        Err(Error::AlreadyDecided { status, .. }) => assert_eq!(status, "abandoned"),
        other => panic!("{other:?}"),
    }
    let next = h.runner.run_turn_at(s.id, 1, "hello").await.unwrap();
    assert!(next.is_parked(), "the new turn's refund waits in turn");
    assert!(h.refunds.0.lock().unwrap().is_empty());
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_allow_is_recorded_and_later_calls_of_the_tool_run_at_once() {
    let Parked {
        _dir,
        store,
        h,
        s,
        parked,
        ..
    } = parked(vec!["refund"], "one").await;
    let always = Decision::Approve {
        input: None,
        always: true,
    };
    let row = h
        .runner
        .decide(parked.pending[0].id, always, Some("bob"))
        .await
        .unwrap();
    assert!(row.always);
    h.runner.run_turn_at(s.id, 0, "one").await.unwrap();
    let second = h.runner.run_turn_at(s.id, 1, "two").await.unwrap();
    assert!(!second.is_parked());
    assert_eq!(h.refunds.0.lock().unwrap().len(), 2);
    // The later call is recorded as approved by the grant.
    let rows = store.approvals(s.id).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[1].status, rows[1].decided_by.as_deref()),
        (
            ApprovalStatus::Approved,
            Some(format!("always allowed (call {})", row.id).as_str())
        )
    );
    // Another session still asks.
    let s2 = h
        .runner
        .create_session("s2", "demo-model", "sys")
        .await
        .unwrap();
    assert!(h
        .runner
        .run_turn_at(s2.id, 0, "x")
        .await
        .unwrap()
        .is_parked());
    assert_verified(&store);
}

/// Scenario: several tasks decide the same call at once, some approving,
/// some rejecting. Exactly one decision is taken; every other is refused
/// with [`Error::AlreadyDecided`] naming that one, and the turn resumes by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_decisions_one_wins_and_the_rest_are_refused_naming_it() {
    let Parked {
        _dir,
        store,
        h,
        s,
        parked,
        path,
        ..
    } = parked(vec!["refund"], "go").await;
    let call = parked.pending[0].id;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store_at(&path);
        tasks.push(tokio::spawn(async move {
            let d = match i % 2 {
                0 => Decision::approve(),
                _ => Decision::reject(format!("no ({i})")),
            };
            store.decide(call, d, Some(&format!("d{i}"))).await
        }));
    }
    let mut won = Vec::new();
    let mut refused = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(row) => won.push(row),
            Err(Error::AlreadyDecided { status, by, .. }) => refused.push((status, by)),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((won.len(), refused.len()), (1, 7));
    let first = &won[0];
    for (status, by) in refused {
        assert_eq!(
            (status, by),
            (first.status.to_string(), first.decided_by.clone())
        );
    }
    let done = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    let ran = h.refunds.0.lock().unwrap().len();
    match first.status {
        ApprovalStatus::Approved => assert_eq!((ran, done.output.as_str()), (1, "refunded 10")),
        _ => assert_eq!(ran, 0),
    }
    assert_verified(&store);
}

/// Scenario: a call is approved; the process resuming the turn crashes at
/// each point between the decision and the approved call's recorded result
/// (before the call is claimed, between calls, inside the transactional
/// tool, after the outside call's effect, before the step completes). A new
/// runner resumes. The at-most-once refund runs once (a crash after its
/// claim committed leaves its outcome unknown, never a second call), the
/// transactional ledger writes exactly once, and the decision stays as taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_decision_and_the_approved_calls_effect_runs_it_at_most_once() {
    for point in [
        FaultPoint::BetweenTools,
        FaultPoint::InsideTransactionalTool,
        FaultPoint::AfterToolEffect,
        FaultPoint::BeforeStepComplete,
    ] {
        let (_d, path) = temp_db();
        let store = open(&path);
        let first = host(&store, vec!["ledger", "refund"], None);
        let s = first
            .runner
            .create_session("s", "demo-model", "sys")
            .await
            .unwrap();
        let parked = first.runner.run_turn_at(s.id, 0, "go").await.unwrap();
        for call in &parked.pending {
            store
                .decide(call.id, Decision::approve(), None)
                .await
                .unwrap();
        }
        let crashing = host_owned(
            &store,
            vec!["ledger", "refund"],
            Some(fail_at(point, 1)),
            "crashing",
        );
        let err = crashing.runner.run_turn_at(s.id, 0, "go").await;
        assert!(matches!(err, Err(Error::Injected(_))), "{point}: {err:?}");
        drop(crashing.runner);
        let after = host_owned(&store, vec!["ledger", "refund"], None, "crashing");
        let done = after.runner.run_turn_at(s.id, 0, "go").await.unwrap();
        let refunds =
            crashing.refunds.0.lock().unwrap().len() + after.refunds.0.lock().unwrap().len();
        assert_eq!(refunds, 1, "{point}: the refund ran {refunds} times");
        assert_eq!(
            ledger_rows(&store),
            1,
            "{point}: the ledger wrote twice or never"
        );
        // A crash after the refund's claim committed leaves its outcome
        // unknown: it is not called again (at-most-once), and the model is
        // told so.
        let want = match point {
            FaultPoint::AfterToolEffect | FaultPoint::BeforeStepComplete => {
                "booked | error: outcome unknown: the call to refund may or may not have taken \
                 effect (the process stopped during it); it was not repeated"
            }
            _ => "booked | refunded 20",
        };
        assert_eq!(done.output, want, "{point}");
        let rows = store.approvals(s.id).await.unwrap();
        assert!(rows.iter().all(|r| r.status == ApprovalStatus::Approved));
        assert_verified(&store);
        assert!(assert_all_steps_rebuild(&store) > 0);
    }
}

/// Scenario: a session well past its compaction threshold parks a turn. The
/// turn resumes after a decision: every step reads a compaction whose
/// boundary is before the parked turn, and a manual compaction meanwhile
/// refuses (a turn is running): the parked call and its result are never
/// folded apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_turn_is_never_folded_into_a_summary() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(Threshold::Tokens(60), None, "runner");
    cfg.compaction = cfg.compaction.with_keep_last_turns(0);
    let refunds = Outside::default();
    let runner = Runner::builder(
        store.clone(),
        Arc::new(CallsThenEcho {
            calls: vec!["refund"],
        }),
    )
    .tools(Tools::new().at_most_once(spec("refund"), refunds.clone()))
    .config(cfg)
    .summariser(abridge::ExtractiveSummariser)
    .approval(abridge::Approval::when(|c: &ToolCall| {
        c.input["amount"] == 10 && c.turn_idx == 4
    }))
    .build()
    .unwrap();
    let s = runner
        .create_session("s", "demo-model", "sys")
        .await
        .unwrap();
    for i in 0..4 {
        let out = runner
            .run_turn_at(
                s.id,
                i,
                &format!("turn {i}: a long enough input to pass the threshold soon"),
            )
            .await
            .unwrap();
        assert!(!out.is_parked());
    }
    let parked = runner
        .run_turn_at(s.id, 4, "turn 4: refund please")
        .await
        .unwrap();
    assert!(parked.is_parked());
    assert!(matches!(
        runner.compact_now(s.id, None).await,
        Err(Error::TurnRunning { .. })
    ));
    runner
        .decide(parked.pending[0].id, Decision::approve(), None)
        .await
        .unwrap();
    let done = runner
        .run_turn_at(s.id, 4, "turn 4: refund please")
        .await
        .unwrap();
    assert_eq!(done.output, "refunded 10");
    let compactions = store.compactions(s.id).await.unwrap();
    assert!(!compactions.is_empty(), "the threshold was never passed");
    assert!(compactions.iter().all(|c| c.up_to_turn_index < 4));
    assert_verified(&store);
    assert!(assert_all_steps_rebuild(&store) > 0);
}

/// The `abridge` command over the demo workload, for the process tests.
fn cli(args: &[&str]) -> std::process::Output {
    abridge_cmd().args(args).output().unwrap()
}

fn demo_args<'a>(db: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "demo",
        "--db",
        db,
        "--sessions",
        "2",
        "--turns",
        "10",
        "--compact-at",
        "1500",
        "--seed",
        "5",
        "--background",
        "off",
        "--json",
    ];
    a.extend(extra);
    a
}

fn demo_transcripts(db: &std::path::Path) -> Vec<String> {
    let c = read_only_conn(db);
    (0..2)
        .map(|i| {
            abridge::inspect::export(
                &c,
                &format!("demo-5-{i}"),
                abridge::inspect::ExportFormat::Jsonl,
            )
            .unwrap()
        })
        .collect()
}

fn pending_ids(db: &str) -> Vec<i64> {
    let out = cli(&["pending", "--db", db, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            for field in ["call", "session", "turn", "tool", "input"] {
                assert!(!c[field].is_null(), "{field} missing from {c}");
            }
            c["call"].as_i64().unwrap()
        })
        .collect()
}

/// Scenario: the demo, with every `place_change` call needing approval, is
/// killed (SIGKILL) while it runs; the same command run again parks every
/// session at its waiting call and exits. Each call is approved by another
/// process (`abridge approve`), and a third process (the demo again)
/// resumes the turns, until no call waits. The sessions then hold exactly
/// the transcript of a run that never asked (an approved call runs as the
/// model wrote it, once), `verify` holds, and every step rebuilds.
#[test]
#[cfg(unix)]
fn parked_killed_decided_elsewhere_resumed_in_a_third_process() {
    let dir = tempfile::tempdir().unwrap();
    let control = db_for(&dir.path().join("control.db"));
    let control_s = control.to_str().unwrap();
    let out = cli(&demo_args(control_s, &[]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let db = db_for(&dir.path().join("parked.db"));
    let db_s = db.to_str().unwrap();
    let asking = ["--require-approval", "place_change", "--model-latency", "5"];
    // Killed while it runs (after its first steps, before it ends).
    let mut child = abridge_cmd()
        .args(demo_args(db_s, &asking))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();

    let mut rounds = 0;
    loop {
        let out = cli(&demo_args(db_s, &asking));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let waiting = pending_ids(db_s);
        assert_eq!(report["calls_waiting"].as_i64(), Some(waiting.len() as i64));
        if waiting.is_empty() {
            break;
        }
        for call in waiting {
            let out = cli(&["approve", "--db", db_s, "--call", &call.to_string()]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // A second decision is refused with one line naming the first.
            let again = cli(&[
                "reject",
                "--db",
                db_s,
                "--call",
                &call.to_string(),
                "--reason",
                "x",
            ]);
            let err = String::from_utf8_lossy(&again.stderr);
            assert_eq!(again.status.code(), Some(1));
            assert!(err.contains("already decided: approved"), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
        rounds += 1;
        assert!(rounds < 50, "the sessions never finished");
    }
    assert!(rounds >= 2, "no call ever waited ({rounds} rounds)");
    assert_eq!(demo_transcripts(&db), demo_transcripts(&control));
    let c = read_only_conn(&db);
    let r =
        abridge::verify::verify_with(&c, &[&abridge_testkit::demo_tables::DemoEffects]).unwrap();
    assert!(r.ok, "{r:#?}");
    let decided = r
        .checks
        .iter()
        .find(|c| c.name.starts_with("G5 a decision"))
        .unwrap();
    // Every call that waited was decided once and ran once, as approved.
    assert!(decided.checked >= 1);
    let c = read_only_conn(&db);
    let unapproved: i64 = c
        .query_row(
            "SELECT count(*) FROM approvals WHERE status <> 'approved'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unapproved, 0);
}

/// Scenario: six `abridge` processes decide one parked call at once, half
/// approving, half rejecting. Exactly one exits 0; each other prints one
/// line naming the decision that won, and the store holds that one.
#[test]
fn racing_decisions_from_several_processes_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let db = db_for(&dir.path().join("race.db"));
    let db_s = db.to_str().unwrap().to_string();
    let out = cli(&demo_args(&db_s, &["--require-approval", "lookup_order"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let call = pending_ids(&db_s)[0].to_string();
    let children: Vec<_> = (0..6)
        .map(|i| {
            let by = format!("p{i}");
            let mut c = abridge_cmd();
            match i % 2 {
                0 => c.args(["approve", "--db", &db_s, "--call", &call, "--by", &by]),
                _ => c.args([
                    "reject", "--db", &db_s, "--call", &call, "--reason", "no", "--by", &by,
                ]),
            };
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let won: Vec<_> = outs.iter().filter(|o| o.status.success()).collect();
    assert_eq!(won.len(), 1, "{outs:?}");
    let c = read_only_conn(&db);
    let (status, by): (String, String) = c
        .query_row(
            "SELECT status, decided_by FROM approvals WHERE id = ?1",
            [call.parse::<i64>().unwrap()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    for o in outs.iter().filter(|o| !o.status.success()) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(
            err.trim(),
            format!("abridge: error: tool call {call} was already decided: {status} by {by}")
        );
    }
}

/// Scenario: with a decision deadline of one hour, read through the store's
/// clock, a parked call waits; before the hour the turn is not among the
/// turns to recover and resuming it parks it again; past the hour it is,
/// and resuming it rejects the call ("no decision within 1 h", decided by
/// `deadline`) and the turn goes on. A call decided before its deadline
/// keeps its decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_decision_deadline_is_rejected_when_its_turn_resumes() {
    let (_d, path) = temp_db();
    let clock = abridge::ManualClock::starting_at(1_000_000_000);
    let store = open_with_clock(&path, &clock);
    let mut cfg = test_config(Threshold::Off, None, "runner");
    cfg.decision_deadline = Some(std::time::Duration::from_secs(3_600));
    let refunds = Outside::default();
    let runner = Runner::builder(
        store.clone(),
        Arc::new(CallsThenEcho {
            calls: vec!["refund", "ledger"],
        }),
    )
    .tools(
        Tools::new()
            .at_most_once(spec("refund"), refunds.clone())
            .transactional(spec("ledger"), Ledger),
    )
    .config(cfg)
    .approval(abridge::Approval::all())
    .build()
    .unwrap();
    let s = runner
        .create_session("s", "demo-model", "sys")
        .await
        .unwrap();
    let parked = runner.run_turn_at(s.id, 0, "go").await.unwrap();
    let (refund, ledger) = (parked.pending[0].id, parked.pending[1].id);
    runner
        .decide(ledger, Decision::approve(), Some("alice"))
        .await
        .unwrap();
    clock.advance(std::time::Duration::from_secs(3_599));
    assert!(runner.recoverable_turns().await.unwrap().is_empty());
    assert!(runner.run_turn_at(s.id, 0, "go").await.unwrap().is_parked());
    clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(runner.recoverable_turns().await.unwrap().len(), 1);
    let done = runner.resume_turn(parked.turn.id).await.unwrap();
    assert_eq!(
        done.output,
        "error: rejected: no decision within 1 h | booked"
    );
    let rows = store.approvals(s.id).await.unwrap();
    let by: Vec<_> = rows
        .iter()
        .map(|r| (r.id, r.status, r.decided_by.clone()))
        .collect();
    assert_eq!(
        by,
        [
            (
                refund,
                ApprovalStatus::Rejected,
                Some("deadline".to_string())
            ),
            (ledger, ApprovalStatus::Approved, Some("alice".to_string())),
        ]
    );
    assert!(refunds.0.lock().unwrap().is_empty());
    assert_verified(&store);
}

/// Scenario: a secret the model put in a parked call's arguments, and in
/// the reason a decider wrote, is redacted from the call's record too; a
/// session deleted with a parked turn leaves none of its calls behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redaction_and_deletion_reach_the_parked_calls() {
    let Parked {
        _dir,
        store,
        h,
        s,
        parked,
        ..
    } = parked(vec!["refund", "ledger"], "go").await;
    h.runner
        .decide(
            parked.pending[0].id,
            Decision::reject("card 4111-1111 declined"),
            None,
        )
        .await
        .unwrap();
    let redacted = store
        .redact("s", abridge::admin::Pattern::text("4111-1111").unwrap())
        .await
        .unwrap();
    assert_eq!(redacted.rows.approvals, 1);
    let rows = store.approvals(s.id).await.unwrap();
    assert_eq!(rows[0].note.as_deref(), Some("card [redacted] declined"));
    // The turn goes on with the redacted reason.
    h.runner
        .decide(parked.pending[1].id, Decision::approve(), None)
        .await
        .unwrap();
    let done = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(
        done.output,
        "error: rejected: card [redacted] declined | booked"
    );
    assert_verified(&store);

    let s2 = h
        .runner
        .create_session("s2", "demo-model", "sys")
        .await
        .unwrap();
    assert!(h
        .runner
        .run_turn_at(s2.id, 0, "go")
        .await
        .unwrap()
        .is_parked());
    store.delete_session(s2.id).await.unwrap();
    assert!(store.pending_calls(None).await.unwrap().is_empty());
    assert_verified(&store);
}

/// Regression: an outside (at-most-once or idempotent) call approved with
/// edited arguments runs with those, not with the model's; its invocation
/// records them and the model sees the result of the edited call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_call_approved_with_edited_arguments_runs_with_them() {
    let Parked {
        _dir,
        store,
        h,
        s,
        parked,
        ..
    } = parked(vec!["refund"], "go").await;
    let edited = Decision::Approve {
        input: Some(json!({"amount": 5})),
        always: false,
    };
    h.runner
        .decide(parked.pending[0].id, edited, None)
        .await
        .unwrap();
    let done = h.runner.run_turn_at(s.id, 0, "go").await.unwrap();
    assert_eq!(*h.refunds.0.lock().unwrap(), vec![json!({"amount": 5})]);
    assert_eq!(done.output, "refunded 5");
    assert_verified(&store);
}

/// G6 for decisions: the schema itself refuses changing a decided call's
/// row, deleting one, and changing a grant (outside a delete or redaction
/// of its session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_refuses_changing_a_decision_or_deleting_a_parked_call() {
    let Parked {
        _dir,
        store,
        h,
        parked,
        ..
    } = parked(vec!["refund"], "go").await;
    let call = parked.pending[0].id;
    let always = Decision::Approve {
        input: None,
        always: true,
    };
    h.runner.decide(call, always, Some("alice")).await.unwrap();
    for sql in [
        "UPDATE approvals SET status = 'rejected' WHERE id = ?1",
        "UPDATE approvals SET decided_by = 'mallory' WHERE id = ?1",
        "DELETE FROM approvals WHERE id = ?1",
        "UPDATE approval_grants SET tool_name = 'other' WHERE approval_id = ?1",
        "DELETE FROM approval_grants WHERE approval_id = ?1",
    ] {
        let sql = if on_postgres() {
            sql.replace("?1", "$1")
        } else {
            sql.to_string()
        };
        let refused = store.with_conn(|c| c.execute(&sql, [call.get()]));
        let msg = format!("{refused:?}");
        assert!(msg.contains("abridge: a"), "{sql}: {msg}");
    }
    let row = store
        .approvals(parked.turn.session_id)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (row.status, row.decided_by.as_deref()),
        (ApprovalStatus::Approved, Some("alice"))
    );
}
