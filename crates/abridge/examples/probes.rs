//! The probe evaluation: what the model can still answer about facts of the
//! kinds summaries lose, after 1, 3, 10 and 20 compactions, by summariser,
//! with the pins guard on and off. The tables of docs/fidelity.md ("The
//! probe evaluation").
//!
//! ```sh
//! cargo run --release --example probes            # the tables
//! cargo run --release --example probes -- --json  # one JSON object per run
//! ```

use abridge_testkit::probes::{run, Outcome, Which, CHECKPOINTS};

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    let dir = std::env::temp_dir().join(format!("abridge-probes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut outcomes: Vec<Outcome> = Vec::new();
    for which in Which::ALL {
        for guard in [true, false] {
            let path = dir.join(format!("probes-{which:?}-{guard}.db"));
            let o = run(&path, which, guard).await?;
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
    }
    Ok(())
}
