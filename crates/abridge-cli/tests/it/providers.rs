//! The provider adapters against a fake HTTP server on 127.0.0.1: what each
//! sends (tools, tool calls with their exact argument text, tool results,
//! thinking blocks with their signatures, cache breakpoints, the key), what it
//! makes of the answers (usage with cache reads and writes, stop reasons),
//! errors classified, and context overflow met without ending the session.

use crate::common;

use abridge::providers::{classify, Anthropic, ApiKey, HttpOptions, OpenAiChat, OpenAiResponses};
use abridge::{
    CompactionConfig, EventKind, ModelClient, ModelError, Runner, RunnerConfig, Store, Threshold,
    Tool, ToolCall, ToolError, ToolSpec, Tools,
};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request the fake server received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
    pub(crate) len: usize,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The answer: status, extra headers, body.
pub(crate) type Answer = (u16, Vec<(&'static str, String)>, Value);
type Handler = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

pub(crate) struct Fake {
    pub(crate) base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// An HTTP/1.1 server answering each request with `handler` (one request per
/// connection).
pub(crate) async fn serve(handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Fake {
    let handler: Handler = Arc::new(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (handler, log) = (handler.clone(), log.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    let n = sock.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "connection closed before the headers");
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let mut lines = head.split("\r\n");
                let path = lines.next().unwrap().split(' ').nth(1).unwrap().to_string();
                let headers: Vec<(String, String)> = lines
                    .filter_map(|l| l.split_once(": "))
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
                    .collect();
                let len: usize = headers
                    .iter()
                    .find(|(n, _)| n == "content-length")
                    .map(|(_, v)| v.parse().unwrap())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let n = sock.read(&mut chunk).await.unwrap();
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body: Value = serde_json::from_slice(&buf[head_end..head_end + len]).unwrap();
                let seen = Seen {
                    path,
                    headers,
                    body,
                    len,
                };
                let (status, extra, answer) = handler(&seen);
                log.lock().unwrap().push(seen);
                let answer = answer.to_string();
                let mut out = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n",
                    answer.len()
                );
                for (n, v) in extra {
                    out.push_str(&format!("{n}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&answer);
                let _ = sock.write_all(out.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Fake { base, seen }
}

/// Returns its input back, with a long `pad` when asked.
struct Lookup;

#[abridge::async_trait]
impl Tool for Lookup {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        let pad = call.input["pad"].as_u64().unwrap_or(0) as usize;
        Ok(json!({"got": call.input, "pad": "x".repeat(pad)}))
    }
}

fn tools() -> Tools {
    Tools::new().idempotent(
        ToolSpec {
            name: "lookup".into(),
            description: "looks a thing up".into(),
            input_schema: json!({"type": "object"}),
        },
        Lookup,
    )
}

fn runner(store: &Store, model: Arc<dyn ModelClient>, compaction: CompactionConfig) -> Runner {
    let mut cfg = RunnerConfig::default().with_owner("providers");
    cfg.model_retry = abridge::RetryPolicy::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(50));
    Runner::builder(store.clone(), model)
        .tools(tools())
        .config(cfg)
        .compaction(compaction.with_background(None))
        .build()
        .unwrap()
}

fn no_compaction() -> CompactionConfig {
    CompactionConfig::default().with_compact_at(Threshold::Off)
}

/// Every executed step rebuilds to its hash, and `verify` passes.
fn assert_store_holds(store: &Store) {
    store
        .with_conn(|c| {
            for id in abridge::inspect::executed_step_ids(c)? {
                let r = abridge::replay::rebuild_step(c, id)?;
                assert!(r.matches(), "step {id} does not rebuild to its hash");
            }
            let report = abridge::verify::verify(c)?;
            assert!(report.ok, "{report:#?}");
            Ok(())
        })
        .unwrap();
}

/// `(input, cache read, cache write, stop reason, elided)` of each step, in order.
type StepUsage = (Option<i64>, Option<i64>, Option<i64>, Option<String>, i64);

fn step_usage(store: &Store) -> Vec<StepUsage> {
    store
        .with_conn(|c| {
            let mut q = c.prepare(
                "SELECT input_tokens, cache_read_tokens, cache_write_tokens, \
                 response, elided_steps FROM steps ORDER BY id",
            )?;
            let rows = q
                .query_map([], |r| {
                    let response: Option<String> = r.get(3)?;
                    let stop = response
                        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                        .and_then(|v| v.get("stop_reason")?.as_str().map(str::to_string));
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, stop, r.get(4)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .unwrap()
}

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(common::db_for(&dir.path().join("p.db"))).unwrap();
    (dir, store)
}

const ARGS: &str = "{\"b\": 1,  \"a\": [2.50, \"x\"]}";

/// Chat Completions: tools offered, a tool call's arguments sent back as the
/// exact text received (spacing, key order and `2.50` kept), the result as a
/// `tool` message, usage with cached tokens and the stop reason stored, the
/// key sent as a bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_sends_tool_calls_back_as_received_and_stores_usage_and_stop_reasons() {
    let fake = serve(|seen| {
        let msgs = seen.body["messages"].as_array().unwrap();
        let last = msgs.last().unwrap();
        let body = if last["role"] == "tool" {
            json!({"choices": [{"message": {"role": "assistant", "content": "done"},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 120, "completion_tokens": 5,
                             "prompt_tokens_details": {"cached_tokens": 100}}})
        } else {
            json!({"choices": [{"message": {"role": "assistant", "content": null,
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "lookup", "arguments": ARGS}}]},
                                "finish_reason": "tool_calls"}],
                   "usage": {"prompt_tokens": 80, "completion_tokens": 9}})
        };
        (200, vec![], body)
    })
    .await;
    let (_d, store) = temp_store();
    let client = OpenAiChat::new(
        HttpOptions::new(&fake.base),
        Some(ApiKey::new("sk-test-123")),
    )
    .unwrap();
    let r = runner(&store, Arc::new(client), no_compaction());
    let s = r.create_session("s", "gpt-4o", "Be brief.").await.unwrap();
    let out = r.run_turn(s.id, "look it up").await.unwrap();
    assert_eq!(out.output, "done");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.path == "/v1/chat/completions"));
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-test-123"));
    assert_eq!(seen[0].body["model"], "gpt-4o");
    assert_eq!(
        seen[0].body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(seen[0].body["tools"][0]["function"]["name"], "lookup");
    let second = seen[1].body["messages"].as_array().unwrap();
    let call = &second[2]["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["function"]["arguments"].as_str(), Some(ARGS));
    assert_eq!(second[3]["role"], "tool");
    assert_eq!(second[3]["tool_call_id"], "call_1");
    assert!(second[3]["content"].as_str().unwrap().contains("2.5"));

    assert_eq!(
        step_usage(&store),
        vec![
            (Some(80), None, None, Some("tool_calls".into()), 0),
            (Some(120), Some(100), None, Some("stop".into()), 0),
        ]
    );
    assert_store_holds(&store);
}

/// Anthropic with extended thinking: thinking and redacted-thinking blocks
/// go back in place, signatures unchanged, before the tool call they led
/// to; cache breakpoints sit on the system prompt, the first message and
/// the last; input tokens are the uncached input plus cache reads and
/// writes, each stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sends_thinking_blocks_back_in_order_with_their_signatures() {
    let fake = serve(|seen| {
        let msgs = seen.body["messages"].as_array().unwrap();
        let last = msgs.last().unwrap()["content"].as_array().unwrap().clone();
        let body = if last.iter().any(|b| b["type"] == "tool_result") {
            json!({"content": [{"type": "text", "text": "all done"}], "stop_reason": "end_turn",
                   "usage": {"input_tokens": 10, "cache_read_input_tokens": 900,
                             "cache_creation_input_tokens": 50, "output_tokens": 7}})
        } else {
            json!({"content": [
                      {"type": "thinking", "thinking": "I should look it up", "signature": "sig-abc=="},
                      {"type": "redacted_thinking", "data": "opaque=="},
                      {"type": "text", "text": "Looking."},
                      {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"a": 1}}],
                   "stop_reason": "tool_use",
                   "usage": {"input_tokens": 400, "cache_creation_input_tokens": 0, "output_tokens": 30}})
        };
        (200, vec![], body)
    })
    .await;
    let (_d, store) = temp_store();
    let client = Anthropic::new(HttpOptions::new(&fake.base), ApiKey::new("ak-secret"))
        .unwrap()
        .with_thinking(1024);
    let r = runner(&store, Arc::new(client), no_compaction());
    let s = r
        .create_session("s", "claude-sonnet-4-5", "You are terse.")
        .await
        .unwrap();
    let out = r.run_turn(s.id, "look it up").await.unwrap();
    assert_eq!(out.output, "all done");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(seen[0].header("x-api-key"), Some("ak-secret"));
    assert_eq!(
        seen[0].header("anthropic-version"),
        Some(Anthropic::API_VERSION)
    );
    assert_eq!(
        seen[0].body["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    let body = &seen[1].body;
    assert_eq!(body["system"][0]["text"], "You are terse.");
    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
    let msgs = body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    let assistant = msgs[1]["content"].as_array().unwrap();
    let kinds: Vec<&str> = assistant
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "redacted_thinking", "text", "tool_use"]);
    assert_eq!(assistant[0]["signature"], "sig-abc==");
    assert_eq!(assistant[0]["thinking"], "I should look it up");
    assert_eq!(assistant[1]["data"], "opaque==");
    let results = msgs[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    for m in [&msgs[0], &msgs[2]] {
        let last = m["content"].as_array().unwrap().last().unwrap();
        assert_eq!(last["cache_control"]["type"], "ephemeral", "{m}");
    }
    assert!(msgs[1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b.get("cache_control").is_none()));

    assert_eq!(
        step_usage(&store),
        vec![
            (Some(400), None, Some(0), Some("tool_use".into()), 0),
            (Some(960), Some(900), Some(50), Some("end_turn".into()), 0),
        ]
    );
    assert_store_holds(&store);
}

/// The Responses API: the system prompt as instructions, calls and results
/// as `function_call` and `function_call_output` items (arguments as
/// received), stateless (`store: false`); a reasoning item is kept as an
/// unknown block and not sent back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_maps_function_calls_and_their_outputs() {
    let fake = serve(|seen| {
        let input = seen.body["input"].as_array().unwrap();
        let body = if input.iter().any(|i| i["type"] == "function_call_output") {
            json!({"status": "completed",
                   "output": [{"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": "finished"}]}],
                   "usage": {"input_tokens": 300, "output_tokens": 4,
                             "input_tokens_details": {"cached_tokens": 256}}})
        } else {
            json!({"status": "completed",
                   "output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                              {"type": "function_call", "call_id": "fc_1", "name": "lookup",
                               "arguments": ARGS}],
                   "usage": {"input_tokens": 200, "output_tokens": 12}})
        };
        (200, vec![], body)
    })
    .await;
    let (_d, store) = temp_store();
    let client =
        OpenAiResponses::new(HttpOptions::new(&fake.base), Some(ApiKey::new("sk-r"))).unwrap();
    let r = runner(&store, Arc::new(client), no_compaction());
    let s = r.create_session("s", "gpt-5", "Sys prompt.").await.unwrap();
    let out = r.run_turn(s.id, "go").await.unwrap();
    assert_eq!(out.output, "finished");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].path, "/v1/responses");
    let body = &seen[1].body;
    assert_eq!(body["instructions"], "Sys prompt.");
    assert_eq!(body["store"], false);
    assert_eq!(body["tools"][0]["name"], "lookup");
    let input = body["input"].as_array().unwrap();
    assert_eq!(
        input[0],
        json!({"role": "user", "content": [{"type": "input_text", "text": "go"}]})
    );
    assert_eq!(input[1]["type"], "function_call");
    assert_eq!(input[1]["arguments"].as_str(), Some(ARGS));
    assert_eq!(input[2]["type"], "function_call_output");
    assert_eq!(input[2]["call_id"], "fc_1");
    assert_eq!(
        input.len(),
        3,
        "the reasoning item is not sent back: {input:#?}"
    );

    assert_eq!(
        step_usage(&store),
        vec![
            (Some(200), None, None, Some("completed".into()), 0),
            (Some(300), Some(256), None, Some("completed".into()), 0),
        ]
    );
    assert_store_holds(&store);
}

