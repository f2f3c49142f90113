//! Streamed answers: each adapter against a local server speaking its wire
//! format, and a runner that streams storing what one that does not stores.
//!
//! The server (the hostile one of `hostile.rs`) writes each scripted stream
//! in small pieces, each flushed on its own and read apart: a piece boundary
//! falls inside a multi-byte UTF-8 character, inside a JSON string and
//! inside an event's lines, and keep-alive comments and pings come between
//! events. The checks: the response a stream assembles is the response the
//! same answer gives unstreamed; the pieces handed over add up to the text
//! and the arguments' text; a stream cut short, stalled, malformed, or
//! ended by an error event is an error of its kind and nothing of it is
//! kept; a runner that streams stores the same rows and hashes as one that
//! does not, and sends the pieces to its subscribers.

use crate::common;
use crate::hostile::{answer, hostile, request, Reply};

use abridge::events::EventKind;
use abridge::providers::{Anthropic, ApiKey, HttpOptions, OpenAiChat, OpenAiResponses};
use abridge::{
    CompactionConfig, Delta, ModelClient, ModelError, ModelResponse, Runner, RunnerConfig, Store,
    Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools,
};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The answer's text: multi-byte characters of 2, 3 and 4 bytes, quotes and
/// an escaped newline inside its JSON strings.
const TEXT: &str = "Ça coûte 12 € — 日本語で \"quoted\"\nline two 🎉 done.";
/// A tool call's arguments, as the exact text the provider sends.
const ARGS: &str = r#"{"city":"Zürich","note":"naïve \"q\" 🎉","n":3}"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Wire {
    Chat,
    Responses,
    Anthropic,
}

const WIRES: [Wire; 3] = [Wire::Chat, Wire::Responses, Wire::Anthropic];

/// What the scripted model answers: text, or a tool call with text before it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Text,
    Call,
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The answer unstreamed: the body a call without `stream` gets.
fn whole_body(wire: Wire, answer: Answer) -> Value {
    let call = answer == Answer::Call;
    match wire {
        Wire::Chat => {
            let mut message = json!({"role": "assistant", "content": TEXT});
            if call {
                message["tool_calls"] = json!([{"id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": ARGS}}]);
            }
            json!({"choices": [{"index": 0, "message": message,
                "finish_reason": if call { "tool_calls" } else { "stop" }}],
                "usage": {"prompt_tokens": 120, "completion_tokens": 30,
                          "prompt_tokens_details": {"cached_tokens": 64}}})
        }
        Wire::Responses => {
            let mut output = vec![json!({"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": TEXT}]})];
            if call {
                output.push(json!({"type": "function_call", "call_id": "call_1",
                    "name": "lookup", "arguments": ARGS}));
            }
            json!({"status": "completed", "output": output,
                "usage": {"input_tokens": 120, "output_tokens": 30,
                          "input_tokens_details": {"cached_tokens": 64}}})
        }
        Wire::Anthropic => {
            let mut content = vec![
                json!({"type": "thinking", "thinking": "Let me think… 考える", "signature": "sig-Zm9vYmFy"}),
                json!({"type": "text", "text": TEXT}),
            ];
            if call {
                content.push(
                    json!({"type": "tool_use", "id": "toolu_1", "name": "lookup",
                    "input": serde_json::from_str::<Value>(ARGS).unwrap()}),
                );
            }
            json!({"id": "msg_1", "type": "message", "role": "assistant", "content": content,
                "stop_reason": if call { "tool_use" } else { "end_turn" },
                "usage": {"input_tokens": 50, "cache_read_input_tokens": 64,
                          "cache_creation_input_tokens": 6, "output_tokens": 30}})
        }
    }
}

/// Splits `s` into pieces of 1 to 4 chars' worth of bytes at byte offsets
/// that ignore char boundaries (so pieces cut characters apart).
fn pieces_of(bytes: &[u8], widths: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut k = 0;
    while i < bytes.len() {
        let w = widths[k % widths.len()].min(bytes.len() - i);
        out.push(bytes[i..i + w].to_vec());
        i += w;
        k += 1;
    }
    out
}

