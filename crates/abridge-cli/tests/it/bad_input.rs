//! Bad input has a defined outcome: an error result the model sees, or a typed
//! error that fails the turn. Never a panic, never a half-written step, and no
//! committed row lost.

use crate::common;
use abridge::{
    Error, ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner, Threshold,
    Tool, ToolCall, ToolError, ToolSpec, Tools, TransactionalTool, Usage,
};
use common::*;
use serde_json::{json, Value};
use std::sync::Arc;

/// Turn 0 answers "done". Step k of turn 1 answers `script[k]`, later steps "done".
struct SecondTurn(Vec<Vec<ResponseBlock>>);

#[abridge::async_trait]
impl ModelClient for SecondTurn {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let is_input = |m: &abridge::Message| {
            m.role == abridge::Role::User
                && matches!(m.content[0], abridge::ContentBlock::Text { .. })
        };
        let users = req.messages.iter().filter(|m| is_input(m)).count();
        let last_user = req.messages.iter().rposition(is_input).unwrap();
        let k = req.messages[last_user..]
            .iter()
            .filter(|m| m.role == abridge::Role::Assistant)
            .count();
        let blocks = match self.0.get(k) {
            Some(b) if users == 2 => b.clone(),
            _ => vec![text("done")],
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

fn text(t: &str) -> ResponseBlock {
    ResponseBlock::Text { text: t.into() }
}
fn call(id: &str, name: &str, input: Value) -> ResponseBlock {
    ResponseBlock::ToolUse {
        id: id.into(),
        name: name.into(),
        input,
        raw_input: None,
    }
}
fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: "test".into(),
        input_schema: json!({"type": "object"}),
    }
}

struct Echo;
#[abridge::async_trait]
impl Tool for Echo {
    async fn call(&self, c: &ToolCall) -> Result<Value, ToolError> {
        Ok(c.input.clone())
    }
}
struct Fails;
#[abridge::async_trait]
impl Tool for Fails {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        Err(ToolError::new("the service said no"))
    }
}
struct Panics;
#[abridge::async_trait]
impl Tool for Panics {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        panic!("tool bug")
    }
}
struct TxPanics;
impl TransactionalTool for TxPanics {
    fn call(&self, tx: &abridge::store::Transaction<'_>, c: &ToolCall) -> Result<Value, ToolError> {
        abridge_testkit::demo_tables::append_effect(
            tx,
            abridge_testkit::demo_tables::DemoTable::Effects,
            &c.idempotency_key,
            "tx_panics",
            "{}",
        )
        .unwrap();
        panic!("transactional tool bug after its write")
    }
}
struct Big(usize);
#[abridge::async_trait]
impl Tool for Big {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        Ok(Value::String("é漢🙂".repeat(self.0)))
    }
}

fn tools() -> Tools {
    Tools::new()
        .idempotent(spec("echo"), Echo)
        .idempotent(spec("fails"), Fails)
        .at_most_once(spec("panics"), Panics)
        .transactional(spec("tx_panics"), TxPanics)
        .idempotent(spec("big"), Big(1_000_000))
}

async fn run(
    script: Vec<Vec<ResponseBlock>>,
) -> (
    tempfile::TempDir,
    abridge::Store,
    abridge::Result<abridge::TurnOutcome>,
) {
    let (d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(Threshold::Off, None, "t");
    cfg.max_steps = 4;
    let runner = Runner::builder(store.clone(), Arc::new(SecondTurn(script)))
        .tools(tools())
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    // A first, good turn: its rows must survive whatever the second does.
    runner.run_turn(s.id, "hello").await.unwrap();
    let r = runner.run_turn(s.id, "second").await;
    (d, store, r)
}

/// The results the model saw, in order: (content, is_error).
fn results(store: &abridge::Store) -> Vec<(String, bool)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare("SELECT result, status FROM tool_invocations ORDER BY id")?;
            let rows = st.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)? == "failed"))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

