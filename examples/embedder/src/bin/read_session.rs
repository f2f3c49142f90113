//! Reading a session back through the read API, with no SQL: its turns, each
//! turn's steps (the compaction each read, context tokens, usage, the hash of
//! the bytes sent), each step's tool calls (effect mode, status, key, result),
//! the compactions (boundary, trigger, tokens before and after), the full
//! transcript, and a replayed step.
//!
//! `cargo run -p abridge-embedder --bin read_session` (CI runs it).

use abridge::{
    CompactionConfig, ExportFormat, ModelClient, ModelError, ModelRequest, ModelResponse,
    ResponseBlock, Runner, Store, Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools, Usage,
};
use serde_json::{json, Value};
use std::sync::Arc;

/// Looks the order up once per turn, then answers.
struct Clerk;

#[abridge::async_trait]
impl ModelClient for Clerk {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().expect("a message");
        let blocks = match &last.content[0] {
            abridge::ContentBlock::ToolResult { content, .. } => vec![ResponseBlock::Text {
                text: format!("Order status: {content}. Anything else?"),
            }],
            _ => vec![ResponseBlock::ToolUse {
                id: "lookup-1".into(),
                name: "lookup_order".into(),
                input: json!({"order": "ORD-1234"}),
                raw_input: None,
            }],
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: Some(req.messages.len() as u64 * 40),
                output_tokens: Some(12),
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

struct Lookup;

#[abridge::async_trait]
impl Tool for Lookup {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        Ok(json!({"order": call.input["order"], "status": "shipped", "eta": "2026-12-03"}))
    }
}

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let dir = std::env::temp_dir().join(format!("abridge-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = Store::open(dir.join("agent.db"))?;
    let spec = ToolSpec {
        name: "lookup_order".into(),
        description: "Looks an order up".into(),
        input_schema: json!({"type": "object"}),
    };
    let runner = Runner::builder(store.clone(), Arc::new(Clerk))
        .tools(Tools::new().idempotent(spec, Lookup))
        .compaction(
            CompactionConfig::default()
                .with_compact_at(Threshold::Tokens(300))
                .with_keep_last_turns(1),
        )
        .build()?;
    let created = runner
        .create_session("customer-7", "gpt-4o", "You are a support agent.")
        .await?;
    for i in 0..6 {
        runner
            .run_turn_at(
                created.id,
                i,
                &format!("Where is ORD-1234? (asked {i} times before)"),
            )
            .await?;
    }

    // Everything below reads through the API: no SQL, no raw connection.
    let session = runner.session("customer-7").await?;
    assert_eq!(session.id, created.id);
    let mut steps_seen = 0;
    for turn in store.turns(session.id).await? {
        println!("turn {} ({:?}): {}", turn.idx, turn.status, turn.input);
        for step in store.steps(turn.id).await? {
            steps_seen += 1;
            println!(
                "  step {} ({}): {:?}, read compaction {:?}, context {:?} tokens{}, usage {:?}/{:?}",
                step.idx,
                step.id,
                step.status,
                step.compaction_id,
                step.context_tokens,
                if step.estimated { " (estimated)" } else { "" },
                step.input_tokens,
                step.output_tokens,
            );
            for call in store.invocations(step.id).await? {
                println!(
                    "    {} [{:?}] {:?}, attempts {}, key {}: {}",
                    call.tool_name,
                    call.effect,
                    call.status,
                    call.attempts,
                    call.idempotency_key,
                    call.result.unwrap_or_default()
                );
            }
            let rebuilt = store.rebuild_step(step.id).await?;
            assert!(rebuilt.matches(), "step {} rebuilds to its hash", step.id);
        }
    }
    let compactions = store.compactions(session.id).await?;
    for c in &compactions {
        println!(
            "compaction up to turn {} ({:?}, {}): trigger {:?} tokens, {:?} -> {:?}, by {:?}, attempts {}",
            c.up_to_turn_index,
            c.status,
            c.trigger,
            c.trigger_tokens,
            c.tokens_before,
            c.tokens_after,
            c.model,
            c.attempts
        );
    }
    assert!(!compactions.is_empty(), "the session compacted");
    assert_eq!(steps_seen, 12);
    let transcript = store.export(session.id, ExportFormat::Jsonl).await?;
    println!("\ntranscript: {} records", transcript.lines().count());
    let report = store.verify(Vec::new()).await?;
    println!("guarantees hold: {}", report.ok);
    assert!(report.ok);
    drop((runner, store));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
