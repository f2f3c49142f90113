//! A hostile provider and a careless host: what each can do to abridge, and
//! what abridge does instead of what it did.
//!
//! The provider is a raw TCP server on 127.0.0.1 that answers each request
//! with whatever bytes a test scripts: redirects to another loopback address
//! (which must receive nothing), absurd and huge headers, huge and endless
//! bodies, truncated and malformed bodies, error bodies that echo the key.
//! Each case is checked for what it used to cause: the key sent elsewhere, a
//! panic of the client or of a summariser's task, a turn stalled for an hour,
//! memory and the store grown by the answer's size, the key stored in
//! `turns.error`. The careless host deletes a session and creates it again
//! (its idempotency keys must be new) and restarts right after a `kill -9`
//! (a zombie holds no lease).

use crate::common;
pub(crate) use abridge_testkit::fake_http::{
    answer, serve as hostile, FakeServer as Hostile, Reply,
};

use abridge::providers::{Anthropic, ApiKey, HttpOptions, OpenAiChat, OpenAiResponses, Redirects};
use abridge::{
    CompactionConfig, Error, Message, ModelClient, ModelError, ModelRequest, Role, Runner,
    RunnerConfig, Store, Summariser, SummaryRequest, SummaryResponse, Threshold, Tool, ToolCall,
    ToolError, ToolSpec, Tools,
};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEY: &str = "sk-hostile-test-0123456789abcdefghij";

const CHAT_OK: &str =
    r#"{"choices":[{"message":{"role":"assistant","content":"fine"},"finish_reason":"stop"}]}"#;

/// The three clients, each at `base` with [`KEY`].
fn clients(
    base: &str,
    options: impl Fn(HttpOptions) -> HttpOptions,
) -> Vec<(&'static str, Arc<dyn ModelClient>)> {
    let o = || options(HttpOptions::new(base));
    vec![
        (
            "openai",
            Arc::new(OpenAiChat::new(o(), Some(ApiKey::new(KEY))).unwrap()) as Arc<dyn ModelClient>,
        ),
        (
            "openai-responses",
            Arc::new(OpenAiResponses::new(o(), Some(ApiKey::new(KEY))).unwrap()),
        ),
        (
            "anthropic",
            Arc::new(Anthropic::new(o(), ApiKey::new(KEY)).unwrap()),
        ),
    ]
}

/// A request of two messages (the clients' tests share it).
pub(crate) fn request() -> ModelRequest {
    ModelRequest {
        model: "m".into(),
        messages: Arc::new(vec![
            Message::text(Role::System, "sys"),
            Message::text(Role::User, "the whole conversation"),
        ]),
        tools: Vec::new(),
        max_output_tokens: None,
    }
}

fn runner_with(store: &Store, model: Arc<dyn ModelClient>, retry: abridge::RetryPolicy) -> Runner {
    let mut cfg = RunnerConfig::default().with_owner("hostile");
    cfg.model_retry = retry;
    Runner::builder(store.clone(), model)
        .tools(Tools::new())
        .config(cfg)
        .compaction(
            CompactionConfig::default()
                .with_compact_at(Threshold::Off)
                .with_background(None),
        )
        .build()
        .unwrap()
}

fn quick_retry() -> abridge::RetryPolicy {
    abridge::RetryPolicy::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(50))
        .with_jitter(0.0)
}

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(common::db_for(&dir.path().join("h.db"))).unwrap();
    (dir, store)
}

/// Every text column of the store, joined: where a leaked key would be.
fn stored_text(store: &Store) -> String {
    store
        .with_conn(|c| {
            let mut out = String::new();
            for sql in [
                "SELECT coalesce(error, '') FROM turns",
                "SELECT coalesce(output, '') FROM turns",
                "SELECT coalesce(response, '') FROM steps",
                "SELECT coalesce(error, '') FROM compactions",
            ] {
                let mut q = c.prepare(sql)?;
                let rows = q
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                out.push_str(&rows.join("\n"));
            }
            Ok(out)
        })
        .unwrap()
}

