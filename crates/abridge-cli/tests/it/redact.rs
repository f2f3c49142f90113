//! Redaction: the one exception to G2, and the second to append-only
//! history. A secret stated once, and carried since into a tool call's
//! arguments, its result, the model's answers, a summary and a pinned fact,
//! is replaced by the marker everywhere in one transaction: its bytes leave
//! the file, `verify` holds and reports the steps it changed as redacted,
//! `replay` rebuilds them with the marker and says so; a turn running on the
//! session is fenced and resumes from the redacted rows; a summary made from
//! the text before is made again; the session goes on.

use crate::common;

use abridge::admin::Pattern;
use abridge::compaction::{Summariser, SummaryRequest, SummaryResponse};
use abridge::store::REDACTION_MARKER;
use abridge::{
    CompactionConfig, ContentBlock, Error, ModelClient, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Role, Runner, RunnerConfig, Store, Threshold, Tool, ToolCall, ToolError,
    ToolSpec, Tools,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The secret: an API key with a quote in it, so it is stored escaped in
/// every JSON text that holds it.
const SECRET: &str = "sk-live-4f9a\"8b7c6d5e";

/// The user's own text of turn `i`; turn 1 states the secret.
fn input(i: usize) -> String {
    match i {
        1 => format!("my api key is {SECRET}, please look up my account with it"),
        _ => format!("turn {i}: a few words about the garden, the weather and the roses."),
    }
}

/// Answers "look up" with a `lookup` call carrying the user's text, a tool
/// result with what it found, anything else by echoing the user.
struct Echo;

fn text_of(m: &abridge::Message) -> String {
    m.content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => text.clone(),
            ContentBlock::ToolResult { content, .. } => content.clone(),
            _ => String::new(),
        })
        .collect()
}

#[abridge::async_trait]
impl ModelClient for Echo {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().unwrap();
        let said = text_of(last);
        let tool_result = last
            .content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolResult { .. }));
        let block = if last.role == Role::User && !tool_result && said.contains("look up") {
            ResponseBlock::ToolUse {
                id: "call_1".into(),
                name: "lookup".into(),
                input: json!({ "query": said }),
                raw_input: None,
            }
        } else if tool_result {
            ResponseBlock::Text {
                text: format!("I found it: {said}"),
            }
        } else {
            ResponseBlock::Text {
                text: format!("You said: {said}"),
            }
        };
        Ok(ModelResponse {
            blocks: vec![block],
            ..Default::default()
        })
    }
}

/// Finds the account the query names, quoting the query; held until the
/// test opens its gate (when it has one).
struct Lookup(Option<watch::Receiver<bool>>, Arc<AtomicUsize>);

#[abridge::async_trait]
impl Tool for Lookup {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.0 {
            gate.clone().wait_for(|o| *o).await.unwrap();
        }
        Ok(json!({ "account": "acct-991", "matched": call.input["query"] }))
    }
}

/// A summary that quotes what the user said about keys (and a line for the
/// rest), behind an optional gate, counting its calls.
struct Quoting {
    gate: Option<watch::Receiver<bool>>,
    calls: AtomicUsize,
    /// Told at each call (a permit is kept for a waiter that comes later).
    called: tokio::sync::Notify,
}

#[abridge::async_trait]
impl Summariser for Quoting {
    async fn summarise(&self, r: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.called.notify_one();
        if let Some(gate) = &self.gate {
            // Only the first call waits: the test redacts while it is held.
            if n == 0 {
                gate.clone().wait_for(|o| *o).await.unwrap();
            }
        }
        let keys: Vec<&str> = r
            .transcript
            .lines()
            .filter(|l| l.contains("api key"))
            .take(1)
            .collect();
        Ok(SummaryResponse {
            text: format!(
                "The user talked about the garden. {}",
                keys.join(" ").chars().take(120).collect::<String>()
            ),
            usage: Default::default(),
        })
    }
}

