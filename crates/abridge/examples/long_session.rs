//! One new fact a turn for 1,500 turns at an 8,000-token threshold: the
//! first step after each compaction, compactions in consecutive turns, the
//! pinned block's size, and the live rules and slots the model still sees.
//! docs/fidelity.md ("No thrash in long sessions").
//!
//! ```sh
//! cargo run --release --example long_session -- [TURNS] [--lossy] [--json]
//! ```

use abridge::compaction::{ExtractiveSummariser, Summariser};
use std::sync::Arc;

#[tokio::main]
async fn main() -> abridge::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let lossy = args.iter().any(|a| a == "--lossy");
    let turns: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(1_500);
    let dir = std::env::temp_dir().join(format!("abridge-long-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("long.db");
    let summariser: Arc<dyn Summariser> = if lossy {
        Arc::new(abridge_testkit::fidelity::Lossy)
    } else {
        Arc::new(ExtractiveSummariser)
    };
    let o = abridge_testkit::long_session::run(&path, turns, summariser, |c| c).await?;
    if json {
        println!("{}", serde_json::to_string(&o).expect("serialisable"));
    } else {
        println!("{o:#?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