/// (1) A provider that redirects to another host (here another loopback
/// address) gets nothing sent there, by any of the three clients, with a 302
/// or a 307: neither the key header nor the conversation. A redirect is an
/// error that says where it pointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_host_is_not_followed_and_the_other_host_receives_nothing() {
    let elsewhere = hostile("127.0.0.2", |_, _| answer(200, &[], CHAT_OK)).await;
    for status in [302u16, 307, 308] {
        let to = format!("http://{}/v1/stolen", elsewhere.addr);
        let provider = hostile("127.0.0.1", move |_, _| {
            answer(status, &[("location", to.clone())], "")
        })
        .await;
        for (name, client) in clients(&provider.base, |o| o) {
            let err = client.complete(&request()).await.unwrap_err();
            match &err {
                ModelError::Permanent(m) => {
                    assert!(
                        m.contains("redirect") && m.contains("stolen"),
                        "{name}: {m}"
                    )
                }
                other => panic!("{name} {status}: expected a permanent error, got {other:?}"),
            }
        }
        assert_eq!(provider.requests(), 3);
        // Allowing same-origin redirects does not allow this one.
        for (name, client) in clients(&provider.base, |o| o.with_redirects(Redirects::SameOrigin)) {
            assert!(client.complete(&request()).await.is_err(), "{name}");
        }
    }
    assert_eq!(elsewhere.requests(), 0, "the other host received a request");
    assert!(elsewhere.bodies.lock().unwrap().is_empty());
}

/// Same-origin redirects are followed when the host allows them, and only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_origin_redirects_are_followed_only_when_allowed() {
    // Every answer points back at the same server under another path.
    let redirecting = hostile("127.0.0.1", |n, _| {
        answer(307, &[("location", format!("/v1/moved?n={n}"))], "")
    })
    .await;
    let chat = |o: HttpOptions| OpenAiChat::new(o, Some(ApiKey::new(KEY))).unwrap();
    // Default: not followed.
    let err = chat(HttpOptions::new(&redirecting.base))
        .complete(&request())
        .await
        .unwrap_err();
    assert!(matches!(err, ModelError::Permanent(_)), "{err:?}");
    assert_eq!(redirecting.requests(), 1);
    // Allowed: followed on the same origin, a bounded number of times.
    let err = chat(HttpOptions::new(&redirecting.base).with_redirects(Redirects::SameOrigin))
        .complete(&request())
        .await
        .unwrap_err();
    assert!(matches!(err, ModelError::Permanent(_)), "{err:?}");
    let followed = redirecting.requests() - 1;
    assert!(
        (2..=7).contains(&followed),
        "{followed} requests for a redirect loop"
    );
}

/// (2) `retry-after-ms: 1e300` (and other absurd values) panic no client: the
/// answer is a rate limit with a capped wait, and the runner, whose policy
/// allows far less, returns a typed error at once and leaves the turn
/// resumable. The server sees one request: nothing is waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_retry_after_values_panic_nothing_and_are_a_typed_rate_limit() {
    for (header, value) in [
        ("retry-after-ms", "1e300"),
        ("retry-after-ms", "-5"),
        ("retry-after-ms", "NaN"),
        ("retry-after", "1e300"),
        ("retry-after", "18446744073709551616000"),
        ("retry-after", "soon"),
    ] {
        let provider = hostile("127.0.0.1", move |_, _| {
            answer(
                429,
                &[(header, value.to_string())],
                r#"{"error":{"message":"slow down"}}"#,
            )
        })
        .await;
        for (name, client) in clients(&provider.base, |o| o) {
            match client.complete(&request()).await {
                Err(ModelError::RateLimited { retry_after, .. }) => assert!(
                    retry_after.is_none_or(|d| d <= abridge::providers::MAX_RETRY_AFTER),
                    "{name} {header}: {value}: {retry_after:?}"
                ),
                other => panic!("{name} {header}: {value}: {other:?}"),
            }
        }
    }
}

