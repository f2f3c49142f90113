//! OpenTelemetry: the spans a runner makes (captured with the SDK's
//! in-memory exporter) have the GenAI conventions' names, parents and
//! attributes; content only when the host opts in; the metrics exist; and
//! `abridge demo` exports over OTLP/HTTP to a receiver on 127.0.0.1 when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use crate::common;
use abridge::message::{ContentBlock, ModelRequest, ModelResponse, ResponseBlock, Role, Usage};
use abridge::telemetry::Telemetry;
use abridge::{
    CompactionConfig, ModelClient, ModelError, Runner, RunnerConfig, Threshold, Tool, ToolCall,
    ToolError, Tools,
};
use opentelemetry::trace::SpanKind;
use opentelemetry::Value;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use std::sync::Arc;

/// Looks a city up once per turn, then answers; says who answered and why
/// it stopped, with usage and cache reads.
struct Model;

#[abridge::async_trait]
impl ModelClient for Model {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().unwrap();
        let done = last.role == Role::User
            && last
                .content
                .iter()
                .any(|b| matches!(b, ContentBlock::ToolResult { .. }));
        let (blocks, stop) = if done {
            (
                vec![ResponseBlock::Text {
                    text: format!("It is sunny. {}", "Details follow. ".repeat(20)),
                }],
                "end_turn",
            )
        } else {
            (
                vec![ResponseBlock::ToolUse {
                    id: format!("call_{}", req.messages.len()),
                    name: "lookup".into(),
                    input: json!({"city": "Oslo"}),
                    raw_input: None,
                }],
                "tool_use",
            )
        };
        // The input as the context's size (a quarter of its JSON's bytes).
        let input = serde_json::to_string(&*req.messages).unwrap().len() as u64 / 4;
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: Some(input),
                output_tokens: Some(12),
                cache_read_tokens: Some(80),
                cache_write_tokens: None,
            },
            stop_reason: Some(stop.into()),
            model: Some("gpt-4o-mini-2024-07-18".into()),
        })
    }

    fn provider_name(&self) -> Option<&str> {
        Some("openai")
    }
}

struct Lookup;

#[abridge::async_trait]
impl Tool for Lookup {
    async fn call(&self, _call: &ToolCall) -> Result<serde_json::Value, ToolError> {
        Ok(json!({"sky": "clear", "note": "x".repeat(300)}))
    }
}