/// Statuses and bodies classified as the retry policy needs them.
#[test]
fn provider_errors_are_classified_by_status_and_body() {
    let secs = Some(Duration::from_secs(3));
    assert_eq!(
        classify(429, secs, r#"{"error":{"message":"slow down"}}"#),
        ModelError::RateLimited {
            message: "HTTP 429: slow down".into(),
            retry_after: secs
        }
    );
    for status in [408, 500, 502, 503, 529] {
        assert!(
            matches!(classify(status, None, "{}"), ModelError::Transient(_)),
            "{status}"
        );
    }
    let overflows = [
        (
            400,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
        ),
        (
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        ),
        (
            413,
            r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#,
        ),
        (
            400,
            r#"{"error":{"message":"the request exceeds the available context size, try increasing it"}}"#,
        ),
    ];
    for (status, body) in overflows {
        assert!(
            matches!(classify(status, None, body), ModelError::ContextOverflow(_)),
            "{body}"
        );
    }
    for status in [400, 401, 403, 404, 422] {
        assert!(
            matches!(classify(status, None, r#"{"error":{"message":"no"}}"#), ModelError::Permanent(m) if m == "HTTP ".to_string() + &status.to_string() + ": no"),
            "{status}"
        );
    }
    assert!(matches!(
        classify(
            400,
            None,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        ),
        ModelError::Transient(_)
    ));
}

/// A 429 is retried no sooner than the provider's delay and the turn goes
/// on; a 401 is not retried and fails the turn with the provider's words;
/// the key is in no error and no debug output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_is_retried_and_an_auth_error_is_not_and_the_key_is_never_shown() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let fake = serve(move |seen| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        let text = seen.body["messages"].to_string();
        if text.contains("AUTH") {
            return (401, vec![], json!({"error": {"message": "invalid x-api-key"}}));
        }
        if n == 0 {
            return (
                429,
                vec![("retry-after-ms", "30".to_string())],
                json!({"error": {"message": "rate limited"}}),
            );
        }
        (
            200,
            vec![],
            json!({"choices": [{"message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}]}),
        )
    })
    .await;
    let (_d, store) = temp_store();
    let key = "sk-very-secret-key";
    let client = OpenAiChat::new(HttpOptions::new(&fake.base), Some(ApiKey::new(key))).unwrap();
    assert!(!format!("{client:?}").contains(key));
    assert!(!format!("{:?} {}", ApiKey::new(key), ApiKey::new(key)).contains(key));
    let r = runner(&store, Arc::new(client), no_compaction());
    let s = r.create_session("s", "gpt-4o", "sys").await.unwrap();
    assert_eq!(r.run_turn(s.id, "hello").await.unwrap().output, "fine");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let err = r.run_turn(s.id, "AUTH please").await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "a 401 is not retried");
    match &err {
        abridge::Error::Model { message, .. } => {
            assert_eq!(message, "HTTP 401: invalid x-api-key")
        }
        other => panic!("expected a model error, got {other:?}"),
    }
    assert!(!format!("{err:?} {err}").contains(key));
    assert_store_holds(&store);
}

/// An OpenAI-style server that refuses any request body over `limit` bytes
/// as too long, and otherwise answers with text (or, while a turn has fewer
/// than `calls` tool results, with one more `lookup` call padded by `pad`).
async fn limited_server(limit: usize, calls: usize, pad: u64) -> Fake {
    serve(move |seen| {
        if seen.len > limit {
            return (
                400,
                vec![],
                json!({"error": {"message": format!("This model's maximum context length is exceeded ({} bytes)", seen.len),
                                 "code": "context_length_exceeded"}}),
            );
        }
        let msgs = seen.body["messages"].as_array().unwrap();
        let since_user = msgs
            .iter()
            .rev()
            .take_while(|m| m["role"] != "user")
            .filter(|m| m["role"] == "tool")
            .count();
        let message = if since_user < calls && calls > 0 {
            json!({"role": "assistant", "content": null,
                   "tool_calls": [{"id": format!("call_{since_user}"), "type": "function",
                     "function": {"name": "lookup", "arguments": format!("{{\"pad\": {pad}}}")}}]})
        } else {
            json!({"role": "assistant", "content": format!("ok after {since_user} calls")})
        };
        (200, vec![], json!({"choices": [{"message": message, "finish_reason": "stop"}]}))
    })
    .await
}

fn overflow_events(rx: &mut tokio::sync::broadcast::Receiver<abridge::Event>) -> Vec<&'static str> {
    let mut out = Vec::new();
    for e in common::drained(rx) {
        if let EventKind::ContextOverflow { remedy, .. } = e.kind {
            out.push(remedy);
        }
    }
    out
}

/// A provider refusing the context as too long does not end the session:
/// every turn before this one is compacted at once (exactly once, as any
/// compaction) and the step is tried once more; the next turns read that
/// summary, and every step rebuilds to the bytes it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_compacts_the_earlier_turns_and_the_step_is_tried_once_more() {
    let fake = limited_server(6_000, 0, 0).await;
    let (_d, store) = temp_store();
    let client = OpenAiChat::new(HttpOptions::new(&fake.base), None).unwrap();
    let mut compaction = no_compaction();
    compaction.max_summary_chars = 800;
    let r = runner(&store, Arc::new(client), compaction);
    let mut events = r.subscribe();
    let s = r.create_session("s", "gpt-4o", "sys").await.unwrap();
    let mut refused_in = None;
    for t in 0..6 {
        let before = fake.seen().len();
        let input = format!("turn {t}: {}", "words and more words ".repeat(80));
        r.run_turn(s.id, &input).await.unwrap();
        let refused = fake.seen()[before..]
            .iter()
            .filter(|x| x.len > 6_000)
            .count();
        if refused > 0 {
            assert_eq!(
                refused, 1,
                "turn {t}: one refusal, then a request that fits"
            );
            assert_eq!(fake.seen().len() - before, 2);
            refused_in.get_or_insert(t);
        }
    }
    let t = refused_in.expect("the history outgrew the server's limit");
    assert!(t >= 2, "{t}");
    let rows: Vec<(i64, String)> = store
        .with_conn(|c| {
            let mut q =
                c.prepare("SELECT up_to_turn_index, status FROM compactions ORDER BY id")?;
            let v = q
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(v)
        })
        .unwrap();
    assert_eq!(rows[0], (t - 1, "completed".to_string()), "{rows:?}");
    assert!(overflow_events(&mut events)
        .iter()
        .all(|r| *r == "compacted"));
    assert_store_holds(&store);
}

/// An overflow inside one turn (nothing before it to compact): the tool
/// results of the turn's steps before its newest are sent as placeholders
/// naming each call, recorded on the step (`elided_steps`) and kept by the
/// turn's later steps; the full results stay in the store, and every step
/// rebuilds to the bytes it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_inside_one_turn_sends_older_tool_results_as_placeholders() {
    let fake = limited_server(6_000, 4, 2_000).await;
    let (_d, store) = temp_store();
    let client = OpenAiChat::new(HttpOptions::new(&fake.base), None).unwrap();
    let r = runner(&store, Arc::new(client), no_compaction());
    let mut events = r.subscribe();
    let s = r.create_session("s", "gpt-4o", "sys").await.unwrap();
    let out = r.run_turn(s.id, "fetch four things").await.unwrap();
    assert_eq!(out.output, "ok after 4 calls");
    assert_eq!(overflow_events(&mut events), ["elided"]);

    let elided: Vec<i64> = step_usage(&store).into_iter().map(|u| u.4).collect();
    assert_eq!(elided, [0, 0, 0, 2, 2]);
    let seen = fake.seen();
    let refused = seen.iter().filter(|x| x.len > 6_000).count();
    assert_eq!(refused, 1);
    let sent = seen
        .iter()
        .rfind(|x| x.len <= 6_000)
        .unwrap()
        .body
        .to_string();
    for id in ["call_0", "call_1"] {
        assert!(
            sent.contains(&format!(
                "result of tool call {id} left out to fit the context window"
            )),
            "{id}"
        );
    }
    assert!(!sent.contains("result of tool call call_2 left out"));
    let full: i64 = store
        .with_conn(|c| {
            c.query_row(
                "SELECT count(*) FROM tool_invocations WHERE length(result) > 2000",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(full, 4, "every full result stays in the store");
    assert_store_holds(&store);
}

/// What no remedy can make fit is a typed error: the turn fails, once
/// refused, and the store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_that_cannot_fit_is_a_typed_error() {
    let fake = limited_server(2_000, 0, 0).await;
    let (_d, store) = temp_store();
    let client = OpenAiChat::new(HttpOptions::new(&fake.base), None).unwrap();
    let r = runner(&store, Arc::new(client), no_compaction());
    let s = r.create_session("s", "gpt-4o", "sys").await.unwrap();
    let err = r.run_turn(s.id, &"y".repeat(3_000)).await.unwrap_err();
    assert!(
        matches!(err, abridge::Error::ContextOverflow { ref message, .. } if message.contains("HTTP 400")),
        "{err:?}"
    );
    assert_eq!(fake.seen().len(), 1);
    let status: String = store
        .with_conn(|c| c.query_row("SELECT status FROM turns", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(status, "failed");
    assert_store_holds(&store);
}

/// OpenAI's own compaction as the summariser: abridge claims each row once
/// (one `/responses/compact` call per compaction), stores the returned items
/// as the summary, feeds them to the next compaction, and every later step
/// sends them back as the very items returned, never as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_compaction_items_are_the_summary_and_go_back_as_returned() {
    use abridge::providers::{compaction_items, OpenAiCompaction, OPENAI_COMPACTION_MARKER};
    let compacts = Arc::new(AtomicUsize::new(0));
    let c = compacts.clone();
    let fake = serve(move |seen| {
        if seen.path == "/v1/responses/compact" {
            let n = c.fetch_add(1, Ordering::SeqCst);
            let item = json!({"type": "compaction", "id": format!("cmp_{n}"),
                              "encrypted_content": format!("gAAAA{n}+opaque/=")});
            return (
                200,
                vec![],
                json!({"output": [item], "usage": {"input_tokens": 500, "output_tokens": 40}}),
            );
        }
        (
            200,
            vec![],
            json!({"status": "completed",
                   "output": [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}],
                   "usage": {"input_tokens": 1000, "output_tokens": 2}}),
        )
    })
    .await;
    let (_d, store) = temp_store();
    let model = OpenAiResponses::new(HttpOptions::new(&fake.base), Some(ApiKey::new("k"))).unwrap();
    let summariser = OpenAiCompaction::new(
        HttpOptions::new(&fake.base),
        Some(ApiKey::new("k")),
        "gpt-5",
    )
    .unwrap();
    let mut cfg = RunnerConfig::default().with_owner("native");
    cfg.compaction = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(900))
        .with_background(None);
    let r = Runner::builder(store.clone(), Arc::new(model))
        .summariser(summariser)
        .config(cfg)
        .build()
        .unwrap();
    let s = r.create_session("s", "gpt-5", "sys").await.unwrap();
    for t in 0..4 {
        let input = format!("turn {t}: {}", "a long question ".repeat(120));
        assert_eq!(r.run_turn(s.id, &input).await.unwrap().output, "ok");
    }

    let rows: Vec<(String, Option<String>)> = store
        .with_conn(|c| {
            let mut q = c.prepare(
                "SELECT summary, model FROM compactions WHERE status = 'completed' ORDER BY id",
            )?;
            let v = q
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(v)
        })
        .unwrap();
    assert!(rows.len() >= 2, "{rows:?}");
    assert_eq!(
        compacts.load(Ordering::SeqCst),
        rows.len(),
        "one call per row"
    );
    for (summary, model) in &rows {
        assert!(summary.starts_with(OPENAI_COMPACTION_MARKER));
        assert_eq!(model.as_deref(), Some("gpt-5"));
    }
    let seen = fake.seen();
    let compact_calls: Vec<&Seen> = seen
        .iter()
        .filter(|x| x.path == "/v1/responses/compact")
        .collect();
    // The second compaction folds the first one's items.
    let (first_items, _) = compaction_items(&rows[0].0).unwrap();
    assert_eq!(compact_calls[1].body["input"][0], first_items[0]);
    // Every step after a compaction sends its items first, as returned.
    let last_items = compaction_items(&rows.last().unwrap().0).unwrap().0;
    let last_step = seen.iter().rfind(|x| x.path == "/v1/responses").unwrap();
    assert_eq!(last_step.body["input"][0], last_items[0]);
    assert!(!last_step
        .body
        .to_string()
        .contains("[Summary of the conversation"));
    assert_store_holds(&store);
}

/// A crash inside the compaction an overflow started (after its claim, mid
/// summary, after its completion): the turn stops there, and a new runner
/// resuming it finishes that same compaction (one row) and the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_inside_an_overflow_compaction_is_finished_by_the_resumed_turn() {
    use abridge::FaultPoint;
    for point in [
        FaultPoint::AfterClaim,
        FaultPoint::MidSummary,
        FaultPoint::AfterCompactionComplete,
    ] {
        let fake = limited_server(6_000, 0, 0).await;
        let (_d, store) = temp_store();
        let client: Arc<dyn ModelClient> =
            Arc::new(OpenAiChat::new(HttpOptions::new(&fake.base), None).unwrap());
        let mut compaction = no_compaction();
        compaction.max_summary_chars = 800;
        let mut cfg = RunnerConfig::default().with_owner(format!("crashing-{}", point.name()));
        cfg.compaction = compaction.clone().with_background(None);
        let crashing = Runner::builder(store.clone(), client.clone())
            .tools(tools())
            .config(cfg)
            .fault_hook(Arc::new(move |p| if p == point { Err(p) } else { Ok(()) }))
            .build()
            .unwrap();
        let s = crashing.create_session("s", "gpt-4o", "sys").await.unwrap();
        let mut stopped = None;
        for t in 0..6 {
            let input = format!("turn {t}: {}", "words and more words ".repeat(80));
            match crashing.run_turn(s.id, &input).await {
                Ok(_) => {}
                Err(abridge::Error::Injected(p)) => {
                    assert_eq!(p, point);
                    stopped = Some(t);
                    break;
                }
                Err(e) => panic!("{}: {e}", point.name()),
            }
        }
        let t = stopped.expect("the overflow compaction ran");
        drop(crashing);
        let resumed = runner(&store, client, compaction);
        let turn = store.turns(s.id).await.unwrap().pop().unwrap();
        assert_eq!(turn.idx, t);
        resumed.resume_turn(turn.id).await.unwrap();
        let rows: Vec<(i64, String)> = store
            .with_conn(|c| {
                let mut q = c.prepare("SELECT up_to_turn_index, status FROM compactions")?;
                let v = q
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(v)
            })
            .unwrap();
        assert_eq!(rows, [(t - 1, "completed".to_string())], "{}", point.name());
        assert_store_holds(&store);
    }
}