/// The answer streamed, as its provider sends it, with keep-alives and
/// pings; `cut` ends it after that many events (no end event).
fn stream_body(wire: Wire, answer: Answer, cut: Option<usize>) -> String {
    let call = answer == Answer::Call;
    let (t1, t2) = TEXT.split_at(TEXT.char_indices().nth(9).unwrap().0);
    let (a1, a2) = ARGS.split_at(ARGS.char_indices().nth(14).unwrap().0);
    let mut events: Vec<String> = Vec::new();
    match wire {
        Wire::Chat => {
            let chunk = |delta: Value, finish: Value| {
                sse(
                    None,
                    &json!({"id": "c", "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                )
            };
            events.push(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ));
            events.push(": keep-alive\n\n".into());
            events.push(chunk(json!({"content": t1}), Value::Null));
            events.push(chunk(json!({"content": t2}), Value::Null));
            if call {
                events.push(chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "lookup", "arguments": ""}}]}),
                    Value::Null,
                ));
                for part in [a1, a2] {
                    events.push(chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}),
                        Value::Null,
                    ));
                }
            }
            events.push(chunk(
                json!({}),
                json!(if call { "tool_calls" } else { "stop" }),
            ));
            events.push(sse(
                None,
                &json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 120,
                "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 64}}}),
            ));
            events.push("data: [DONE]\n\n".into());
        }
        Wire::Responses => {
            let ev = |kind: &str, mut v: Value| {
                v["type"] = json!(kind);
                sse(Some(kind), &v)
            };
            events.push(ev(
                "response.created",
                json!({"response": {"status": "in_progress", "output": []}}),
            ));
            events.push(ev(
                "response.output_item.added",
                json!({"output_index": 0, "item": {"type": "message", "content": []}}),
            ));
            for part in [t1, t2] {
                events.push(ev(
                    "response.output_text.delta",
                    json!({"output_index": 0, "content_index": 0, "delta": part}),
                ));
            }
            events.push(": keep-alive\n\n".into());
            if call {
                events.push(ev(
                    "response.output_item.added",
                    json!({"output_index": 1, "item": {"type": "function_call",
                        "call_id": "call_1", "name": "lookup", "arguments": ""}}),
                ));
                for part in [a1, a2] {
                    events.push(ev(
                        "response.function_call_arguments.delta",
                        json!({"output_index": 1, "delta": part}),
                    ));
                }
            }
            events.push(ev(
                "response.completed",
                json!({"response": whole_body(Wire::Responses, answer)}),
            ));
        }
        Wire::Anthropic => {
            let ev = |kind: &str, mut v: Value| {
                v["type"] = json!(kind);
                sse(Some(kind), &v)
            };
            events.push(ev(
                "message_start",
                json!({"message": {"id": "msg_1", "type": "message", "role": "assistant",
                "content": [], "stop_reason": null, "usage": {"input_tokens": 50,
                "cache_read_input_tokens": 64, "cache_creation_input_tokens": 6,
                "output_tokens": 1}}}),
            ));
            events.push(ev(
                "content_block_start",
                json!({"index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            ));
            events.push(ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me think… 考える"}}),
            ));
            events.push(ev(
                "content_block_delta",
                json!({"index": 0, "delta": {"type": "signature_delta", "signature": "sig-Zm9vYmFy"}}),
            ));
            events.push(ev("content_block_stop", json!({"index": 0})));
            events.push(ev("ping", json!({})));
            events.push(ev(
                "content_block_start",
                json!({"index": 1, "content_block": {"type": "text", "text": ""}}),
            ));
            for part in [t1, t2] {
                events.push(ev(
                    "content_block_delta",
                    json!({"index": 1, "delta": {"type": "text_delta", "text": part}}),
                ));
            }
            events.push(ev("content_block_stop", json!({"index": 1})));
            if call {
                events.push(ev(
                    "content_block_start",
                    json!({"index": 2, "content_block": {"type": "tool_use", "id": "toolu_1",
                        "name": "lookup", "input": {}}}),
                ));
                for part in [a1, a2] {
                    events.push(ev(
                        "content_block_delta",
                        json!({"index": 2, "delta": {"type": "input_json_delta", "partial_json": part}}),
                    ));
                }
                events.push(ev("content_block_stop", json!({"index": 2})));
            }
            events.push(ev(
                "message_delta",
                json!({"delta": {"stop_reason": if call { "tool_use" } else { "end_turn" },
                "stop_sequence": null}, "usage": {"output_tokens": 30}}),
            ));
            events.push(ev("message_stop", json!({})));
        }
    }
    if let Some(n) = cut {
        events.truncate(n);
    }
    events.concat()
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";

fn streamed(body: String, widths: &[usize]) -> Reply {
    Reply::Pieces {
        head: SSE_HEAD.into(),
        pieces: pieces_of(body.as_bytes(), widths),
        gap: Duration::from_millis(1),
        hang: Duration::ZERO,
    }
}

fn json_reply(body: &Value) -> Reply {
    answer(200, &[], &body.to_string())
}

/// A server answering every request with `answer` in `wire`'s format:
/// streamed (in pieces of `widths` bytes) when the request asks for it.
async fn server(wire: Wire, answer: Answer, widths: &'static [usize]) -> crate::hostile::Hostile {
    hostile("127.0.0.1", move |_, body| {
        if body.get("stream") == Some(&json!(true)) {
            streamed(stream_body(wire, answer, None), widths)
        } else {
            json_reply(&whole_body(wire, answer))
        }
    })
    .await
}

fn client(wire: Wire, base: &str, idle: Duration) -> Arc<dyn ModelClient> {
    let o = HttpOptions::new(base).with_stream_idle_timeout(idle);
    let key = || ApiKey::new("sk-stream-test-0123456789");
    match wire {
        Wire::Chat => Arc::new(OpenAiChat::new(o, Some(key())).unwrap()),
        Wire::Responses => Arc::new(OpenAiResponses::new(o, Some(key())).unwrap()),
        Wire::Anthropic => Arc::new(Anthropic::new(o, key()).unwrap()),
    }
}

/// Streams `client`'s answer, returning it and the pieces handed over.
async fn stream(client: &dyn ModelClient) -> (Result<ModelResponse, ModelError>, Vec<Delta>) {
    let seen = Mutex::new(Vec::new());
    let out = client
        .complete_streaming(&request(), &|d| seen.lock().unwrap().push(d))
        .await;
    (out, seen.into_inner().unwrap())
}

/// Each adapter, pieces of 1, 2, 3, 5 and 7 bytes (cutting characters,
/// JSON strings and event lines apart), keep-alive comments and pings
/// between events: the response assembled equals the unstreamed one, and
/// the pieces handed over add up to the text and the arguments' text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_adapters_stream_assembles_exactly_the_unstreamed_response() {
    for wire in WIRES {
        for answer in [Answer::Text, Answer::Call] {
            for widths in [&[1usize][..], &[2, 3, 5, 7][..]] {
                let widths: &'static [usize] = Box::leak(widths.to_vec().into_boxed_slice());
                let srv = server(wire, answer, widths).await;
                let c = client(wire, &srv.base, Duration::from_secs(10));
                let whole = c.complete(&request()).await.unwrap();
                let (streamed, deltas) = stream(&*c).await;
                let streamed = streamed.unwrap_or_else(|e| panic!("{wire:?} {answer:?}: {e}"));
                assert_eq!(streamed, whole, "{wire:?} {answer:?} {widths:?}");
                let bodies = srv.bodies.lock().unwrap().clone();
                assert_eq!(bodies[1]["stream"], json!(true), "{wire:?}");
                let text: String = deltas
                    .iter()
                    .filter_map(|d| match d {
                        Delta::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(text, TEXT, "{wire:?} {answer:?}");
                let args: String = deltas
                    .iter()
                    .filter_map(|d| match d {
                        Delta::ToolCall {
                            index: 0,
                            arguments,
                            ..
                        } => Some(arguments.as_str()),
                        _ => None,
                    })
                    .collect();
                let named = deltas.iter().any(|d| {
                    matches!(d, Delta::ToolCall { name: Some(n), id: Some(_), .. } if n == "lookup")
                });
                if answer == Answer::Call {
                    assert_eq!(args, ARGS, "{wire:?}");
                    assert!(named, "{wire:?}: no piece named the call");
                } else {
                    assert!(args.is_empty() && !named, "{wire:?}");
                }
                if wire == Wire::Anthropic {
                    assert!(deltas.contains(&Delta::Thinking {
                        text: "Let me think… 考える".into()
                    }));
                }
            }
        }
    }
}

/// A server that ignored `stream: true` and answered with one JSON body:
/// the answer is read as that body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstreamed_answer_to_a_streamed_request_is_read_whole() {
    for wire in WIRES {
        let srv = hostile("127.0.0.1", move |_, _| {
            json_reply(&whole_body(wire, Answer::Call))
        })
        .await;
        let c = client(wire, &srv.base, Duration::from_secs(10));
        let whole = c.complete(&request()).await.unwrap();
        let (streamed, deltas) = stream(&*c).await;
        assert_eq!(streamed.unwrap(), whole, "{wire:?}");
        assert!(deltas.is_empty());
    }
}

fn expect_transient(wire: Wire, what: &str, r: Result<ModelResponse, ModelError>, has: &str) {
    match r {
        Err(ModelError::Transient(m)) => assert!(m.contains(has), "{wire:?} {what}: {m}"),
        other => panic!("{wire:?} {what}: expected a transient error, got {other:?}"),
    }
}

/// A stream cut before its end event, one that stalls past the idle
/// timeout, one with an event that is not JSON, and one whose bytes are not
/// UTF-8: each a transient error saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stalled_or_malformed_stream_is_a_transient_error() {
    for wire in WIRES {
        let full = stream_body(wire, Answer::Call, None)
            .matches("\n\n")
            .count();
        for cut in [1, full / 2, full - 1] {
            let srv = hostile("127.0.0.1", move |_, _| {
                streamed(stream_body(wire, Answer::Call, Some(cut)), &[3, 11])
            })
            .await;
            let (r, _) = stream(&*client(wire, &srv.base, Duration::from_secs(10))).await;
            expect_transient(wire, "cut", r, "ended before the answer did");
        }

        let srv = hostile("127.0.0.1", move |_, _| Reply::Pieces {
            head: SSE_HEAD.into(),
            pieces: vec![stream_body(wire, Answer::Text, Some(2)).into_bytes()],
            gap: Duration::ZERO,
            hang: Duration::from_secs(30),
        })
        .await;
        let start = std::time::Instant::now();
        let (r, _) = stream(&*client(wire, &srv.base, Duration::from_millis(300))).await;
        expect_transient(wire, "stalled", r, "stalled");
        assert!(start.elapsed() < Duration::from_secs(10), "{wire:?}");

        let srv = hostile("127.0.0.1", move |_, _| {
            let mut body = stream_body(wire, Answer::Text, Some(2));
            body.push_str("data: {\"choices\": [{\"delta\": \n\n");
            streamed(body, &[64])
        })
        .await;
        let (r, _) = stream(&*client(wire, &srv.base, Duration::from_secs(10))).await;
        expect_transient(wire, "not JSON", r, "not JSON");

        let srv = hostile("127.0.0.1", move |_, _| {
            let mut body = stream_body(wire, Answer::Text, Some(2)).into_bytes();
            body.extend_from_slice(b"data: \xff\xfe\xff\n\n");
            Reply::Pieces {
                head: SSE_HEAD.into(),
                pieces: vec![body],
                gap: Duration::ZERO,
                hang: Duration::ZERO,
            }
        })
        .await;
        let (r, _) = stream(&*client(wire, &srv.base, Duration::from_secs(10))).await;
        assert!(
            matches!(r, Err(ModelError::Transient(_))),
            "{wire:?} not UTF-8: {r:?}"
        );
    }
}

type IsKind = fn(&ModelError) -> bool;

/// An error event mid-stream is the error its kind names: overloaded is
/// transient, a rate limit is a rate limit, a prompt too long is an
/// overflow, a bad request is permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_mid_stream_is_the_error_it_names() {
    let error_event = |wire: Wire, kind: &str, message: &str| match wire {
        Wire::Chat => sse(
            None,
            &json!({"error": {"message": message, "type": kind, "code": kind}}),
        ),
        Wire::Responses => sse(
            Some("error"),
            &json!({"type": "error", "code": kind, "message": message}),
        ),
        Wire::Anthropic => sse(
            Some("error"),
            &json!({"type": "error", "error": {"type": kind, "message": message}}),
        ),
    };
    for wire in WIRES {
        let cases: [(&str, &str, IsKind); 4] = [
            ("overloaded_error", "Overloaded", |e| {
                matches!(e, ModelError::Transient(_))
            }),
            ("rate_limit_exceeded", "slow down", |e| {
                matches!(e, ModelError::RateLimited { .. })
            }),
            (
                "context_length_exceeded",
                "prompt is too long: 300000 tokens",
                |e| matches!(e, ModelError::ContextOverflow(_)),
            ),
            ("invalid_request_error", "bad tool schema", |e| {
                matches!(e, ModelError::Permanent(_))
            }),
        ];
        for (kind, message, is) in cases {
            let ev = error_event(wire, kind, message);
            let srv = hostile("127.0.0.1", move |_, _| {
                let mut body = stream_body(wire, Answer::Text, Some(3));
                body.push_str(&ev);
                streamed(body, &[5, 9])
            })
            .await;
            let (r, _) = stream(&*client(wire, &srv.base, Duration::from_secs(10))).await;
            let e = r.expect_err("an error event");
            assert!(is(&e), "{wire:?} {kind}: {e:?}");
        }
    }
}

