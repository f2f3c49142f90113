//! `abridge chat` against a local server speaking OpenAI's Chat Completions:
//! one turn with the answer alone on stdout, the session kept across calls,
//! a missing key in one line, a chat killed mid-answer finished by the next
//! (the same turn, once), and the interactive `/context`, `/compact`, `/quit`
//! driven through stdin.

use crate::common::{abridge_cmd, db_for};
use crate::providers::{serve, Answer, Fake, Seen};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The text of the last user message of a Chat Completions request.
fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

/// An answer in the Chat Completions shape.
fn completion(text: &str) -> Answer {
    (
        200,
        vec![],
        json!({
            "id": "c1",
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}
        }),
    )
}

/// Echoes the last user message; a summary request gets a short summary.
fn echo(seen: &Seen) -> Answer {
    let text = last_user_text(&seen.body);
    if text.contains("summar") || text.contains("Summar") {
        return completion("The user said hello and asked about the weather.");
    }
    completion(&format!(
        "echo: {}",
        text.chars().take(60).collect::<String>()
    ))
}

fn chat(fake: &Fake, db: &Path, args: &[&str]) -> Command {
    chat_at(&fake.base, db, args)
}

/// `abridge chat` of session `s` on model `gpt-test` with the openai
/// provider at `base` (key `sk-test`), with `args` after.
pub(crate) fn chat_at(base: &str, db: &Path, args: &[&str]) -> Command {
    let mut c = abridge_cmd();
    c.args(["chat", "--db"])
        .arg(db_for(db))
        .args([
            "--session",
            "s",
            "--provider",
            "openai",
            "--model",
            "gpt-test",
        ])
        .args(args)
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", base)
        .env_remove("RUST_LOG");
    c
}