struct Captured {
    spans: InMemorySpanExporter,
    metrics: InMemoryMetricExporter,
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

fn captured() -> Captured {
    let spans = InMemorySpanExporter::default();
    let metrics = InMemoryMetricExporter::default();
    let tracer = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let meter = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .build();
    Captured {
        spans,
        metrics,
        tracer,
        meter,
    }
}

async fn run_turns(c: &Captured, log_content: bool) -> Vec<SpanData> {
    let (_d, path) = common::temp_db();
    let store = common::store_at(&path);
    let mut cfg = RunnerConfig::default().with_owner("otel-test");
    cfg.log_content = log_content;
    let tools = Tools::new().idempotent(
        abridge::ToolSpec {
            name: "lookup".into(),
            description: "The weather.".into(),
            input_schema: json!({"type": "object"}),
        },
        Lookup,
    );
    let mut compaction = CompactionConfig::default().with_compact_at(Threshold::Tokens(600));
    compaction.background = None;
    let runner = Runner::builder(store.clone(), Arc::new(Model))
        .tools(tools)
        .config(cfg)
        .compaction(compaction)
        .telemetry(Telemetry::new(&c.tracer, &c.meter))
        .build()
        .unwrap();
    let s = runner
        .create_session("weather-desk", "gpt-4o-mini", "You report the weather.")
        .await
        .unwrap();
    for t in 0..6 {
        runner
            .run_turn(s.id, &format!("What is the weather in Oslo, day {t}?"))
            .await
            .unwrap();
    }
    c.tracer.force_flush().unwrap();
    c.spans.get_finished_spans().unwrap()
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn s(v: &str) -> Value {
    Value::from(v.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_follow_the_genai_conventions_names_parents_and_attributes() {
    let c = captured();
    let spans = run_turns(&c, false).await;
    let named = |prefix: &str| -> Vec<&SpanData> {
        spans
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .collect()
    };
    let turns = named("invoke_agent");
    let chats = named("chat ");
    let tools = named("execute_tool ");
    let compactions = named("compaction");
    assert_eq!(turns.len(), 6);
    assert_eq!(chats.len(), 12, "two model calls a turn");
    assert_eq!(tools.len(), 6);
    assert!(
        !compactions.is_empty(),
        "the threshold of 600 tokens compacts"
    );

    for turn in &turns {
        assert_eq!(turn.span_kind, SpanKind::Internal);
        assert_eq!(
            attr(turn, "gen_ai.operation.name"),
            Some(&s("invoke_agent"))
        );
        assert_eq!(attr(turn, "gen_ai.provider.name"), Some(&s("openai")));
        assert_eq!(attr(turn, "gen_ai.request.model"), Some(&s("gpt-4o-mini")));
        assert_eq!(
            attr(turn, "gen_ai.conversation.id"),
            Some(&s("weather-desk"))
        );
        assert_eq!(attr(turn, "abridge.turn.steps"), Some(&Value::I64(2)));
        assert_eq!(turn.parent_span_id, opentelemetry::trace::SpanId::INVALID);
    }
    // Each model call and tool call is a child of its own turn's span.
    let parent_of = |span: &SpanData| {
        turns
            .iter()
            .find(|t| t.span_context.span_id() == span.parent_span_id)
            .map(|t| attr(t, "abridge.turn.index").cloned())
    };
    for chat in &chats {
        assert_eq!(chat.name, "chat gpt-4o-mini");
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert!(
            parent_of(chat).is_some(),
            "a chat span's parent is its turn"
        );
        assert_eq!(attr(chat, "gen_ai.operation.name"), Some(&s("chat")));
        assert_eq!(attr(chat, "gen_ai.provider.name"), Some(&s("openai")));
        assert_eq!(attr(chat, "gen_ai.request.model"), Some(&s("gpt-4o-mini")));
        assert_eq!(
            attr(chat, "gen_ai.response.model"),
            Some(&s("gpt-4o-mini-2024-07-18"))
        );
        assert!(matches!(attr(chat, "gen_ai.usage.input_tokens"), Some(Value::I64(n)) if *n > 0));
        assert_eq!(
            attr(chat, "gen_ai.usage.output_tokens"),
            Some(&Value::I64(12))
        );
        assert_eq!(
            attr(chat, "gen_ai.usage.cache_read.input_tokens"),
            Some(&Value::I64(80))
        );
        let reasons = format!(
            "{:?}",
            attr(chat, "gen_ai.response.finish_reasons").unwrap()
        );
        assert!(
            reasons.contains("tool_use") || reasons.contains("end_turn"),
            "{reasons}"
        );
        // No content without the host's opt-in.
        assert!(attr(chat, "gen_ai.input.messages").is_none());
        assert!(attr(chat, "gen_ai.output.messages").is_none());
    }
    for tool in &tools {
        assert_eq!(tool.name, "execute_tool lookup");
        assert!(
            parent_of(tool).is_some(),
            "a tool span's parent is its turn"
        );
        assert_eq!(
            attr(tool, "gen_ai.operation.name"),
            Some(&s("execute_tool"))
        );
        assert_eq!(attr(tool, "gen_ai.tool.name"), Some(&s("lookup")));
        assert_eq!(attr(tool, "gen_ai.tool.type"), Some(&s("function")));
        assert_eq!(attr(tool, "abridge.tool.effect"), Some(&s("idempotent")));
        match attr(tool, "gen_ai.tool.call.id") {
            Some(Value::String(id)) => assert!(id.as_str().starts_with("call_")),
            other => panic!("{other:?}"),
        }
    }
    for comp in &compactions {
        assert!(
            parent_of(comp).is_some(),
            "an inline compaction's parent is the turn that claimed it"
        );
        for key in [
            "abridge.compaction.boundary",
            "abridge.compaction.tokens_before",
            "abridge.compaction.tokens_after",
            "abridge.compaction.pins",
        ] {
            assert!(attr(comp, key).is_some(), "{key} missing");
        }
        match (
            attr(comp, "abridge.compaction.tokens_before"),
            attr(comp, "abridge.compaction.tokens_after"),
        ) {
            (Some(Value::I64(b)), Some(Value::I64(a))) => assert!(a < b),
            other => panic!("{other:?}"),
        }
    }
    // Each span's trace is its turn's.
    for span in chats.iter().chain(&tools) {
        let turn = turns
            .iter()
            .find(|t| t.span_context.span_id() == span.parent_span_id)
            .unwrap();
        assert_eq!(span.span_context.trace_id(), turn.span_context.trace_id());
    }

    c.meter.force_flush().unwrap();
    let names: std::collections::BTreeSet<String> = c
        .metrics
        .get_finished_metrics()
        .unwrap()
        .iter()
        .flat_map(|rm| rm.scope_metrics())
        .flat_map(|sm| sm.metrics())
        .map(|m| m.name().to_string())
        .collect();
    for want in [
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "abridge.compactions",
        "abridge.compaction.tokens_saved",
    ] {
        assert!(names.contains(want), "{want} not in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_content_is_sent_only_when_the_host_opts_in() {
    let c = captured();
    let spans = run_turns(&c, true).await;
    let chat = spans.iter().find(|s| s.name.starts_with("chat ")).unwrap();
    match attr(chat, "gen_ai.input.messages") {
        Some(Value::String(m)) => assert!(m.as_str().contains("What is the weather in Oslo")),
        other => panic!("{other:?}"),
    }
    assert!(attr(chat, "gen_ai.output.messages").is_some());
}

/// A receiver of OTLP/HTTP on 127.0.0.1: every request's path,
/// content-type and body.
pub(crate) type Received = Arc<std::sync::Mutex<Vec<(String, String, Vec<u8>)>>>;

pub(crate) async fn otlp_receiver() -> (String, Received) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let got: Received = Arc::default();
    let keep = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let keep = keep.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(socket);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or_default().to_string();
                    let (mut len, mut kind) = (0usize, String::new());
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end().to_string();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            match k.to_ascii_lowercase().as_str() {
                                "content-length" => len = v.trim().parse().unwrap_or(0),
                                "content-type" => kind = v.trim().to_string(),
                                _ => {}
                            }
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    keep.lock().unwrap().push((path, kind, body));
                    let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if r.get_mut().write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exports_spans_and_metrics_over_otlp_when_the_endpoint_is_set() {
    let (base, got) = otlp_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    // One demo run exporting with `protocol`, to its end.
    let run = |protocol: &str, db: std::path::PathBuf| {
        let mut c = common::abridge_cmd();
        c.args([
            "demo",
            "--sessions",
            "1",
            "--turns",
            "6",
            "--compact-at",
            "400",
            "--json",
            "--db",
        ])
        .arg(db)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &base)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .env("OTEL_SERVICE_NAME", "demo-under-test");
        tokio::task::spawn_blocking(move || {
            let out = c.output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        })
    };
    run("http/json", db).await.unwrap();
    let received = got.lock().unwrap().clone();
    let traces: Vec<serde_json::Value> = received
        .iter()
        .filter(|(p, _, _)| p == "/v1/traces")
        .map(|(_, kind, body)| {
            assert!(kind.contains("json"), "{kind}");
            serde_json::from_slice(body).unwrap()
        })
        .collect();
    assert!(
        !traces.is_empty(),
        "no traces arrived: {:?}",
        received.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    let text = serde_json::to_string(&traces).unwrap();
    for name in [
        "\"invoke_agent\"",
        "\"chat ",
        "\"execute_tool ",
        "\"compaction\"",
    ] {
        assert!(
            text.contains(name),
            "no {name} span in what the receiver got"
        );
    }
    assert!(text.contains("demo-under-test"), "the service name");
    assert!(text.contains("gen_ai.operation.name"));
    let metrics: String = received
        .iter()
        .filter(|(p, _, _)| p == "/v1/metrics")
        .map(|(_, _, b)| String::from_utf8_lossy(b).to_string())
        .collect();
    assert!(
        metrics.contains("abridge.compactions"),
        "no compaction metric arrived"
    );

    // The default protocol is protobuf.
    got.lock().unwrap().clear();
    let db2 = dir.path().join("demo2.db");
    run("http/protobuf", db2).await.unwrap();
    let received = got.lock().unwrap().clone();
    let proto = received
        .iter()
        .find(|(p, _, _)| p == "/v1/traces")
        .expect("traces over protobuf");
    assert_eq!(proto.1, "application/x-protobuf");
    assert!(proto.2.windows(12).any(|w| w == b"invoke_agent"));
}
