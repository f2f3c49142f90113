//! Agents that delegate. A parent's tool call runs a child session (a
//! sub-agent) whose final answer is the call's result. A crash at every
//! named point of a delegating call (the child's creation, every point of
//! the child's own turn, the child's answer before the parent records it,
//! after the parent's tool effect, before the parent's step completes) ends,
//! once resumed, with one child and one parent result, identical to a run
//! without a crash. On PostgreSQL too, with `ABRIDGE_TEST_POSTGRES` set.

use crate::common;
use abridge::message::{ContentBlock, ModelRequest, ModelResponse, ResponseBlock, Role, Usage};
use abridge::{
    Error, FaultPoint, ModelClient, ModelError, Runner, RunnerConfig, Store, SubAgent, Tools,
};
use serde_json::json;
use std::sync::Arc;

const CHILD_PROMPT: &str = "You research one question and answer it in a sentence.";

/// The parent asks its sub-agent once, then answers with what it said; the
/// child answers its task. A child whose task says "fail" fails.
struct Agents;

#[abridge::async_trait]
impl ModelClient for Agents {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let system = match &req.messages[0].content[0] {
            ContentBlock::Text { text } => text.clone(),
            _ => String::new(),
        };
        let last = req.messages.last().unwrap();
        let text = |t: String| ModelResponse {
            blocks: vec![ResponseBlock::Text { text: t }],
            usage: Usage::new(Some(100), Some(10)),
            stop_reason: None,
            model: None,
        };
        if system == CHILD_PROMPT {
            let task = last
                .content
                .iter()
                .find_map(|b| match b {
                    ContentBlock::Text { text } => Some(text.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            if task.contains("fail") {
                return Err(ModelError::Permanent(
                    "the sub-agent's model refused".into(),
                ));
            }
            return Ok(text(format!("Found it: {task} is in aisle 7.")));
        }
        let result = last.content.iter().find_map(|b| match b {
            ContentBlock::ToolResult {
                content, is_error, ..
            } => Some((content.clone(), *is_error)),
            _ => None,
        });
        match (last.role, result) {
            (Role::User, Some((content, false))) => {
                Ok(text(format!("The researcher says: {content}")))
            }
            (Role::User, Some((content, true))) => {
                Ok(text(format!("The researcher failed: {content}")))
            }
            _ => {
                let question = last
                    .content
                    .iter()
                    .find_map(|b| match b {
                        ContentBlock::Text { text } => Some(text.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                Ok(ModelResponse {
                    blocks: vec![ResponseBlock::ToolUse {
                        id: "call_research".into(),
                        name: "research".into(),
                        input: json!({"task": question}),
                        raw_input: None,
                    }],
                    usage: Usage::new(Some(100), Some(10)),
                    stop_reason: None,
                    model: None,
                })
            }
        }
    }
}

fn runner(store: &Store, hook: Option<abridge::FaultHook>) -> Runner {
    let spec = abridge::ToolSpec {
        name: "research".into(),
        description: "Hand a question to the researcher.".into(),
        input_schema: json!({"type": "object", "properties": {"task": {"type": "string"}}}),
    };
    let mut cfg = RunnerConfig::default().with_owner("delegation-test");
    cfg.testing.fault_hook = hook;
    Runner::builder(store.clone(), Arc::new(Agents))
        .tools(Tools::new().delegate(spec, SubAgent::new("gpt-4o-mini", CHILD_PROMPT)))
        .config(cfg)
        .build()
        .unwrap()
}

/// Sessions: (external id, parent turn, call).
type SessionLines = Vec<(String, Option<i64>, Option<String>)>;
/// Turns: (session, idx, status, output).
type TurnLines = Vec<(String, i64, String, String)>;

/// Every session and every turn.
fn tree(store: &Store) -> (SessionLines, TurnLines) {
    store
        .with_conn(|c| {
            let mut sessions = Vec::new();
            let mut st = c.prepare(
                "SELECT external_id, parent_turn, parent_call FROM sessions ORDER BY id",
            )?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                sessions.push((r.get(0)?, r.get(1)?, r.get(2)?));
            }
            let mut turns = Vec::new();
            let mut st = c.prepare(
                "SELECT s.external_id, t.idx, t.status, coalesce(t.output, '') FROM turns t \
                 JOIN sessions s ON s.id = t.session_id ORDER BY s.id, t.idx",
            )?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                turns.push((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?));
            }
            Ok((sessions, turns))
        })
        .unwrap()
}

/// The parent's invocation rows of the research call.
fn research_results(store: &Store) -> Vec<(String, String)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT i.status, coalesce(i.result, '') FROM tool_invocations i \
                 WHERE i.tool_name = 'research' ORDER BY i.id",
            )?;
            let mut rows = st.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push((r.get(0)?, r.get(1)?));
            }
            Ok(out)
        })
        .unwrap()
}