/// (3) A `Retry-After` longer than the policy's `max_backoff` is not waited
/// for: the host gets `Error::RateLimited` naming the wait, after one
/// request, and the turn stays running (resumable, and resumed once the
/// provider answers). A shorter one is waited and retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_longer_than_the_policy_is_a_typed_error_and_the_turn_resumes() {
    let provider = hostile("127.0.0.1", |n, _| match n {
        0 => answer(
            429,
            &[("retry-after", "3600".into())],
            r#"{"error":{"message":"later"}}"#,
        ),
        1 => answer(
            429,
            &[("retry-after-ms", "5".into())],
            r#"{"error":{"message":"soon"}}"#,
        ),
        _ => answer(200, &[], CHAT_OK),
    })
    .await;
    let (_d, store) = temp_store();
    let client = OpenAiChat::new(HttpOptions::new(&provider.base), Some(ApiKey::new(KEY))).unwrap();
    let r = runner_with(&store, Arc::new(client), quick_retry());
    let s = r.create_session("s", "m", "sys").await.unwrap();
    let err = r.run_turn_at(s.id, 0, "hello").await.unwrap_err();
    match &err {
        Error::RateLimited {
            retry_after,
            allowed,
            ..
        } => {
            assert_eq!(*retry_after, Duration::from_secs(3600));
            assert_eq!(*allowed, Duration::from_millis(50));
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    assert!(err.is_resumable());
    assert_eq!(provider.requests(), 1, "the long wait was not waited");
    let running = r.recoverable_turns().await.unwrap();
    assert_eq!(running.len(), 1, "the turn stays running");
    // Once its lease has run out with no host on it, `verify` names it.
    let notes = store
        .with_conn(|c| {
            c.execute("UPDATE turns SET lease_expires_at = 1", [])?;
            Ok(abridge::verify::verify(c)?.notes)
        })
        .unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("turn 0 of session s is running with no live holder")),
        "{notes:#?}"
    );
    // The host resumes later: the short wait is waited, then the answer comes.
    let out = r.resume_turn(running[0].id).await.unwrap();
    assert_eq!(out.output, "fine");
    assert_eq!(provider.requests(), 3);
    common::assert_verified(&store);
}

/// (4) A body longer than `max_response_bytes` is refused before it is
/// buffered: by its declared length (100 MB announced, never sent), and by
/// the bytes read of an endless chunked body. The client reads at most about
/// the limit; the turn fails with a short error; the store does not grow with
/// the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_and_endless_bodies_are_refused_before_they_are_buffered_or_stored() {
    let limit = 256 * 1024;
    let announced = hostile("127.0.0.1", |_, _| {
        Reply::Raw(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n{\"choices\": ["
                .to_vec(),
        )
    })
    .await;
    let endless = hostile("127.0.0.1", |_, _| Reply::Endless {
        head: "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            .into(),
        chunk: {
            let data = format!("{{\"pad\": \"{}\"}}", "x".repeat(16 * 1024));
            format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
        },
    })
    .await;
    for provider in [&announced, &endless] {
        for (name, client) in clients(&provider.base, |o| o.with_max_response_bytes(limit)) {
            let err = client.complete(&request()).await.unwrap_err();
            assert_eq!(
                err,
                ModelError::ResponseTooLarge {
                    limit_bytes: limit as u64
                },
                "{name}"
            );
        }
    }
    // The clients hung up: the endless server's writes fail and it stops,
    // far short of the 1 GiB it would send to a reader (what it did send
    // sits in the kernel's socket buffers, never in the client).
    let stopped = async {
        loop {
            let before = endless.sent.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            if endless.sent.load(Ordering::SeqCst) == before {
                return before;
            }
        }
    };
    let sent = tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .expect("the endless body is still being read");
    assert!(sent < 1 << 30, "{sent} bytes sent");

    let (_d, store) = temp_store();
    let client = OpenAiChat::new(
        HttpOptions::new(&endless.base).with_max_response_bytes(limit),
        Some(ApiKey::new(KEY)),
    )
    .unwrap();
    let r = runner_with(&store, Arc::new(client), quick_retry());
    let s = r.create_session("s", "m", "sys").await.unwrap();
    let err = r.run_turn_at(s.id, 0, "hello").await.unwrap_err();
    assert!(matches!(err, Error::Model { .. }), "{err:?}");
    assert!(
        !err.is_resumable(),
        "a too-large answer is final for the turn"
    );
    assert!(stored_text(&store).len() < 4096, "the answer was stored");
    common::assert_verified(&store);
}

