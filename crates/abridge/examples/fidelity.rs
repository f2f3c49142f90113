//! The fidelity benchmark: what the model still sees of 21 facts stated early
//! in a session, after many compactions, by summariser, with the pins guard on
//! and off. The table of docs/fidelity.md.
//!
//! ```sh
//! cargo run --release --example fidelity            # the table
//! cargo run --release --example fidelity -- --json  # one JSON object per run
//! ```

use abridge_testkit::fidelity::{run, Outcome, Which, FACTS};

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    let dir = tempfile_dir();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for which in Which::ALL {
        for guard in [false, true] {
            let path = dir.join(format!("fidelity-{which:?}-{guard}.db"));
            let _ = std::fs::remove_file(&path);
            let o = run(&path, which, guard).await?;
            if json {
                println!("{}", serde_json::to_string(&o).expect("serialisable"));
            }
            outcomes.push(o);
        }
    }
    if json {
        return Ok(());
    }
    println!(
        "{} facts stated in the first turns, {} filler turns with large tool results\n",
        FACTS.len(),
        abridge_testkit::fidelity::FILLER_TURNS
    );
    println!(
        "| summariser | guard | compactions | visible at the last step | with its sentence | failed-transaction ids visible | verify |"
    );
    println!("|---|---|---:|---:|---:|---:|---|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {}/{} ({:.0}%) | {}/{} ({:.0}%) | {}/{} | {} |",
            o.summariser.name(),
            if o.guard { "on" } else { "off" },
            o.compactions,
            o.visible,
            o.facts,
            100.0 * o.visible_share(),
            o.with_sentence,
            o.facts,
            100.0 * o.sentence_share(),
            o.tool_ids_visible,
            o.tool_ids,
            if o.verified { "ok" } else { "FAIL" }
        );
    }
    let kinds: Vec<String> = outcomes[0].by_kind.keys().cloned().collect();
    println!("\nVisible at the last step, by kind of fact:\n");
    print!("| summariser | guard |");
    for k in &kinds {
        print!(" {k} |");
    }
    println!();
    print!("|---|---|");
    for _ in &kinds {
        print!("---:|");
    }
    println!();
    for o in &outcomes {
        print!(
            "| {} | {} |",
            o.summariser.name(),
            if o.guard { "on" } else { "off" }
        );
        for k in &kinds {
            let (v, n) = o.by_kind[k];
            print!(" {v}/{n} |");
        }
        println!();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("abridge-fidelity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}