/// Runs the parent's turn 0 (resuming after each injected crash with a
/// fresh runner, as a restarted process would); returns the crashes.
async fn run(store: &Store, hook: Option<abridge::FaultHook>) -> usize {
    let first = runner(store, hook);
    let s = first
        .create_session("boss", "gpt-4o-mini", "You run the shop.")
        .await
        .unwrap();
    let mut r = first;
    let mut crashes = 0;
    loop {
        match r.run_turn_at(s.id, 0, "Where are the lanterns?").await {
            Ok(out) => {
                assert_eq!(
                    out.output,
                    "The researcher says: Found it: Where are the lanterns? is in aisle 7."
                );
                return crashes;
            }
            Err(Error::Injected(_)) => {
                crashes += 1;
                r = runner(store, None);
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegating_call_runs_one_child_whose_answer_is_the_parents_result() {
    let (_d, path) = common::temp_db();
    let store = common::store_at(&path);
    assert_eq!(run(&store, None).await, 0);
    let (sessions, turns) = tree(&store);
    assert_eq!(
        sessions,
        vec![
            ("boss".to_string(), None, None),
            (
                "boss/0/call_research".to_string(),
                Some(0),
                Some("call_research".to_string())
            ),
        ]
    );
    assert_eq!(turns.len(), 2);
    assert_eq!(
        turns[1].3,
        "Found it: Where are the lanterns? is in aisle 7."
    );
    assert_eq!(research_results(&store).len(), 1);
    // The child knows its parent; the parent names its child.
    let child = store.session("boss/0/call_research").await.unwrap();
    let parent = store.session("boss").await.unwrap();
    let link = child.parent.clone().unwrap();
    assert_eq!(
        (link.session_id, link.turn, link.call.as_deref()),
        (parent.id, 0, Some("call_research"))
    );
    assert_eq!(link.kind, abridge::store::ParentKind::Delegate);
    let children = store.children("boss").await.unwrap();
    assert_eq!(
        children.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![child.id]
    );
    common::assert_verified(&store);
    assert!(common::assert_all_steps_rebuild(&store) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_carry_the_tree() {
    let (_d, path) = common::temp_db();
    let store = common::store_at(&path);
    let r = runner(&store, None);
    let mut events = r.subscribe();
    let s = r
        .create_session("boss", "gpt-4o-mini", "You run the shop.")
        .await
        .unwrap();
    r.run_turn(s.id, "Where are the lanterns?").await.unwrap();
    let mut delegated = None;
    let mut child_events = 0;
    for e in common::drained(&mut events) {
        if let abridge::events::EventKind::Delegated { child, created, .. } = &e.kind {
            assert!(*created);
            assert_eq!(e.subject.session, "boss");
            delegated = Some(child.clone());
        }
        if e.subject.session == "boss/0/call_research" {
            assert_eq!(e.subject.parent, Some(s.id));
            child_events += 1;
        }
    }
    assert_eq!(delegated.as_deref(), Some("boss/0/call_research"));
    assert!(child_events > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_child_is_the_tools_error_result() {
    let (_d, path) = common::temp_db();
    let store = common::store_at(&path);
    let r = runner(&store, None);
    let s = r
        .create_session("boss", "gpt-4o-mini", "You run the shop.")
        .await
        .unwrap();
    let out = r.run_turn(s.id, "please fail").await.unwrap();
    assert!(
        out.output
            .starts_with("The researcher failed: the sub-agent failed"),
        "{}",
        out.output
    );
    let results = research_results(&store);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "failed");
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_named_point_of_a_delegating_call_ends_with_one_child_and_one_result() {
    let (_c, control_path) = common::temp_db();
    let control = common::store_at(&control_path);
    assert_eq!(run(&control, None).await, 0);
    let want = tree(&control);
    let want_results = research_results(&control);
    // How often a run reaches each point: every one of those is a crash.
    let hits = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        FaultPoint,
        usize,
    >::new()));
    let counted = hits.clone();
    let counting: abridge::FaultHook = Arc::new(move |p| {
        *counted.lock().unwrap().entry(p).or_default() += 1;
        Ok(())
    });
    let (_e, counted_path) = common::temp_db();
    assert_eq!(
        run(&common::store_at(&counted_path), Some(counting)).await,
        0
    );
    let hits = hits.lock().unwrap().clone();
    // The child's turn reaches the points of any turn; the parent's call the
    // delegation's own and those around its tool's effect.
    let points = [
        FaultPoint::ChildCreated,
        FaultPoint::BeforeModelCall,
        FaultPoint::AfterResponseWritten,
        FaultPoint::BeforeStepComplete,
        FaultPoint::ChildAnswered,
        FaultPoint::AfterToolEffect,
    ];
    for point in points {
        let reached = hits.get(&point).copied().unwrap_or(0);
        assert!(reached > 0, "{point} is never reached by a delegating call");
        for nth in 1..=reached {
            let (_d, path) = common::temp_db();
            let store = common::store_at(&path);
            let crashes = run(&store, Some(common::fail_at(point, nth))).await;
            assert_eq!(crashes, 1, "{point} #{nth} was never reached");
            assert_eq!(
                tree(&store),
                want,
                "{point} #{nth}: sessions or turns differ"
            );
            assert_eq!(
                research_results(&store),
                want_results,
                "{point} #{nth}: results differ"
            );
            common::assert_verified(&store);
            assert!(common::assert_all_steps_rebuild(&store) > 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoning_the_parents_turn_abandons_the_childs_and_delete_takes_the_child_along() {
    let (_d, path) = common::temp_db();
    let store = common::store_at(&path);
    // Crash inside the child's turn: both turns stay running.
    // (The parent's first step writes its response first; the child's is the second.)
    let r = runner(
        &store,
        Some(common::fail_at(FaultPoint::AfterResponseWritten, 2)),
    );
    let s = r
        .create_session("boss", "gpt-4o-mini", "You run the shop.")
        .await
        .unwrap();
    assert!(matches!(
        r.run_turn(s.id, "Where are the lanterns?").await,
        Err(Error::Injected(_))
    ));
    let fresh = runner(&store, None);
    let parent_turn = store
        .with_conn(move |c| abridge::inspect::turns(c, s.id))
        .unwrap()
        .remove(0);
    fresh
        .abandon_turn(parent_turn.id, "the user gave up")
        .await
        .unwrap();
    let (_, turns) = tree(&store);
    assert!(turns.iter().all(|t| t.2 == "failed"), "{turns:?}");
    let deleted = store.delete_session("boss").await.unwrap();
    assert_eq!(deleted.children, vec!["boss/0/call_research".to_string()]);
    assert!(tree(&store).0.is_empty());
    common::assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_export_and_the_report_show_a_sessions_children() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.db");
    let store = Store::open(&path).unwrap();
    assert_eq!(run(&store, None).await, 0);
    let r = runner(&store, None);
    let parent = store.session("boss").await.unwrap();
    let fork = r.fork(parent.id, 0, "boss-branch").await.unwrap();
    r.run_turn(fork.id, "And the candles?").await.unwrap();
    let export = |key: &str| {
        store
            .with_conn(|c| abridge::inspect::export(c, key, abridge::inspect::ExportFormat::Jsonl))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let kinds = |recs: &[serde_json::Value], kind: &str| {
        recs.iter()
            .filter(|r| r["kind"] == kind)
            .cloned()
            .collect::<Vec<_>>()
    };
    let boss = export("boss");
    let children = kinds(&boss, "child");
    assert_eq!(children.len(), 2, "{children:?}");
    assert_eq!(children[0]["session"], "boss/0/call_research");
    assert_eq!(children[0]["relation"], "delegate");
    assert_eq!(children[0]["call"], "call_research");
    assert_eq!(children[1]["session"], "boss-branch");
    assert_eq!(children[1]["relation"], "fork");
    let child = export("boss/0/call_research");
    assert_eq!(child[0]["kind"], "delegated_by");
    assert_eq!(child[0]["parent"], "boss");
    // The fork: its parent first, then the shared turn 0, then its own turn 1.
    let branch = export("boss-branch");
    assert_eq!(branch[0]["kind"], "forked_from");
    assert_eq!(branch[0]["at_turn"], 0);
    let users: Vec<_> = kinds(&branch, "user")
        .iter()
        .map(|r| r["turn"].clone())
        .collect();
    assert_eq!(users, vec![json!(0), json!(1)]);
    drop(r);
    drop(store);
    let inspect = common::abridge_cmd()
        .args(["inspect", "--db"])
        .arg(&path)
        .arg("boss")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        text.contains("delegated boss/0/call_research (id 2) for call call_research of turn 0"),
        "{text}"
    );
    assert!(text.contains("fork boss-branch"), "{text}");
    let page = abridge::store::read_only(&path, |c| {
        abridge_cli::report::session_page(c, "boss", &abridge_cli::report::ReportOptions::default())
    })
    .unwrap();
    assert!(page.contains("data-child=\"boss/0/call_research\""));
    assert!(page.contains("data-child=\"boss-branch\""));
    let page = abridge::store::read_only(&path, |c| {
        abridge_cli::report::session_page(
            c,
            "boss-branch",
            &abridge_cli::report::ReportOptions::default(),
        )
    })
    .unwrap();
    assert!(page.contains("A fork of boss at turn 0"));
}

/// A child's model call waits for `gate` before it answers.
struct Gated {
    gate: Arc<tokio::sync::Notify>,
}

#[abridge::async_trait]
impl ModelClient for Gated {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let child = matches!(&req.messages[0].content[0],
            ContentBlock::Text { text } if text == CHILD_PROMPT);
        if child {
            self.gate.notified().await;
        }
        Agents.complete(req).await
    }
}

/// The regression: a delegating call whose child's turn was leased by
/// another live host (one that ran the parent's step, lost the parent's
/// lease, and still runs the child) recorded "the sub-agent failed: turn N
/// is leased by ..." as the parent's completed result, an answer a run
/// without the race never gives (the chaos run on PostgreSQL found it). An
/// error about the moment in the child's turn is the parent's step's too:
/// the call stays started, the turn running, and once the child's turn is
/// done the parent resumes into its answer, recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_turn_leased_elsewhere_leaves_the_parents_call_to_resume_not_failed() {
    let (_d, path) = common::temp_db();
    let store = common::store_at(&path);
    let gate = Arc::new(tokio::sync::Notify::new());
    let other = Runner::builder(store.clone(), Arc::new(Gated { gate: gate.clone() }))
        .tools(Tools::new().delegate(
            abridge::ToolSpec {
                name: "research".into(),
                description: "Hand a question to the researcher.".into(),
                input_schema: json!({"type": "object"}),
            },
            SubAgent::new("gpt-4o-mini", CHILD_PROMPT),
        ))
        .config(RunnerConfig::default().with_owner("other-host"))
        .build()
        .unwrap();
    let s = other
        .create_session("boss", "gpt-4o-mini", "You run the shop.")
        .await
        .unwrap();
    // The other host runs the parent's step into the child's model call.
    let first = {
        let other = other.clone();
        tokio::spawn(async move { other.run_turn_at(s.id, 0, "Where are the lanterns?").await })
    };
    let child_running = || {
        store
            .with_conn(|c| {
                c.query_row(
                    "SELECT count(*) FROM turns t JOIN sessions s ON s.id = t.session_id \
                     WHERE s.external_id = 'boss/0/call_research' AND t.status = 'running'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .unwrap()
            == 1
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !child_running() {
        assert!(
            std::time::Instant::now() < until,
            "the child's turn never began"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // The parent's lease runs out (the other host stalled); the child's is
    // still the other host's, live.
    store
        .with_conn(|c| {
            c.execute(
                "UPDATE turns SET lease_expires_at = 0 WHERE session_id = ?1",
                [s.id.0],
            )
        })
        .unwrap();
    let r = runner(&store, None);
    match r.run_turn_at(s.id, 0, "Where are the lanterns?").await {
        Err(e) => assert!(e.is_resumable(), "{e}"),
        Ok(out) => panic!("the parent's turn finished: {}", out.output),
    }
    assert_eq!(
        research_results(&store),
        vec![("started".to_string(), String::new())]
    );
    // The other host's child answers; its parent's step is fenced off.
    gate.notify_one();
    let fenced = first.await.unwrap();
    assert!(fenced.is_err(), "{fenced:?}");
    let out = r
        .run_turn_at(s.id, 0, "Where are the lanterns?")
        .await
        .unwrap();
    assert_eq!(
        out.output,
        "The researcher says: Found it: Where are the lanterns? is in aisle 7."
    );
    let results = research_results(&store);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "completed");
    common::assert_verified(&store);
}