/// (4, continued) Truncated and malformed bodies, and huge headers: transient
/// errors, retried, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_malformed_and_oversized_answers_are_transient_errors() {
    let cases: Vec<(&str, Reply)> = vec![
        (
            "truncated",
            Reply::Raw(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{\"choices\"".to_vec()),
        ),
        ("malformed", answer(200, &[], "{\"choices\": [")),
        ("not json", answer(200, &[], "<html>gateway</html>")),
        ("wrong shape", answer(200, &[], "{\"choices\": 7}")),
        (
            "huge header",
            answer(200, &[("x-junk", "y".repeat(2 << 20))], CHAT_OK),
        ),
        ("garbage", Reply::Raw(vec![0xff; 4096])),
        ("nothing", Reply::Raw(Vec::new())),
    ];
    for (what, reply) in cases {
        let reply = Arc::new(Mutex::new(Some(reply)));
        let provider = hostile("127.0.0.1", move |_, _| {
            reply
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| answer(200, &[], CHAT_OK))
        })
        .await;
        let client =
            OpenAiChat::new(HttpOptions::new(&provider.base), Some(ApiKey::new(KEY))).unwrap();
        let err = client.complete(&request()).await.unwrap_err();
        assert!(matches!(err, ModelError::Transient(_)), "{what}: {err:?}");
        // Retried by the runner: the next answer is a good one.
        let (_d, store) = temp_store();
        let r = runner_with(&store, Arc::new(client), quick_retry());
        let s = r.create_session("s", "m", "sys").await.unwrap();
        assert_eq!(
            r.run_turn_at(s.id, 0, "hi").await.unwrap().output,
            "fine",
            "{what}"
        );
    }
}

/// (5) A 401 whose body echoes the key, whole or in part, leaves the key in
/// no stored row and in no error text, for the bearer and the `x-api-key`
/// clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_key_is_scrubbed_from_stored_and_shown_errors() {
    let provider = hostile("127.0.0.1", |n, _| {
        let said = match n % 2 {
            0 => format!("Incorrect API key provided: {KEY}. Find yours at ..."),
            _ => format!("key {}...{} is invalid", &KEY[..12], &KEY[KEY.len() - 10..]),
        };
        answer(401, &[], &json!({"error": {"message": said}}).to_string())
    })
    .await;
    for (name, client) in clients(&provider.base, |o| o) {
        for _ in 0..2 {
            let (_d, store) = temp_store();
            let r = runner_with(&store, client.clone(), quick_retry());
            let s = r.create_session("s", "m", "sys").await.unwrap();
            let err = r.run_turn_at(s.id, 0, "hello").await.unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(shown.contains("[redacted]"), "{name}: {shown}");
            for fragment in [KEY, &KEY[..12], &KEY[KEY.len() - 10..]] {
                assert!(!shown.contains(fragment), "{name}: {shown}");
                assert!(!stored_text(&store).contains(fragment), "{name}: stored");
            }
        }
    }
}

/// A summariser that panics on every call.
struct Panicking;

#[abridge::async_trait]
impl Summariser for Panicking {
    async fn summarise(&self, _: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        panic!("a summariser bug")
    }
}

/// A model that answers at once, with a long text so that compaction is due.
struct Chatty;

#[abridge::async_trait]
impl ModelClient for Chatty {
    async fn complete(&self, _: &ModelRequest) -> Result<abridge::ModelResponse, ModelError> {
        Ok(serde_json::from_value(json!({
            "blocks": [{"type": "text", "text": "word ".repeat(200)}],
            "usage": {}
        }))
        .unwrap())
    }
}