struct Setup {
    store: Store,
    runner: Runner,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

fn setup(
    summariser: Arc<Quoting>,
    gate: Option<watch::Receiver<bool>>,
) -> (Setup, Arc<AtomicUsize>) {
    let (dir, db) = common::temp_db();
    let store = common::open(&db);
    let calls = Arc::new(AtomicUsize::new(0));
    let spec = ToolSpec {
        name: "lookup".into(),
        description: "look up an account".into(),
        input_schema: json!({"type": "object"}),
    };
    let mut cfg = RunnerConfig::default().with_owner("redact-test");
    cfg.lease_ttl = Duration::from_secs(5);
    let runner = Runner::builder(store.clone(), Arc::new(Echo))
        .tools(Tools::new().idempotent(spec, Lookup(gate, calls.clone())))
        .summariser_arc(summariser)
        .config(cfg)
        .compaction(
            CompactionConfig::default()
                .with_compact_at(Threshold::Tokens(400))
                .with_background(None),
        )
        .build()
        .unwrap();
    (
        Setup {
            store,
            runner,
            db,
            _dir: dir,
        },
        calls,
    )
}

impl Setup {
    /// A session with `turns` turns of [`input`] run.
    async fn session(&self, external_id: &str, turns: i64) -> abridge::SessionId {
        let sid = self
            .runner
            .create_session(external_id, "claude-sonnet-4-5", "You help.")
            .await
            .unwrap()
            .id;
        for i in 0..turns {
            self.runner
                .run_turn_at(sid, i, &input(i as usize))
                .await
                .unwrap();
        }
        sid
    }
}

fn quoting() -> Arc<Quoting> {
    Arc::new(Quoting {
        gate: None,
        calls: AtomicUsize::new(0),
        called: tokio::sync::Notify::new(),
    })
}

fn file_bytes(db: &Path) -> Vec<u8> {
    common::stored_bytes(db)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The secret as stored: raw in plain texts, escaped inside JSON.
fn stored_forms() -> Vec<Vec<u8>> {
    vec![
        SECRET.as_bytes().to_vec(),
        SECRET.replace('"', "\\\"").into_bytes(),
        // Both halves around the quote, so no form of it is missed.
        b"sk-live-4f9a".to_vec(),
        b"8b7c6d5e".to_vec(),
    ]
}

fn count(store: &Store, sql: &str) -> i64 {
    let sql = sql.to_string();
    store
        .with_conn(move |c| c.query_row(&sql, [], |r| r.get(0)))
        .unwrap()
}

fn abridge() -> Command {
    common::abridge_cmd()
}

/// The secret, once in the user's input, is in the tool call's arguments
/// (escaped), its result, the model's answers, a summary and a pinned fact.
/// After the redaction (and a second, of a fragment the pin extractor took
/// on its own) none of its bytes are in the file or the WAL; verify
/// holds, with the steps and summaries it changed reported as redacted;
/// each changed step rebuilds, with the marker, to the hash the redaction
/// recorded (`replay --raw` prints the marker, `replay` says "redacted");
/// the session goes on with the same runner (its kept context is built
/// again), and the host re-submitting the redacted turn's original input
/// gets the finished turn back. Deleting the session takes the records too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacted_secret_is_gone_from_the_file_and_verify_reports_the_redaction() {
    let (s, _) = setup(quoting(), None);
    let sid = s
        .runner
        .create_session("user-42", "claude-sonnet-4-5", "You help with accounts.")
        .await
        .unwrap()
        .id;
    let other = s
        .runner
        .create_session("user-7", "claude-sonnet-4-5", "You help with accounts.")
        .await
        .unwrap()
        .id;
    for i in 0..12 {
        s.runner
            .run_turn_at(sid, i, &input(i as usize))
            .await
            .unwrap();
    }
    s.runner.run_turn(other, &input(0)).await.unwrap();
    // Where the secret went before the redaction.
    let holds = |sql: &str| count(&s.store, sql);
    assert!(
        holds("SELECT count(*) FROM tool_invocations WHERE instr(arguments, 'sk-live-4f9a') > 0")
            >= 1
    );
    assert!(
        holds("SELECT count(*) FROM tool_invocations WHERE instr(result, 'sk-live-4f9a') > 0") >= 1
    );
    assert!(holds("SELECT count(*) FROM steps WHERE instr(response, 'sk-live-4f9a') > 0") >= 1);
    assert!(
        holds("SELECT count(*) FROM compactions WHERE instr(summary, 'sk-live-4f9a') > 0") >= 1,
        "a summary quotes the secret"
    );
    assert!(holds("SELECT count(*) FROM pins WHERE instr(value, 'sk-live-4f9a') > 0") >= 1);
    // (On an encrypted store no text is in the file's bytes at all.)
    if !cfg!(feature = "encryption") {
        assert!(contains(&file_bytes(&s.db), SECRET.as_bytes()));
    }

    let r = s
        .store
        .redact("user-42", Pattern::text(SECRET).unwrap())
        .await
        .unwrap();
    let id = r.redaction_id.expect("recorded");
    assert!(r.occurrences >= 6, "{r:?}");
    assert!(
        r.rows.turns == 1 && r.rows.steps >= 1 && r.rows.tool_invocations == 1,
        "{r:?}"
    );
    assert!(r.rows.compactions >= 1 && r.rows.pins >= 1, "{r:?}");
    assert!(
        r.steps_rebuilt >= 2 && r.checkpointed && r.turns_fenced == 0,
        "{r:?}"
    );
    let after = file_bytes(&s.db);
    for form in &stored_forms()[..2] {
        assert!(!contains(&after, form));
    }
    // The pin extractor took the part after the quote for an id of its
    // own: not an occurrence of the text, so a second redaction names it.
    let again = s
        .store
        .redact("user-42", Pattern::regex(r"\b8b7c6d5e\b").unwrap())
        .await
        .unwrap();
    assert!(
        again.occurrences >= 1 && again.rows.compactions >= 1,
        "{again:?}"
    );
    let newest = again.redaction_id.unwrap();

    let after = file_bytes(&s.db);
    for form in stored_forms() {
        assert!(
            !contains(&after, &form),
            "{:?} is still in the file's bytes",
            String::from_utf8_lossy(&form)
        );
    }
    let report = s.store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
    let g2 = report
        .checks
        .iter()
        .find(|c| c.name.starts_with("G2"))
        .unwrap();
    assert_eq!(g2.redacted, r.rows.compactions);
    assert!(
        report.notes.iter().any(|n| n.contains("redaction")),
        "{:?}",
        report.notes
    );

    // Every step holds; the changed ones rebuild with the marker, to the
    // redaction's hash, not to the hash they recorded.
    let changed: Vec<abridge::StepId> = s
        .store
        .with_conn(move |c| {
            let mut changed = Vec::new();
            for step in abridge::inspect::executed_step_ids(c)? {
                let rb = abridge::replay::rebuild_step(c, step)?;
                assert!(rb.holds(), "step {step}");
                if let Some(m) = &rb.redaction {
                    assert!(m.redaction_id == id || m.redaction_id == newest);
                    assert!(rb.matches_redacted() && !rb.matches());
                    assert!(contains(&rb.bytes, REDACTION_MARKER.as_bytes()));
                    changed.push(step);
                }
            }
            Ok(changed)
        })
        .unwrap();
    assert!(changed.len() as i64 >= r.steps_rebuilt);
    let g3 = report
        .checks
        .iter()
        .find(|c| c.name.starts_with("G3"))
        .unwrap();
    assert_eq!(g3.redacted, changed.len() as i64);

    // The same runner goes on: its kept context had the secret, so it is
    // built again from the redacted rows, and the new steps match strictly.
    let out = s
        .runner
        .run_turn(sid, "and what about the tulips?")
        .await
        .unwrap();
    assert!(!out.output.contains("sk-live"));
    let report = s.store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
    // The host re-running its script sends the original input of turn 1.
    let again = s.runner.run_turn_at(sid, 1, &input(1)).await.unwrap();
    assert!(again.output.contains(REDACTION_MARKER), "{}", again.output);
    assert!(matches!(
        s.runner.run_turn_at(sid, 1, "something else").await,
        Err(Error::TurnConflict { .. })
    ));

    // From the command line: replay says so, --raw prints the marker.
    drop(s.runner);
    s.store.checkpoint().await.unwrap();
    let out = abridge()
        .args(["replay", "--db"])
        .arg(common::db_for(&s.db))
        .args(["--step", &changed[0].to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("match (redacted)") && text.contains("redaction "),
        "{text}"
    );
    let raw = abridge()
        .args(["replay", "--raw", "--db"])
        .arg(common::db_for(&s.db))
        .args(["--step", &changed[0].to_string()])
        .output()
        .unwrap();
    assert!(raw.status.success());
    assert!(contains(&raw.stdout, REDACTION_MARKER.as_bytes()));
    assert!(!contains(&raw.stdout, b"sk-live-4f9a"));
    let v = abridge()
        .args(["verify", "--db"])
        .arg(common::db_for(&s.db))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(v.status.success(), "{text}");
    assert!(
        text.contains(&format!("redacted {}", changed.len())),
        "{text}"
    );

    // inspect lists the redactions (the pattern as its hash only).
    let d = s
        .store
        .with_conn(|c| abridge::inspect::session_detail(c, "user-42"))
        .unwrap();
    assert_eq!(
        d.redactions.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![id, newest]
    );
    assert_eq!(d.redactions[0].rows, r.rows);
    let out = abridge()
        .args(["inspect", "--db"])
        .arg(common::db_for(&s.db))
        .arg("user-42")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("redactions:") && text.contains("text sha256"),
        "{text}"
    );
    assert!(!text.contains("sk-live"), "{text}");

    // Deleting the session takes its redaction records with it.
    s.store.delete_session("user-42").await.unwrap();
    assert_eq!(count(&s.store, "SELECT count(*) FROM redactions"), 0);
    assert_eq!(count(&s.store, "SELECT count(*) FROM redacted_rows"), 0);
    let report = s.store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
}

/// A runner that keeps the newest summary it read (its text is read once a
/// compaction) reads it again after a redaction rewrote it: the next turn,
/// which compacts nothing, sends the marker, not the secret, and its step
/// rebuilds strictly (G3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_the_runner_kept_is_read_again_after_a_redaction() {
    let (s, _) = setup(quoting(), None);
    let sid = s.session("user-42", 2).await;
    let summaries = |s: &Setup| {
        count(
            &s.store,
            "SELECT count(*) FROM compactions WHERE status = 'completed'",
        )
    };
    let newest_quotes = |s: &Setup| {
        count(
            &s.store,
            "SELECT count(*) FROM compactions WHERE status = 'completed' \
             AND instr(summary, 'sk-live-4f9a') > 0 \
             AND up_to_turn_index = (SELECT max(up_to_turn_index) FROM compactions \
             WHERE status = 'completed')",
        ) == 1
    };
    // Short turns until the newest summary quotes the secret and the turn
    // after it compacted nothing: the runner has read that summary.
    let mut turn = 2;
    loop {
        assert!(turn < 30, "no summary quoted the secret");
        let before = summaries(&s);
        s.runner.run_turn_at(sid, turn, "ok").await.unwrap();
        turn += 1;
        if newest_quotes(&s) && summaries(&s) == before {
            break;
        }
    }
    let r = s
        .store
        .redact("user-42", Pattern::text(SECRET).unwrap())
        .await
        .unwrap();
    assert!(r.rows.compactions >= 1, "{r:?}");
    let before = summaries(&s);
    let out = s.runner.run_turn_at(sid, turn, "ok").await.unwrap();
    assert_eq!(summaries(&s), before, "the turn compacted nothing");
    let step = count(
        &s.store,
        &format!(
            "SELECT max(s.id) FROM steps s JOIN turns t ON t.id = s.turn_id \
             WHERE t.id = {}",
            out.turn.id
        ),
    );
    let rb = s
        .store
        .with_conn(move |c| abridge::replay::rebuild_step(c, step.into()))
        .unwrap();
    assert!(rb.matches(), "the step sent what its rows rebuild to");
    assert!(contains(&rb.bytes, REDACTION_MARKER.as_bytes()));
    assert!(!contains(&rb.bytes, b"sk-live-4f9a"));
}

