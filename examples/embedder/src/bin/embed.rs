//! Embedding abridge in a host: a model client, tools, crash recovery at
//! start-up, turns numbered by the host (so a turn retried after a crash is
//! the same turn, never a second one), and a check of what was stored.
//!
//! Built with the engine alone, as an app depends on it
//! (`abridge = { package = "abridge-engine", version = "0.1" }`, no default
//! features): `cargo run -p abridge-embedder --bin embed`.

use abridge::{
    CompactionConfig, ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner,
    Store, Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools, TransactionalTool, Usage,
};
use serde_json::{json, Value};
use std::sync::Arc;

/// A stand-in for a real provider client: calls the `weather` tool once per
/// turn, then answers with what it got back.
struct EchoModel;

#[abridge::async_trait]
impl ModelClient for EchoModel {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().expect("at least the system prompt");
        let blocks = match &last.content[0] {
            abridge::ContentBlock::ToolResult { content, .. } => vec![ResponseBlock::Text {
                text: format!("The tool said: {content}"),
            }],
            _ => vec![ResponseBlock::ToolUse {
                id: "call-1".into(),
                name: "weather".into(),
                input: json!({"city": "Lisbon"}),
                raw_input: None,
            }],
        };
        Ok(ModelResponse {
            blocks,
            usage: Usage::default(),
            ..Default::default()
        })
    }
}

/// Idempotent: a real one would pass `call.idempotency_key` to the service.
struct Weather;

#[abridge::async_trait]
impl Tool for Weather {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        Ok(json!({"city": call.input["city"], "forecast": "sunny", "key": call.idempotency_key}))
    }
}

/// Transactional: its write commits with the invocation record, exactly once.
struct Remember;

impl TransactionalTool for Remember {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<Value, ToolError> {
        tx.execute("CREATE TABLE IF NOT EXISTS notes (key TEXT, body TEXT)", [])
            .and_then(|_| {
                tx.execute(
                    "INSERT INTO notes VALUES (?1, ?2)",
                    [&call.idempotency_key, &call.input.to_string()],
                )
            })
            .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(json!("noted"))
    }
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema: json!({"type": "object"}),
    }
}

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let dir = std::env::temp_dir().join(format!("abridge-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = Store::open(dir.join("agent.db"))?;
    let runner = Runner::builder(store, Arc::new(EchoModel))
        .tools(
            Tools::new()
                .idempotent(spec("weather"), Weather)
                .transactional(spec("remember"), Remember),
        )
        .compaction(CompactionConfig::default().with_compact_at(Threshold::Tokens(400)))
        .build()?;

    // At start-up: finish whatever a crash left running.
    // A turn another live host holds (or has just finished) is theirs: not a
    // reason to stop. Anything resumable (a busy store, a lost connection, a
    // provider's long rate limit) is tried again at the next start-up.
    for turn in runner.recoverable_turns().await? {
        match runner.resume_turn(turn.id).await {
            Ok(_) => {}
            Err(e @ abridge::Error::LeaseHeld { .. }) => eprintln!("skipped: {e}"),
            Err(abridge::Error::TurnFinished { .. }) => {}
            Err(e) if e.is_resumable() => eprintln!("left for later: {e}"),
            Err(e) => eprintln!("turn {} failed: {e}", turn.id),
        }
    }

    let session = runner
        .create_session("user-42", "gpt-4o", "You are a helpful agent.")
        .await?;
    let questions = [
        "Weather in Lisbon?",
        "And tomorrow?",
        "Pack an umbrella?",
        "Thanks!",
    ];
    for (i, q) in questions.iter().enumerate() {
        // Turn i, whatever happened before: after a crash the host runs the
        // same loop again and gets each finished turn's outcome back.
        let out = runner.run_turn_at(session.id, i as i64, q).await?;
        println!("> {q}\n{} ({} steps)", out.output, out.steps);
    }
    // Run again, as a restarted host would: nothing runs twice.
    let again = runner.run_turn_at(session.id, 0, questions[0]).await?;
    assert_eq!(again.steps, 2);

    let conn = abridge::store::open_read_only(dir.join("agent.db"))?;
    let report = abridge::verify::verify(&conn)?;
    println!("\nguarantees hold: {}", report.ok);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