/// (2, the summariser's side) A summariser that panics fails its attempts
/// under the failure policy: the row is failed, the turn goes on uncompacted
/// (the default policy) and completes, the next turn is not refused, and
/// nothing panics the host's task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_summariser_is_a_failed_attempt_and_never_wedges_the_session() {
    let (_d, store) = temp_store();
    let mut cfg = RunnerConfig::default().with_owner("hostile");
    cfg.model_retry = quick_retry();
    let r = Runner::builder(store.clone(), Arc::new(Chatty))
        .summariser(Panicking)
        .config(cfg)
        .compaction({
            let mut c = CompactionConfig::default()
                .with_compact_at(Threshold::Tokens(300))
                .with_background(None);
            c.retry = abridge::RetryPolicy::immediate(2);
            c
        })
        .build()
        .unwrap();
    let s = r.create_session("s", "m", "sys").await.unwrap();
    for t in 0..4 {
        r.run_turn_at(s.id, t, &format!("turn {t} {}", "talk ".repeat(100)))
            .await
            .unwrap_or_else(|e| panic!("turn {t}: {e}"));
    }
    let failed: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM compactions WHERE status = 'failed' AND error LIKE '%panicked%'",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(failed >= 1, "no failed compaction recorded the panic");
    assert!(r.recoverable_turns().await.unwrap().is_empty());
    common::assert_verified(&store);
}

/// Records each call's idempotency key.
struct Keys(Arc<Mutex<Vec<String>>>);

#[abridge::async_trait]
impl Tool for Keys {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        self.0.lock().unwrap().push(call.idempotency_key.clone());
        Ok(json!({"ok": true}))
    }
}

/// Calls `lookup` once per turn, then answers.
struct CallsOnce;

#[abridge::async_trait]
impl ModelClient for CallsOnce {
    async fn complete(&self, req: &ModelRequest) -> Result<abridge::ModelResponse, ModelError> {
        let last_is_result = req
            .messages
            .last()
            .is_some_and(|m| serde_json::to_string(m).unwrap().contains("tool_result"));
        let v = if last_is_result {
            json!({"blocks": [{"type": "text", "text": "done"}], "usage": {}})
        } else {
            json!({"blocks": [{"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": 1}}], "usage": {}})
        };
        Ok(serde_json::from_value(v).unwrap())
    }
}

/// (6) A session deleted and created again under the same external id sends
/// new idempotency keys: an idempotent outside API would otherwise skip the
/// new session's effects as repeats of the deleted one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_session_never_repeats_a_deleted_sessions_idempotency_keys() {
    let (_d, store) = temp_store();
    let keys = Arc::new(Mutex::new(Vec::new()));
    let r = Runner::builder(store.clone(), Arc::new(CallsOnce))
        .tools(Tools::new().idempotent(
            ToolSpec {
                name: "lookup".into(),
                description: "looks up".into(),
                input_schema: json!({"type": "object"}),
            },
            Keys(keys.clone()),
        ))
        .config(RunnerConfig::default().with_owner("careless"))
        .compaction(CompactionConfig::default().with_compact_at(Threshold::Off))
        .build()
        .unwrap();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let s = r.create_session("user-42", "m", "sys").await.unwrap();
        for t in 0..2 {
            r.run_turn_at(s.id, t, "look it up").await.unwrap();
        }
        rounds.push(std::mem::take(&mut *keys.lock().unwrap()));
        store.delete_session("user-42").await.unwrap();
    }
    assert!(rounds.iter().all(|k| k.len() == 2), "{rounds:?}");
    let all: std::collections::HashSet<&String> = rounds.iter().flatten().collect();
    assert_eq!(all.len(), 6, "keys repeated across recreations: {rounds:?}");
}

/// Answers "ok" at once.
struct Terse;

#[abridge::async_trait]
impl ModelClient for Terse {
    async fn complete(&self, _: &ModelRequest) -> Result<abridge::ModelResponse, ModelError> {
        Ok(
            serde_json::from_value(
                json!({"blocks": [{"type": "text", "text": "ok"}], "usage": {}}),
            )
            .unwrap(),
        )
    }
}