/// The append-only triggers still hold outside a redaction: the gate is
/// open only inside the redacting transaction, for its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_a_redaction_history_still_never_changes() {
    let (s, _) = setup(quoting(), None);
    s.session("user-1", 3).await;
    s.store
        .redact("user-1", Pattern::text(SECRET).unwrap())
        .await
        .unwrap();
    for sql in [
        "UPDATE turns SET input = 'x' WHERE idx = 0",
        "UPDATE steps SET response = '{}' WHERE id = 1",
        "UPDATE tool_invocations SET result = 'x'",
        "UPDATE sessions SET system_prompt = 'x'",
        "UPDATE redactions SET marker = 'x'",
        "DELETE FROM redacted_rows",
        "DELETE FROM redactions",
    ] {
        let e = s.store.with_conn(move |c| c.execute(sql, [])).unwrap_err();
        assert!(e.to_string().contains("abridge:"), "{sql}: {e}");
    }
    assert_eq!(count(&s.store, "SELECT count(*) FROM erasing"), 0);
}

/// A turn is running (its tool holds, its step's arguments and response
/// already carry the secret) when the session is redacted: the turn is
/// fenced, its runner is refused at the tool result's write with LeaseLost,
/// and the turn, resumed, finishes from the redacted rows; nothing of the
/// secret is written after the redaction, and every guarantee holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_running_during_a_redaction_is_fenced_and_resumes_from_the_redacted_rows() {
    let (open, gate) = watch::channel(false);
    let (s, tool_calls) = setup(quoting(), Some(gate));
    let sid = s
        .runner
        .create_session("user-9", "claude-sonnet-4-5", "You help.")
        .await
        .unwrap()
        .id;
    s.runner.run_turn_at(sid, 0, &input(0)).await.unwrap();
    let running = tokio::spawn({
        let r = s.runner.clone();
        async move { r.run_turn_at(sid, 1, &input(1)).await }
    });
    while tool_calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = s
        .store
        .redact(sid, Pattern::regex(r#"sk-live-[0-9a-f"]+"#).unwrap())
        .await
        .unwrap();
    assert_eq!(r.turns_fenced, 1, "{r:?}");
    open.send_replace(true);
    let fenced = running.await.unwrap();
    assert!(matches!(fenced, Err(Error::LeaseLost { .. })), "{fenced:?}");
    let turn = s.runner.recoverable_turns().await.unwrap().remove(0);
    let out = s.runner.resume_turn(turn.id).await.unwrap();
    assert!(out.output.contains(REDACTION_MARKER), "{}", out.output);
    s.store.checkpoint().await.unwrap();
    for form in stored_forms() {
        assert!(!contains(&file_bytes(&s.db), &form));
    }
    let report = s.store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
}

/// A summary is being made from text that holds the secret when the session
/// is redacted: its completion is refused, and it is made again from the
/// redacted rows (two summariser calls, one row); the summary stored holds
/// the marker, not the secret. (The turn waiting for it is fenced, and
/// resumed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_made_while_the_session_is_redacted_is_made_again_from_the_redacted_rows() {
    let (open, gate) = watch::channel(false);
    let summariser = Arc::new(Quoting {
        gate: Some(gate),
        calls: AtomicUsize::new(0),
        called: tokio::sync::Notify::new(),
    });
    let (s, _) = setup(summariser.clone(), None);
    let sid = s
        .runner
        .create_session("user-5", "claude-sonnet-4-5", "You help.")
        .await
        .unwrap()
        .id;
    let mut compacting = None;
    for i in 0..12 {
        let r = s.runner.clone();
        let mut turn = tokio::spawn(async move { r.run_turn_at(sid, i, &input(i as usize)).await });
        // The turn whose step waits for the held summary is the one: told by
        // the summariser's call, not guessed from a pause.
        tokio::select! {
            done = &mut turn => done.unwrap().map(|_| ()).unwrap(),
            _ = summariser.called.notified() => {
                compacting = Some(turn);
                break;
            }
        }
    }
    let compacting = compacting.expect("a compaction began");
    let r = s
        .store
        .redact(sid, Pattern::text(SECRET).unwrap())
        .await
        .unwrap();
    assert!(r.redaction_id.is_some());
    // The turn waiting for the summary was running: fenced.
    assert_eq!(r.turns_fenced, 1);
    open.send_replace(true);
    let fenced = compacting.await.unwrap();
    assert!(matches!(fenced, Err(Error::LeaseLost { .. })), "{fenced:?}");
    assert_eq!(summariser.calls.load(Ordering::SeqCst), 2);
    let turn = s.runner.recoverable_turns().await.unwrap().remove(0);
    s.runner.resume_turn(turn.id).await.unwrap();
    let summaries: Vec<String> = s
        .store
        .with_conn(move |c| {
            let mut q = c.prepare("SELECT summary FROM compactions WHERE status = 'completed'")?;
            let v = q.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
            Ok(v)
        })
        .unwrap();
    assert_eq!(summaries.len(), 1);
    assert!(summaries[0].contains(REDACTION_MARKER), "{}", summaries[0]);
    assert!(!summaries[0].contains("sk-live"), "{}", summaries[0]);
    let report = s.store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
}

