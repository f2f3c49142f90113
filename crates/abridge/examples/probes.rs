//! The probe evaluation: what the model can still answer about facts of the
//! kinds summaries lose, after 1, 3, 10 and 20 compactions, by summariser,
//! with the pins guard on and off. The tables of docs/fidelity.md ("The
//! probe evaluation").
//!
//! ```sh
//! cargo run --release --example probes            # the tables
//! cargo run --release --example probes -- --json  # one JSON object per run
//! # Also graded by a model (its key in OPENAI_API_KEY or ANTHROPIC_API_KEY):
//! cargo run --release --features providers --example probes -- \
//!     --grade-with openai:gpt-4o-mini
//! ```
//!
//! `--grade-with PROVIDER:MODEL` (`openai`, `openai-responses`,
//! `anthropic`) asks that model each probe's question about the messages
//! the model saw at each checkpoint, and scores its answers the same way
//! (one call per probe, checkpoint and run: 21 × 4 × 6 = 504 calls); the
//! tables then have a graded row under each run.

use abridge_testkit::probes::{run, run_graded, Grader, Outcome, Which, CHECKPOINTS};

/// The grading model `--grade-with PROVIDER:MODEL` names, if any.
fn grader() -> abridge::Result<Option<Grader>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--grade-with") else {
        return Ok(None);
    };
    let spec = args.get(i + 1).cloned().unwrap_or_default();
    let Some((provider, model)) = spec.split_once(':') else {
        return Err(abridge::Error::Config(format!(
            "--grade-with wants PROVIDER:MODEL (openai, openai-responses, anthropic), got {spec:?}"
        )));
    };
    Ok(Some(Grader {
        client: client(provider)?,
        model: model.to_string(),
    }))
}

#[cfg(feature = "providers")]
fn client(provider: &str) -> abridge::Result<std::sync::Arc<dyn abridge::ModelClient>> {
    use abridge::providers::{Anthropic, OpenAiChat, OpenAiResponses};
    use std::sync::Arc;
    Ok(match provider {
        "openai" => Arc::new(OpenAiChat::from_env()?),
        "openai-responses" => Arc::new(OpenAiResponses::from_env()?),
        "anthropic" => Arc::new(Anthropic::from_env()?),
        other => {
            return Err(abridge::Error::Config(format!(
                "--grade-with: unknown provider {other:?} (openai, openai-responses, anthropic)"
            )))
        }
    })
}

#[cfg(not(feature = "providers"))]
fn client(_: &str) -> abridge::Result<std::sync::Arc<dyn abridge::ModelClient>> {
    Err(abridge::Error::Config(
        "--grade-with needs the provider clients: cargo run --release --features providers \
         --example probes -- --grade-with PROVIDER:MODEL"
            .into(),
    ))
}

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let grader = grader()?;
    let json = std::env::args().any(|a| a == "--json");
    let dir = std::env::temp_dir().join(format!("abridge-probes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut outcomes: Vec<Outcome> = Vec::new();
    for which in Which::ALL {
        for guard in [true, false] {
            let path = dir.join(format!("probes-{which:?}-{guard}.db"));
            let o = match &grader {
                Some(g) => run_graded(&path, which, guard, g).await?,
                None => run(&path, which, guard).await?,
            };
            if json {
                println!("{}", serde_json::to_string(&o).expect("serialisable"));
            }
            outcomes.push(o);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if std::env::args().any(|a| a == "--summaries") {
        for o in &outcomes {
            println!(
                "==== {} guard {}\n{}\n",
                o.summariser.name(),
                o.guard,
                o.last_summary
            );
        }
        return Ok(());
    }
    if json {
        return Ok(());
    }
    print!("| summariser | guard |");
    for k in CHECKPOINTS {
        print!(" after {k} |");
    }
    println!(" verify |");
    println!("|---|---|{}---|", "---:|".repeat(CHECKPOINTS.len()));
    for o in &outcomes {
        print!(
            "| {} | {} |",
            o.summariser.name(),
            if o.guard { "on" } else { "off" }
        );
        for k in CHECKPOINTS {
            print!(" {:.0}% |", 100.0 * o.share(k));
        }
        println!(" {} |", if o.verified { "ok" } else { "FAIL" });
        if let Some(g) = &grader {
            print!("| ... graded by {} | |", g.model);
            for k in CHECKPOINTS {
                print!(" {:.0}% |", 100.0 * o.graded_share(k).unwrap_or(0.0));
            }
            println!(" |");
        }
    }
    let kinds: Vec<String> = outcomes[0].by_kind.keys().cloned().collect();
    println!(
        "\nAfter {} compactions, by kind of fact (points of the maximum):\n",
        CHECKPOINTS[3]
    );
    print!("| summariser | guard |");
    for k in &kinds {
        print!(" {k} |");
    }
    println!();
    println!("|---|---|{}", "---:|".repeat(kinds.len()));
    for o in &outcomes {
        print!(
            "| {} | {} |",
            o.summariser.name(),
            if o.guard { "on" } else { "off" }
        );
        for k in &kinds {
            let (p, m) = o.by_kind.get(k).copied().unwrap_or((0, 0));
            print!(" {p}/{m} |");
        }
        println!();
    }
    for o in outcomes.iter().filter(|o| o.guard) {
        println!(
            "\n{} with the guard, below 2 points at the end:",
            o.summariser.name()
        );
        for (q, s) in &o.missed {
            println!("  {s}  {q}");
        }
        if grader.is_some() {
            println!("  graded below 2 points at the end:");
            for (q, answer, s) in &o.graded_missed {
                println!("  {s}  {q}  (answered: {})", answer.trim());
            }
        }
    }
    Ok(())
}