/// A streamed answer longer than `max_response_bytes` is refused as it
/// arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_limit_is_refused() {
    for wire in WIRES {
        let srv = hostile("127.0.0.1", move |_, _| Reply::Endless {
            head: SSE_HEAD.into(),
            chunk: b": keep-alive padding padding padding padding\n\n".to_vec(),
        })
        .await;
        let o = HttpOptions::new(&srv.base).with_max_response_bytes(64 * 1024);
        let key = ApiKey::new("k");
        let c: Arc<dyn ModelClient> = match wire {
            Wire::Chat => Arc::new(OpenAiChat::new(o, Some(key)).unwrap()),
            Wire::Responses => Arc::new(OpenAiResponses::new(o, Some(key)).unwrap()),
            Wire::Anthropic => Arc::new(Anthropic::new(o, key).unwrap()),
        };
        let (r, _) = stream(&*c).await;
        assert!(
            matches!(r, Err(ModelError::ResponseTooLarge { .. })),
            "{wire:?}: {r:?}"
        );
    }
}

struct Lookup;

#[abridge::async_trait]
impl Tool for Lookup {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        Ok(json!(format!("found {}", call.input["city"])))
    }
}

fn lookup() -> Tools {
    Tools::new().idempotent(
        ToolSpec {
            name: "lookup".into(),
            description: "Looks a city up.".into(),
            input_schema: json!({"type": "object"}),
        },
        Lookup,
    )
}