fn turn_statuses(store: &abridge::Store) -> Vec<String> {
    store
        .with_conn(|c| {
            let mut st = c.prepare("SELECT status FROM turns ORDER BY idx")?;
            let rows = st.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_and_unknown_tools_become_error_results_the_model_sees() {
    let (_d, store, r) = run(vec![vec![
        call("a", "echo", json!("{not json")),
        call("b", "no_such_tool", json!({})),
    ]])
    .await;
    r.unwrap();
    let res = results(&store);
    assert!(
        res.iter()
            .any(|(c, e)| *e && c.contains("malformed arguments")),
        "{res:?}"
    );
    assert!(
        res.iter()
            .any(|(c, e)| *e && c.contains("unknown tool: no_such_tool")),
        "{res:?}"
    );
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_panicking_tools_become_error_results_and_roll_back() {
    let (_d, store, r) = run(vec![vec![
        call("a", "fails", json!({})),
        call("b", "panics", json!({})),
        call("c", "tx_panics", json!({})),
        call("d", "echo", json!({"x": 1})),
    ]])
    .await;
    r.unwrap();
    let res = results(&store);
    assert_eq!(res[0], ("the service said no".to_string(), true));
    // The panic's own message, nothing that differs between runs (a task id).
    assert_eq!(res[1], ("tool panicked: tool bug".to_string(), true));
    assert!(
        res[2].1 && res[2].0.contains("transactional tool bug"),
        "{res:?}"
    );
    assert_eq!(res[3], (r#"{"x":1}"#.to_string(), false));
    // The panicking transactional tool's write was rolled back with it.
    let effects: i64 = store
        .with_conn(|c| c.query_row("SELECT count(*) FROM demo_effects", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(effects, 0);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_response_fails_the_turn_and_keeps_earlier_rows() {
    let (_d, store, r) = run(vec![vec![text(" ")]]).await;
    assert!(matches!(r, Err(Error::EmptyResponse { .. })), "{r:?}");
    assert_eq!(turn_statuses(&store), vec!["completed", "failed"]);
    let failed_steps: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM steps WHERE status = 'failed'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(failed_steps, 1);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_tool_call_ids_are_an_invalid_response() {
    let (_d, store, r) = run(vec![vec![
        call("x", "echo", json!({})),
        call("x", "echo", json!({})),
    ]])
    .await;
    assert!(matches!(r, Err(Error::InvalidResponse { .. })), "{r:?}");
    assert_eq!(turn_statuses(&store), vec!["completed", "failed"]);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_block_types_are_stored_but_not_sent_back() {
    let other = ResponseBlock::Other {
        kind: "thinking_v9".into(),
        value: json!({"secret": 1}),
    };
    let (_d, store, r) = run(vec![vec![other, call("a", "echo", json!({"k": "v"}))]]).await;
    r.unwrap();
    let stored: String = store
        .with_conn(|c| {
            c.query_row(
                "SELECT response FROM steps WHERE response LIKE '%thinking_v9%'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(stored.contains("secret"));
    let last_step: i64 = store
        .with_conn(|c| c.query_row("SELECT max(id) FROM steps", [], |r| r.get(0)))
        .unwrap();
    let rebuilt = store
        .with_conn(|c| abridge::replay::rebuild_step(c, abridge::StepId(last_step)))
        .unwrap();
    assert!(rebuilt.matches());
    assert!(!String::from_utf8(rebuilt.bytes)
        .unwrap()
        .contains("thinking_v9"));
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_steps_fails_the_turn_with_a_typed_error() {
    let looping: Vec<ResponseBlock> = vec![call("a", "echo", json!({}))];
    struct Loop(Vec<ResponseBlock>);
    #[abridge::async_trait]
    impl ModelClient for Loop {
        async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> {
            Ok(ModelResponse {
                blocks: self.0.clone(),
                usage: Usage::default(),
                ..Default::default()
            })
        }
    }
    let (_d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(Threshold::Off, None, "t");
    cfg.max_steps = 3;
    let runner = Runner::builder(store.clone(), Arc::new(Loop(looping)))
        .tools(tools())
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    let r = runner.run_turn(s.id, "go").await;
    assert!(
        matches!(r, Err(Error::MaxSteps { max_steps: 3, .. })),
        "{r:?}"
    );
    assert_eq!(turn_statuses(&store), vec!["failed"]);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_megabyte_results_and_exotic_unicode_round_trip_byte_for_byte() {
    let (_d, store, r) = run(vec![vec![
        text("emoji 👩‍👩‍👧 CJK 漢字 combining e\u{301} and RTL שלום"),
        call("a", "big", json!({"q": "🙂"})),
    ]])
    .await;
    r.unwrap();
    let len: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT max(octet_length(result)) FROM tool_invocations",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(len > 8_000_000, "{len}");
    assert!(assert_all_steps_rebuild(&store) >= 3);
    assert_verified(&store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_configuration_is_refused_when_built() {
    for bad in [
        Threshold::Fraction(0.0),
        Threshold::Fraction(1.5),
        Threshold::Fraction(f64::NAN),
        Threshold::Tokens(0),
    ] {
        let (_d, path) = temp_db();
        let store = open(&path);
        let r = Runner::builder(store, Arc::new(SecondTurn(vec![])))
            .config(test_config(bad, None, "t"))
            .build();
        assert!(matches!(r, Err(Error::Config(_))), "{bad:?}");
    }
    assert!(matches!(Threshold::parse("1.2"), Err(Error::Config(_))));
    assert!(matches!(Threshold::parse("abc"), Err(Error::Config(_))));
    assert_eq!(Threshold::parse("off").unwrap(), Threshold::Off);
    assert_eq!(Threshold::parse("0.9").unwrap(), Threshold::Fraction(0.9));
    assert_eq!(Threshold::parse("5000").unwrap(), Threshold::Tokens(5000));
}

/// Regression (found by the chaos harness's control comparison): the stored text
/// of a failed step or turn named the step's row id, so two stores that ran the
/// same script held different transcripts. Failure text now names no row id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_messages_name_no_row_ids() {
    let (_d, store, r) = run(vec![vec![text(" ")]]).await;
    assert!(r.is_err());
    let (step_err, turn_err): (String, String) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT s.error, t.error FROM steps s JOIN turns t ON s.turn_id = t.id WHERE s.status = 'failed'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap();
    assert_eq!(step_err, "model returned an empty response");
    assert_eq!(turn_err, step_err);
}

/// A model client that panics.
struct PanickingModel;
#[abridge::async_trait]
impl abridge::ModelClient for PanickingModel {
    async fn complete(
        &self,
        _: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        panic!("client bug")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_model_client_fails_the_turn_with_its_message() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(Threshold::Off, None, "t");
    cfg.model_retry = abridge::RetryPolicy::default()
        .with_max_attempts(2)
        .with_backoff(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        );
    let runner = Runner::builder(store.clone(), Arc::new(PanickingModel))
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    let r = runner.run_turn(s.id, "hello").await;
    match r {
        Err(Error::Model { message, .. }) => {
            assert_eq!(message, "model client panicked: client bug")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(turn_statuses(&store), vec!["failed"]);
    assert_verified(&store);
}

/// A model that fails transiently `fail` times, then answers.
struct FlakyModel {
    fail: usize,
    calls: std::sync::atomic::AtomicUsize,
}

#[abridge::async_trait]
impl abridge::ModelClient for FlakyModel {
    async fn complete(
        &self,
        _: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n < self.fail {
            return Err(abridge::ModelError::Transient(format!("busy ({n})")));
        }
        Ok(abridge::ModelResponse {
            blocks: vec![abridge::ResponseBlock::Text {
                text: "finally".into(),
            }],
            usage: Default::default(),
            ..Default::default()
        })
    }
}

/// Regression: the delay between attempts doubled without a cap and, past
/// about 66 attempts, overflowed `Duration` (a panic). Retries now double up
/// to `max_backoff`, saturating: 80 attempts run through with short waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_retried_eighty_times_neither_overflows_nor_waits_past_the_cap() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(Threshold::Off, None, "t");
    cfg.model_retry = abridge::RetryPolicy::default()
        .with_max_attempts(80)
        .with_backoff(
            std::time::Duration::from_micros(1),
            std::time::Duration::from_micros(50),
        );
    let model = Arc::new(FlakyModel {
        fail: 79,
        calls: Default::default(),
    });
    let runner = Runner::builder(store.clone(), model.clone())
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        runner.run_turn(s.id, "hello"),
    )
    .await
    .expect("the retries did not stay under their cap")
    .unwrap();
    assert_eq!(out.output, "finally");
    assert_eq!(model.calls.load(std::sync::atomic::Ordering::SeqCst), 80);
    assert_verified(&store);
}

/// `[[[ … ]]]` nested `depth` levels, built without recursion.
fn nested(depth: usize) -> Value {
    let mut v = json!({});
    for _ in 1..depth {
        v = Value::Array(vec![v]);
    }
    v
}

/// Turn 1's first step calls `echo` with arguments nested `depth` levels
/// (built afresh on every call, never cloned: a derived clone or drop of a
/// value 100,000 levels deep overflows the stack), then answers.
struct Deep(usize);

#[abridge::async_trait]
impl ModelClient for Deep {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = serde_json::to_string(&req.messages.last().unwrap().content).unwrap();
        let blocks = if req.messages.len() == 4 && !last.contains("tool_result") {
            vec![ResponseBlock::ToolUse {
                id: "deep".into(),
                name: "echo".into(),
                // Not json!: it would copy the value recursively.
                input: Value::Object(
                    [("payload".to_string(), nested(self.0))]
                        .into_iter()
                        .collect(),
                ),
                raw_input: None,
            }]
        } else {
            vec![text("done")]
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

async fn run_deep(depth: usize) -> (tempfile::TempDir, abridge::Store) {
    let (d, path) = temp_db();
    let store = open(&path);
    let runner = Runner::builder(store.clone(), Arc::new(Deep(depth)))
        .tools(tools())
        .config(test_config(Threshold::Off, None, "t"))
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    runner.run_turn(s.id, "hello").await.unwrap();
    let out = runner.run_turn(s.id, "go deep").await.unwrap();
    assert_eq!(out.output, "done");
    // Nothing is wedged: the next turn runs, and every step rebuilds.
    runner.run_turn(s.id, "and after").await.unwrap();
    assert_eq!(turn_statuses(&store), vec!["completed"; 3]);
    assert_all_steps_rebuild(&store);
    assert_verified(&store);
    (d, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_nested_125_levels_are_an_error_result_and_the_session_goes_on() {
    let (_d, store) = run_deep(125).await;
    let r = results(&store);
    assert_eq!(r.len(), 1);
    assert!(r[0].1, "an error result: {r:?}");
    assert!(r[0].0.starts_with("malformed arguments for echo"), "{r:?}");
    assert!(r[0].0.contains("nested deeper than 64 levels"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_nested_100000_levels_do_not_abort_the_process() {
    let (_d, store) = run_deep(100_000).await;
    assert!(results(&store)[0].1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_at_the_depth_limit_are_kept_and_read_back() {
    let (_d, store) = run_deep(60).await;
    let r = results(&store);
    assert!(!r[0].1, "{r:?}");
}

struct DeepResult;
#[abridge::async_trait]
impl Tool for DeepResult {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        Ok(nested(100_000))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_nested_100000_levels_is_an_error_result() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let runner = Runner::builder(
        store.clone(),
        Arc::new(SecondTurn(vec![vec![call("a", "deep", json!({}))]])),
    )
    .tools(tools().idempotent(spec("deep"), DeepResult))
    .config(test_config(Threshold::Off, None, "t"))
    .build()
    .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    runner.run_turn(s.id, "hello").await.unwrap();
    runner.run_turn(s.id, "second").await.unwrap();
    let r = results(&store);
    assert_eq!(
        r,
        vec![(
            "the tool's result was nested deeper than 64 levels and was not kept".to_string(),
            true
        )]
    );
    assert_verified(&store);
}

/// A running turn whose stored response no longer decodes (written by a bug
/// or an edit) cannot make progress: `verify` names it, and resuming it fails
/// it with a typed error instead of leaving it running for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_turn_whose_rows_do_not_read_back_is_named_by_verify_and_failed() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let mut cfg = test_config(
        Threshold::Off,
        Some(fail_at(abridge::FaultPoint::AfterToolEffect, 1)),
        "t",
    );
    cfg.max_steps = 4;
    let crashing = Runner::builder(
        store.clone(),
        Arc::new(SecondTurn(vec![vec![call("a", "echo", json!({"x": 1}))]])),
    )
    .tools(tools())
    .config(cfg)
    .build()
    .unwrap();
    let s = crashing.create_session("s", "m", "sys").await.unwrap();
    crashing.run_turn(s.id, "hello").await.unwrap();
    let err = crashing.run_turn(s.id, "second").await.unwrap_err();
    assert!(matches!(err, Error::Injected(_)), "{err}");
    // The responded step's response is damaged behind the schema's back.
    store
        .with_conn(|c| {
            c.execute_batch(if on_postgres() {
                "DROP TRIGGER steps_response_never_changes ON steps; \
                 UPDATE steps SET response = '{\"blocks\": [' WHERE status = 'responded'"
            } else {
                "DROP TRIGGER steps_response_never_changes; \
                 UPDATE steps SET response = '{\"blocks\": [' WHERE status = 'responded'"
            })?;
            Ok(())
        })
        .unwrap();
    let report = store.with_conn(|c| verify_demo(c)).unwrap();
    let stuck = report
        .checks
        .iter()
        .find(|c| c.name == "G6 running turns can resume")
        .unwrap();
    assert_eq!(stuck.violations.len(), 1, "{report:#?}");
    assert!(
        stuck.violations[0].contains("cannot be read back"),
        "{stuck:?}"
    );

    let runner = Runner::builder(store.clone(), Arc::new(SecondTurn(vec![])))
        .tools(tools())
        .config(test_config(Threshold::Off, None, "t"))
        .build()
        .unwrap();
    let turn_id = store
        .with_conn(|c| {
            c.query_row("SELECT id FROM turns WHERE status = 'running'", [], |r| {
                r.get(0)
            })
        })
        .unwrap();
    let err = runner.resume_turn(turn_id).await.unwrap_err();
    assert!(matches!(err, Error::Json(_)), "{err}");
    assert_eq!(turn_statuses(&store), vec!["completed", "failed"]);
    // The session is not wedged: the next turn runs.
    runner.run_turn(s.id, "third").await.unwrap();
    assert_eq!(
        turn_statuses(&store),
        vec!["completed", "failed", "completed"]
    );
}

/// Reports more input tokens than SQLite's integer holds.
struct HugeUsage;

#[abridge::async_trait]
impl ModelClient for HugeUsage {
    async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            blocks: vec![text("done")],
            usage: Usage {
                input_tokens: Some(u64::MAX),
                output_tokens: Some(u64::MAX - 1),
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_above_i64_max_is_stored_saturated_and_the_threshold_still_fires() {
    let (_d, path) = temp_db();
    let store = open(&path);
    // No verbatim tail: the turns are a few characters, and a tail by
    // share would keep them all, leaving nothing for the threshold to fold.
    let mut cfg = test_config(Threshold::Tokens(1_000), None, "t");
    cfg.compaction.keep_recent_share = None;
    let runner = Runner::builder(store.clone(), Arc::new(HugeUsage))
        .config(cfg)
        .build()
        .unwrap();
    let s = runner.create_session("s", "m", "sys").await.unwrap();
    for t in 0..3 {
        runner.run_turn(s.id, &format!("turn {t}")).await.unwrap();
    }
    let (context, input, output, compactions): (i64, i64, i64, i64) = store
        .with_conn(|c| {
            c.query_row(
                "SELECT min(context_tokens), min(input_tokens), min(output_tokens), \
                 (SELECT count(*) FROM compactions WHERE status = 'completed') FROM steps",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
        })
        .unwrap();
    assert_eq!((context, input, output), (i64::MAX, i64::MAX, i64::MAX));
    assert!(compactions >= 1, "the threshold fired");
}