/// A history smaller than a summary message's own framing is not handed to
/// the summariser at all: no summary could be smaller (G7), so the row fails
/// at once with the reason, the turns go on, and no attempt is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_smaller_than_a_summary_message_spends_no_summariser_attempt() {
    let (_d, store) = temp_store();
    let counting = common::Counting::new(abridge::ExtractiveSummariser);
    let r = Runner::builder(store.clone(), Arc::new(Terse))
        .summariser_arc(counting.clone())
        .config(RunnerConfig::default().with_owner("careless"))
        .compaction(
            CompactionConfig::default()
                .with_compact_at(Threshold::Tokens(1))
                .with_background(None),
        )
        .build()
        .unwrap();
    let s = r.create_session("s", "m", "sys").await.unwrap();
    // Turn 1's step would fold turn 0 alone: about 30 tokens, under the
    // 34 of an empty summary message.
    for t in 0..2 {
        r.run_turn_at(s.id, t, "hi").await.unwrap();
    }
    let rows: Vec<(i64, String, Option<String>)> = store
        .with_conn(|c| {
            let mut q = c.prepare("SELECT up_to_turn_index, status, error FROM compactions")?;
            let rows = q
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(counting.count(), 0, "the summariser was called");
    let errors: Vec<String> = store
        .with_conn(|c| {
            let mut q = c.prepare("SELECT error FROM compactions WHERE status = 'failed'")?;
            let rows = q
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .unwrap();
    assert!(!errors.is_empty(), "no compaction was tried");
    assert!(
        errors
            .iter()
            .all(|e| e.contains("no larger than an empty summary message")),
        "{errors:?}"
    );
    common::assert_verified(&store);
}

/// The peak resident memory (VmHWM) of process `pid` so far, in KiB; None
/// once it has exited.
#[cfg(target_os = "linux")]
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// (4, measured) An endless answer, whole or streamed, to an `abridge chat`
/// process: the process ends with the too-large error, having sent the
/// request once, and its peak resident memory stays bounded (under 160 MiB,
/// against the 518 MB a 100 MB answer took when bodies were read whole
/// without a limit), whatever the server would have sent.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_leaves_a_chat_processs_memory_bounded() {
    for stream in ["off", "on"] {
        let provider = hostile("127.0.0.1", move |_, _| Reply::Endless {
            head: format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {}\r\nconnection: close\r\n\r\n",
                if stream == "on" {
                    "text/event-stream"
                } else {
                    "application/json"
                }
            ),
            chunk: if stream == "on" {
                b": padding padding padding padding padding padding padding\n\n".repeat(64)
            } else {
                b"[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]".repeat(64)
            },
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut child = common::abridge_cmd()
            .args(["chat", "--db"])
            .arg(common::db_for(&dir.path().join("m.db")))
            .args([
                "--session",
                "s",
                "--provider",
                "openai",
                "--model",
                "gpt-test",
            ])
            .args(["--compact-at", "off", "--stream", stream, "hello"])
            .env("OPENAI_API_KEY", KEY)
            .env("OPENAI_BASE_URL", &provider.base)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let (peak, out) = tokio::task::spawn_blocking(move || {
            let mut peak = 0;
            while child.try_wait().unwrap().is_none() {
                if let Some(kib) = peak_rss_kib(pid) {
                    peak = peak.max(kib);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (peak, child.wait_with_output().unwrap())
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "stream {stream}: {stderr}");
        assert!(stderr.contains("larger than"), "stream {stream}: {stderr}");
        assert!(!stderr.contains(KEY));
        assert_eq!(
            provider.requests(),
            1,
            "stream {stream}: a too-large answer is not asked again"
        );
        let sent = provider.sent.load(Ordering::SeqCst);
        assert!(
            sent >= 32 << 20,
            "stream {stream}: only {sent} bytes went out"
        );
        assert!(
            peak > 0 && peak < 160 * 1024,
            "stream {stream}: peak resident memory {peak} KiB"
        );
        eprintln!(
            "stream {stream}: {} MiB sent, peak RSS {} MiB",
            sent >> 20,
            peak >> 10
        );
    }
}