/// A server answering a tool call first, then text, each streamed or not
/// as asked.
async fn two_step_server(wire: Wire) -> crate::hostile::Hostile {
    hostile("127.0.0.1", move |n, body| {
        let answer = if n % 2 == 0 {
            Answer::Call
        } else {
            Answer::Text
        };
        if body.get("stream") == Some(&json!(true)) {
            streamed(stream_body(wire, answer, None), &[4, 9, 2])
        } else {
            json_reply(&whole_body(wire, answer))
        }
    })
    .await
}

fn runner(store: &Store, model: Arc<dyn ModelClient>, stream: bool) -> Runner {
    Runner::builder(store.clone(), model)
        .tools(lookup())
        .config(RunnerConfig::default().with_owner("stream-test"))
        .stream(stream)
        .compaction(
            CompactionConfig::default()
                .with_compact_at(Threshold::Off)
                .with_background(None),
        )
        .build()
        .unwrap()
}

/// What a turn stored, less row ids and times: each step's response,
/// usage, hash and status, each tool call's arguments and result.
fn stored(store: &Store) -> Vec<String> {
    store
        .with_conn(|c| {
            let mut out = Vec::new();
            for sql in [
                "SELECT idx || '|' || status || '|' || coalesce(response, '') || '|' || \
                 coalesce(messages_sha256, '') || '|' || coalesce(input_tokens, -1) || '|' || \
                 coalesce(output_tokens, -1) FROM steps ORDER BY turn_id, idx",
                "SELECT tool_call_id || '|' || tool_name || '|' || arguments || '|' || \
                 coalesce(result, '') || '|' || status FROM tool_invocations ORDER BY id",
                "SELECT idx || '|' || status || '|' || coalesce(output, '') FROM turns ORDER BY idx",
            ] {
                let mut q = c.prepare(sql)?;
                let rows = q
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                out.extend(rows);
            }
            Ok(out)
        })
        .unwrap()
}

