//! The host the provider examples share: a durable session of three turns
//! against one provider, the answers streamed to the terminal as they
//! arrive, then every step rebuilt to its hash and `verify` run.
//!
//! With the provider's key in the environment (`OPENAI_API_KEY`,
//! `ANTHROPIC_API_KEY`; `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL` as their
//! SDKs read them) it talks to the real API, with the model in
//! `ABRIDGE_EXAMPLE_MODEL` or a small default. Without one it starts a
//! local stand-in that speaks the same wire format (what CI runs).

use abridge::events::EventKind;
use abridge::providers::{Anthropic, HttpOptions, OpenAiChat, OpenAiResponses};
use abridge::{CompactionConfig, Delta, ModelClient, ModelSummariser, Runner, Store, Threshold};
use abridge_testkit::local_provider::{self, Wire};
use std::io::Write;
use std::sync::Arc;

/// Runs the example for `wire`.
pub async fn main_for(wire: Wire) -> Result<(), Box<dyn std::error::Error>> {
    let key_var = match wire {
        Wire::Anthropic => "ANTHROPIC_API_KEY",
        _ => "OPENAI_API_KEY",
    };
    let real = std::env::var(key_var).is_ok_and(|k| !k.trim().is_empty());
    // Kept alive for the run when there is no key.
    let mut _local = None;
    let (client, model): (Arc<dyn ModelClient>, String) = if real {
        let default = match wire {
            Wire::Anthropic => "claude-haiku-4-5",
            _ => "gpt-4o-mini",
        };
        let model = std::env::var("ABRIDGE_EXAMPLE_MODEL").unwrap_or(default.into());
        let client: Arc<dyn ModelClient> = match wire {
            Wire::OpenAiChat => Arc::new(OpenAiChat::from_env()?),
            Wire::OpenAiResponses => Arc::new(OpenAiResponses::from_env()?),
            Wire::Anthropic => Arc::new(Anthropic::from_env()?),
        };
        (client, model)
    } else {
        let local = local_provider::start(wire).await;
        eprintln!(
            "{key_var} is not set: talking to a local stand-in at {}",
            local.base
        );
        let options = HttpOptions::new(&local.base);
        let client: Arc<dyn ModelClient> = match wire {
            Wire::OpenAiChat => Arc::new(OpenAiChat::new(options, None)?),
            Wire::OpenAiResponses => Arc::new(OpenAiResponses::new(options, None)?),
            Wire::Anthropic => Arc::new(Anthropic::new(
                options,
                abridge::providers::ApiKey::new("none"),
            )?),
        };
        _local = Some(local);
        (client, "local-model".to_string())
    };

    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("provider-example.db"))?;
    let runner = Runner::builder(store.clone(), client.clone())
        .summariser(ModelSummariser::new(client, model.clone()))
        .compaction(CompactionConfig::default().with_compact_at(Threshold::Tokens(100_000)))
        .stream(true)
        .build()?;

    // The answer's text as it arrives.
    let mut events = runner.subscribe();
    let printer = tokio::spawn(async move {
        loop {
            let e = match events.recv().await {
                Ok(e) => e,
                // Fell behind: the oldest pieces are gone, the stream goes on.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            };
            if let EventKind::ModelDelta {
                delta: Delta::Text { text },
                ..
            } = e.kind
            {
                print!("{text}");
                let _ = std::io::stdout().flush();
            }
        }
    });

    let session = runner
        .create_session("example", &model, "You are a concise assistant.")
        .await?;
    let said = [
        "Hello! My name is Ada and my order number is ORD-1234.",
        "It should arrive in Lisbon, postal code 1100-148.",
        "What is my order number, and where is it going?",
    ];
    for (i, input) in said.iter().enumerate() {
        println!("> {input}");
        let outcome = runner.run_turn_at(session.id, i as i64, input).await?;
        println!();
        assert!(!outcome.output.is_empty(), "an empty answer");
    }
    runner.finish_background().await;
    drop(runner);
    printer.abort();

    // Every step the model was sent rebuilds to the bytes it was sent.
    let mut steps = 0;
    for turn in store.turns(session.id).await? {
        for step in store.steps(turn.id).await? {
            let rebuilt = store.rebuild_step(step.id).await?;
            assert!(rebuilt.matches(), "step {} does not rebuild", step.id);
            steps += 1;
        }
    }
    let report = store.verify(Vec::new()).await?;
    println!(
        "{steps} steps rebuilt to their hashes; verify: {}",
        if report.ok { "ok" } else { "FAILED" }
    );
    if !report.ok {
        return Err("verify failed".into());
    }
    Ok(())
}