/// `abridge redact`: by text (from standard input with `-`) and by regular
/// expression, JSON output; nothing matching changes and records nothing;
/// a pattern matching the empty text and an unknown session are refused
/// with a message, exit 1 (or clap's 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redact_from_the_command_line() {
    let (s, _) = setup(quoting(), None);
    s.session("user-3", 3).await;
    drop(s.runner);
    let db = s.db.clone();
    let run = |args: &[&str], stdin: Option<&str>| {
        let mut child = abridge()
            .arg("redact")
            .arg("--db")
            .arg(common::db_for(&db))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    };
    // A dry run says what it would do and changes nothing.
    let out = run(
        &[
            "--session",
            "user-3",
            "--text",
            SECRET,
            "--dry-run",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dry: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["redaction_id"].as_i64()),
        (Some(true), None)
    );
    {
        let store = common::store_at(&db);
        assert_eq!(count(&store, "SELECT count(*) FROM redactions"), 0);
        assert!(
            count(
                &store,
                "SELECT count(*) FROM turns WHERE instr(input, 'sk-live') > 0"
            ) > 0
        );
    }
    let out = run(
        &["--session", "user-3", "--text", "-", "--json"],
        Some(&format!("{SECRET}\n")),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["occurrences"].as_i64().unwrap() >= 3, "{v}");
    for field in ["occurrences", "rows", "steps_rebuilt", "turns_fenced"] {
        assert_eq!(v[field], dry[field], "the dry run foretold {field}");
    }
    assert!(v["redaction_id"].as_i64().is_some());
    let out = run(&["--session", "user-3", "--regex", "roses?"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("redacted session user-3"),
        "{text}"
    );
    let out = run(&["--session", "user-3", "--text", "no such words"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("nothing to redact"),
        "{text}"
    );
    let out = run(&["--session", "user-3", "--regex", "x*"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("matches the empty text"));
    // A pattern that would take a value abridge reads back (a response's
    // block type) is refused, and nothing is changed.
    let out = run(&["--session", "user-3", "--regex", "^text$"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a value abridge reads back"), "{err}");
    let out = run(&["--session", "nobody", "--text", "x"], None);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["--session", "user-3"], None);
    assert_eq!(
        out.status.code(),
        Some(2),
        "one of --text and --regex is required"
    );
    let store = common::store_at(&db);
    assert_eq!(count(&store, "SELECT count(*) FROM redactions"), 2);
    let report = store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
    for form in stored_forms() {
        assert!(!contains(&file_bytes(&db), &form));
    }
}

/// `abridge redact` and `abridge delete` killed (SIGKILL) at growing delays,
/// before, during and after their transaction: the store is either as it
/// was or wholly redacted (deleted), never in between, and every guarantee
/// holds either way.
#[cfg(unix)]
#[test]
fn a_redaction_or_a_delete_killed_at_any_moment_is_all_or_nothing() {
    if common::on_postgres() {
        // Each delay starts from a copy of one SQLite file; on PostgreSQL a
        // killed client's transaction is rolled back by the server.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.db");
    let out = abridge()
        .args([
            "demo",
            "--sessions",
            "2",
            "--turns",
            "40",
            "--background",
            "off",
            "--db",
        ])
        .arg(&base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut before, mut after) = (0, 0);
    for (i, delay_ms) in [0u64, 2, 5, 10, 15, 20, 30, 45, 60, 90, 150]
        .iter()
        .enumerate()
    {
        for verb in ["redact", "delete"] {
            let db = dir.path().join(format!("{verb}-{i}.db"));
            std::fs::copy(&base, &db).unwrap();
            let mut cmd = abridge();
            cmd.arg(verb)
                .arg("--db")
                .arg(common::db_for(&db))
                .args(["--session", "demo-42-0"]);
            if verb == "redact" {
                cmd.args(["--text", "online shop"]);
            }
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(*delay_ms));
            let _ = child.kill();
            child.wait().unwrap();
            let store = common::store_at(&db);
            let (records, prompts, sessions): (i64, i64, i64) = store
                .with_conn(|c| {
                    c.query_row(
                        "SELECT (SELECT count(*) FROM redactions) + (SELECT count(*) FROM erasures), \
                                (SELECT count(*) FROM sessions WHERE instr(system_prompt, '[redacted]') > 0), \
                                (SELECT count(*) FROM sessions)",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                })
                .unwrap();
            match (verb, records) {
                (_, 0) => {
                    assert_eq!(
                        (prompts, sessions),
                        (0, 2),
                        "{verb} at {delay_ms} ms: untouched"
                    );
                    before += 1;
                }
                ("redact", 1) => {
                    assert_eq!(
                        (prompts, sessions),
                        (1, 2),
                        "{verb} at {delay_ms} ms: whole"
                    );
                    after += 1;
                }
                ("delete", 1) => {
                    assert_eq!(
                        (prompts, sessions),
                        (0, 1),
                        "{verb} at {delay_ms} ms: whole"
                    );
                    after += 1;
                }
                other => panic!("{other:?}"),
            }
            let report = store.with_conn(|c| common::verify_demo(c)).unwrap();
            assert!(report.ok, "{verb} killed at {delay_ms} ms: {report:#?}");
        }
    }
    // Which side each kill fell on is timing; that both are all or nothing is not.
    assert_eq!(before + after, 22);
}

/// A regex redaction removes a secret also where a truncation cut it: a
/// pinned fact's sentence is the words around its value, and a secret
/// standing at that window's edge is kept there cut (`…ve-…`), which the
/// regex alone no longer matches. Its whole matches elsewhere in the
/// session say what to look for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regex_redaction_removes_a_secret_a_pinned_sentence_cut_in_two() {
    let (s, _) = setup(quoting(), None);
    let sid = s.session("cut-secret", 2).await;
    let key = "sk-live-ABCD1234EFGH";
    // The tool-result fact's sentence, as the extractor keeps it: 40
    // characters either side of the value, here starting inside the key.
    let cut = &key[5..];
    s.runner
        .pin(
            sid,
            abridge::pins::Fact {
                kind: abridge::pins::FactKind::Id,
                slot: None,
                value: "txn_8f3a2".into(),
                sentence: format!("…{cut}\",\"txn\":\"txn_8f3a2\",\"ok\":true…"),
            },
        )
        .await
        .unwrap();
    s.runner
        .run_turn_at(sid, 2, &format!("my other key is {key}, keep it safe"))
        .await
        .unwrap();
    let r = s
        .store
        .redact(sid, Pattern::regex(r"sk-live-[A-Za-z0-9]+").unwrap())
        .await
        .unwrap();
    assert!(r.redaction_id.is_some());
    let sentences: Vec<String> = s
        .store
        .pins(sid)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.sentence)
        .collect();
    assert!(
        sentences
            .iter()
            .all(|t| !t.contains(cut) && !t.contains("ABCD1234")),
        "{sentences:?}"
    );
    assert!(
        sentences
            .iter()
            .any(|t| t.contains("txn_8f3a2") && t.contains(REDACTION_MARKER)),
        "{sentences:?}"
    );
    assert!(!contains(&file_bytes(&s.db), b"ABCD1234EFGH"));
}