/// The same scripted answers, run by a runner that streams and by one that
/// does not, each in a store of its own: the rows stored (responses, usage,
/// hashes, tool calls and results, the turns' outputs) are identical, every
/// step rebuilds to its hash, and the streaming runner's subscribers got
/// the answer's pieces, tagged with the session, turn and step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_and_an_unstreamed_run_store_identical_rows_and_hashes() {
    for wire in WIRES {
        let mut runs = Vec::new();
        for streaming in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(common::db_for(&dir.path().join("s.db"))).unwrap();
            let srv = two_step_server(wire).await;
            let r = runner(
                &store,
                client(wire, &srv.base, Duration::from_secs(10)),
                streaming,
            );
            let mut events = r.subscribe();
            let s = r.create_session("user-1", "m", "sys").await.unwrap();
            for i in 0..2 {
                let out = r.run_turn_at(s.id, i, "where is Zürich?").await.unwrap();
                assert_eq!(out.output, TEXT, "{wire:?}");
            }
            let mut deltas = Vec::new();
            for e in common::drained(&mut events) {
                if let EventKind::ModelDelta { step, delta, .. } = e.kind {
                    assert_eq!(e.subject.session, "user-1");
                    deltas.push((e.subject.turn, step, delta));
                }
            }
            if streaming {
                let text: String = deltas
                    .iter()
                    .filter(|(t, s, _)| *t == Some(1) && *s == 1)
                    .filter_map(|(_, _, d)| match d {
                        Delta::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(text, TEXT, "{wire:?}: turn 1 step 1's pieces");
            } else {
                assert!(deltas.is_empty(), "{wire:?}: pieces without streaming");
            }
            assert_eq!(common::assert_all_steps_rebuild(&store), 4, "{wire:?}");
            runs.push(stored(&store));
        }
        assert_eq!(runs[0], runs[1], "{wire:?}");
    }
}