async fn output(mut c: Command) -> Output {
    tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_with_a_message_prints_the_answer_alone_and_keeps_the_session() {
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("chat.db");
    let out = output(chat(&fake, &db, &["hello there"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "echo: hello there\n");
    let out = output(chat(&fake, &db, &["and again"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "echo: and again\n");
    // The second call's request carried the first turn.
    let seen = fake.seen();
    let last = &seen.last().unwrap().body;
    let said: Vec<String> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert!(said.iter().any(|m| m.contains("hello there")), "{said:?}");
    assert_eq!(last["model"], "gpt-test");
    let verify = abridge_cmd()
        .args(["verify", "--db"])
        .arg(db_for(&db))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", text(&verify.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_without_a_key_says_so_in_one_line() {
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = chat(&fake, &dir.path().join("k.db"), &["hi"]);
    c.env_remove("OPENAI_API_KEY");
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("OPENAI_API_KEY"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
    assert!(fake.seen().is_empty(), "nothing was sent");
}

/// A share of an unknown window is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fraction_of_an_unknown_window_is_a_usage_error() {
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let out = output(chat(
        &fake,
        &dir.path().join("f.db"),
        &["--compact-at", "0.7", "hi"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("give a token count"), "{err}");
    assert!(fake.seen().is_empty());
}

/// A chat killed while the model answers leaves its turn running; the
/// session's next chat finishes that same turn (one more request, one
/// answer stored) and then runs its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_killed_mid_answer_is_finished_once_by_the_next() {
    let arrived = Arc::new(AtomicUsize::new(0));
    let a = arrived.clone();
    let fake = serve(move |seen| {
        let text = last_user_text(&seen.body);
        if text == "slow one" && a.fetch_add(1, Ordering::SeqCst) == 0 {
            // The first time only: long enough to be killed meanwhile.
            std::thread::sleep(Duration::from_secs(3));
        }
        echo(seen)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kill.db");
    let out = output(chat(&fake, &db, &["first"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    let mut slow = chat(&fake, &db, &["slow one"]);
    slow.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = slow.spawn().unwrap();
    for _ in 0..200 {
        if arrived.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        1,
        "the slow request arrived"
    );
    child.kill().unwrap();
    let killed = child.wait_with_output().unwrap();
    assert!(killed.stdout.is_empty(), "{}", text(&killed.stdout));

    let out = output(chat(&fake, &db, &["after"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "echo: after\n");
    let err = text(&out.stderr);
    assert!(err.contains("finishing turn 1"), "{err}");
    assert!(err.contains("echo: slow one"), "{err}");
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        2,
        "asked once more, not again"
    );

    let export = abridge_cmd()
        .args(["export", "--db"])
        .arg(db_for(&db))
        .args(["--session", "s", "--format", "jsonl"])
        .output()
        .unwrap();
    let jsonl = text(&export.stdout);
    assert_eq!(jsonl.matches("echo: slow one").count(), 1, "{jsonl}");
    assert_eq!(jsonl.matches("echo: after").count(), 1, "{jsonl}");
}

/// Interactive, through stdin: answers on stdout, `/context` a line of
/// figures, `/compact` a manual compaction (its summary made by the same
/// server), `/quit` the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_chat_answers_and_serves_context_and_compact() {
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("i.db");
    let mut c = chat(&fake, &db, &[]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = c.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"hello\nhow is the weather\n/context\n/compact\n/context\n/quit\n")
            .unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("echo: hello\n"), "{stdout}");
    assert!(stdout.contains("echo: how is the weather\n"), "{stdout}");
    let context: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("tokens "))
        .collect();
    assert_eq!(context.len(), 2, "{stdout}");
    assert!(
        context[0].contains("turns 2") && context[0].contains("compactions 0"),
        "{stdout}"
    );
    assert!(stdout.contains("compacted turns up to 1"), "{stdout}");
    assert!(context[1].contains("compactions 1"), "{stdout}");
}

/// `compact` and `serve` summarise with the model they are given
/// (`--summary-provider`, `--summary-model`; keys from the provider's
/// variables), not always the offline summariser; one without the other is a
/// usage error, a missing key one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_and_serve_summarise_with_the_configured_model() {
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    for said in ["hello there", "and about the weather", "one more"] {
        let out = output(chat(&fake, &db, &["--compact-at", "off", said])).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let compact = |extra: &[&str]| {
        let mut c = abridge_cmd();
        c.args(["compact", "--db"])
            .arg(db_for(&db))
            .args(["--session", "s"])
            .args(extra)
            .env("OPENAI_API_KEY", "sk-test")
            .env("OPENAI_BASE_URL", &fake.base);
        c
    };
    let out = output(compact(&["--summary-provider", "openai"])).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let mut missing = compact(&["--summary-provider", "openai", "--summary-model", "summ-1"]);
    missing.env_remove("OPENAI_API_KEY");
    let out = output(missing).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("OPENAI_API_KEY"),
        "{}",
        text(&out.stderr)
    );
    let before = fake.seen().len();
    let out = output(compact(&[
        "--summary-provider",
        "openai",
        "--summary-model",
        "summ-1",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let asked: Vec<Value> = fake.seen()[before..]
        .iter()
        .map(|s| s.body.clone())
        .collect();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["model"], "summ-1");
    let store = abridge::Store::open(db_for(&db)).unwrap();
    let model: String = store
        .with_conn(|c| {
            c.query_row(
                "SELECT model FROM compactions WHERE status = 'completed'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(model, "summ-1");

    // serve: a pending row, queued for another process, finished by the model.
    let session = store.session("s").await.unwrap();
    let turns = store.turns(session.id).await.unwrap();
    let runner = abridge::Runner::builder(
        store.clone(),
        Arc::new(
            abridge::providers::OpenAiChat::new(
                abridge::providers::HttpOptions::new(&fake.base),
                None,
            )
            .unwrap(),
        ),
    )
    .compaction(
        abridge::CompactionConfig::default()
            // Reported 40 tokens a step: past the soft threshold (30), under
            // the hard one, so the row is queued and nobody waits for it.
            .with_compact_at(abridge::Threshold::Tokens(100))
            .with_background(Some(abridge::compaction::Background {
                soft_share: 0.3,
                worker: abridge::compaction::BackgroundWorker::Elsewhere,
                ..Default::default()
            })),
    )
    .build()
    .unwrap();
    for i in 0..3 {
        runner
            .run_turn_at(session.id, turns.len() as i64 + i, "and again")
            .await
            .unwrap();
    }
    drop(runner);
    let pending: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM compactions WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(pending >= 1, "nothing left pending for serve");
    let mut serve_cmd = abridge_cmd();
    serve_cmd
        .args(["serve", "--db"])
        .arg(db_for(&db))
        .args(["--summary-provider", "openai", "--summary-model", "summ-2"])
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &fake.base);
    let out = output(serve_cmd).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let served: Vec<String> = store
        .with_conn(|c| {
            let mut q =
                c.prepare("SELECT model FROM compactions WHERE status = 'completed' ORDER BY id")?;
            let rows = q
                .query_map([], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(rows)
        })
        .unwrap();
    assert!(served.iter().any(|m| m == "summ-2"), "{served:?}");
}

/// A fork made with `abridge fork` is continued by `abridge chat`: its
/// request carries the parent's turns up to the fork point, not the later
/// ones, and the parent is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_continues_a_fork_made_from_the_command_line() {
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fork.db");
    for said in ["first thing", "second thing"] {
        let out = output(chat(&fake, &db, &[said])).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let fork = abridge_cmd()
        .args(["fork", "--db"])
        .arg(db_for(&db))
        .args(["--session", "s", "--at-turn", "0", "--as", "s-branch"])
        .output()
        .unwrap();
    assert!(fork.status.success(), "{}", text(&fork.stderr));
    let mut c = abridge_cmd();
    c.args(["chat", "--db"])
        .arg(db_for(&db))
        .args([
            "--session",
            "s-branch",
            "--provider",
            "openai",
            "--model",
            "gpt-test",
        ])
        .arg("another thing")
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &fake.base)
        .env_remove("RUST_LOG");
    let out = output(c).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "echo: another thing\n");
    let last = fake.seen().last().unwrap().body.to_string();
    assert!(last.contains("first thing"), "{last}");
    assert!(!last.contains("second thing"), "{last}");
    let export = abridge_cmd()
        .args(["export", "--db"])
        .arg(db_for(&db))
        .args(["--session", "s", "--format", "jsonl"])
        .output()
        .unwrap();
    let parent = text(&export.stdout);
    assert!(!parent.contains("another thing"));
    assert!(parent.contains("\"kind\":\"child\""));
    let verify = abridge_cmd()
        .args(["verify", "--db"])
        .arg(db_for(&db))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", text(&verify.stdout));
}

/// Calls `add_note` once, then answers with the tool's result.
#[cfg(feature = "mcp")]
fn note_taker(seen: &Seen) -> Answer {
    let messages = seen.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let last = messages.last().cloned().unwrap_or_default();
    if last["role"] == "tool" {
        return completion(&format!(
            "done: {}",
            last["content"].as_str().unwrap_or_default()
        ));
    }
    (
        200,
        vec![],
        json!({
            "id": "c1",
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_n", "type": "function",
                     "function": {"name": "add_note", "arguments": "{\"note\":\"from chat\"}"}}]}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}
        }),
    )
}

#[cfg(feature = "mcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_offers_the_tools_of_mcp_servers_given_by_command_and_url() {
    use crate::mcp::{fixture_bin, Files, HttpFixture};
    let fake = serve(note_taker).await;
    let dir = tempfile::tempdir().unwrap();

    // --mcp: a server run as a command line.
    let files = Files::new();
    let mut line = vec![fixture_bin().display().to_string()];
    line.extend(files.args());
    line.push("--stdio".into());
    let command = line.join(" ");
    let db = dir.path().join("stdio.db");
    let out = output(chat(
        &fake,
        &db,
        &[
            "--mcp",
            &command,
            "--mcp-effect",
            "add_note=idempotent",
            "note this",
        ],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "done: noted: from chat\n");
    let offered: Vec<String> = fake.seen()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(offered.contains(&"add_note".to_string()), "{offered:?}");
    let calls = files.calls();
    assert_eq!(calls.len(), 1);
    let key: String = crate::common::store_at(&db)
        .with_conn(|c| {
            c.query_row(
                "SELECT idempotency_key || ' ' || effect FROM tool_invocations",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(
        key,
        format!("{} idempotent", calls[0]["key"].as_str().unwrap())
    );

    // --mcp-url: a server over streamable HTTP, with a header.
    let files = Files::new();
    let http = HttpFixture::start(&files, "127.0.0.1:0");
    let db = dir.path().join("http.db");
    let out = output(chat(
        &fake,
        &db,
        &[
            "--mcp-url",
            &http.url,
            "--mcp-header",
            "Authorization: Bearer t",
            "note that",
        ],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "done: noted: from chat\n");
    assert_eq!(files.calls().len(), 1);

    // A mode for a tool no server has, and a server that is not there.
    let out = output(chat(
        &fake,
        &db,
        &["--mcp", &command, "--mcp-effect", "nope=idempotent", "x"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = output(chat(&fake, &db, &["--mcp", "/nonexistent/server", "x"])).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("could not connect to the MCP server"),
        "{}",
        text(&out.stderr)
    );
}

#[cfg(feature = "otel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_exports_its_turn_over_otlp_when_the_endpoint_is_set() {
    let (otlp, got) = crate::telemetry::otlp_receiver().await;
    let fake = serve(echo).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("chat.db");
    let mut c = chat(&fake, &db, &["hello there"]);
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json");
    let out = output(c).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "echo: hello there\n");
    let traces: String = got
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _, _)| path == "/v1/traces")
        .map(|(_, _, body)| String::from_utf8_lossy(body).to_string())
        .collect();
    for want in [
        "\"invoke_agent\"",
        "\"chat gpt-test\"",
        "\"openai\"",
        "\"abridge\"",
    ] {
        assert!(traces.contains(want), "{want} not in what the receiver got");
    }
    // Without the opt-in, no message text.
    assert!(!traces.contains("hello there"));
}