/// Anthropic's server-side compaction as the summariser: the request asks
/// for it (beta header, the `compact_20260112` edit paused after
/// compacting, abridge's rules as its instructions); the `compaction`
/// block's text is the stored summary, and a span under the API's trigger
/// floor gets the model's answer instead; one call per row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_compaction_text_is_the_summary_one_call_per_row() {
    use abridge::providers::AnthropicCompaction;
    let compacts = Arc::new(AtomicUsize::new(0));
    let c = compacts.clone();
    let fake = serve(move |seen| {
        if seen.body.get("context_management").is_some() {
            let n = c.fetch_add(1, Ordering::SeqCst);
            // The first is past the trigger (compacted by the provider), the
            // next under it (answered by the model).
            let content = if n == 0 {
                json!([{"type": "compaction", "content": "Summary by the provider: order ORD-1 asked."}])
            } else {
                json!([{"type": "text", "text": format!("Summary by the model, call {n}.")}])
            };
            let stop = if n == 0 { "compaction" } else { "end_turn" };
            return (
                200,
                vec![],
                json!({"content": content, "stop_reason": stop,
                       "usage": {"input_tokens": 700, "output_tokens": 30}}),
            );
        }
        (
            200,
            vec![],
            json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                   "usage": {"input_tokens": 1000, "output_tokens": 2}}),
        )
    })
    .await;
    let (_d, store) = temp_store();
    let model = Anthropic::new(HttpOptions::new(&fake.base), ApiKey::new("k")).unwrap();
    let summariser = AnthropicCompaction::new(
        HttpOptions::new(&fake.base),
        ApiKey::new("k"),
        "claude-haiku-4-5",
    )
    .unwrap();
    let mut cfg = RunnerConfig::default().with_owner("anthropic-native");
    cfg.compaction = CompactionConfig::default()
        .with_compact_at(Threshold::Tokens(900))
        .with_background(None);
    let r = Runner::builder(store.clone(), Arc::new(model))
        .summariser(summariser)
        .config(cfg)
        .build()
        .unwrap();
    let s = r
        .create_session("s", "claude-sonnet-4-5", "sys")
        .await
        .unwrap();
    for t in 0..3 {
        let input = format!("turn {t}: order ORD-1, {}", "a long question ".repeat(120));
        assert_eq!(r.run_turn(s.id, &input).await.unwrap().output, "ok");
    }
    let summaries: Vec<String> = store
        .with_conn(|c| {
            let mut q = c.prepare(
                "SELECT summary FROM compactions WHERE status = 'completed' ORDER BY id",
            )?;
            let v = q
                .query_map([], |r| r.get(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(v)
        })
        .unwrap();
    assert_eq!(summaries.len(), 2, "{summaries:?}");
    assert_eq!(compacts.load(Ordering::SeqCst), 2, "one call per row");
    assert!(summaries[0].starts_with("Summary by the provider"));
    assert!(summaries[1].starts_with("Summary by the model"));
    let seen = fake.seen();
    let ask = seen
        .iter()
        .find(|x| x.body.get("context_management").is_some())
        .unwrap();
    assert_eq!(
        ask.header("anthropic-beta"),
        Some(AnthropicCompaction::BETA)
    );
    let edit = &ask.body["context_management"]["edits"][0];
    assert_eq!(edit["type"], "compact_20260112");
    assert_eq!(edit["pause_after_compaction"], true);
    assert_eq!(edit["trigger"]["value"], AnthropicCompaction::TRIGGER_FLOOR);
    assert!(ask.body["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("The turns to compact"));
    // The next steps send the stored text as the summary.
    let last = seen
        .iter()
        .rfind(|x| x.body.get("context_management").is_none())
        .unwrap();
    assert!(last.body["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains(&summaries[1]));
    assert_store_holds(&store);
}

/// A session that changes provider: Anthropic's reasoning blocks in the
/// history are not sent to OpenAI's Chat Completions (an assistant message
/// holding only them is left out), and are sent to Anthropic in place.
#[test]
fn reasoning_blocks_go_only_to_the_provider_that_takes_them() {
    use abridge::{ContentBlock, Message, ModelRequest, Role};
    let thinking = ContentBlock::Thinking {
        thinking: "hmm".into(),
        signature: Some("sig".into()),
    };
    let request = ModelRequest {
        model: "m".into(),
        messages: Arc::new(vec![
            Message::text(Role::System, "sys"),
            Message::text(Role::User, "hi"),
            Message {
                role: Role::Assistant,
                content: vec![thinking.clone()],
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    thinking,
                    ContentBlock::Text {
                        text: "hello".into(),
                    },
                ],
            },
        ]),
        tools: Vec::new(),
        max_output_tokens: None,
    };
    let chat = OpenAiChat::request_body(&request);
    let msgs = chat["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert_eq!(msgs[2], json!({"role": "assistant", "content": "hello"}));
    let anthropic = Anthropic::new(HttpOptions::new("http://127.0.0.1:9"), ApiKey::new("k"))
        .unwrap()
        .request_body(&request);
    let content = anthropic["messages"][1]["content"].as_array().unwrap();
    let kinds: Vec<&str> = content
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "thinking", "text"]);
    assert_eq!(content[0]["signature"], "sig");
}

/// `ANTHROPIC_BASE_URL` and `OPENAI_BASE_URL` mean what the providers' own
/// SDKs take them to mean: Anthropic's is the API's root (`/v1/messages` is
/// added; a value ending in `/v1` is taken as it is), OpenAI's is the URL
/// the paths are added to (with `/v1` when the server has it, as given).
/// Each form, with and without a trailing `/v1` (and `/`), against a server
/// that records the path it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_urls_mean_what_the_providers_sdks_take_them_to_mean() {
    use abridge::providers::{anthropic_base_url, openai_base_url};
    use abridge::{Message, ModelRequest, Role};
    let fake = serve(|seen| {
        let body = if seen.path.ends_with("/messages") {
            json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                   "usage": {"input_tokens": 1, "output_tokens": 1}})
        } else {
            json!({"choices": [{"message": {"role": "assistant", "content": "ok"},
                                "finish_reason": "stop"}]})
        };
        (200, vec![], body)
    })
    .await;
    let root = fake.base.trim_end_matches("/v1").to_string();
    let request = ModelRequest {
        model: "m".into(),
        messages: Arc::new(vec![Message::text(Role::User, "hi")]),
        tools: Vec::new(),
        max_output_tokens: None,
    };
    let mut sent = Vec::new();
    for value in [
        root.clone(),
        format!("{root}/"),
        fake.base.clone(),
        format!("{}/", fake.base),
    ] {
        let options = HttpOptions::new(anthropic_base_url(&value));
        let client = Anthropic::new(options, ApiKey::new("k")).unwrap();
        client.complete(&request).await.unwrap();
        sent.push(("anthropic", value));
    }
    for value in [fake.base.clone(), format!("{}/", fake.base), root.clone()] {
        let options = HttpOptions::new(openai_base_url(&value));
        let client = OpenAiChat::new(options, Some(ApiKey::new("k"))).unwrap();
        client.complete(&request).await.unwrap();
        sent.push(("openai", value));
    }
    let paths: Vec<String> = fake.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/messages",
            "/v1/messages",
            "/v1/messages",
            "/v1/messages",
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/chat/completions",
        ],
        "{sent:?}"
    );
}