/// A stream cut midway is tried again from the step: the turn completes,
/// and what is stored is the whole answer of the attempt that finished (the
/// same rows as a run whose stream was never cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_is_retried_from_the_step_and_nothing_partial_is_kept() {
    for wire in WIRES {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(common::db_for(&dir.path().join("s.db"))).unwrap();
        let srv = hostile("127.0.0.1", move |n, _| {
            // Request 0: the tool call, cut halfway; then whole answers.
            let (answer, cut) = match n {
                0 => (Answer::Call, Some(5)),
                1 => (Answer::Call, None),
                _ => (Answer::Text, None),
            };
            streamed(stream_body(wire, answer, cut), &[6, 1, 13])
        })
        .await;
        let mut cfg = RunnerConfig::default().with_owner("stream-test");
        cfg.model_retry = abridge::RetryPolicy::default()
            .with_backoff(Duration::from_millis(1), Duration::from_millis(20))
            .with_jitter(0.0);
        let r = Runner::builder(
            store.clone(),
            client(wire, &srv.base, Duration::from_secs(10)),
        )
        .tools(lookup())
        .config(cfg)
        .stream(true)
        .compaction(CompactionConfig::default().with_compact_at(Threshold::Off))
        .build()
        .unwrap();
        let mut events = r.subscribe();
        let s = r.create_session("user-1", "m", "sys").await.unwrap();
        let out = r.run_turn_at(s.id, 0, "where is Zürich?").await.unwrap();
        assert_eq!(out.output, TEXT);
        assert_eq!(srv.requests(), 3, "{wire:?}");
        let mut attempts = std::collections::BTreeSet::new();
        for e in common::drained(&mut events) {
            if let EventKind::ModelDelta {
                step: 0, attempt, ..
            } = e.kind
            {
                attempts.insert(attempt);
            }
        }
        assert_eq!(attempts, [1, 2].into(), "{wire:?}: each attempt's pieces");
        let rows = stored(&store);
        assert!(
            rows.iter().all(|r| !r.contains("ended before")),
            "{wire:?}: {rows:?}"
        );
        assert_eq!(common::assert_all_steps_rebuild(&store), 2);
        let calls: Vec<&String> = rows
            .iter()
            .filter(|r| r.starts_with("call_1|") || r.starts_with("toolu_1|"))
            .collect();
        assert_eq!(calls.len(), 1, "{wire:?}: {rows:?}");
        assert!(
            calls[0].contains(ARGS) || calls[0].contains("Zürich"),
            "{wire:?}: {calls:?}"
        );
    }
}

/// `abridge chat --stream on` prints the answer as it arrives and stores
/// what `--stream off` stores: the same stdout (the answer, then a
/// newline), the same rows, and the request asked for a stream only when on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_on_request_and_stores_what_an_unstreamed_chat_stores() {
    let mut runs = Vec::new();
    for flag in ["on", "off"] {
        let srv = server(Wire::Chat, Answer::Text, &[3, 8]).await;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("chat.db");
        let mut c = crate::chat::chat_at(&srv.base, &db, &["--stream", flag, "hello"]);
        let out = tokio::task::spawn_blocking(move || c.output().unwrap())
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{flag}: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{TEXT}\n"),
            "{flag}"
        );
        let asked = srv.bodies.lock().unwrap()[0].get("stream").cloned();
        assert_eq!(
            asked == Some(json!(true)),
            flag == "on",
            "{flag}: {asked:?}"
        );
        let store = Store::open(common::db_for(&db)).unwrap();
        runs.push(stored(&store));
    }
    assert_eq!(runs[0], runs[1]);
}

/// A chat killed while its answer streams leaves the turn running; the next
/// chat of the session finishes that same turn (its answer asked for again,
/// stored once) before its own, and `verify` holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_killed_mid_stream_is_finished_once_by_the_next() {
    let srv = hostile("127.0.0.1", move |n, _| {
        if n == 0 {
            // Half the answer, then silence until the process is killed.
            let body = stream_body(Wire::Chat, Answer::Text, Some(4));
            Reply::Pieces {
                head: SSE_HEAD.into(),
                pieces: pieces_of(body.as_bytes(), &[16]),
                gap: Duration::from_millis(2),
                hang: Duration::from_secs(60),
            }
        } else {
            streamed(stream_body(Wire::Chat, Answer::Text, None), &[16])
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("chat.db");
    let mut child = crate::chat::chat_at(&srv.base, &db, &["--stream", "on", "first"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The first pieces are out: the answer is streaming.
    let mut stdout = child.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut buf = [0u8; 8];
        let n = stdout.read(&mut buf).unwrap();
        (n, stdout)
    })
    .await
    .unwrap();
    assert!(first.0 > 0, "nothing streamed");
    child.kill().unwrap();
    child.wait().unwrap();
    let mut c = crate::chat::chat_at(&srv.base, &db, &["--stream", "on", "second"]);
    let out = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("finishing turn 0"), "{stderr}");
    assert_eq!(srv.requests(), 3, "turn 0 asked twice, turn 1 once");
    let store = Store::open(common::db_for(&db)).unwrap();
    let (turns, steps): (i64, i64) = store
        .with_conn(|c| {
            Ok((
                c.query_row(
                    "SELECT count(*) FROM turns WHERE status = 'completed'",
                    [],
                    |r| r.get(0),
                )?,
                c.query_row("SELECT count(*) FROM steps", [], |r| r.get(0))?,
            ))
        })
        .unwrap();
    assert_eq!((turns, steps), (2, 2), "each turn once, one step each");
    assert_eq!(common::assert_all_steps_rebuild(&store), 2);
    let verify = common::abridge_cmd()
        .args(["verify", "--db"])
        .arg(common::db_for(&db))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

/// A host that drops a turn's future while its answer streams (a timeout
/// around the turn) leaves the turn resumable: nothing of the stream is
/// stored, and a runner of another host (once the lease is free) finishes
/// the same turn with the whole answer, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_dropped_mid_stream_is_resumed_with_nothing_partial_kept() {
    for wire in WIRES {
        let srv = hostile("127.0.0.1", move |n, _| {
            if n == 0 {
                Reply::Pieces {
                    head: SSE_HEAD.into(),
                    pieces: pieces_of(stream_body(wire, Answer::Text, Some(4)).as_bytes(), &[7]),
                    gap: Duration::from_millis(1),
                    hang: Duration::from_secs(60),
                }
            } else {
                streamed(stream_body(wire, Answer::Text, None), &[7])
            }
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(common::db_for(&dir.path().join("s.db"))).unwrap();
        let first = runner(
            &store,
            client(wire, &srv.base, Duration::from_secs(30)),
            true,
        );
        let mut events = first.subscribe();
        let s = first.create_session("user-1", "m", "sys").await.unwrap();
        let mut turn = Box::pin(first.run_turn_at(s.id, 0, "hello"));
        // Dropped once the first piece has arrived.
        tokio::select! {
            _ = &mut turn => panic!("{wire:?}: the stalled stream finished"),
            _ = async {
                loop {
                    if let Ok(e) = events.recv().await {
                        if matches!(e.kind, EventKind::ModelDelta { .. }) {
                            break;
                        }
                    }
                }
            } => {}
        }
        drop(turn);
        drop(first);
        let (steps, responded): (i64, i64) = store
            .with_conn(|c| {
                Ok((
                    c.query_row("SELECT count(*) FROM steps", [], |r| r.get(0))?,
                    c.query_row(
                        "SELECT count(*) FROM steps WHERE response IS NOT NULL",
                        [],
                        |r| r.get(0),
                    )?,
                ))
            })
            .unwrap();
        assert_eq!(
            (steps, responded),
            (1, 0),
            "{wire:?}: a partial answer was stored"
        );
        let mut cfg = RunnerConfig::default().with_owner("another-host");
        cfg.lease_ttl = Duration::from_millis(200);
        let second = Runner::builder(
            store.clone(),
            client(wire, &srv.base, Duration::from_secs(30)),
        )
        .config(cfg)
        .stream(true)
        .compaction(CompactionConfig::default().with_compact_at(Threshold::Off))
        .build()
        .unwrap();
        let turns = second.recoverable_turns().await.unwrap();
        assert_eq!(turns.len(), 1, "{wire:?}");
        let out = loop {
            match second.resume_turn(turns[0].id).await {
                Ok(out) => break out,
                Err(abridge::Error::LeaseHeld { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("{wire:?}: {e}"),
            }
        };
        assert_eq!(out.output, TEXT, "{wire:?}");
        assert_eq!(srv.requests(), 2, "{wire:?}");
        assert_eq!(common::assert_all_steps_rebuild(&store), 1);
    }
}
